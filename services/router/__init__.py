"""The router: requests in flight, the chain step over the workers' operations, and (later) the scheduler.

- `chain.py`         one running batch and the lossless multi-level cycle: draft, verify at each level, emit
- `batcher.py`       continuous batching: requests join and leave the running batches between cycles
- `requests.py`      a generation request and its validation
- `server.py`        the router's gRPC server (RouterService), health and reflection
- `remote.py`        a worker over gRPC; `workers.py` what the router needs of any worker
- `measurements.py`  cycle measurements sent to the profiler, and its cached snapshot
- `inprocess.py`     the whole pool in one process, driven exactly as over gRPC
"""
