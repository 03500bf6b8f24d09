"""The exporter-toolkit web configuration's vocabulary: the names its files may use and
what each means to Python's ssl module. A leaf: the file's reader, its pydantic schema and
the TLS server all read it, and it imports none of them (the agent, which serves TLS, does
not load pydantic)."""

from __future__ import annotations

import re
import ssl

CLIENT_AUTH = {
    "": ssl.CERT_NONE,
    "NoClientCert": ssl.CERT_NONE,
    "VerifyClientCertIfGiven": ssl.CERT_OPTIONAL,
    "RequireAndVerifyClientCert": ssl.CERT_REQUIRED,
}
# Go asks for a certificate and takes any; OpenSSL verifies every certificate it asks for.
UNSUPPORTED_CLIENT_AUTH = ("RequestClientCert", "RequireAnyClientCert", "RequireClientCert")
TLS_VERSIONS = {"TLS12": ssl.TLSVersion.TLSv1_2, "TLS13": ssl.TLSVersion.TLSv1_3}
OLD_TLS_VERSIONS = ("TLS10", "TLS11")
# Go's tls.CipherSuites() names (the ones the exporter-toolkit accepts) -> OpenSSL's names.
CIPHERS_TLS12 = {
    "TLS_RSA_WITH_AES_128_CBC_SHA": "AES128-SHA",
    "TLS_RSA_WITH_AES_256_CBC_SHA": "AES256-SHA",
    "TLS_RSA_WITH_AES_128_GCM_SHA256": "AES128-GCM-SHA256",
    "TLS_RSA_WITH_AES_256_GCM_SHA384": "AES256-GCM-SHA384",
    "TLS_ECDHE_ECDSA_WITH_AES_128_CBC_SHA": "ECDHE-ECDSA-AES128-SHA",
    "TLS_ECDHE_ECDSA_WITH_AES_256_CBC_SHA": "ECDHE-ECDSA-AES256-SHA",
    "TLS_ECDHE_RSA_WITH_AES_128_CBC_SHA": "ECDHE-RSA-AES128-SHA",
    "TLS_ECDHE_RSA_WITH_AES_256_CBC_SHA": "ECDHE-RSA-AES256-SHA",
    "TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256": "ECDHE-ECDSA-AES128-GCM-SHA256",
    "TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384": "ECDHE-ECDSA-AES256-GCM-SHA384",
    "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256": "ECDHE-RSA-AES128-GCM-SHA256",
    "TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384": "ECDHE-RSA-AES256-GCM-SHA384",
    "TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256": "ECDHE-RSA-CHACHA20-POLY1305",
    "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256": "ECDHE-ECDSA-CHACHA20-POLY1305",
}
# TLS 1.3's suites are not configurable, in Go as in OpenSSL's cipher list: accepted, no effect.
CIPHERS_TLS13 = ("TLS_AES_128_GCM_SHA256", "TLS_AES_256_GCM_SHA384",
                 "TLS_CHACHA20_POLY1305_SHA256")
# The only headers the exporter-toolkit lets a file set, and the values it allows (None: any).
HEADERS: dict[str, tuple[str, ...] | None] = {
    "Strict-Transport-Security": None,
    "X-Content-Type-Options": ("nosniff",),
    "X-Frame-Options": ("deny", "sameorigin"),
    "X-XSS-Protection": None,
    "Content-Security-Policy": None,
}
# Keys of later exporter-toolkit versions (after the one in Prometheus 2.42's promtool).
NEWER_KEYS = {"tls_server_config.cert", "tls_server_config.key", "tls_server_config.client_ca",
              "tls_server_config.client_allowed_sans", "rate_limit"}
BCRYPT_HASH = re.compile(r"^\$2[abxy]?\$(\d\d)\$[./A-Za-z0-9]{53}$")
