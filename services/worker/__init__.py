"""The model worker: one model of the pool, its masked KV states by opaque id, and the draft / verify steps.

- `state.py`     the validity mask: logical rollback, physical truncation, compaction, rows joining and leaving
- `forward.py`   a forward pass over a masked state with logical position ids
- `sampling.py`  logits processors and seeded sampling, identical at every level of a chain
- `verify.py`    the lossless acceptance rule (accepted / recovered / bonus tokens)
- `rows.py`      distribution rows as they travel between levels
- `calls.py`     the types both sides of a worker call use: a row's step, sampling parameters, the result
- `engine.py`    the operations a worker serves: prefill, draft, verify, release
- `protocol.py`  protobuf at the edge: messages to and from the types of `calls.py`
- `server.py`    the worker's gRPC server; `settings.py` its settings; `__main__.py` the process
"""
