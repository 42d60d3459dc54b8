"""Offline similarity of every ordered pair of a pool's models: the scheduler's prior for acceptance.

Every model scores the same held-out windows once; pairs are then compared position by position.
For a drafter d and a verifier v, over held-out positions t:

    greedy:   mean_t [argmax_x p_d(x | t) == argmax_x p_v(x | t)]
    sampling: mean_t sum_x min(p_d(x | t), p_v(x | t))  =  mean_t (1 - TV(p_d(. | t), p_v(. | t)))

with softmax at temperature 1. The first is the chance that greedy verification accepts a greedily
drafted token; the second is the expected acceptance of one drafted token under speculative sampling
(Leviathan et al. 2023, "Fast Inference from Transformers via Speculative Decoding", section 3.5).
Both are symmetric in (d, v); the table still lists ordered pairs because the router looks them up so.

`python -m specrouter.pool.similarity --pool models/demo-pool` writes `similarity.json` into the pool.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
from dataclasses import asdict, dataclass
from itertools import permutations
from pathlib import Path

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from specrouter.pool import corpus, evaluate
from specrouter.pool.load import DTYPES, PoolDir, load_model, load_tokenizer, parse_dtype
from specrouter.pool.manifest import PoolError

log = logging.getLogger(__name__)

SIMILARITY_NAME = "similarity.json"
GREEDY, SAMPLING = "greedy", "sampling"
MODES = (GREEDY, SAMPLING)
DEFAULT_WINDOWS = 32
DEFAULT_SEQ_LEN = 128
SCORE_BATCH = 8  # windows per forward pass
DEFAULT_POOL = Path("models") / "demo-pool"
FILE_SHAPE = ('{"windows": N, "seq_len": N, "pairs": [{"drafter": NAME, "verifier": NAME, '
              '"mode": "greedy"|"sampling", "similarity": 0..1, "positions": N}, ...]}')


@dataclass(frozen=True)
class PairSimilarity:
    drafter: str
    verifier: str
    mode: str  # GREEDY or SAMPLING
    similarity: float  # in [0, 1]
    positions: int  # held-out positions compared


@dataclass(frozen=True)
class NextTokenDists:
    """One model's next-token distributions at every held-out position."""

    probs: torch.Tensor  # [windows, seq, vocab] softmax at temperature 1, fp32
    argmax: torch.Tensor  # [windows, seq] argmax of the logits


def heldout_stream(tokenizer: PreTrainedTokenizerBase) -> torch.Tensor:
    """The held-out token stream the model cards are measured on: held-out files, each followed by EOS."""
    from specrouter.pool.build import encode_files

    _, heldout = corpus.split(corpus.stdlib_files())
    return encode_files(tokenizer, heldout).long()


@torch.inference_mode()
def next_token_dists(model: PreTrainedModel, windows: torch.Tensor, batch_size: int = SCORE_BATCH) -> NextTokenDists:
    """Scores windows [count, seq + 1]: the distribution after each of the first `seq` tokens."""
    probs, argmax = [], []
    for chunk in windows.split(batch_size):
        inputs = chunk[:, :-1].to(model.device)  # [b, seq]
        logits = model(input_ids=inputs, use_cache=False).logits.float().cpu()  # [b, seq, vocab]
        probs.append(torch.softmax(logits, dim=-1))
        argmax.append(logits.argmax(-1))
    return NextTokenDists(probs=torch.cat(probs), argmax=torch.cat(argmax))


def greedy_similarity(drafter: NextTokenDists, verifier: NextTokenDists) -> float:
    """Fraction of positions at which the two argmaxes agree."""
    return (drafter.argmax == verifier.argmax).float().mean().item()


def sampling_similarity(drafter: NextTokenDists, verifier: NextTokenDists) -> float:
    """Mean over positions of sum_x min(p_d(x), p_v(x)), i.e. 1 - total variation distance."""
    if drafter.probs.shape != verifier.probs.shape:
        raise PoolError(f"next-token distributions differ in shape ({tuple(drafter.probs.shape)} vs "
                        f"{tuple(verifier.probs.shape)}); every model of a pool needs the same vocabulary size")
    # One window at a time: a second [windows, seq, vocab] tensor would double the peak memory.
    overlap = sum(torch.minimum(d, v).sum(-1, dtype=torch.float64).sum().item()
                  for d, v in zip(drafter.probs, verifier.probs))
    positions = drafter.argmax.numel()
    return min(overlap / positions, 1.0)  # fp32 softmaxes sum to 1 only up to rounding


def pair_similarities(dists: dict[str, NextTokenDists]) -> list[PairSimilarity]:
    """Both modes for every ordered pair of distinct models, sorted by (drafter, verifier, mode)."""
    pairs = []
    for d, v in permutations(sorted(dists), 2):
        positions = dists[d].argmax.numel()
        pairs.append(PairSimilarity(d, v, GREEDY, greedy_similarity(dists[d], dists[v]), positions))
        pairs.append(PairSimilarity(d, v, SAMPLING, sampling_similarity(dists[d], dists[v]), positions))
    return sorted(pairs, key=_sort_key)


def measure_similarity(pool: PoolDir, windows: int = DEFAULT_WINDOWS, seq_len: int = DEFAULT_SEQ_LEN,
                       dtype: torch.dtype = torch.float32) -> list[PairSimilarity]:
    """Loads the pool's models one at a time, scores the same held-out windows, compares every pair."""
    if windows < 1 or seq_len < 1:
        raise ValueError(f"windows and seq_len must be positive, got {windows} and {seq_len}")
    stream = heldout_stream(load_tokenizer(pool.model_dir(pool.target)))
    if stream.numel() < windows + seq_len + 1:
        raise ValueError(f"the held-out stream has {stream.numel()} tokens: too few for {windows} distinct "
                         f"windows of {seq_len + 1}")
    held_out = evaluate.heldout_windows(stream, windows, seq_len)  # [windows, seq_len + 1]
    dists = {}
    for name in pool.names:
        model = load_model(pool.model_dir(name), dtype=dtype)
        dists[name] = next_token_dists(model, held_out)
        del model
        log.info("%s: scored %d held-out positions", name, held_out[:, 1:].numel())
    return pair_similarities(dists)


def _sort_key(pair: PairSimilarity) -> tuple[str, str, str]:
    return pair.drafter, pair.verifier, pair.mode


def save_similarity(pool_dir: Path, pairs: list[PairSimilarity], *, windows: int, seq_len: int) -> Path:
    """Writes `similarity.json` into the pool directory; `windows` and `seq_len` record how it was measured."""
    path = Path(pool_dir) / SIMILARITY_NAME
    data = {"windows": windows, "seq_len": seq_len, "pairs": [asdict(p) for p in sorted(pairs, key=_sort_key)]}
    path.write_text(json.dumps(data, indent=2) + "\n")
    return path


def load_similarity(pool_dir: Path) -> list[PairSimilarity]:
    """The pool's offline similarity table; [] when the pool has none."""
    path = Path(pool_dir) / SIMILARITY_NAME
    if not path.exists():
        return []
    try:
        data = json.loads(path.read_text())
        pairs = [PairSimilarity(drafter=str(p["drafter"]), verifier=str(p["verifier"]), mode=str(p["mode"]),
                                similarity=float(p["similarity"]), positions=int(p["positions"]))
                 for p in data["pairs"]]
    except (KeyError, TypeError, ValueError) as exc:  # json.JSONDecodeError is a ValueError
        raise PoolError(f"{path} is malformed ({exc!r}); expected {FILE_SHAPE}. "
                        "Regenerate it with `python -m specrouter.pool.similarity --pool DIR`") from exc
    for p in pairs:
        if p.mode not in MODES or not 0.0 <= p.similarity <= 1.0 or p.positions <= 0 or p.drafter == p.verifier:
            raise PoolError(f"{path}: invalid pair {p}; modes are {list(MODES)}, similarity lies in [0, 1], "
                            "positions > 0 and drafter != verifier. "
                            "Regenerate it with `python -m specrouter.pool.similarity --pool DIR`")
    return pairs


def format_table(pairs: list[PairSimilarity]) -> str:
    """One row per ordered pair, one column per mode."""
    table: dict[tuple[str, str], dict[str, float]] = {}
    for p in pairs:
        table.setdefault((p.drafter, p.verifier), {})[p.mode] = p.similarity
    width = max([len("drafter"), *(len(n) for pair in table for n in pair)])
    lines = [f"{'drafter':<{width}}  {'verifier':<{width}}  {GREEDY:>8}  {SAMPLING:>8}"]
    for (d, v), modes in sorted(table.items()):
        cells = "  ".join(f"{modes.get(m, math.nan):>8.4f}" for m in MODES)
        lines.append(f"{d:<{width}}  {v:<{width}}  {cells}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m specrouter.pool.similarity", description=__doc__.split("\n")[0])
    parser.add_argument("--pool", type=Path, default=DEFAULT_POOL, help="pool directory (with pool.json)")
    parser.add_argument("--windows", type=int, default=DEFAULT_WINDOWS, help="held-out windows to score")
    parser.add_argument("--seq-len", type=int, default=DEFAULT_SEQ_LEN, help="positions per window")
    parser.add_argument("--dtype", default="float32", choices=sorted(DTYPES), help="dtype to run the models in")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    pool = PoolDir.open(args.pool)
    pairs = measure_similarity(pool, args.windows, args.seq_len, parse_dtype(args.dtype))
    path = save_similarity(args.pool, pairs, windows=args.windows, seq_len=args.seq_len)
    log.info("wrote %s", path)
    print(format_table(pairs))


if __name__ == "__main__":
    main()
