"""The gateway: OpenAI's HTTP API in front of the router, so that clients, evaluation harnesses and agent
frameworks that speak only that API work unchanged. The gRPC SDK stays the primary interface.

- `app.py`        the routes: completions and chat completions (whole or streamed as server-sent events),
                  models, health; a client that leaves cancels its router requests
- `schemas.py`    the request bodies, checked strictly; SpecRouter's knobs as extra fields
- `chat.py`       chat messages to a prompt through the checkpoint's chat template
- `stops.py`      stop strings cut as OpenAI's API cuts them
- `responses.py`  OpenAI bodies from the router's messages; per-request statistics in `specrouter`
- `upstream.py`   the router over gRPC (asyncio): the caller's token and the trace context on each call
- `errors.py`     the one place where failures become OpenAI-shaped errors and HTTP statuses
- `observed.py`   a root span per request, and the Prometheus metrics
- `server.py`     uvicorn on a bound socket, on a thread of its own
- `settings.py`   the typed settings (SPECROUTER_GATEWAY_*)
- `__main__.py`   `python -m specrouter.gateway` (`specrouter serve gateway`)
"""
