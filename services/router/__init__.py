"""The router: requests in flight, the chain step over the workers' operations, and the scheduler that picks
each cycle's chain and window.

- `chain.py`           one running batch and the lossless multi-level cycle: draft, verify at each level, emit
- `row.py`             a request's row in a batch; `cycle_report.py` what one cycle did
- `batcher.py`         continuous batching: the loop, and each cycle's steps (choose, run, emit, report, finish)
- `running.py`         the loop's state: running batches, their requests, the rows waiting to join
- `joining.py`         waiting rows join their batch (the prefill), and what a failed prefill does
- `recovery.py`        a batch after a worker fails it: another replica, fewer rows, a shorter window or chain
- `chain_choice.py`    who chooses a cycle's chain and window: the default chain, or the scheduler
- `cycle_observers.py` who hears about each cycle: the profiler, Prometheus, the scheduler
- `scheduling/`        the scheduler: a cycle's cost, acceptance estimates, plans and the decision policy
- `replicas.py`        every replica of each model, found by resolving the worker addresses, again and again
- `placement.py`       which replica of each model a batch runs on, and where it moves when the target's is lost
- `health.py`          which replicas answer: a failed one sits out until a probe finds it
- `requests.py`        a generation request: read off the wire, and validated
- `server.py`          the router's gRPC server (RouterService), health and reflection, and the parts' wiring
- `remote.py`          a worker over gRPC; `workers.py` the `Worker` interface (what the router reads of any
                       worker, declared once; the types it passes: `specrouter.contract`)
- `measurements.py`    cycle measurements sent to the profiler, and its cached snapshot
- `breakdown.py`       where a request's cycles spent their time
"""
