"""Logits processors and seeded sampling, applied identically at every level of a chain.

Order, as in Hugging Face's generate: repetition penalty, temperature, top-k, top-p. Greedy decoding
(temperature 0) is the point mass on the argmax of the penalised logits, so greedy and sampling share
one code path: with one-hot rows the acceptance rule of `verify.py` reduces to "accept iff the token is
this level's argmax".

Randomness comes from counter-based streams: the uniforms of a row are a function of (request seed,
cycle, level) only, so a row's output does not depend on which other rows share its batch. The three are
hashed into a 64-bit stream key, and the key, all 64 bits of it, into the uniforms (a seeded torch CPU
generator would keep only the key's low 32 bits, so that streams of one long request could repeat).

Coupled sampling (Daliri, Musco and Suresh 2024, arXiv 2408.07978) draws the token at absolute position t
of a row as argmax_v(log p(v) + g_t[v]), with standard Gumbel noise g_t that is a function of (seed, t)
alone (`coupled_pick`, from `exponential_noise`). That is an exact draw from p (the Gumbel-max trick); and
every level of a chain, using the same noise, picks the same token wherever its distribution is close to
the others', so a level accepts a proposed token iff its own pick equals it. The target's picks, and with
them the text, depend on the prompt, the seed and the target alone: not on the chain, the window, the
batch or the replica.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Sequence

import numpy as np
import torch

from specrouter.contract.calls import RowStep, SamplingParams


class BatchSampling:
    """The per-row parameters of a batch as tensors on one device."""

    def __init__(self, params: Sequence[SamplingParams], device: torch.device):
        self.params = list(params)
        self.coupled = [p.coupled and not p.greedy for p in params]                                      # [B]
        self.any_coupled = any(self.coupled)
        f32 = dict(dtype=torch.float32, device=device)
        self.greedy = torch.tensor([p.greedy for p in params], dtype=torch.bool, device=device)          # [B]
        self.temperature = torch.tensor([p.temperature if not p.greedy else 1.0 for p in params], **f32)  # [B]
        self.top_k = torch.tensor([p.top_k for p in params], dtype=torch.long, device=device)            # [B]
        self.top_p = torch.tensor([p.top_p for p in params], **f32)                                      # [B]
        self.penalty = torch.tensor([p.repetition_penalty for p in params], **f32)                       # [B]
        self.any_penalty = any(p.repetition_penalty != 1.0 for p in params)
        self.all_greedy = all(p.greedy for p in params)

    def rows(self, index: torch.Tensor) -> BatchSampling:
        """The parameters for rows `index` (a row may repeat, e.g. one per draft position)."""
        out = BatchSampling.__new__(BatchSampling)
        out.params = [self.params[i] for i in index.tolist()]
        for name in ("greedy", "temperature", "top_k", "top_p", "penalty"):
            setattr(out, name, getattr(self, name)[index])
        out.any_penalty, out.all_greedy = self.any_penalty, self.all_greedy
        out.coupled = [self.coupled[i] for i in index.tolist()]
        out.any_coupled = any(out.coupled)
        return out


def token_presence(tokens: torch.Tensor, valid: torch.Tensor, vocab: int) -> torch.Tensor:
    """[N, vocab] bool: which token ids occur among the valid entries of tokens [N, L].

    Holes are scattered into a spare column past the vocabulary, never into a real token's: a hole shares
    no index with a token, so no write order can unset the presence of one (token 0 included)."""
    presence = torch.zeros(tokens.shape[0], vocab + 1, dtype=torch.bool, device=tokens.device)   # [N, V + 1]
    if tokens.numel():
        presence.scatter_(1, torch.where(valid, tokens, vocab), True)
    return presence[:, :vocab]


def next_token_probs(logits: torch.Tensor, s: BatchSampling, presence: torch.Tensor | None) -> torch.Tensor:
    """Processed next-token distributions [N, vocab] (fp32) from logits [N, vocab]."""
    logits = logits.float()
    if s.any_penalty and presence is not None:
        pen = s.penalty[:, None]
        penalised = torch.where(logits > 0, logits / pen, logits * pen)
        logits = torch.where(presence, penalised, logits)
    greedy_rows = torch.nn.functional.one_hot(logits.argmax(-1), logits.shape[-1]).float()
    if s.all_greedy:
        return greedy_rows
    logits = logits / s.temperature[:, None]
    sorted_logits, sorted_idx = logits.sort(dim=-1, descending=True)                       # [N, V]
    ranks = torch.arange(logits.shape[-1], device=logits.device)[None, :]
    keep = (s.top_k[:, None] == 0) | (ranks < s.top_k[:, None])
    sorted_logits = sorted_logits.masked_fill(~keep, float("-inf"))
    sorted_probs = sorted_logits.softmax(-1)
    mass_before = sorted_probs.cumsum(-1) - sorted_probs
    keep = mass_before < s.top_p[:, None]          # the smallest prefix whose mass reaches top_p
    keep[:, 0] = True
    sorted_probs = sorted_probs.masked_fill(~keep, 0.0)
    probs = torch.zeros_like(sorted_probs).scatter_(-1, sorted_idx, sorted_probs)
    probs = probs / probs.sum(-1, keepdim=True)
    return torch.where(s.greedy[:, None], greedy_rows, probs)


def sample(probs: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor:
    """Inverse-CDF sampling: tokens [N] from probs [N, vocab] and uniforms [N] in [0, 1)."""
    cdf = probs.cumsum(-1)
    u = (uniforms.to(probs.device) * cdf[:, -1]).unsqueeze(-1)
    return torch.searchsorted(cdf, u, right=True).squeeze(-1).clamp(max=probs.shape[-1] - 1)


KEY_BYTES = 8        # a stream key: 64 bits
UNIFORM_BITS = 24    # float32 holds every k / 2**24, k < 2**24, exactly: the uniforms torch.rand makes too


def stream_key(seed: int, cycle: int, level: int) -> int:
    """The 64-bit key of a row's random stream at one cycle and level. The seed is signed, the cycle and the
    level unsigned, as the wire carries them (int64, uint64, uint32); below 2**63 either packing is the same."""
    return _key(struct.pack("<qQQ", seed, cycle, level))


def _key(packed: bytes, domain: bytes = b"") -> int:
    """A 64-bit key hashed from `packed` (blake2b, personalised by `domain`)."""
    return int.from_bytes(hashlib.blake2b(packed, digest_size=KEY_BYTES, person=domain).digest(), "little")


def key_uniforms(key: int, count: int) -> torch.Tensor:
    """`count` uniforms in [0, 1) from all 64 bits of `key`: [count] float32 on the CPU.

    Uniform i is the i-th 32-bit word of SHAKE-256(key), its top UNIFORM_BITS bits over 2**UNIFORM_BITS:
    counter-based, so a stream's first n uniforms are the same however many are asked for.
    """
    words = np.frombuffer(hashlib.shake_256(key.to_bytes(KEY_BYTES, "little")).digest(4 * count), dtype="<u4")
    return torch.from_numpy((words >> (32 - UNIFORM_BITS)).astype(np.float32)) * 2.0 ** -UNIFORM_BITS


def row_uniforms(seed: int, cycle: int, level: int, count: int) -> torch.Tensor:
    """`count` uniforms in [0, 1) that depend only on (seed, cycle, level): [count] on the CPU."""
    return key_uniforms(stream_key(seed, cycle, level), count)


# -- coupled sampling ---------------------------------------------------------------------------------

# float32 holds (k + 1/2) / 2**23 exactly for every k < 2**23, so u < 1 and the noise -log(u) is never 0 (with
# 24 bits the largest u would round to 1: noise 0, and 0 / 0 would pick a token of probability 0)
NOISE_BITS = 23
_GOLDEN32 = np.uint32(0x9E3779B1)   # spreads consecutive vocabulary ids over the 32-bit words before mixing
COUPLED_DOMAIN = b"coupled-noise"   # blake2b's personalisation: the noise's keys differ from the streams' keys
_spread_ids: dict[int, np.ndarray] = {}   # vocabulary size -> its ids times _GOLDEN32, [V] uint32


def _fmix32(x: np.ndarray) -> np.ndarray:
    """MurmurHash3's 32-bit finaliser, in place on uint32 words: every input bit reaches every output bit."""
    x ^= x >> np.uint32(16)
    x *= np.uint32(0x85EBCA6B)
    x ^= x >> np.uint32(13)
    x *= np.uint32(0xC2B2AE35)
    x ^= x >> np.uint32(16)
    return x


def position_key(seed: int, position: int) -> int:
    """The 64-bit key of the noise at absolute position `position` of a row of a request seeded `seed`."""
    return _key(struct.pack("<qQ", seed, position), COUPLED_DOMAIN)


def exponential_noise(keys: Sequence[int], vocab: int) -> np.ndarray:
    """[N, vocab] float32 standard exponential noise, row i a function of keys[i] alone (`position_key`): the
    same on every level, device and batch. Each entry hashes (key, vocabulary id) to a 32-bit word whose top
    NOISE_BITS bits k make a uniform u = (k + 1/2) / 2**NOISE_BITS, and is -log(u) > 0."""
    ids = _spread_ids.get(vocab)
    if ids is None:
        ids = _spread_ids[vocab] = np.arange(vocab, dtype=np.uint32) * _GOLDEN32
    k = np.array(keys, dtype=np.uint64)
    lo = (k & np.uint64(0xFFFFFFFF)).astype(np.uint32)[:, None]                                       # [N, 1]
    hi = (k >> np.uint64(32)).astype(np.uint32)[:, None]                                               # [N, 1]
    h = _fmix32(_fmix32(ids[None, :] ^ lo) ^ hi)                                                       # [N, V]
    u = ((h >> np.uint32(32 - NOISE_BITS)).astype(np.float32) + np.float32(0.5)) * np.float32(2.0 ** -NOISE_BITS)
    return -np.log(u)


def coupled_pick(probs: torch.Tensor, keys: Sequence[int]) -> torch.Tensor:
    """Tokens [N]: argmax_v(probs[i, v] / E_i[v]) for probs [N, vocab] and the exponential noise E_i of
    keys[i], which is argmax_v(log probs[i, v] + g_i[v]) with Gumbel noise g = -log E (the Gumbel-max trick,
    as an exponential race): an exact draw from each row of probs. Rows with the same key pick the same
    token wherever their distributions favour it alike; tokens of probability 0 are never picked."""
    noise = torch.from_numpy(exponential_noise(keys, probs.shape[-1])).to(probs.device)               # [N, V]
    return (probs.float() / noise).argmax(-1)


def with_coupled_picks(tokens: torch.Tensor, probs: torch.Tensor, s: BatchSampling, rows: Sequence[RowStep],
                        positions: torch.Tensor) -> torch.Tensor:
    """`tokens` [B, T] with the rows that sample coupled replaced by their coupled picks from probs [B, T, V]
    at absolute positions [B, T] (`coupled_pick`)."""
    index = [i for i, c in enumerate(s.coupled) if c]
    keys = [position_key(rows[i].sampling.seed, t) for i in index for t in positions[i].tolist()]
    out = tokens.clone()
    out[index] = coupled_pick(probs[index].flatten(0, 1), keys).view(len(index), -1).to(out.device)
    return out
