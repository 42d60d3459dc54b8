"""The model worker: one model of the pool, its masked KV states by opaque id, and the draft / verify steps.

It takes and returns the types of `specrouter.contract`, the router's only way in.

- `state.py`     the validity mask: logical rollback, physical truncation, compaction, rows joining and leaving
- `forward.py`   a forward pass over a masked state with logical position ids
- `sampling.py`  logits processors and seeded sampling, identical at every level of a chain
- `verify.py`    the lossless acceptance rule (accepted / recovered / bonus tokens)
- `rows.py`      distribution rows as they travel between levels
- `engine.py`    the operations a worker serves: prefill, draft, verify, release
- `protocol.py`  distribution rows between protobuf and tensors (the rest of a call: `specrouter.contract`)
- `server.py`    the worker's gRPC server; `settings.py` its settings; `__main__.py` the process
"""
