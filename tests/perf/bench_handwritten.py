"""Benchmark: dyn's hand-written pieces against the library that would replace each. Not a test.

Six comparisons, each on the same load for both sides, measured in pairs (each repetition runs
every side once, in alternating order, so the machine's noise falls on both alike); the table
gives the median over the repetitions of the time per operation and the median of the paired
ratios (library / ours: above 1 means the library is slower).

- ``config``: ``--config FILE.yaml`` read into ``dyn frontend``'s ``default_map``
  (``dyn.cli.config_file.load``) vs PyYAML's ``safe_load`` put in ``default_map`` as it is; and a
  "billion laughs" file: refused by ours vs ``safe_load`` then turned into flag text (JSON).
- ``openapi``: ``openapi_document`` (built once per model, then cached) vs
  ``msgspec.json.schema_components`` of the same types alone (the library's share of it).
- ``logging``: one log record with extra fields through ``dyn.core.logs.JsonFormatter`` vs
  python-json-logger's ``JsonFormatter`` and ``OrjsonFormatter`` configured to the same keys,
  structlog's ``ProcessorFormatter`` on the same stdlib path, and structlog's own logger (not
  stdlib logging: every call site would change) rendering JSON with orjson; all to ``/dev/null``.
- ``cors``: an actual request and a preflight from an allowed origin through ``FrontendApp``'s
  ``CorsPolicy`` vs Starlette's ``CORSMiddleware`` around the same ``FrontendApp`` (its own CORS
  made a no-op), driven in-process (the ASGI app called with a fake receive and send).
- ``routing``: a small JSON POST and a 16-event SSE stream answered through ``FrontendApp``'s
  dispatch (its endpoint table, with two bench endpoints added in this process) vs a Starlette
  app and a FastAPI app with the same handlers (their routes listed first: their best case),
  in-process; with ``--http`` also over uvicorn (dyn's protocol for dyn, uvicorn's httptools for
  the others), a closed-loop httpx client, reporting the server process's CPU time
  (its threads' schedstat run time) per request.
- ``histogram``: one observation of a labelled histogram series, ``dyn.core.histogram``'s
  ``LocklessHistogram`` vs prometheus_client's ``Histogram`` child (the loop's own cost is in both).

The libraries are not dyn's dependencies (starlette is in dyn's venv only because another package
pulls it in); install them into a separate venv that sees dyn's::

    python3 -m venv /tmp/venv-libs
    echo "import site; site.addsitedir('/work/venv/lib/python3.11/site-packages')" \\
        > /tmp/venv-libs/lib/python3.11/site-packages/_dyn_venv.pth
    /tmp/venv-libs/bin/pip install python-json-logger structlog starlette fastapi
    /tmp/venv-libs/bin/python tests/perf/bench_handwritten.py --http

A comparison whose library is missing is skipped with the reason printed.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import io
import json
import logging
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

import msgspec

Case = Callable[[int], float]
"""Runs an operation ``n`` times; returns the seconds it took."""

ORIGIN = "https://app.example"
CHUNKS = 16


# ------------------------------------------------------------------------------------ measuring


def paired(cases: dict[str, Case], n: int, reps: int) -> dict[str, list[float]]:
    """Seconds per operation of each case, ``reps`` times, every case once per repetition in
    alternating order."""
    names = list(cases)
    for case in cases.values():  # warm up: imports, caches, first-call paths
        case(max(1, n // 10))
    out: dict[str, list[float]] = {name: [] for name in names}
    for rep in range(reps):
        for name in names if rep % 2 == 0 else reversed(names):
            out[name].append(cases[name](n) / n)
    return out


def fmt_time(seconds: float) -> str:
    if seconds >= 1e-3:
        return f"{seconds * 1e3:.2f} ms"
    return f"{seconds * 1e6:.1f} us"


ROWS: list[tuple[str, str, str, str, str]] = []


def report(piece: str, load: str, times: dict[str, list[float]], ours: str = "ours") -> None:
    """One table row per library case: ours, the library, the median paired ratio."""
    base = times[ours]
    for name, values in times.items():
        if name == ours:
            continue
        ratio = statistics.median(v / b for v, b in zip(values, base, strict=True))
        ROWS.append(
            (
                piece,
                load,
                fmt_time(statistics.median(base)),
                f"{name} {fmt_time(statistics.median(values))}",
                f"{ratio:.2f}x",
            )
        )


def skipped(piece: str, why: str) -> None:
    ROWS.append((piece, "skipped", "", why, ""))


def print_table() -> None:
    head = ("piece", "load", "ours (median)", "library (median)", "lib/ours")
    widths = [max(len(str(r[i])) for r in [head, *ROWS]) for i in range(5)]
    for row in [head, tuple("-" * w for w in widths), *ROWS]:
        print("  ".join(str(c).ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())


# ------------------------------------------------------------------------------------ config


STACK_YAML = """\
http-port: 8000
max-inflight: 256
max-n: 16
max-logprobs: 20
allowed-origins: '["https://app.example"]'
allow-credentials: false
router-mode: kv
router-temperature: 0.0
router-parent-affinity: true
no-enable-anthropic-api: false
responses-store-max-entries: 1000
tool-call-parser: hermes
reasoning-parser: qwen3
served-model-name: [qwen, qwen3-8b]
allowed-media-domains: [upload.wikimedia.org, example.com]
default-chat-template-kwargs: {enable_thinking: false}
uvicorn-log-level: warning
namespace: prod
discovery-backend: file
"""


def laughs(levels: int) -> str:
    """A "billion laughs" YAML file: each level nine aliases of the one before."""
    lines = ['a0: &a0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    for i in range(1, levels + 1):
        lines.append(f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 9) + "]")
    lines.append(f"chat-template: *a{levels}")
    return "\n".join(lines) + "\n"


def bench_config(n: int, reps: int) -> None:
    import typer.main
    import yaml

    from dyn.cli import config_file
    from dyn.cli.app import app

    command = typer.main.get_command(app).commands["frontend"]  # type: ignore[attr-defined]
    ctx = command.make_context("frontend", [], resilient_parsing=True)
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "stack.yaml")
        with open(path, "w") as file:
            file.write(STACK_YAML)

        def ours(k: int) -> float:
            start = time.perf_counter()
            for _ in range(k):
                ctx.default_map = None
                config_file.load(ctx, path)
            return time.perf_counter() - start

        def library(k: int) -> float:
            start = time.perf_counter()
            for _ in range(k):
                with open(path, "rb") as f:
                    values = yaml.safe_load(f)
                ctx.default_map = {key.replace("-", "_"): value for key, value in values.items()}
            return time.perf_counter() - start

        report(
            "config", "19-key file -> default_map", paired({"ours": ours, "pyyaml+click": library}, n, reps)
        )

        bomb = os.path.join(tmp, "laughs.yaml")
        with open(bomb, "w") as file:
            file.write(laughs(6))  # 9**6 = 531441 "lol"s once expanded; 9 levels would be 3.9e8

        def refuse(k: int) -> float:
            start = time.perf_counter()
            for _ in range(k):
                with contextlib.suppress(config_file.ConfigFileError):
                    config_file.read_config(bomb)
            return time.perf_counter() - start

        def expand(k: int) -> float:
            start = time.perf_counter()
            for _ in range(k):
                with open(bomb, "rb") as f:
                    json.dumps(yaml.safe_load(f)["chat-template"])  # the flag's text
            return time.perf_counter() - start

        times = paired({"ours": refuse, "pyyaml+json": expand}, 2, 5)  # ~0.5 s per expansion
        report("config", "billion laughs, 6 levels", times)


# ------------------------------------------------------------------------------------ openapi


def bench_openapi(n: int, reps: int) -> None:
    from dyn.core.frontend import openapi

    types = [
        openapi.ChatCompletionRequest,
        openapi.ChatCompletionResponse,
        openapi.CompletionRequest,
        openapi.CompletionResponse,
        openapi.ModelList,
        openapi.ErrorResponse,
        openapi.TokenizeCompletionRequest,
        openapi.TokenizeChatRequest,
        openapi.TokenizeResponse,
        openapi.DetokenizeRequest,
        openapi.DetokenizeResponse,
        openapi.EmbeddingRequest,
        openapi.EmbeddingResponse,
        openapi.PoolingResponse,
        openapi.ClassificationResponse,
        openapi.ScoreRequest,
        openapi.ScoreResponse,
        openapi.RerankRequest,
        openapi.RerankResponse,
    ]

    def ours(k: int) -> float:
        start = time.perf_counter()
        for _ in range(k):
            openapi.openapi_document("m", context_length=4096, vocab_size=32000)
        return time.perf_counter() - start

    def schemas_only(k: int) -> float:
        start = time.perf_counter()
        for _ in range(k):
            msgspec.json.schema_components(types, ref_template=openapi._REF)
        return time.perf_counter() - start

    times = paired({"ours": ours, "msgspec schemas alone": schemas_only}, max(1, n // 100), reps)
    report("openapi", "whole document (once per model)", times)


# ------------------------------------------------------------------------------------ logging


def bench_logging(n: int, reps: int) -> None:
    from dyn.core.logs import JsonFormatter

    sink = open(os.devnull, "w")
    formatters: dict[str, logging.Formatter] = {"ours": JsonFormatter("frontend")}
    try:
        from pythonjsonlogger.json import JsonFormatter as PjlJson

        same = {
            "fmt": "{created}{levelname}{name}{message}",
            "style": "{",
            "rename_fields": {"created": "ts", "levelname": "level", "name": "logger"},
            "static_fields": {"process": "frontend"},
        }
        formatters["python-json-logger"] = PjlJson(**same)  # type: ignore[arg-type]
        try:
            from pythonjsonlogger.orjson import OrjsonFormatter

            formatters["python-json-logger orjson"] = OrjsonFormatter(**same)  # type: ignore[arg-type]
        except ImportError:
            pass
    except ImportError:
        skipped("logging", "python-json-logger is not installed")
    with contextlib.suppress(ImportError):
        import orjson
        import structlog

        formatters["structlog ProcessorFormatter"] = structlog.stdlib.ProcessorFormatter(
            processors=[
                structlog.stdlib.ProcessorFormatter.remove_processors_meta,
                structlog.processors.JSONRenderer(serializer=lambda v, **_: orjson.dumps(v).decode()),
            ],
            foreign_pre_chain=[
                structlog.stdlib.add_log_level,
                structlog.stdlib.add_logger_name,
                structlog.stdlib.ExtraAdder(),
                structlog.processors.TimeStamper(key="ts"),
            ],
        )
    cases: dict[str, Case] = {}
    for name, formatter in formatters.items():
        logger = logging.Logger(f"bench.{name}", logging.INFO)
        handler = logging.StreamHandler(sink)
        handler.setFormatter(formatter)
        logger.addHandler(handler)

        def case(k: int, logger: logging.Logger = logger) -> float:
            start = time.perf_counter()
            for i in range(k):
                logger.info(
                    "served %s in %.1f ms",
                    "req-1",
                    12.5,
                    extra={"request_id": "req-1", "model": "qwen", "tokens": i},
                )
            return time.perf_counter() - start

        cases[name] = case
    try:
        import orjson
        import structlog

        slog = structlog.wrap_logger(
            structlog.BytesLogger(open(os.devnull, "wb")),
            processors=[
                structlog.processors.add_log_level,
                structlog.processors.TimeStamper(key="ts"),
                structlog.processors.JSONRenderer(serializer=orjson.dumps),
            ],
            context_class=dict,
        ).bind(logger="bench", process="frontend")

        def structlog_case(k: int) -> float:
            start = time.perf_counter()
            for i in range(k):
                slog.info(
                    "served %s in %.1f ms" % ("req-1", 12.5),
                    request_id="req-1",
                    model="qwen",
                    tokens=i,
                )
            return time.perf_counter() - start

        cases["structlog (native, orjson)"] = structlog_case
    except ImportError:
        skipped("logging", "structlog is not installed")
    if len(cases) > 1:
        report("logging", "1 record, 3 extra fields", paired(cases, n, reps))
    sink.close()


# ------------------------------------------------------------------------------------ ASGI apps


class Item(msgspec.Struct):
    model: str
    prompt: str
    max_tokens: int = 16


class Echo(msgspec.Struct):
    id: str
    model: str
    tokens: int


JSON_BODY = msgspec.json.encode(Item("qwen", "Say hello to the benchmark.", 16))
EVENTS = [
    b'data: {"id":"c","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":"tok%d"}}]}\n\n'
    % i
    for i in range(CHUNKS)
]
DONE = b"data: [DONE]\n\n"
SSE_HEADERS = {"cache-control": "no-cache", "x-accel-buffering": "no"}


def dyn_app(cors: Any = None) -> Any:
    """The real ``FrontendApp`` with ``POST /bench/json`` (a ``JsonEndpoint``) and ``POST
    /bench/sse`` (16 SSE events and ``[DONE]``, sent as the generate endpoints send them, under
    their ``until_disconnect``) added to its endpoint table in this process."""
    from dyn.core.asgi import BodyTooLarge, read_body
    from dyn.core.frontend.app import FrontendApp
    from dyn.core.frontend.endpoints import ENDPOINTS
    from dyn.core.frontend.endpoints.base import Call, Endpoint
    from dyn.core.frontend.endpoints.generate import (
        _SSE_HEADERS,
        MAX_BODY_BYTES,
        require_json,
        until_disconnect,
    )
    from dyn.core.frontend.endpoints.json_post import JsonEndpoint
    from dyn.core.protocol.errors import ApiError

    async def handle(app: Any, body: bytes) -> Echo:
        item = msgspec.json.decode(body, type=Item)
        return Echo("c", item.model, item.max_tokens)

    class SseEndpoint(Endpoint):
        path = "/bench/sse"
        methods = ("POST",)

        async def serve(self, app: Any, call: Call) -> None:
            require_json(call.headers)
            try:
                body = await read_body(call.receive, MAX_BODY_BYTES)
            except BodyTooLarge as exc:
                raise ApiError(413, str(exc)) from None
            msgspec.json.decode(body, type=Item)
            send = call.send

            async def stream() -> None:
                await send(
                    {"type": "http.response.start", "status": 200, "headers": _SSE_HEADERS + call.extra}
                )
                for event in EVENTS:
                    await send({"type": "http.response.body", "body": event, "more_body": True})
                await send({"type": "http.response.body", "body": DONE, "more_body": False})

            await until_disconnect(stream(), call)

    ENDPOINTS["/bench/json"] = JsonEndpoint("/bench/json", handle)
    ENDPOINTS["/bench/sse"] = SseEndpoint()
    return FrontendApp(None, cors=cors)  # type: ignore[arg-type] - the bench endpoints need no model


def _handlers() -> tuple[Any, Any]:
    from starlette.responses import JSONResponse, Response, StreamingResponse

    def not_json(request: Any) -> Response | None:
        media = request.headers.get("content-type", "").split(";", 1)[0].strip().lower()
        return None if media == "application/json" else JSONResponse({"error": "415"}, status_code=415)

    async def json_post(request: Any) -> Response:
        refused = not_json(request)
        if refused is not None:
            return refused
        item = msgspec.json.decode(await request.body(), type=Item)
        return Response(
            msgspec.json.encode(Echo("c", item.model, item.max_tokens)), media_type="application/json"
        )

    async def sse(request: Any) -> Response:
        refused = not_json(request)
        if refused is not None:
            return refused
        msgspec.json.decode(await request.body(), type=Item)

        async def events() -> Any:
            for event in EVENTS:
                yield event
            yield DONE

        return StreamingResponse(events(), media_type="text/event-stream", headers=SSE_HEADERS)

    return json_post, sse


def starlette_app() -> Any:
    from starlette.applications import Starlette
    from starlette.routing import Route

    json_post, sse = _handlers()
    return Starlette(
        routes=[Route("/bench/json", json_post, methods=["POST"]), Route("/bench/sse", sse, methods=["POST"])]
    )


def fastapi_app() -> Any:
    from fastapi import FastAPI, Request

    json_post, sse = _handlers()
    app = FastAPI(openapi_url=None, docs_url=None, redoc_url=None)

    async def _json(request: Request) -> Any:
        return await json_post(request)

    async def _sse(request: Request) -> Any:
        return await sse(request)

    for path, endpoint in (("/bench/json", _json), ("/bench/sse", _sse)):
        endpoint.__annotations__ = {"request": Request, "return": Any}  # resolved here, not as strings
        app.add_api_route(path, endpoint, methods=["POST"])

    return app


def scope(method: str, path: str, headers: list[tuple[bytes, bytes]]) -> dict[str, Any]:
    """A request's scope as uvicorn's httptools protocol builds it."""
    return {
        "type": "http",
        "asgi": {"version": "3.0", "spec_version": "2.3"},
        "http_version": "1.1",
        "server": ("127.0.0.1", 8000),
        "client": ("127.0.0.1", 50000),
        "scheme": "http",
        "method": method,
        "root_path": "",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "headers": headers,
        "state": {},
    }


POST_HEADERS = [
    (b"host", b"127.0.0.1:8000"),
    (b"content-type", b"application/json"),
    (b"content-length", str(len(JSON_BODY)).encode()),
    (b"accept", b"*/*"),
]


def asgi_case(app: Any, request: dict[str, Any], body: bytes, expect: int) -> Case:
    """Calls ``app`` ``n`` times on a fresh copy of ``request`` with ``body``; checks the status
    and that the response ended."""
    from dyn.core.asgi import DISCONNECT_HOOK, DisconnectHook

    loop = asyncio.new_event_loop()
    forever = loop.create_future()

    class Exchange:
        """One request's receive (the body, then no disconnect) and send (noting the status)."""

        __slots__ = ("read", "status", "done")

        def __init__(self) -> None:
            self.read = False
            self.status = 0
            self.done = False

        async def receive(self) -> dict[str, Any]:
            if self.read:
                await asyncio.shield(forever)  # the client stays
            self.read = True
            return {"type": "http.request", "body": body, "more_body": False}

        async def send(self, message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                self.status = message["status"]
            elif not message.get("more_body", False):
                self.done = True

    async def run(k: int) -> None:
        for _ in range(k):
            exchange = Exchange()
            # every app's scope holds the disconnect hook dyn's protocol adds; only dyn reads it
            await app({**request, DISCONNECT_HOOK: DisconnectHook()}, exchange.receive, exchange.send)
            if exchange.status != expect or not exchange.done:
                raise RuntimeError(f"{request['path']}: status {exchange.status}, done {exchange.done}")

    def case(k: int) -> float:
        start = time.perf_counter()
        loop.run_until_complete(run(k))
        return time.perf_counter() - start

    return case


def new_loop_policy() -> None:
    with contextlib.suppress(ImportError):
        import uvloop

        asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())


# ------------------------------------------------------------------------------------ cors


class NoCors:
    """A ``CorsPolicy`` that adds nothing: ``FrontendApp`` under Starlette's middleware."""

    def response_headers(self, origin: str) -> list[tuple[bytes, bytes]]:
        return []


def bench_cors(n: int, reps: int) -> None:
    try:
        from starlette.middleware.cors import CORSMiddleware
    except ImportError:
        skipped("cors", "starlette is not installed")
        return
    from dyn.core.frontend.cors import CorsPolicy

    ours = dyn_app(CorsPolicy(allowed_origins=(ORIGIN,)))
    theirs = CORSMiddleware(
        dyn_app(NoCors()), allow_origins=[ORIGIN], allow_methods=["*"], allow_headers=["*"]
    )
    actual = scope("POST", "/bench/json", [*POST_HEADERS, (b"origin", ORIGIN.encode())])
    pre = scope(
        "OPTIONS",
        "/bench/json",
        [
            (b"host", b"127.0.0.1:8000"),
            (b"origin", ORIGIN.encode()),
            (b"access-control-request-method", b"POST"),
            (b"access-control-request-headers", b"content-type, authorization"),
        ],
    )
    times = paired(
        {
            "ours": asgi_case(ours, actual, JSON_BODY, 200),
            "starlette": asgi_case(theirs, actual, JSON_BODY, 200),
        },
        n,
        reps,
    )
    report("cors", "JSON POST from an allowed origin", times)
    times = paired(
        {"ours": asgi_case(ours, pre, b"", 200), "starlette": asgi_case(theirs, pre, b"", 200)}, n, reps
    )
    report("cors", "preflight", times)


# ------------------------------------------------------------------------------------ histogram


def bench_histogram(n: int, reps: int) -> None:
    from prometheus_client import CollectorRegistry, Histogram

    from dyn.core.histogram import LocklessHistogram

    buckets = [0.001 * 2**i for i in range(15)]  # the router's compute-phase buckets
    ours = LocklessHistogram("x_ms", "x", ["router_id"], ["0"], buckets, CollectorRegistry())
    theirs = Histogram("x_ms", "x", ["router_id"], buckets=buckets, registry=CollectorRegistry()).labels("0")
    values = [0.004 * 1.7**i for i in range(12)]  # spread over the buckets

    def observing(observe: Callable[[float], None]) -> Case:
        def run(count: int) -> float:
            start = time.perf_counter()
            for i in range(count):
                observe(values[i % 12])
            return time.perf_counter() - start

        return run

    times = paired({"ours": observing(ours.observe), "prometheus_client": observing(theirs.observe)}, n, reps)
    report("histogram", "one observation of a labelled series", times)


# ------------------------------------------------------------------------------------ routing


def app_named(name: str) -> Any:
    return {"ours": dyn_app, "starlette": starlette_app, "fastapi": fastapi_app}[name]()


def routing_apps() -> dict[str, Any]:
    apps = {"ours": dyn_app()}
    for name in ("starlette", "fastapi"):
        try:
            apps[name] = app_named(name)
        except ImportError:
            skipped("routing", f"{name} is not installed")
    return apps


def bench_routing(n: int, reps: int) -> None:
    apps = routing_apps()
    if len(apps) == 1:
        return
    for path, load in (("/bench/json", "small JSON POST"), ("/bench/sse", f"{CHUNKS}-event SSE POST")):
        request = scope("POST", path, POST_HEADERS)
        cases = {name: asgi_case(app, request, JSON_BODY, 200) for name, app in apps.items()}
        report("routing", f"{load}, in-process", paired(cases, n, reps))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def serve(name: str, port: int) -> None:
    """Run app ``name`` under uvicorn as dyn's frontend runs (uvloop, no access log, no lifespan)."""
    import uvicorn

    app = app_named(name)
    http = app.http_protocol() if name == "ours" else "httptools"
    uvicorn.run(
        app,
        host="127.0.0.1",
        port=port,
        loop="uvloop",
        http=http,
        lifespan="off",
        log_config=None,
        access_log=False,
    )


def cpu_seconds(pid: int) -> float:
    """The CPU time of process ``pid``'s threads so far, in nanoseconds' resolution (schedstat;
    utime + stime from /proc/PID/stat count whole clock ticks)."""
    total = 0
    for task in os.listdir(f"/proc/{pid}/task"):
        with contextlib.suppress(FileNotFoundError), open(f"/proc/{pid}/task/{task}/schedstat") as f:
            total += int(f.read().split()[0])
    return total / 1e9


def bench_http(requests: int, reps: int, concurrency: int) -> None:
    """Each app under uvicorn in its own process; a closed loop of ``concurrency`` httpx clients
    sends ``requests`` requests per repetition; the server's CPU seconds per request."""
    import httpx

    names = list(routing_apps())
    if len(names) == 1:
        return
    servers: dict[str, tuple[subprocess.Popen[bytes], int]] = {}
    try:
        for name in names:
            port = free_port()
            proc = subprocess.Popen(
                [sys.executable, __file__, "--serve", name, "--port", str(port)],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            servers[name] = (proc, port)
        for name, (proc, port) in servers.items():
            deadline = time.monotonic() + 60
            while True:
                try:
                    httpx.get(f"http://127.0.0.1:{port}/live", timeout=1)
                    break
                except httpx.TransportError:
                    if time.monotonic() > deadline or proc.poll() is not None:
                        raise RuntimeError(f"{name}'s server did not start") from None
                    time.sleep(0.2)

        async def load(port: int, path: str, k: int) -> None:
            async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as client:

                async def one() -> None:
                    for _ in range(k // concurrency):
                        response = await client.post(
                            path, content=JSON_BODY, headers={"content-type": "application/json"}
                        )
                        if response.status_code != 200:
                            raise RuntimeError(f"{path}: {response.status_code}")

                await asyncio.gather(*(one() for _ in range(concurrency)))

        for path, what in (("/bench/json", "small JSON POST"), ("/bench/sse", f"{CHUNKS}-event SSE POST")):
            cases: dict[str, Case] = {}
            for name, (proc, port) in servers.items():

                def case(k: int, pid: int = proc.pid, port: int = port, path: str = path) -> float:
                    before = cpu_seconds(pid)
                    asyncio.run(load(port, path, k))
                    return cpu_seconds(pid) - before

                cases[name] = case
            report("routing", f"{what}, uvicorn, server CPU", paired(cases, requests, reps))
    finally:
        for proc, _ in servers.values():
            proc.terminate()
        for proc, _ in servers.values():
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()


# ------------------------------------------------------------------------------------ main

PIECES = {
    "config": bench_config,
    "openapi": bench_openapi,
    "logging": bench_logging,
    "cors": bench_cors,
    "routing": bench_routing,
    "histogram": bench_histogram,
}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("pieces", nargs="*", metavar="PIECE", help=f"of {', '.join(PIECES)} (default: all)")
    parser.add_argument("-n", type=int, default=5000, help="operations per repetition (default 5000)")
    parser.add_argument("--reps", type=int, default=9, help="paired repetitions (default 9)")
    parser.add_argument(
        "--http", action="store_true", help="also routing over uvicorn (server CPU per request)"
    )
    parser.add_argument(
        "--http-requests", type=int, default=500, help="requests per repetition over HTTP (default 500)"
    )
    parser.add_argument(
        "--concurrency", type=int, default=4, help="HTTP clients in the closed loop (default 4)"
    )
    parser.add_argument("--serve", help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    unknown = [p for p in args.pieces if p not in PIECES]
    if unknown:
        parser.error(f"unknown piece {unknown[0]!r}; choose from {', '.join(PIECES)}")
    new_loop_policy()
    if args.serve:
        serve(args.serve, args.port)
        return
    logging.getLogger("dyn").setLevel(logging.CRITICAL)  # bench endpoints log nothing worth seeing
    for name in args.pieces or list(PIECES):
        print(f"{name} ...", file=sys.stderr, flush=True)
        PIECES[name](args.n, args.reps)
    if args.http:
        print("routing over uvicorn ...", file=sys.stderr, flush=True)
        bench_http(args.http_requests, args.reps, args.concurrency)
    print(f"medians of {args.reps} paired repetitions; lib/ours: median of the paired ratios")
    print_table()


if __name__ == "__main__":
    sys.stdout = io.TextIOWrapper(sys.stdout.buffer, line_buffering=True)
    main()
