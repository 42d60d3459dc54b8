"""The lossless verification step (speculative sampling; Leviathan et al. 2023, Chen et al. 2023).

A level receives a proposal x_1..x_k drawn from rows q_1..q_k and computes its own rows p_1..p_{k+1}.
Walking left to right, x_i is *accepted* with probability min(1, p_i(x_i) / q_i(x_i)). At the first
rejection i the level appends a *recovered* token drawn from norm(max(0, p_i - q_i)); if all k are
accepted it appends a *bonus* token drawn from p_{k+1}. The output x_1..x_a, y is distributed exactly
as sampling from p itself, whatever q was, so applying the step level by level up a chain emits the
target's distribution. With one-hot rows (greedy) it accepts iff x_i is the level's argmax and y is
the argmax at the first disagreement.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from specrouter.worker.sampling import sample


@dataclass(frozen=True)
class Verdict:
    accepted: torch.Tensor    # [B] number of proposal tokens accepted
    next_token: torch.Tensor  # [B] the recovered (a < k) or bonus (a == k) token


def verify_proposal(
    draft_tokens: torch.Tensor,   # [B, K] proposal, right-padded
    draft_lengths: torch.Tensor,  # [B] k_b <= K
    draft_probs: torch.Tensor,    # [B, K, V] rows the proposal was drawn from (q)
    target_probs: torch.Tensor,   # [B, K + 1, V] this level's rows at each proposal position and one more (p)
    u_accept: torch.Tensor,       # [B, K] uniforms in [0, 1)
    u_sample: torch.Tensor,       # [B] uniforms in [0, 1)
) -> Verdict:
    b, k = draft_tokens.shape
    rows = torch.arange(b, device=draft_tokens.device)
    in_range = torch.arange(k, device=draft_tokens.device)[None, :] < draft_lengths[:, None]    # [B, K]
    tokens = torch.where(in_range, draft_tokens, 0)
    p_x = target_probs[:, :k].gather(-1, tokens[..., None]).squeeze(-1)                         # [B, K]
    q_x = draft_probs.gather(-1, tokens[..., None]).squeeze(-1)                                 # [B, K]
    accept = u_accept.to(p_x.device) * q_x < p_x                                                # u < p / q
    rejected = ~accept & in_range
    first_rejection = rejected.int().argmax(1) if k else draft_lengths
    accepted = torch.where(rejected.any(1), first_rejection, draft_lengths)                    # [B]
    p_a = target_probs[rows, accepted]                                                          # [B, V]
    q_a = draft_probs[rows, accepted.clamp(max=k - 1)] if k else torch.zeros_like(p_a)
    q_a = torch.where((accepted < draft_lengths)[:, None], q_a, 0.0)                            # bonus: q = 0
    residual = (p_a - q_a).clamp(min=0)
    mass = residual.sum(-1, keepdim=True)
    residual = torch.where(mass > 0, residual / mass.clamp(min=torch.finfo(mass.dtype).tiny), p_a)
    return Verdict(accepted=accepted, next_token=sample(residual, u_sample))


def proposal_similarity(
    draft_probs: torch.Tensor,    # [B, K, V] q
    target_probs: torch.Tensor,   # [B, K + 1, V] p
    draft_lengths: torch.Tensor,  # [B]
) -> torch.Tensor:
    """Per row, the sum over its k proposal positions of sum_x min(p(x), q(x)) = 1 - TV(p, q).

    Every position of the proposal counts, also those after the first rejection: this is how close the
    two models are, not how many tokens this cycle accepted. Under sampling its mean is the expected
    acceptance of a token drawn from q (Leviathan et al., Theorem 3.5); under greedy (one-hot rows) it
    counts the positions where the two argmaxes agree.
    """
    b, k = draft_probs.shape[:2]
    if k == 0:
        return torch.zeros(b, device=draft_probs.device)
    overlap = torch.minimum(draft_probs, target_probs[:, :k]).sum(-1)                       # [B, K]
    in_range = torch.arange(k, device=draft_probs.device)[None, :] < draft_lengths[:, None]
    return torch.where(in_range, overlap, 0.0).sum(1)


def verify_greedy(
    draft_tokens: torch.Tensor,   # [B, K] proposal, right-padded
    draft_lengths: torch.Tensor,  # [B] k_b <= K
    target_argmax: torch.Tensor,  # [B, K + 1] this level's argmax at each proposal position and one more
) -> tuple[Verdict, torch.Tensor]:
    """`verify_proposal` and `proposal_similarity` when every row is greedy, without the one-hot rows.

    With one-hot q and p the rule accepts x_i iff it is this level's argmax, and the recovered or bonus
    token is the argmax at the first disagreement; the similarity counts the positions that agree.
    Returns the verdict and the similarity per row [B].
    """
    k = draft_tokens.shape[1]
    in_range = torch.arange(k, device=draft_tokens.device)[None, :] < draft_lengths[:, None]    # [B, K]
    agree = (draft_tokens == target_argmax[:, :k]) & in_range                                   # [B, K]
    accepted = (agree.int().cumprod(1)).sum(1) if k else draft_lengths                          # [B]
    next_token = target_argmax.gather(1, accepted[:, None]).squeeze(1)                          # [B]
    return Verdict(accepted=accepted, next_token=next_token), agree.sum(1).float()
