"""`python -m specrouter.gateway --router HOST:PORT [--port 8000] [--tokenizer-dir DIR] ...`: the OpenAI-compatible
HTTP API in front of a router."""

from __future__ import annotations

import sys

from pydantic import ValidationError

from specrouter import lifecycle, prometheus
from specrouter.gateway import chat
from specrouter.gateway.settings import GatewaySettings, setting_hint
from specrouter.tls import ClientTLS, CredentialsError, read_pem


def parse_settings(argv: list[str] | None) -> GatewaySettings:
    return lifecycle.settings_from_flags(GatewaySettings, argv, prog="specrouter serve gateway", description=__doc__,
                                         convert={"model_aliases": lambda s: [a for a in s.split(",") if a]})


def router_tls(settings: GatewaySettings) -> ClientTLS | None:
    files = (settings.router_ca, settings.router_cert, settings.router_key)
    if all(f is None for f in files):
        return None
    names = tuple(setting_hint(n) for n in ("router_ca", "router_cert", "router_key"))
    return ClientTLS.from_files(*files, names=names)


def check_https(settings: GatewaySettings) -> None:
    """Both HTTPS files or neither, each readable."""
    given = [n for n in ("tls_cert", "tls_key") if getattr(settings, n) is not None]
    if len(given) == 1:
        missing = ({"tls_cert", "tls_key"} - set(given)).pop()
        raise CredentialsError(f"HTTPS needs {setting_hint('tls_cert')} and {setting_hint('tls_key')} together; "
                               f"{setting_hint(missing)} is missing")
    for name in given:
        read_pem(getattr(settings, name), setting_hint(name))


def main(argv: list[str] | None = None) -> int:
    lifecycle.configure_logging()
    try:   # the files are read before anything starts: a missing or broken one stops the gateway here
        settings = parse_settings(argv)
        check_https(settings)
        tls = router_tls(settings)
        template = chat.load(settings.tokenizer_dir, settings.chat_template)
        if template is not None:
            chat.check(template)
    except (ValidationError, CredentialsError, chat.ChatTemplateError) as exc:
        print(f"gateway: {exc}", file=sys.stderr)
        return 2
    from specrouter.gateway.server import GatewayServer

    def open_gateway() -> lifecycle.Running:
        server = GatewayServer(settings, template, tls)
        server.start()
        metrics = prometheus.serve_metrics(server.metrics.registry, settings.host, settings.metrics_port)

        def close() -> None:
            server.stop()
            if metrics is not None:
                metrics.close()

        return lifecycle.Running(f"gateway listening on {settings.host}:{server.port}", close,
                                 metrics=prometheus.metrics_line("gateway", metrics))

    return lifecycle.serve("specrouter-gateway", open_gateway)


if __name__ == "__main__":
    sys.exit(main())
