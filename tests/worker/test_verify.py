"""The acceptance rule: exact under greedy, the target's distribution under sampling."""

from __future__ import annotations

import torch

from specrouter.worker.rows import one_hot_rows
from specrouter.worker.verify import proposal_similarity, verify_greedy, verify_proposal
from tests.stats import chi_square_p_value

P_THRESHOLD = 1e-4  # each statistical assertion is a false positive with this probability


def test_greedy_accepts_up_to_the_first_disagreement() -> None:
    vocab = 10
    draft = torch.tensor([[3, 4, 5], [3, 4, 5], [1, 2, 0]])
    lengths = torch.tensor([3, 3, 2])
    target_argmax = torch.tensor([[3, 4, 5, 6], [3, 9, 5, 6], [7, 2, 0, 0]])
    verdict = verify_proposal(draft, lengths, one_hot_rows(draft, vocab), one_hot_rows(target_argmax, vocab),
                              torch.rand(3, 3), torch.rand(3))
    assert verdict.accepted.tolist() == [3, 1, 0]
    assert verdict.next_token.tolist() == [6, 9, 7]  # bonus, recovered, recovered


def test_one_step_output_is_distributed_as_the_target() -> None:
    """Draft x ~ q, verify against p: the emitted first token follows p, and acceptance is 1 - TV(p, q)."""
    gen = torch.Generator().manual_seed(0)
    vocab, n = 6, 40_000
    q = torch.tensor([0.4, 0.3, 0.1, 0.1, 0.05, 0.05])
    p = torch.tensor([0.1, 0.1, 0.3, 0.2, 0.2, 0.1])
    x = torch.multinomial(q, n, replacement=True, generator=gen)
    verdict = verify_proposal(
        x[:, None], torch.ones(n, dtype=torch.long), q.expand(n, 1, vocab),
        torch.stack([p, p]).expand(n, 2, vocab), torch.rand(n, 1, generator=gen), torch.rand(n, generator=gen))
    first = torch.where(verdict.accepted == 1, x, verdict.next_token)
    assert chi_square_p_value(torch.bincount(first, minlength=vocab), p) > P_THRESHOLD
    tv = 0.5 * (p - q).abs().sum()
    rate = verdict.accepted.float().mean()
    assert abs(rate - (1 - tv)) < 4.5 * (((1 - tv) * tv / n) ** 0.5)  # 4.5 sigma: ~7e-6 false positives


def test_handing_the_wrong_rows_breaks_it() -> None:
    """Power check of the test above: verify against rows that are not the draft's."""
    gen = torch.Generator().manual_seed(1)
    vocab, n = 6, 40_000
    q = torch.tensor([0.4, 0.3, 0.1, 0.1, 0.05, 0.05])
    p = torch.tensor([0.1, 0.1, 0.3, 0.2, 0.2, 0.1])
    x = torch.multinomial(q, n, replacement=True, generator=gen)
    wrong = torch.full((vocab,), 1 / vocab)
    verdict = verify_proposal(
        x[:, None], torch.ones(n, dtype=torch.long), wrong.expand(n, 1, vocab),
        torch.stack([p, p]).expand(n, 2, vocab), torch.rand(n, 1, generator=gen), torch.rand(n, generator=gen))
    first = torch.where(verdict.accepted == 1, x, verdict.next_token)
    assert chi_square_p_value(torch.bincount(first, minlength=vocab), p) < P_THRESHOLD


def test_similarity_counts_every_position_and_is_one_minus_total_variation() -> None:
    from specrouter.worker.verify import proposal_similarity

    gen = torch.Generator().manual_seed(3)
    q = torch.rand(2, 3, 5, generator=gen).softmax(-1)
    p = torch.rand(2, 4, 5, generator=gen).softmax(-1)
    lengths = torch.tensor([3, 1])
    got = proposal_similarity(q, p, lengths)
    tv = 0.5 * (p[:, :3] - q).abs().sum(-1)                          # [B, K]
    assert torch.allclose(got, torch.stack([(1 - tv[0]).sum(), 1 - tv[1, 0]]), atol=1e-6)
    # greedy: one-hot rows agree at positions 0 and 2, also past the first disagreement at 1
    drafts = torch.tensor([[1, 2, 3]])
    argmax = torch.tensor([[1, 4, 3, 0]])
    sim = proposal_similarity(one_hot_rows(drafts, 5), one_hot_rows(argmax, 5), torch.tensor([3]))
    assert sim.tolist() == [2.0]


def test_the_greedy_rule_without_rows_agrees_with_the_general_rule() -> None:
    """`verify_greedy` (argmaxes only) gives the verdict and similarity of the one-hot general rule."""
    gen = torch.Generator().manual_seed(3)
    vocab, b, k = 7, 400, 5
    draft = torch.randint(vocab, (b, k), generator=gen)
    lengths = torch.randint(0, k + 1, (b,), generator=gen)
    # argmaxes that often agree with the draft, so that every acceptance length occurs
    target = torch.where(torch.rand(b, k + 1, generator=gen) < 0.7,
                         torch.cat([draft, draft[:, :1]], 1), torch.randint(vocab, (b, k + 1), generator=gen))
    q, p = one_hot_rows(draft, vocab), one_hot_rows(target, vocab)
    general = verify_proposal(draft, lengths, q, p, torch.rand(b, k, generator=gen), torch.rand(b, generator=gen))
    fast, similarity = verify_greedy(draft, lengths, target)
    assert fast.accepted.tolist() == general.accepted.tolist()
    assert fast.next_token.tolist() == general.next_token.tolist()
    assert similarity.tolist() == proposal_similarity(q, p, lengths).tolist()
    assert set(fast.accepted.tolist()) == set(range(k + 1))
