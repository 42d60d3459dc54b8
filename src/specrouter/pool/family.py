"""The shapes of the demo pool: Llama-architecture models with tied embeddings, one tokenizer.

Sizes span about 30x in parameters so that drafter/target cost ratios resemble
a llama-68m / TinyLlama-1.1B / Llama-2-7b chain (drafter, intermediate, target).
"""

from __future__ import annotations

from dataclasses import dataclass

from transformers import LlamaConfig

VOCAB_SIZE = 4096
CONTEXT_LENGTH = 1024  # max_position_embeddings; the models are trained on windows of TRAIN_SEQ_LEN
TRAIN_SEQ_LEN = 256


@dataclass(frozen=True)
class ModelShape:
    name: str
    hidden: int
    layers: int
    heads: int
    intermediate: int

    def config(self, eos_token_id: int) -> LlamaConfig:
        return LlamaConfig(
            vocab_size=VOCAB_SIZE,
            hidden_size=self.hidden,
            intermediate_size=self.intermediate,
            num_hidden_layers=self.layers,
            num_attention_heads=self.heads,
            num_key_value_heads=self.heads,
            max_position_embeddings=CONTEXT_LENGTH,
            tie_word_embeddings=True,
            bos_token_id=eos_token_id,
            eos_token_id=eos_token_id,
            pad_token_id=eos_token_id,
        )


TARGET = ModelShape("stdlib-29m", hidden=512, layers=8, heads=8, intermediate=1536)
MID = ModelShape("stdlib-5m", hidden=256, layers=4, heads=4, intermediate=768)
DRAFTER = ModelShape("stdlib-1m", hidden=128, layers=2, heads=4, intermediate=384)
