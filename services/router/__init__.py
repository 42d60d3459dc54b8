"""The router: requests in flight, the chain step over the workers' operations, and (later) the scheduler.

- `chain.py`     one running batch and the lossless multi-level cycle: draft, verify at each level, emit
- `workers.py`   what the router needs of a worker (in process or over gRPC)
"""
