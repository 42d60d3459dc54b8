"""Can two levels of a chain run at once on this machine? The target's and the drafter's passes, alone and
side by side, with one and with two threads.

    python -m benchmarks.threads [--pool DIR] [--context 256] [--block 4] [--passes 40]

A pipelined chain keeps the drafter drafting while the target verifies. On a CPU that only pays if the two
passes, run at once on their own cores, finish sooner than one after the other with every core each. This
measures, for the pool's target (a pass over `--block` tokens after `--context` cached ones, as a verify
step of a window of block - 1 runs) and its smallest drafter (a pass over one token, as each drafted token
costs):

- each alone with 1 thread and with all the threads torch would use;
- the target with 1 thread pinned to one core while the drafter drafts without a pause in another process,
  pinned to another core with 1 thread (the pipelined layout);
- the target with all threads while that drafter runs unpinned (both levels on every core).

and prints what a cycle of window W would cost lock-step (W drafter passes, then one target pass, each with
every thread) against pipelined (the slower of the two stages side by side), for W = 1..8. Medians of
`--passes` passes; the machine line first.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import statistics
import time
from pathlib import Path

DEFAULT_POOL = Path(__file__).resolve().parents[1] / "models" / "demo-pool"


def _forward_and_state(model_dir: Path, context: int):
    import torch

    from specrouter.pool.load import load_model
    from specrouter.worker.forward import ModelForward

    forward = ModelForward(load_model(model_dir, torch.float32, "cpu"))
    state = forward.empty_state(["r"])
    prompt = torch.arange(1, context + 1, dtype=torch.long)[None, :] % forward.vocab_size
    forward(state, prompt, torch.ones_like(prompt, dtype=torch.bool))
    return forward, state


def pass_ms(forward, state, block: int, passes: int) -> float:
    """Median wall time of a pass over `block` tokens after the cached context (rolled back after each)."""
    import torch

    tokens = torch.full((1, block), 7, dtype=torch.long)
    valid = torch.ones_like(tokens, dtype=torch.bool)
    times = []
    for i in range(passes + 2):   # two warm passes
        started = time.perf_counter()
        forward(state, tokens, valid)
        elapsed = time.perf_counter() - started
        state.rollback(torch.full((1,), block, dtype=torch.long))
        if i >= 2:
            times.append(elapsed * 1e3)
    return statistics.median(times)


def _draft_forever(model_dir: str, context: int, core: int | None, ready, stop) -> None:
    """The drafter's stage of a pipeline: one-token passes without a pause until `stop` is set."""
    import torch

    if core is not None:
        os.sched_setaffinity(0, {core})
    torch.set_num_threads(1)
    forward, state = _forward_and_state(Path(model_dir), context)
    tokens = torch.full((1, 1), 7, dtype=torch.long)
    valid = torch.ones_like(tokens, dtype=torch.bool)
    ready.set()
    while not stop.is_set():
        forward(state, tokens, valid)
        state.rollback(torch.ones(1, dtype=torch.long))


def beside_drafter(drafter_dir: Path, context: int, core: int | None, measure):
    """`measure()` while a drafter drafts without a pause in another process (pinned to `core`)."""
    ctx = mp.get_context("spawn")
    ready, stop = ctx.Event(), ctx.Event()
    proc = ctx.Process(target=_draft_forever, args=(str(drafter_dir), context, core, ready, stop), daemon=True)
    proc.start()
    try:
        if not ready.wait(120):
            raise SystemExit("the drafter's process did not start")
        return measure()
    finally:
        stop.set()
        proc.join(10)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pool", type=Path, default=DEFAULT_POOL)
    parser.add_argument("--context", type=int, default=256)
    parser.add_argument("--block", type=int, default=4)
    parser.add_argument("--passes", type=int, default=40)
    args = parser.parse_args()

    import torch

    from specrouter.pool.load import PoolDir
    from specrouter.report.machine import machine_line

    print(machine_line(), flush=True)
    cores = sorted(os.sched_getaffinity(0))
    every = torch.get_num_threads()
    if len(cores) < 2:
        raise SystemExit("pipelining needs at least two cores")
    pool = PoolDir.open(args.pool)
    target_dir = pool.model_dir(pool.target)
    target, t_state = _forward_and_state(target_dir, args.context)
    drafters = {n: _forward_and_state(pool.model_dir(n), args.context) for n in pool.names if n != pool.target}
    drafter = min(drafters, key=lambda n: sum(p.numel() for p in drafters[n][0].model.parameters()))
    small, s_state = drafters[drafter]

    rows = {}
    for threads in sorted({1, every}):
        torch.set_num_threads(threads)
        rows[f"target alone, {threads} thread(s)"] = pass_ms(target, t_state, args.block, args.passes)
        rows[f"drafter alone, {threads} thread(s)"] = pass_ms(small, s_state, 1, args.passes)
    torch.set_num_threads(1)
    os.sched_setaffinity(0, {cores[0]})
    rows["target, 1 thread on one core, drafter on another"] = beside_drafter(
        pool.model_dir(drafter), args.context, cores[1], lambda: pass_ms(target, t_state, args.block, args.passes))
    os.sched_setaffinity(0, set(cores))
    torch.set_num_threads(every)
    rows[f"target, {every} threads, drafter beside it unpinned"] = beside_drafter(
        pool.model_dir(drafter), args.context, None, lambda: pass_ms(target, t_state, args.block, args.passes))

    print(f"\ntarget {pool.target}, drafter {drafter}; pass over {args.block} tokens (target) or 1 token (drafter) "
          f"after {args.context} cached, median of {args.passes} (ms)")
    for label, ms in rows.items():
        print(f"  {label:<58} {ms:7.2f}")
    draft_every = rows[f"drafter alone, {every} thread(s)"]
    draft_one = rows["drafter alone, 1 thread(s)"]
    verify_every = rows[f"target alone, {every} thread(s)"]
    verify_pinned = rows["target, 1 thread on one core, drafter on another"]
    print("\na cycle of window W (ms): lock-step = W drafter passes then the target's, every thread each; "
          "pipelined = the slower stage, each on its own core")
    print("   W  lock-step  pipelined  pipelined/lock-step")
    for w in range(1, 9):
        lock = w * draft_every + verify_every
        pipe = max(w * draft_one, verify_pinned)
        print(f"  {w:2d}  {lock:9.2f}  {pipe:9.2f}  {pipe / lock:8.2f}")


if __name__ == "__main__":
    main()
