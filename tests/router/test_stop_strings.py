"""Stop strings end a row where the text first reaches one, whatever the chain and the window, also in the
cycle that reaches max_new_tokens."""

from __future__ import annotations

import pytest

from specrouter.inprocess import InProcessPool
from specrouter.pool.prompts import heldout_code_prompts
from specrouter.router.chain import ChainBatch, run_to_completion
from specrouter.router.row import Row
from specrouter.router.stops import StopStrings
from specrouter.contract.calls import SamplingParams
from tests.conftest import DEMO_POOL

PIECES = ["de", "f ", "pa", "rse", "(", "x", ")", ":", "\n", "    ", "ret", "urn", " x", "\n"]


def decode(ids) -> str:
    return "".join(PIECES[i] for i in ids)


def first_stop(generated: list[int], strings, text_of) -> int | None:
    """The fewest tokens whose text holds one of `strings` (the definition, by brute force)."""
    return next((k for k in range(len(generated) + 1) if any(s in text_of(generated[:k]) for s in strings)), None)


@pytest.mark.parametrize("strings", [["parse"], ["se(x"], [":\n"], ["urn x", "("], ["\n    ret"], ["nothing"]])
def test_the_row_keeps_the_fewest_tokens_that_reach_a_stop_string(strings) -> None:
    stops = StopStrings(strings, decode)
    generated = list(range(len(PIECES)))
    for new in range(1, 4):   # the same text handed out a few tokens a cycle
        kept = None
        for n in range(new, len(generated) + 1, new):
            kept = stops.keep(generated[:n], new)
            if kept is not None:
                break
        assert kept == first_stop(generated, strings, decode)


def test_a_stop_string_far_back_in_a_long_generation_is_not_searched_again() -> None:
    stops = StopStrings(["x)"], decode)
    assert stops.keep([5, 6] + [13] * 500, 3) is None   # the string ended long before the last 3 tokens


@pytest.fixture(scope="module")
def local() -> InProcessPool:
    return InProcessPool.open(DEMO_POOL)


CONFIGURATIONS = [(("stdlib-29m",), 0), (("stdlib-29m",), 1), (("stdlib-29m",), 3), (("stdlib-1m", "stdlib-29m"), 1),
                  (("stdlib-1m", "stdlib-29m"), 4), (("stdlib-1m", "stdlib-5m", "stdlib-29m"), 3)]


def test_a_stop_string_that_completes_at_max_new_tokens_stops_every_chain_and_window(local) -> None:
    """The stop string is the text of the last allowed token (with the one before it): the row must end
    'stop' on exactly the tokens that reach it, whether the cycle that completes it also reaches
    max_new_tokens or not."""
    decode_ids = local.tokenizer.decode
    checked = 0
    for prompt in heldout_code_prompts(6):
        for new in (4, 7):
            free = local.generate([prompt], ("stdlib-29m",), 1, SamplingParams(), new)[0].token_ids
            stop = decode_ids(free[-2:]).strip()
            expected = first_stop(free, [stop], decode_ids) if stop else None
            if expected is None or expected != len(free):   # the string must complete at the last token
                continue
            for chain, window in CONFIGURATIONS:
                batch = ChainBatch(local.engines, local.target, local.context_length)
                batch.add([Row("r", local.encode(prompt), len(local.encode(prompt)), SamplingParams(), new,
                               stop_strings=StopStrings([stop], decode_ids))])
                row = run_to_completion(batch, lambda _: (chain, window))["r"]
                assert (row.finish_reason, row.generated) == ("stop", free), (prompt[:30], chain, window, stop)
            checked += 1
    assert checked >= 4, "too few prompts end in a stop string of their own; pick others"
