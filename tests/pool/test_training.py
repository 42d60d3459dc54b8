"""The pool's training pipeline on toy sizes: tokenizer round trip, loss goes down, runs are reproducible."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from specrouter.pool.tokenizer import EOS_TOKEN, train_tokenizer
from specrouter.pool.train import TrainPlan, train
from tests.conftest import tiny_llama

CODE = [
    "def add(a, b):\n    return a + b\n",
    "class Point:\n    def __init__(self, x, y):\n        self.x = x\n        self.y = y\n",
    "for i in range(10):\n    print(i * i)  # squares\n",
] * 20


def test_tokenizer_round_trips_code() -> None:
    tok = train_tokenizer(CODE, vocab_size=300)
    assert tok.eos_token == EOS_TOKEN and tok.convert_tokens_to_ids(EOS_TOKEN) == 0
    text = "def mul(x, y):\n\treturn x * y  # ünïcode\n"
    assert tok.decode(tok(text)["input_ids"]) == text
    assert len(tok(CODE[0])["input_ids"]) < 0.6 * len(CODE[0].encode())  # merges learned


def _stream(n: int = 4000) -> torch.Tensor:
    gen = torch.Generator().manual_seed(0)
    pattern = torch.randint(1, 64, (50,), generator=gen)
    return pattern.repeat(n // 50).to(torch.int16)


def _loss(model, stream) -> float:
    x = stream[:257].long()[None]
    with torch.no_grad():
        return F.cross_entropy(model(input_ids=x[:, :-1]).logits[0], x[0, 1:]).item()


def test_pretraining_lowers_the_loss_and_is_reproducible() -> None:
    stream = _stream()
    plan = TrainPlan(steps=40, batch_size=8, seq_len=32, lr=3e-3, seed=3, warmup_steps=5)
    a, b = tiny_llama(0, 32, 1), tiny_llama(0, 32, 1)
    before = _loss(a, stream)
    train(a, stream, plan)
    train(b, stream, plan)
    assert _loss(a, stream) < before - 1.0
    for pa, pb in zip(a.parameters(), b.parameters()):
        assert torch.equal(pa, pb)


def test_distillation_moves_the_student_towards_the_teacher() -> None:
    stream = _stream()
    teacher = tiny_llama(1, 32, 1, sharpness=5.0)
    student = tiny_llama(2, 16, 1)
    x = stream[:65].long()[None, :-1]

    def kl() -> float:
        with torch.no_grad():
            t = F.log_softmax(teacher(input_ids=x).logits, -1)
            s = F.log_softmax(student(input_ids=x).logits, -1)
        return F.kl_div(s[0], t[0], log_target=True, reduction="batchmean").item()

    before = kl()
    train(student, stream, TrainPlan(steps=40, batch_size=8, seq_len=32, lr=3e-3, seed=0, warmup_steps=5), teacher=teacher)
    assert kl() < 0.5 * before
