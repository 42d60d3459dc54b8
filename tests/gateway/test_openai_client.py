"""The official `openai` client against a live gateway: completions and chat, whole and streamed, seeds, stop
strings, n; greedy text and token ids equal to the gRPC SDK's for the same request."""

from __future__ import annotations

import pytest
from transformers import AutoTokenizer

from tests.gateway.conftest import CHAT_TEMPLATE, DRAFTER, TARGET

PROMPTS = ["def fibonacci(n):", "import os\n"]
NEW_TOKENS = 24
MESSAGES = [{"role": "system", "content": "You write Python."}, {"role": "user", "content": "Sort a list"}]


def test_models_lists_the_target(openai_client) -> None:
    assert [m.id for m in openai_client.models.list().data] == [TARGET]


@pytest.mark.parametrize("chain", ["auto", "target", f"{DRAFTER},{TARGET}"])
def test_greedy_completions_are_the_sdks(openai_client, sdk, chain) -> None:
    """The same text, token ids and usage as the SDK; `chain: target` runs target-only decoding."""
    got = openai_client.completions.create(model=TARGET, prompt=PROMPTS, max_tokens=NEW_TOKENS, temperature=0,
                                           extra_body={"chain": chain, "window": 3 if "," in chain else 0})
    expected = [sdk.generate(p, max_new_tokens=NEW_TOKENS, chain="target") for p in PROMPTS]
    assert [c.index for c in got.choices] == [0, 1]
    assert [c.text for c in got.choices] == [e.text for e in expected]
    assert [c.specrouter["token_ids"] for c in got.choices] == [e.token_ids for e in expected]
    assert [c.finish_reason for c in got.choices] == [e.finish_reason for e in expected]
    assert got.usage.prompt_tokens == sum(e.stats.prompt_tokens for e in expected)
    assert got.usage.completion_tokens == sum(e.stats.generated_tokens for e in expected)
    assert got.usage.total_tokens == got.usage.prompt_tokens + got.usage.completion_tokens
    for choice in got.choices:
        stats = choice.specrouter
        assert stats["cycles"] == sum(stats["chain_counts"].values()) > 0
        assert stats["breakdown"]["cycle_ns"] > 0 and stats["total_ns"] >= stats["queue_ns"]
        if chain != "auto":
            assert set(stats["chain_counts"]) == {TARGET if chain == "target" else chain}


def test_streamed_completion_is_the_sdks_with_usage_last(openai_client, sdk) -> None:
    expected = sdk.generate(PROMPTS[0], max_new_tokens=NEW_TOKENS, chain="target")
    chunks = list(openai_client.completions.create(model=TARGET, prompt=PROMPTS[0], max_tokens=NEW_TOKENS,
                                                   temperature=0, stream=True,
                                                   stream_options={"include_usage": True}))
    text_chunks, usage_chunk = chunks[:-1], chunks[-1]
    assert "".join(c.choices[0].text for c in text_chunks) == expected.text
    assert [t for c in text_chunks for t in c.choices[0].specrouter["token_ids"]] == expected.token_ids
    assert [c.choices[0].finish_reason for c in text_chunks] == [None] * (len(text_chunks) - 1) + ["length"]
    assert text_chunks[-1].choices[0].specrouter["generated_tokens"] == NEW_TOKENS
    assert usage_chunk.choices == [] and usage_chunk.usage.completion_tokens == NEW_TOKENS
    assert usage_chunk.usage.prompt_tokens == expected.stats.prompt_tokens
    assert len({c.id for c in chunks}) == 1 and all(c.usage is None for c in text_chunks)


def test_chat_formats_the_messages_with_the_checkpoints_template(openai_client, sdk, cluster) -> None:
    """The prompt is the template's, as transformers renders it; whole and streamed answers are the SDK's."""
    tokenizer = AutoTokenizer.from_pretrained(cluster.pool / TARGET)
    assert tokenizer.chat_template == CHAT_TEMPLATE
    prompt = tokenizer.apply_chat_template(MESSAGES, tokenize=False, add_generation_prompt=True)
    assert prompt.startswith("<|endoftext|>system: You write Python.\n") and prompt.endswith("assistant:")
    expected = sdk.generate(prompt, max_new_tokens=NEW_TOKENS, chain="target")
    got = openai_client.chat.completions.create(model=TARGET, messages=MESSAGES, max_tokens=NEW_TOKENS, temperature=0)
    assert got.object == "chat.completion" and got.choices[0].message.role == "assistant"
    assert got.choices[0].message.content == expected.text
    assert got.choices[0].specrouter["token_ids"] == expected.token_ids
    assert got.usage.prompt_tokens == expected.stats.prompt_tokens == len(tokenizer(prompt, add_special_tokens=False)
                                                                            ["input_ids"])
    chunks = list(openai_client.chat.completions.create(model=TARGET, messages=MESSAGES, temperature=0, stream=True,
                                                        max_completion_tokens=NEW_TOKENS))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == expected.text
    assert chunks[-1].choices[0].finish_reason == expected.finish_reason


def test_a_seed_pins_the_sampled_text_and_each_choice_has_its_own(openai_client, sdk) -> None:
    params = dict(max_tokens=NEW_TOKENS, temperature=0.9, top_p=0.95, seed=7)
    first = openai_client.completions.create(model=TARGET, prompt=PROMPTS[0], n=2, **params)
    again = openai_client.completions.create(model=TARGET, prompt=PROMPTS[0], n=2, **params)
    expected = [sdk.generate(PROMPTS[0], max_new_tokens=NEW_TOKENS, temperature=0.9, top_p=0.95, seed=seed)
                for seed in (7, 8)]
    assert [c.specrouter["token_ids"] for c in first.choices] == [e.token_ids for e in expected]
    assert [c.text for c in again.choices] == [c.text for c in first.choices] == [e.text for e in expected]
    assert [c.specrouter["seed"] for c in first.choices] == [7, 8]
    assert expected[0].token_ids != expected[1].token_ids   # two seeds, two samples (else pick another prompt)


def test_stop_strings_end_the_text_before_them(openai_client, sdk) -> None:
    free = sdk.generate(PROMPTS[0], max_new_tokens=NEW_TOKENS, chain="target").text
    stop = next(free[i:i + 3] for i in range(4, len(free) - 3)   # its first occurrence at i
                if free[i:i + 3].strip() and free[i:i + 3] not in free[:i + 2])
    expected = free[:free.index(stop)]
    whole = openai_client.completions.create(model=TARGET, prompt=PROMPTS[0], max_tokens=NEW_TOKENS, temperature=0,
                                             stop=[stop, "never appears"])
    assert (whole.choices[0].text, whole.choices[0].finish_reason) == (expected, "stop")
    streamed = list(openai_client.completions.create(model=TARGET, prompt=PROMPTS[0], max_tokens=NEW_TOKENS,
                                                     temperature=0, stop=stop, stream=True))
    assert "".join(c.choices[0].text for c in streamed) == expected
    assert streamed[-1].choices[0].finish_reason == "stop"
