"""The profiler: live measurements from every router, kept as EMAs that the schedulers read back.

- `metrics.py`       samples (forward latency, acceptance, similarity), EMA records, snapshots (the modes and
                     buckets they are keyed by: `specrouter.contract.measures`)
- `store.py`         the store interface and the choice made from the settings
- `memory_store.py`  records in this process (the local embedded default)
- `redis_store.py`   records in Redis, each report applied by one atomic Lua script
- `resilient.py`     stale snapshots and dropped reports while the store is unreachable
- `codec.py`         protobuf to samples, snapshots to protobuf
- `errors.py`        domain errors and their gRPC status codes
- `settings.py`      the typed settings (SPECROUTER_PROFILER_*)
- `server.py`        `create_server(settings, store) -> (server, port)`, health, reflection, shutdown
- `__main__.py`      `python -m specrouter.profiler`
"""
