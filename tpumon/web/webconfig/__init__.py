"""TLS and basic auth from a Prometheus-style web-config file: ``file`` reads it into
settings, ``schema`` is its format (pydantic, loaded only with a file), ``terms`` the names
both share, ``strict_yaml`` the YAML reader, ``live`` the settings in force.

May import ``common`` only. Imports nothing itself.
"""
