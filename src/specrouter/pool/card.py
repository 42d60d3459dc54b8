"""Renders a model card from measured figures."""

from __future__ import annotations


def render_card(name: str, is_target: bool, target: str, f: dict) -> str:
    t = f["training"]
    role = "target" if is_target else f"drafter / intermediate verifier for {target}"
    agreement = "1.000 (it is the target)" if is_target else f"{f['greedy_agreement_with_target']:.3f}"
    return f"""# {name}

A Llama-architecture causal LM of SpecRouter's demo pool ({role}). Trained by `specrouter train-pool`
on the Python standard library's own source; every model of the pool shares this directory's
byte-level BPE tokenizer. Stored in fp16; load with
`AutoModelForCausalLM.from_pretrained(path)` and `AutoTokenizer.from_pretrained(path)`.

| figure | value |
|---|---|
| parameters | {f['parameters']:,} |
| objective | {t['objective']} |
| training tokens | {t['tokens']:,} ({t['plan']['steps']} steps x {t['plan']['batch_size']} x {t['plan']['seq_len']}) |
| training time | {t['seconds'] / 60:.1f} min on 2 CPU cores (bf16 autocast: {t['bf16_autocast']}) |
| held-out loss (nats/token) | {f['heldout_loss']:.3f} |
| held-out top-1 accuracy | {f['heldout_top1']:.3f} |
| greedy agreement with the target | {agreement} |
| decode latency, batch 1 | {f['decode_ms_batch1']:.2f} ms/token |
| decode latency, batch 16 | {f['decode_ms_batch16']:.2f} ms/step |

Held-out figures are over {f['heldout_tokens']:,} tokens of held-out standard-library files (split by
file). Greedy agreement is the fraction of held-out positions where this model's argmax equals the
target's. Latencies are the median single-token decode step with a KV cache, fp32, {f['torch_threads']}
CPU threads. These models are demonstrations of the serving system, not useful code assistants.
"""
