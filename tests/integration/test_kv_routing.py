"""The KV router end to end: real mocker workers publishing KV events, a real frontend in kv mode,
the official openai client. A request that lands where its prefix is cached reports it in
``usage.prompt_tokens_details.cached_tokens``, so that is what these tests read."""

from __future__ import annotations

import anyio
import pytest

from tests.waiting import poll_until

pytestmark = pytest.mark.integration

MODEL = "dyn-tiny"
BLOCK = 16


def _prompt(group: int, tail: int) -> str:
    # ~50 blocks of shared prefix per group, then a short distinct tail
    return f"Group {group} shared context: " + f"fact {group} is important. " * 120 + f"Question {tail}?"


def _cached(client, prompt: str) -> tuple[int, int]:
    r = client.completions.create(model=MODEL, prompt=prompt, max_tokens=2)
    return r.usage.prompt_tokens, r.usage.prompt_tokens_details.cached_tokens


def _client(url: str):
    import openai

    return openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=30)


@pytest.fixture(scope="module")
def kv_stack(stack_factory):
    return stack_factory("kv").up("--router-mode", "kv", workers=3, worker_args=("--block-size", str(BLOCK)))


def _stored_events(url: str) -> float:
    import httpx

    for line in httpx.get(url + "/metrics", timeout=5).text.splitlines():
        if line.startswith('dynamo_component_kv_cache_events_applied_total{event_type="stored",status="ok"}'):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def _first_then_hits(client, url: str, group: int, tails: range) -> list[float]:
    """Send a group's first request, wait until the worker's BlockStored reached the router,
    then return the cached fraction of each later request of the group."""
    before = _stored_events(url)
    _cached(client, _prompt(group, 0))
    poll_until(lambda: _stored_events(url) > before, 10, f"group {group}'s blocks to be indexed")
    fractions = []
    for tail in tails:
        n, cached = _cached(client, _prompt(group, tail))
        fractions.append(cached / n)
    return fractions


def test_shared_prefix_groups_land_where_their_prefix_is_cached(kv_stack):
    client = _client(kv_stack.url)
    for group in range(3):
        fractions = _first_then_hits(client, kv_stack.url, group, range(1, 7))
        # the ~50-block shared prefix is the bulk of each prompt: every request must hit it
        assert min(fractions) > 0.8, (group, fractions)


def test_router_metrics_are_exported(kv_stack):
    import httpx

    _cached(_client(kv_stack.url), _prompt(9, 1))
    text = httpx.get(kv_stack.url + "/metrics", timeout=5).text
    for name in (
        "dynamo_component_router_requests_total",
        "dynamo_component_router_kv_hit_rate_bucket",
        "dynamo_router_overhead_total_ms_bucket",
        "dynamo_router_overhead_block_hashing_ms_bucket",
        "dynamo_frontend_worker_active_decode_blocks",
        "dynamo_frontend_router_queue_pending_requests",
        'dynamo_component_kv_cache_events_applied_total{event_type="stored",status="ok"}',
    ):
        assert name in text, name


def test_approximate_mode_routes_repeats_together_without_events(stack_factory):
    s = stack_factory("approx").up(
        "--router-mode", "kv", "--no-router-kv-events", workers=3, worker_args=("--block-size", str(BLOCK))
    )
    client = _client(s.url)
    for group in range(2):
        isl, _ = _cached(client, _prompt(group, 0))
        # no events: the router predicted the prefix on the worker it chose, at once
        fractions = [c / n for n, c in (_cached(client, _prompt(group, t)) for t in range(1, 5))]
        assert min(fractions) > 0.8, (group, fractions)


def _tokens(seed: int, length: int) -> list[int]:
    return [(seed * 131 + i * 7) % 4000 + 10 for i in range(length)]


def _complete(url: str, tokens: list[int], **headers: str) -> dict:
    import httpx

    r = httpx.post(
        url + "/v1/completions",
        timeout=30,
        headers=headers,
        json={"model": MODEL, "prompt": tokens, "max_tokens": 2},
    )
    assert r.status_code == 200, r.text
    return r.json()


def _holders(url: str, tokens: list[int]) -> dict[str, int]:
    """Worker instance -> matched tokens of ``tokens``, as the router's index (``/kv/query``)
    or a ``dyn indexer`` (``/query``) sees it."""
    import httpx

    r = httpx.post(url, json={"token_ids": tokens}, timeout=5)
    assert r.status_code == 200, r.text
    return {inst: max(ranks.values()) for inst, ranks in r.json()["scores"].items()}


async def _burst(url: str, prompts: list[list[int]]) -> None:
    import httpx

    async with httpx.AsyncClient(timeout=30) as client:

        async def one(tokens):
            r = await client.post(
                url + "/v1/completions", json={"model": MODEL, "prompt": tokens, "max_tokens": 2}
            )
            assert r.status_code == 200, r.text

        async with anyio.create_task_group() as tg:
            for tokens in prompts:
                tg.start_soon(one, tokens)


@pytest.mark.parametrize(("predicted", "one_worker"), [(True, True), (False, False)])
def test_sibling_burst_lands_on_one_worker_only_with_predicted_routes(stack_factory, predicted, one_worker):
    s = stack_factory("burst")
    # real-time engines: a prefill takes long enough (~40 ms) that the whole burst arrives before
    # the first sibling's blocks are stored, the race the side index exists for
    s.worker("--block-size", str(BLOCK), "--speedup-ratio", "1", count=3)
    s.start_frontend("--router-mode", "kv", *(("--router-predicted-ttl-secs", "5") if predicted else ()))
    s.wait_instances(3)
    prefix = _tokens(7, 100 * BLOCK)
    anyio.run(_burst, s.url, [prefix + _tokens(100 + i, BLOCK) for i in range(16)])
    holders = poll_until(
        lambda: _holders(s.url + "/kv/query", prefix) or None, 10, "the burst's blocks to be indexed"
    )
    full = [inst for inst, tokens in holders.items() if tokens >= len(prefix)]
    assert (len(full) == 1) is one_worker, holders


def test_dyn_indexer_answers_the_same_overlaps_as_the_embedded_index(kv_stack):
    from tests.integration.test_indexer_service import start_indexer

    _, indexer_http, _ = start_indexer(kv_stack, namespace=kv_stack.namespace)
    prompts = [_tokens(seed, 30 * BLOCK + 3) for seed in range(20, 26)]
    for tokens in prompts:
        _complete(kv_stack.url, tokens)
    for tokens in prompts:
        poll_until(
            lambda t=tokens: (
                _holders(indexer_http + "/query", t) == _holders(kv_stack.url + "/kv/query", t) != {}
            ),
            10,
            "the dyn indexer and the frontend's index to agree",
        )


def test_use_remote_indexer_routes_on_the_indexers_answers(stack_factory):
    from tests.integration.test_indexer_service import start_indexer

    s = stack_factory("remote-idx")
    s.worker("--block-size", str(BLOCK), count=3)
    start_indexer(s, namespace=s.namespace)
    s.start_frontend("--router-mode", "kv", "--use-remote-indexer")
    s.wait_instances(3)
    client = _client(s.url)
    fractions = _first_then_hits_remote(client, s, group=4)
    assert min(fractions) > 0.8, fractions


def _first_then_hits_remote(client, stack, group: int) -> list[float]:
    """Like ``_first_then_hits``, but the index lives in the dyn indexer: wait on its /workers."""
    import httpx

    from tests.integration.test_indexer_service import READY_PREFIX

    http = next(
        line[len(READY_PREFIX) :].split()[0].split("=", 1)[1]
        for p in stack.procs
        for line in p.log().splitlines()
        if line.startswith(READY_PREFIX)
    )
    _cached(client, _prompt(group, 0))
    poll_until(
        lambda: any(w["blocks"] for w in httpx.get(http + "/workers", timeout=5).json()),
        10,
        "the dyn indexer to index the first request",
    )
    return [c / n for n, c in (_cached(client, _prompt(group, t)) for t in range(1, 6))]


def test_a_dead_worker_is_dropped_from_the_index(stack_factory):
    import httpx

    s = stack_factory("kv-dies")
    doomed = s.worker("--block-size", str(BLOCK))
    s.worker("--block-size", str(BLOCK))
    s.start_frontend("--router-mode", "kv")
    first, second = s.wait_instances(2)
    listed = {w["instance_id"] for w in httpx.get(s.url + "/kv/workers", timeout=5).json()}
    assert listed == {first, second}  # live workers are listed before they cache anything
    for instance in (first, second):
        _complete(s.url, _tokens(instance % 1000, 20 * BLOCK), **{"x-worker-instance-id": str(instance)})

    def indexed():
        return {w["instance_id"] for w in httpx.get(s.url + "/kv/workers", timeout=5).json() if w["blocks"]}

    poll_until(lambda: indexed() == {first, second}, 10, "both workers' blocks to be indexed")
    doomed.kill()
    left = poll_until(
        lambda: indexed() if len(indexed()) == 1 else None, 30, "the killed worker to leave the index"
    )
    _complete(s.url, _tokens(5, 20 * BLOCK))  # routing goes on with the survivor
    assert len(left) == 1


def test_no_booking_outlives_its_request(kv_stack):
    """Finished, failed and abandoned requests (a streamed n=2 chat the client drops after its
    first event) all give their booking back: the router's per-worker load returns to zero."""
    import httpx

    client = _client(kv_stack.url)
    _cached(client, _prompt(11, 1))
    with httpx.stream(
        "POST",
        kv_stack.url + "/v1/chat/completions",
        timeout=30,
        json={
            "model": MODEL,
            "n": 2,
            "stream": True,
            "max_tokens": 500,
            "ignore_eos": True,
            "messages": [{"role": "user", "content": _prompt(12, 1)}],
        },
    ) as r:
        next(r.iter_lines())
    bad = httpx.post(
        kv_stack.url + "/v1/completions", timeout=30, json={"model": MODEL, "prompt": "x", "max_tokens": -1}
    )
    assert bad.status_code == 400

    def loads() -> list[float]:
        text = httpx.get(kv_stack.url + "/metrics", timeout=5).text
        return [
            float(line.rsplit(" ", 1)[1])
            for line in text.splitlines()
            if line.startswith(
                (
                    "dynamo_frontend_worker_active_decode_blocks{",
                    "dynamo_frontend_worker_active_prefill_tokens{",
                )
            )
        ]

    poll_until(lambda: loads() and not any(loads()), 10, f"every booking to be freed: {loads()}")
