"""The official openai client against a real frontend and real mocker workers, end to end. The
frontend's HTTP contract alone (read-only endpoints, request ids, metrics names, SSE framing) is
tested in process in tests/core/frontend/test_http_*.py."""

from __future__ import annotations

import openai
import pytest

from tests.live_engines import check_beam_search, check_best_of

pytestmark = pytest.mark.integration

MODEL = "dyn-tiny"
MESSAGES = [
    {"role": "system", "content": "You answer briefly."},
    {"role": "user", "content": "Name three prime numbers."},
]


@pytest.fixture(scope="module")
def client(stack):
    return openai.OpenAI(base_url=stack.url + "/v1", api_key="unused", max_retries=0, timeout=30)


def test_chat_unary_usage_adds_up(client):
    r = client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=12, seed=7)
    choice = r.choices[0]
    assert r.object == "chat.completion" and r.model == MODEL
    assert choice.message.role == "assistant" and isinstance(choice.message.content, str)
    assert choice.finish_reason in ("stop", "length")
    u = r.usage
    assert u.prompt_tokens > 10 and 1 <= u.completion_tokens <= 12
    assert u.total_tokens == u.prompt_tokens + u.completion_tokens
    assert u.prompt_tokens_details.cached_tokens >= 0


def test_chat_stream_matches_unary_for_the_same_seed(client):
    args = dict(model=MODEL, messages=MESSAGES, max_tokens=16, seed=11, extra_body={"ignore_eos": True})
    unary = client.chat.completions.create(**args)
    chunks = list(client.chat.completions.create(stream=True, stream_options={"include_usage": True}, **args))
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == unary.choices[0].message.content
    finals = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finals == ["length"]
    usage = chunks[-1].usage
    assert chunks[-1].choices == [] and usage.completion_tokens == 16
    assert usage.total_tokens == usage.prompt_tokens + 16 == unary.usage.total_tokens


def test_greedy_is_greedy_and_a_seed_reproduces_sampling(client):
    """temperature 0 and nvext.greed_sampling: the same prompt gives the same text whatever the
    seed (and on either worker); a seed makes sampled text reproducible."""
    args = dict(model=MODEL, messages=MESSAGES, max_tokens=16, extra_body={"ignore_eos": True})

    def text(**extra) -> str:
        body = {**args["extra_body"], **extra.pop("extra_body", {})}
        r = client.chat.completions.create(**{**args, **extra, "extra_body": body})
        return r.choices[0].message.content

    greedy = {text(temperature=0, seed=seed) for seed in (1, 2, 3)}
    greedy |= {text(seed=seed, extra_body={"nvext": {"greed_sampling": True}}) for seed in (4, 5)}
    assert len(greedy) == 1
    assert text(temperature=0.9, seed=21) == text(temperature=0.9, seed=21) != text(temperature=0.9, seed=22)


def test_completions_unary_and_stream_with_n(client):
    r = client.completions.create(
        model=MODEL, prompt="def fibonacci(n):", max_tokens=8, n=3, extra_body={"ignore_eos": True}
    )
    assert sorted(c.index for c in r.choices) == [0, 1, 2]
    assert r.usage.completion_tokens == 24
    assert all(c.finish_reason == "length" for c in r.choices)
    stream = client.completions.create(
        model=MODEL, prompt="import os", max_tokens=5, n=2, stream=True, extra_body={"ignore_eos": True}
    )
    finished = {c.choices[0].index for c in stream if c.choices and c.choices[0].finish_reason}
    assert finished == {0, 1}


def test_beam_search_through_the_openai_client(stack):
    check_beam_search(stack.url, MODEL)


def test_best_of_through_the_openai_client(stack):
    check_best_of(stack.url, MODEL)


def test_completions_echo_and_batched_prompts(client):
    r = client.completions.create(model=MODEL, prompt=["hello", "world"], max_tokens=3, echo=True)
    texts = {c.index: c.text for c in r.choices}
    assert texts[0].startswith("hello") and texts[1].startswith("world")


def test_vllm_extra_parameters_are_accepted(client):
    r = client.chat.completions.create(
        model=MODEL,
        messages=MESSAGES,
        max_tokens=6,
        extra_body=dict(
            top_k=5,
            min_p=0.05,
            repetition_penalty=1.1,
            length_penalty=1.0,
            stop_token_ids=[],
            include_stop_str_in_output=False,
            ignore_eos=True,
            min_tokens=6,
            skip_special_tokens=True,
            spaces_between_special_tokens=True,
            truncate_prompt_tokens=8,
            priority=0,
            request_id="vllm-extras-1",
            echo=False,
            add_generation_prompt=True,
            continue_final_message=False,
            add_special_tokens=False,
            chat_template_kwargs={"enable_thinking": False},
            documents=[{"title": "t", "text": "x"}],
        ),
    )
    assert r.usage.completion_tokens == 6
    assert r.usage.prompt_tokens == 8  # truncated to the last 8 tokens
    assert r.id == "chatcmpl-vllm-extras-1"


def test_logit_bias_and_allowed_token_ids_decide_the_tokens(client):
    """OpenAI's logit_bias and vLLM's allowed_token_ids through the openai client: a +100 bias
    under greedy sampling repeats its token, allowed_token_ids keep every token in the set, and
    an id outside the vocabulary is a 400 naming the parameter."""
    from dyn.core.frontend.tokenizer import Tokenizer
    from dyn.core.model import load_model_info

    decode = Tokenizer.from_model(load_model_info(None, None)).decode

    def tokens(**extra) -> list[str]:
        body = {"ignore_eos": True, **extra.pop("extra_body", {})}
        r = client.completions.create(
            model=MODEL, prompt="Count with me:", max_tokens=12, logprobs=0, extra_body=body, **extra
        )
        return r.choices[0].logprobs.tokens

    assert tokens(temperature=0, logit_bias={"777": 100}) == [decode([777])] * 12
    allowed = [300, 301, 302]
    assert set(tokens(seed=5, extra_body={"allowed_token_ids": allowed})) <= {decode([i]) for i in allowed}
    with pytest.raises(openai.BadRequestError) as exc:
        tokens(logit_bias={"99999999": 1})
    assert exc.value.body["param"] == "logit_bias"


def test_stop_string_ends_the_output(client):
    args = dict(model=MODEL, prompt="class Parser:", max_tokens=40, seed=3, extra_body={"ignore_eos": True})
    full = client.completions.create(**args).choices[0].text
    stop = full[len(full) // 2 : len(full) // 2 + 3]
    assert stop and stop in full
    cut = client.completions.create(stop=[stop], **args).choices[0]
    assert cut.finish_reason == "stop" and cut.stop_reason == stop
    assert cut.text == full[: full.index(stop)]
    kept = client.completions.create(
        stop=[stop], **{**args, "extra_body": {"ignore_eos": True, "include_stop_str_in_output": True}}
    ).choices[0]
    assert kept.text == full[: full.index(stop)] + stop
    streamed = "".join(
        c.choices[0].text for c in client.completions.create(stop=[stop], stream=True, **args) if c.choices
    )
    assert streamed == cut.text


def test_repeated_long_prompt_is_cached_on_the_same_worker(client, stack):
    instance = stack.instances()[0]
    prompt = "The quick brown fox jumps over the lazy dog. " * 40
    pinned = client.with_options(default_headers={"x-worker-instance-id": str(instance)})
    first = pinned.completions.create(model=MODEL, prompt=prompt, max_tokens=2)
    second = pinned.completions.create(model=MODEL, prompt=prompt, max_tokens=2)
    assert first.usage.prompt_tokens > 200
    assert second.usage.prompt_tokens_details.cached_tokens >= first.usage.prompt_tokens - 16
    by_body = client.completions.create(
        model=MODEL, prompt=prompt, max_tokens=2, extra_body={"nvext": {"backend_instance_id": instance}}
    )
    assert by_body.usage.prompt_tokens_details.cached_tokens > 200
