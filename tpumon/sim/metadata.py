"""A simulated TPU VM's metadata server: the instance attributes a real one serves.

Each host of a simulated slice (``tpumon sim --hosts N``) answers on its own loopback port
with its own ``tpu-env`` (slice, worker, accelerator type, runtime ports) and the slice's
``worker-network-endpoints``, so an agent pointed at it (``$GCE_METADATA_HOST``,
``simulator.host``) and ``tpumon status --slice`` find their identity and peers through
the same code as on a TPU VM. Like the real one it answers only requests that carry
``Metadata-Flavor: Google``.
"""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Mapping

from tpumon.common.identity import ATTRIBUTES_PATH


def render_tpu_env(values: Mapping[str, str]) -> str:
    """tpu-env's flat ``KEY: 'value'`` lines."""
    return "".join(f"{key}: '{value}'\n" for key, value in values.items())


class MetadataServer:
    """Serves fixed instance attributes on a loopback address (port 0: a free one)."""

    def __init__(self, attributes: Mapping[str, str], host: str = "127.0.0.1",
                 port: int = 0) -> None:
        served = {ATTRIBUTES_PATH + name: text.encode() for name, text in attributes.items()}

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 (http.server's name)
                body = served.get(self.path)
                if self.headers.get("Metadata-Flavor") != "Google":
                    self.send_error(403, "Missing Metadata-Flavor:Google header")
                elif body is None:
                    self.send_error(404)
                else:
                    self.send_response(200)
                    self.send_header("Content-Type", "application/text")
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)

            def log_message(self, format: str, *args: object) -> None:
                pass

        self._httpd = ThreadingHTTPServer((host, port), Handler)
        self._httpd.daemon_threads = True
        self.address = f"{host}:{self._httpd.server_address[1]}"
        self._thread = threading.Thread(target=self._httpd.serve_forever,
                                        name="sim-metadata", daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
