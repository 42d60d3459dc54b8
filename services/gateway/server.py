"""The gateway's HTTP server: uvicorn on a socket bound here (port 0: a free one), serving on a thread of its
own with its own event loop, so that the service's main thread waits for signals as every service's does
and the tests run it in process."""

from __future__ import annotations

import logging
import socket
import threading
import time

import uvicorn

from specrouter.gateway.app import create_app
from specrouter.gateway.chat import ChatTemplate
from specrouter.gateway.observed import GatewayMetrics
from specrouter.gateway.settings import GatewaySettings
from specrouter.tls import ClientTLS

log = logging.getLogger(__name__)
START_TIMEOUT_S = 30.0


class GatewayServer:
    """`start()` binds and serves; `port` is the bound port; `stop()` lets requests in flight finish (up to the
    grace period) and closes the router's channel."""

    def __init__(self, settings: GatewaySettings, template: ChatTemplate | None, tls: ClientTLS | None = None,
                 metrics: GatewayMetrics | None = None):
        self.settings = settings
        self.metrics = metrics or GatewayMetrics()
        self.socket = _bind(settings.host, settings.port)
        self.port = self.socket.getsockname()[1]
        https = {} if settings.tls_cert is None else {"ssl_certfile": str(settings.tls_cert),
                                                      "ssl_keyfile": str(settings.tls_key)}
        config = uvicorn.Config(create_app(settings, template, tls, self.metrics), lifespan="on", log_level="warning",
                                access_log=False, timeout_graceful_shutdown=settings.grace_s, server_header=False,
                                **https)
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, kwargs={"sockets": [self.socket]},
                                        name="gateway-http", daemon=True)

    def start(self) -> None:
        self._thread.start()
        deadline = time.monotonic() + START_TIMEOUT_S
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the gateway's HTTP server did not start (see the log above)")
            time.sleep(0.01)

    def stop(self) -> None:
        self._server.should_exit = True
        self._thread.join(self.settings.grace_s + 5)
        self.socket.close()


def _bind(host: str, port: int) -> socket.socket:
    """A listening TCP socket on host:port; `[::]` (gRPC's spelling) is every interface, IPv6 and IPv4."""
    bare = host.strip("[]")
    family = socket.AF_INET6 if ":" in bare else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if family == socket.AF_INET6:
        sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
    try:
        sock.bind((bare, port))
    except OSError as exc:
        sock.close()
        raise OSError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    sock.listen(2048)
    sock.setblocking(False)
    return sock
