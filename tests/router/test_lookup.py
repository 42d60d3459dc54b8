"""The lookup level: prompt-lookup proposals start a chain, and the output stays the target's.

Greedy: token ids equal to target-only decoding for every chain that starts with the lookup, windows 1-8,
with rows joining and leaving a running batch. Sampled: a chi-square over many seeds against the target's
exact joint distribution of two new tokens (P_THRESHOLD is its false-positive rate), with a power control
that must fail: the lookup's point-mass proposal passed off as drawn from a uniform distribution. A cycle
where the lookup proposed nothing has its next level draft: the same greedy and sampled checks on that
path, the sampled one with a drafter that hands up uniform rows as its power control.
"""

from __future__ import annotations

import random

import pytest
import torch

from specrouter.router.batcher import Batcher
from specrouter.router.chain import ChainBatch
from specrouter.router.handles import Failed, Finished
from specrouter.router.lookup import LOOKUP, LookupProposer, RecentRows, lookup_proposal
from specrouter.router.requests import GenerationRequest, InvalidRequest, parse_chain
from specrouter.contract.calls import RowStep, SamplingParams
from tests.conftest import tiny_engines
from tests.router.cycles import RecordedCycles
from tests.router.test_chain_sampling import P_THRESHOLD, SAMPLES, VOCAB, exact_joint, sample_chain
from tests.stats import chi_square_p_value

CONTEXT = 256
LOOKUP_CHAINS = [(LOOKUP, "t"), (LOOKUP, "s", "t"), (LOOKUP, "m", "t"), (LOOKUP, "s", "m", "t")]


def test_lookup_proposes_what_followed_the_latest_longest_match() -> None:
    assert lookup_proposal([1, 2, 3, 9, 1, 2, 3, 7, 8, 5, 2, 3], 3) == [7, 8, 5]   # "2 3" most recently before
    assert lookup_proposal([4, 1, 2, 5, 6, 1, 2, 7, 9, 1, 2], 2, max_ngram=3) == [7, 9]
    assert lookup_proposal([5, 6, 1, 2, 7, 6, 2], 4) == [7, 6, 2]     # only "2" matches (n = 1)
    assert lookup_proposal([5, 6, 1, 2, 7, 6, 2], 4, min_ngram=2) == []
    assert lookup_proposal([1, 2, 3, 4], 5) == []
    assert lookup_proposal([3, 3], 4) == [3]          # what follows the match ends at the row's last token
    assert lookup_proposal([7], 4) == [] and lookup_proposal([], 4) == []
    assert lookup_proposal([1, 2, 1, 2], 0) == []


def test_the_lookup_keeps_each_rows_tokens_as_a_model_keeps_its_state() -> None:
    """Prefill, draft (rollback, pending, the draft cached but its last token) and release, per row."""
    lk = LookupProposer()
    lk.prefill("s1", [("a", [1, 2, 3, 1]), ("b", [4, 4])])
    out = lk.draft("s1", 0, 3, [RowStep("a", [2], SamplingParams(), 0), RowStep("b", [5], SamplingParams(), 0)])
    assert out.tokens == [[3, 1, 2], []] and out.rows == [None, None]
    # row a: the router accepted 3, emitted 9 in place of 1: roll back the cached 1, feed 9
    out = lk.draft("s1", 0, 2, [RowStep("a", [9], SamplingParams(), 1, rollback=1),
                                RowStep("b", [4], SamplingParams(), 1)])
    assert lk._states["s1"]["a"][:7] == [1, 2, 3, 1, 2, 3, 9]
    lk.release("s1", ["a"])
    lk.release("s1", ["b"])
    assert lk.state_ids() == []


def test_recent_rows_stay_within_their_bound_and_forget_what_left() -> None:
    recent = RecentRows(max_tokens=100, max_ngram=3, min_ngram=2)
    recent.add([1, 2, 3, 4, 5, 6])
    assert recent.match([9, 2, 3], 3) == ([4, 5, 6], 2)
    assert recent.match([1, 2, 3], 2, longer_than=2) == ([4, 5], 3)
    assert recent.match([9, 2, 3], 3, longer_than=2) == ([], 0)
    recent.add([7, 2, 3, 8])
    assert recent.match([2, 3], 4) == ([8], 2)            # the latest row that holds the n-gram
    rng = random.Random(1)
    for _ in range(50):
        recent.add([rng.randrange(1000, 2000) for _ in range(rng.randrange(5, 60))])
        assert recent.tokens <= 100
        assert recent.index_size() <= 2 * recent.tokens   # one entry per n-gram and n at most
    assert recent.match([1, 2, 3], 3) == ([], 0) and recent.match([7, 2, 3], 3) == ([], 0)   # long gone
    assert all(number in recent._rows for number, _ in recent._index.values())
    with pytest.raises(ValueError):
        RecentRows(max_tokens=10, max_ngram=2, min_ngram=3)


@pytest.mark.parametrize("recent_tokens", [1 << 16, 0])
def test_a_request_that_repeats_an_earlier_one_copies_its_output(tiny_pool, recent_tokens) -> None:
    """Greedy, the same prompt twice through `lookup -> target`: the second run finds the first one's
    tokens in the lookup's recent rows and emits the same ids in fewer cycles; with no recent rows kept,
    the two runs make the same proposals and cycles."""
    prompt = random.Random(9).sample(range(1, 64), 12)
    recorded = RecordedCycles()
    b = batcher(tiny_pool, recorded, LookupProposer(recent_tokens=recent_tokens))
    b.start()
    try:
        runs = []
        for _ in range(2):
            before = len(recorded.cycles)
            out = outcome(b.submit(GenerationRequest(prompt, SamplingParams(), 40, chain=(LOOKUP, "t"), window=7)))
            runs.append((out.token_ids, len(recorded.cycles) - before))
    finally:
        b.stop()
    (first, first_cycles), (second, second_cycles) = runs
    assert second == first
    assert second_cycles < first_cycles if recent_tokens else second_cycles == first_cycles, runs


def repetitive_prompts(rng: random.Random, n: int) -> list[list[int]]:
    """Prompts that repeat a phrase of their own, so the lookup finds matches (the tiny pool's vocabulary
    is 64)."""
    out = []
    for _ in range(n):
        phrase = [rng.randrange(1, 64) for _ in range(rng.randrange(3, 7))]
        out.append([rng.randrange(1, 64) for _ in range(rng.randrange(0, 4))] + phrase * rng.randrange(2, 4))
    return out


def batcher(pool, recorded: RecordedCycles | None = None, lookup: LookupProposer | None = None) -> Batcher:
    return Batcher(pool, "t", CONTEXT, None, observers=[recorded] if recorded else [],
                   levels={LOOKUP: lookup or LookupProposer()})


def outcome(handle) -> Finished:
    while True:
        event = handle.events.get(timeout=120)
        if isinstance(event, Failed):
            raise event.error
        if isinstance(event, Finished):
            return event


@pytest.mark.parametrize("chain", LOOKUP_CHAINS, ids=[",".join(c) for c in LOOKUP_CHAINS])
def test_greedy_ids_through_the_lookup_equal_target_only_as_rows_join_and_leave(tiny_pool, chain) -> None:
    rng = random.Random(5)
    prompts = repetitive_prompts(rng, 6)
    news = [rng.randrange(30, 60) for _ in prompts]   # long enough that greedy falls into loops the lookup sees
    expected = []
    b = batcher(tiny_pool)
    b.start()
    try:
        for p, n in zip(prompts, news):
            expected.append(outcome(b.submit(GenerationRequest(p, SamplingParams(), n, chain=("t",), window=1)))
                            .token_ids)
    finally:
        b.stop()
    recorded = RecordedCycles()
    for window in range(1, 9):
        b = batcher(tiny_pool, recorded)
        b.start()
        try:
            # three rows at once, then one joining each time one has left: the batch changes under the lookup
            handles = {i: b.submit(GenerationRequest(prompts[i], SamplingParams(), news[i], chain=chain,
                                                     window=window)) for i in range(3)}
            got = {}
            for i in range(3, len(prompts)):
                first = min(handles)
                got[first] = outcome(handles.pop(first)).token_ids
                handles[i] = b.submit(GenerationRequest(prompts[i], SamplingParams(), news[i], chain=chain,
                                                        window=window))
            got |= {i: outcome(h).token_ids for i, h in handles.items()}
        finally:
            b.stop()
        assert [got[i] for i in range(len(prompts))] == expected, f"window {window}"
        assert not b.levels[LOOKUP].state_ids(), "the lookup kept rows that left"
    proposed = sum(sum(report.proposed[chain[1]]) for report, _ in recorded.cycles)
    accepted = sum(sum(report.accepted[chain[1]]) for report, _ in recorded.cycles)
    assert accepted > 0 and proposed > accepted, (proposed, accepted)   # it proposed, and was checked


class PassedOffAsUniform:
    """A lookup whose point-mass proposals are handed up as if drawn from a uniform distribution: the next
    level then accepts them far too often. A deliberately broken level, for the test's power."""

    def __init__(self, lookup: LookupProposer):
        self.lookup, self.name = lookup, lookup.name

    def __getattr__(self, item):
        return getattr(self.lookup, item)

    def draft(self, state_id, level, window, rows, hand_up=True):
        out = self.lookup.draft(state_id, level, window, rows, hand_up)
        out.rows = [torch.full((len(t), VOCAB), 1.0 / VOCAB, dtype=torch.float16) if t else None for t in out.tokens]
        return out


PROMPT = [1, 2, 3, 1, 2, 3, 1, 2]   # the lookup proposes "3 1 2 ..." after it
PARAMS = [SamplingParams(temperature=1.0), SamplingParams(temperature=0.8, top_k=5, repetition_penalty=1.2),
          SamplingParams(temperature=1.0, coupled=True)]


@pytest.fixture(scope="module")
def sharp():
    return tiny_engines(vocab=VOCAB, sharpness=8.0)


def sample(workers, chain, params) -> tuple[torch.Tensor, int]:
    """The two new tokens' counts over SAMPLES seeds through `chain` at window 2, and the lookup's proposed
    tokens its next level accepted."""
    accepted = [0]
    counts = sample_chain(workers, chain, 2, params, PROMPT,
                          lambda report: accepted.__setitem__(0, accepted[0] + sum(report.accepted[chain[1]])))
    return counts, accepted[0]


# (the small drafter, under the repetition penalty and top-k, almost never keeps a token the lookup copies)
@pytest.mark.parametrize("chain, params", [((LOOKUP, "t"), PARAMS[0]), ((LOOKUP, "t"), PARAMS[1]),
                                           ((LOOKUP, "t"), PARAMS[2]), ((LOOKUP, "s", "t"), PARAMS[0]),
                                           ((LOOKUP, "s", "t"), PARAMS[2])],
                         ids=["lookup,t-plain", "lookup,t-processors", "lookup,t-coupled", "lookup,s,t-plain",
                              "lookup,s,t-coupled"])
def test_sampling_through_the_lookup_matches_the_target(sharp, chain, params) -> None:
    expected = exact_joint(sharp["t"].forward.model, params, PROMPT)
    counts, accepted = sample({**sharp, LOOKUP: LookupProposer()}, chain, params)
    assert accepted > SAMPLES // 20, "the lookup's proposals were hardly ever accepted: the test has no power"
    assert chi_square_p_value(counts, expected) > P_THRESHOLD


def test_the_sampling_test_fails_when_a_point_mass_is_passed_off_as_a_distribution(sharp) -> None:
    params = PARAMS[0]
    expected = exact_joint(sharp["t"].forward.model, params, PROMPT)
    counts, _ = sample({**sharp, LOOKUP: PassedOffAsUniform(LookupProposer())}, (LOOKUP, "t"), params)
    assert chi_square_p_value(counts, expected) < P_THRESHOLD


def test_a_seed_pins_the_text_through_the_lookup(tiny_pool) -> None:
    """Coupled sampling: the same ids with and without the lookup level, at every window."""
    params = SamplingParams(temperature=0.9, seed=2**40 + 5, coupled=True)
    prompt = repetitive_prompts(random.Random(3), 1)[0]
    texts = set()
    for chain, window in [(("t",), 1), ((LOOKUP, "t"), 2), ((LOOKUP, "s", "t"), 4), ((LOOKUP, "m", "t"), 7)]:
        b = batcher(tiny_pool)
        b.start()
        try:
            texts.add(tuple(outcome(b.submit(GenerationRequest(prompt, params, 20, chain=chain, window=window)))
                            .token_ids))
        finally:
            b.stop()
    assert len(texts) == 1, texts


def test_the_lookup_may_only_start_a_chain() -> None:
    names = [LOOKUP, "s", "m", "t"]
    assert parse_chain("lookup,s,t", names, "t", drafts_only={LOOKUP}) == (LOOKUP, "s", "t")
    with pytest.raises(InvalidRequest, match="can only start a chain, as in 'lookup,t'"):
        parse_chain("s,lookup,t", names, "t", drafts_only={LOOKUP})
    with pytest.raises(ValueError, match="can only start a chain"):
        ChainBatch({"s": object(), LOOKUP: LookupProposer(), "t": object()}, "t", 64)._check_chain(("s", LOOKUP, "t"))


# -- a cycle without a match: the next level drafts ----------------------------------------------------


NO_MATCH = [1, 2, 3, 4, 5, 6, 7]   # its last token occurs once: the lookup has nothing to copy after it


class UniformDraftRows:
    """A drafter whose sampled drafts are handed up as drawn from a uniform distribution: a deliberately
    broken level, for the power of the sampled test of the lookup's fallback draft."""

    def __init__(self, engine):
        self.engine, self.name = engine, engine.name

    def __getattr__(self, item):
        return getattr(self.engine, item)

    def draft(self, state_id, level, window, rows, hand_up=True):
        out = self.engine.draft(state_id, level, window, rows, hand_up)
        out.rows = [None if r is None else torch.full_like(r, 1.0 / VOCAB) for r in out.rows]
        return out


@pytest.mark.parametrize("chain", [(LOOKUP, "s", "t"), (LOOKUP, "s", "m", "t")], ids=["lookup,s,t", "lookup,s,m,t"])
@pytest.mark.parametrize("fallback", [3, 0])
def test_a_row_without_a_match_drafts_with_the_next_level(tiny_pool, chain, fallback) -> None:
    """One row at a time through a chain that starts with the lookup, at window 8: in a cycle where the lookup
    proposed nothing, the level above it drafts `fallback` tokens for the levels above (0: it hands up the
    one token it verified past nothing). The ids are target-only's either way."""
    prompts = [[9, 17, 33, 41, 2, 58, 11], *repetitive_prompts(random.Random(8), 2)]
    expected = []
    b = batcher(tiny_pool)
    b.start()
    try:
        for p in prompts:
            expected.append(outcome(b.submit(GenerationRequest(p, SamplingParams(), 40, chain=("t",), window=1)))
                            .token_ids)
    finally:
        b.stop()
    recorded = RecordedCycles()
    b = Batcher(tiny_pool, "t", CONTEXT, None, observers=[recorded], levels={LOOKUP: LookupProposer()},
                lookup_fallback_window=fallback)
    b.start()
    try:
        got = [outcome(b.submit(GenerationRequest(p, SamplingParams(), 40, chain=chain, window=8))).token_ids
               for p in prompts]
    finally:
        b.stop()
    assert got == expected
    above = chain[2]
    without = [r for r, _ in recorded.cycles if r.proposed[chain[1]] == [0]]   # the lookup proposed nothing
    matched = [r for r, _ in recorded.cycles if r.proposed[chain[1]] != [0]]
    assert without and matched, (len(without), len(matched))
    handed = {r.proposed[above][0] for r in without if len(r.emitted[next(iter(r.emitted))]) > 0}
    # where the row still wants that many tokens, the level above is handed the whole draft
    assert max(handed) == (fallback or 1), handed
    assert all(r.matches == [0] for r in without)
    # the lookup's checks are filed as in any cycle: nothing offered, rejected at its first position
    assert all(r.checked(chain[1], 0) == 1 and r.accepted[chain[1]] == [0] for r in without)


@pytest.mark.parametrize("params", [PARAMS[0], PARAMS[2]], ids=["plain", "coupled"])
def test_sampling_through_the_lookups_fallback_draft_matches_the_target(sharp, params) -> None:
    """Every row's prompt has no match, so the small drafter drafts for the target in the first cycle."""
    expected = exact_joint(sharp["t"].forward.model, params, NO_MATCH)
    drafted = []
    counts = sample_chain({**sharp, LOOKUP: LookupProposer()}, (LOOKUP, "s", "t"), 2, params, NO_MATCH,
                          lambda report: drafted.append(report.proposed["t"][0]))
    assert drafted[0] == 3, drafted   # the small model drafted for the target (the fallback window, 3)
    assert chi_square_p_value(counts, expected) > P_THRESHOLD


def test_the_fallback_sampling_test_fails_when_the_drafts_rows_are_wrong(sharp) -> None:
    params = PARAMS[0]
    expected = exact_joint(sharp["t"].forward.model, params, NO_MATCH)
    counts = sample_chain({**sharp, "s": UniformDraftRows(sharp["s"]), LOOKUP: LookupProposer()},
                          (LOOKUP, "s", "t"), 2, params, NO_MATCH)
    assert chi_square_p_value(counts, expected) < P_THRESHOLD
