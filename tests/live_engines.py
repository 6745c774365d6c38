"""What the live-engine tests (vLLM's and SGLang's CPU builds under ``dyn serve``) ask of a stack
the same way: its workers, its router's index, a chat request with dyn's nvext answers, and the
checks both engines pass alike (chat through the openai client, a shared prefix routed to the
worker that holds it)."""

from __future__ import annotations

import httpx

from tests.vllm_cpu import MODEL
from tests.waiting import poll_until


def instances(url: str) -> list[int]:
    return httpx.get(url + "/health", timeout=10).json()["instances"]


def kv_blocks(url: str) -> dict[int, int]:
    """Blocks the frontend's router has indexed per worker, from its /kv/ view."""
    workers = httpx.get(url + "/kv/workers", timeout=10).json()
    return {int(w["instance_id"]): w["blocks"] for w in workers}


def chat(url: str, content: str | list, worker: int | None = None, **extra) -> dict:
    """A unary chat completion of ``content`` (a user message, or the messages), 4 tokens unless
    ``extra`` says otherwise, answering the worker id and timing in nvext; on ``worker`` if given."""
    messages = [{"role": "user", "content": content}] if isinstance(content, str) else content
    nvext = {"extra_fields": ["worker_id", "timing"], **extra.pop("nvext", {})}
    body = {"model": MODEL, "messages": messages, "max_tokens": 4, "nvext": nvext, **extra}
    headers = {"x-worker-instance-id": str(worker)} if worker is not None else None
    r = httpx.post(url + "/v1/chat/completions", json=body, headers=headers, timeout=120)
    assert r.status_code == 200, r.text
    return r.json()


def worker_of(reply: dict) -> int:
    return reply["nvext"]["worker_id"]["decode_worker_id"]


def cached(reply: dict) -> int:
    return reply["usage"]["prompt_tokens_details"]["cached_tokens"]


def check_chat_through_the_openai_client(url: str, workers: int) -> None:
    """``workers`` serve; a unary and a streamed chat completion (``ignore_eos``) come back in
    OpenAI's shapes with exactly the tokens asked for."""
    import openai

    assert len(instances(url)) == workers
    client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)
    reply = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Say something."}],
        max_tokens=6,
        extra_body={"ignore_eos": True},
    )
    assert reply.choices[0].finish_reason == "length"
    assert reply.usage.completion_tokens == 6 and reply.choices[0].message.content
    chunks = list(
        client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "Stream please."}],
            max_tokens=5,
            stream=True,
            stream_options={"include_usage": True},
            extra_body={"ignore_eos": True},
        )
    )
    assert chunks[-1].usage.completion_tokens == 5
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == [
        "length"
    ]
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)


def check_a_shared_prefix_goes_to_its_holder(url: str, block: int, engine: str) -> None:
    """The engine's own KV events for a prompt's full blocks reach the router's index, and three
    prompts sharing that prefix go to its holder and hit its cache."""
    shared = " ".join(f"fact {i}: the {engine} worker keeps this prefix cached." for i in range(30))
    first = chat(url, shared + " Question one?")
    holder = worker_of(first)
    prompt_blocks = first["usage"]["prompt_tokens"] // block
    poll_until(
        lambda: kv_blocks(url).get(holder, 0) >= prompt_blocks,
        30,
        f"the router to index worker {holder}'s {prompt_blocks} blocks",
    )
    for question in ("Question two?", "Question three?", "Question four?"):
        reply = chat(url, shared + " " + question)
        assert worker_of(reply) == holder
        assert cached(reply) >= (prompt_blocks - 1) * block
        assert reply["nvext"]["timing"]["kv_hit_rate"] > 0.8


def check_beam_search(url: str, model: str = MODEL) -> None:
    """``use_beam_search`` (run by the frontend over the engine's top logprobs) through the openai
    client: ``n`` distinct beams, ranked by their cumulative logprob (``length_penalty`` 0 ranks
    by it alone), each token's logprob in the answer; the same search twice gives the same beams."""
    import openai

    client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=120)

    def search() -> list[tuple[str, float]]:
        r = client.completions.create(
            model=model,
            prompt="The beams are",
            max_tokens=4,
            n=3,
            logprobs=1,
            extra_body={"use_beam_search": True, "length_penalty": 0.0, "ignore_eos": True},
        )
        assert [c.index for c in r.choices] == [0, 1, 2]
        assert all(c.finish_reason == "length" and len(c.logprobs.tokens) == 4 for c in r.choices)
        assert r.usage.completion_tokens == 12
        return [("".join(c.logprobs.tokens), sum(c.logprobs.token_logprobs)) for c in r.choices]

    beams = search()
    assert len({text for text, _ in beams}) == 3, beams
    scores = [score for _, score in beams]
    assert scores == sorted(scores, reverse=True), beams
    again = search()
    assert [t for t, _ in again] == [t for t, _ in beams]


def check_best_of(url: str, model: str = MODEL) -> None:
    """``best_of`` through the openai client: the answer is the likeliest (by cumulative logprob)
    of the ``best_of`` generations, which are the ones seeds ``seed``, ``seed + 1``, ... give."""
    import openai

    client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=120)
    args = dict(model=model, prompt="Pick the best", max_tokens=6, temperature=1.0, logprobs=0)
    singles = []
    for seed in (40, 41, 42):
        c = client.completions.create(seed=seed, extra_body={"ignore_eos": True}, **args).choices[0]
        singles.append((c.text, sum(c.logprobs.token_logprobs)))
    r = client.completions.create(seed=40, best_of=3, extra_body={"ignore_eos": True}, **args)
    (best,) = r.choices
    score = sum(best.logprobs.token_logprobs)
    assert best.text in {text for text, _ in singles}, (best.text, singles)
    assert score >= max(s for _, s in singles) - 1e-3, (score, singles)
    assert r.usage.completion_tokens == 18
