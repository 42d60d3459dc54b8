"""The router: requests in flight, the chain step over the workers' operations, and the scheduler that picks
each cycle's chain and window.

- `chain.py`         one running batch and the lossless multi-level cycle: draft, verify at each level, emit
- `batcher.py`       continuous batching: requests join and leave the running batches between cycles
- `scheduling/`      the scheduler: a cycle's cost, acceptance estimates, plans and the decision policy
- `replicas.py`      every replica of each model, found by resolving the worker addresses, again and again
- `placement.py`     which replica of each model a batch runs on, and where it moves when the target's is lost
- `health.py`        which replicas answer: a failed one sits out until a probe finds it
- `requests.py`      a generation request and its validation
- `server.py`        the router's gRPC server (RouterService), health and reflection
- `remote.py`        a worker over gRPC; `workers.py` the `Worker` interface (what the router reads of any
                     worker, declared once; the types it passes: `specrouter.contract`)
- `measurements.py`  cycle measurements sent to the profiler, and its cached snapshot
- `breakdown.py`     where a request's cycles spent their time
"""
