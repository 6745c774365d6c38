"""A fake ``sglang`` package for the SGLang plugin's tests: it records every call and streams the
way SGLang does. ``install(monkeypatch)`` puts it in ``sys.modules`` as ``sglang`` and returns
the ``Control`` that scripts it and holds the recorded calls.

The parameter lists are copied from SGLang 0.5.23 (the PyPI wheel), these files:

- ``python/sglang/srt/entrypoints/engine.py``: ``Engine.__init__(self, **kwargs)`` (``server_args=``
  or ``ServerArgs`` fields), ``Engine.async_generate(...)`` (below, in full), ``Engine.shutdown(self)``,
  ``Engine._scheduler_init_result.scheduler_infos`` (``SchedulerInitResult``).
- ``python/sglang/srt/server_args.py``: ``ServerArgs.add_cli_args(parser)`` (staticmethod),
  ``ServerArgs.from_cli_args(cls, args)`` (classmethod), ``ServerArgs.resolved_dict(self)``; the
  field defaults of the fields used here (``srt/arg_groups/fields/*.py``).
- ``python/sglang/srt/managers/tokenizer_manager.py``: ``generate_request(self, obj, request=None)``
  with ``_handle_batch_output`` / ``_wait_one_response`` / ``_handle_abort_req``'s output dicts,
  ``abort_request(self, rid: str = "", abort_all: bool = False)``, ``context_len``.
- ``python/sglang/srt/managers/tokenizer_control_mixin.py``: ``open_session(self, obj, request=None)``,
  ``close_session(self, obj, request=None)``, ``get_loads(self, include=None, dp_rank=None)``.
- ``python/sglang/srt/managers/io_struct.py``: ``OpenSessionReqInput``, ``CloseSessionReqInput``.
- ``python/sglang/srt/disaggregation/kv_events.py``: ``KVEventsConfig`` (a pydantic model; only
  ``model_fields`` is used).
- ``python/sglang/srt/session/session_controller.py``: streaming-session appends, refusals and
  deferred closes; ``srt/managers/scheduler.py``: the session lookup's aborts and
  ``_set_or_validate_priority``; ``srt/managers/schedule_batch.py``: ``Req.set_finish_with_abort``
  (status 400 by default).
- Structured outputs: ``srt/sampling/sampling_params.py`` (``SamplingParams.verify``: at most one
  of ``json_schema`` / ``regex`` / ``ebnf``, a ``ValueError`` out of ``async_generate``) and
  ``srt/constrained/grammar_manager.py`` (a grammar the backend cannot compile, or any grammar
  under ``--grammar-backend none``, aborts the request with status 400 before any token).
  ``grammar_error`` stands for the backends' compilers: xgrammar reads JSON schemas, regexes and
  GBNF-style EBNF only; llguidance also reads Lark in ``ebnf``; outlines reads no EBNF. The fake
  does not enforce constraints on the script's tokens (it has no tokenizer).
- Logprobs: ``srt/managers/scheduler.py`` (``logprob_start_len`` -1 means output only; above the
  prompt length it aborts), ``srt/managers/schedule_batch.py`` (a streaming session ignores
  ``logprob_start_len``), ``srt/managers/scheduler_components/logprob_result_processor.py``
  (prompt positions from ``logprob_start_len``, the first with a ``None`` logprob and top row)
  and ``srt/managers/tokenizer_manager.py`` (``convert_logprob_style`` / ``add_logprob_to_meta_info``:
  ``(logprob, token_id, None)`` tuples, top rows only when ``top_logprobs_num`` > 0, output lists
  sliced to the chunk under incremental streaming, prompt lists repeated whole). The values come
  from ``fake_logprobs``: deterministic and self-consistent (rows sorted, the chosen token in its
  row exactly when its logprob is among the row's).

The model is a script: ``Control.script(context) -> token ids`` it would generate; the fake then
applies SGLang's stop rules (``Req._check_token_based_finish``: ``ignore_eos`` disables stop ids
too; the matched token stays in ``output_ids``).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import re
import signal
import sys
import threading
import time
import types
import uuid
from collections.abc import Callable
from typing import Any

import anyio
import anyio.lowlevel

EOS = 2


class Control:
    """Scripts the fake and records what the plugin called."""

    def __init__(self) -> None:
        self.engines: list[Engine] = []
        self.script: Callable[[list[int]], list[int]] = lambda context: list(range(100, 108))
        self.fail_start: str | None = None
        self.start_s = 0.0
        """How long ``Engine()`` blocks (loading the model)."""
        self.max_total_num_tokens = 4096
        self.cached_tokens = 0
        self.resolved_overrides: dict[str, Any] = {}
        """Resolved values that differ from the record (an SGLang that ignores a flag)."""
        self.hold: anyio.Event | None = None
        """While set and not fired, every request waits once it has ``hold_after`` tokens."""
        self.hold_after = 0
        self.ignore_aborts = False
        self.abort_after: tuple[int, dict[str, Any]] | None = None
        """``(n, finish_reason)``: the scheduler aborts every request with it once ``n`` tokens are out."""
        self.tokens_per_chunk = 1
        self.has_get_loads = True
        self.max_running_requests = 0
        """What the load snapshot reports (SGLang sizes it itself when not given)."""
        self.sampling: list[dict[str, Any]] = []
        """The ``sampling_params`` of every request, as SGLang received them."""
        self.module = sys.modules[__name__]

    @property
    def engine(self) -> Engine:
        (engine,) = self.engines
        return engine


CONTROL = Control()


# --------------------------------------------------------------------------- server_args.py


@dataclasses.dataclass
class ServerArgs:
    model_path: str
    tp_size: int = 1
    dp_size: int = 1
    mem_fraction_static: float | None = None
    max_running_requests: int | None = None
    max_prefill_tokens: int = 16384
    chunked_prefill_size: int | None = None
    page_size: int | None = None
    context_length: int | None = None
    dtype: str = "auto"
    quantization: str | None = None
    enable_priority_scheduling: bool = False
    abort_on_priority_when_disabled: bool = False
    schedule_low_priority_values_first: bool = False
    radix_eviction_policy: str = "lru"
    enable_streaming_session: bool = False
    disable_radix_cache: bool = False
    kv_events_config: str | None = None
    tokenizer_path: str | None = None
    skip_tokenizer_init: bool = False
    incremental_streaming_output: bool = False
    enable_metrics: bool = False
    grammar_backend: str | None = None
    enable_hierarchical_cache: bool = False
    device: str | None = None
    log_level: str = "info"

    @staticmethod
    def add_cli_args(parser: argparse.ArgumentParser):
        choices = {
            "dtype": ["auto", "half", "float16", "bfloat16", "float", "float32"],
            "radix_eviction_policy": ["lru", "lfu", "slru", "priority", "tlru"],
        }
        aliases = {
            "model_path": ["--model"],
            "tp_size": ["--tensor-parallel-size"],
            "dp_size": ["--data-parallel-size"],
        }
        for field in dataclasses.fields(ServerArgs):
            names = [f"--{field.name.replace('_', '-')}", *aliases.get(field.name, [])]
            if field.type == "bool":
                parser.add_argument(*names, dest=field.name, action="store_true")
                continue
            kind = {"int": int, "Optional[int]": int, "Optional[float]": float}.get(field.type, str)
            default = None if field.default is dataclasses.MISSING else field.default
            parser.add_argument(
                *names,
                dest=field.name,
                type=kind,
                default=default,
                choices=choices.get(field.name),
                required=field.default is dataclasses.MISSING,
            )
        parser.add_argument("--config", type=str)

    @classmethod
    def from_cli_args(cls, args: argparse.Namespace):
        attrs = [attr.name for attr in dataclasses.fields(cls) if hasattr(args, attr.name)]
        return cls(**{attr: getattr(args, attr) for attr in attrs})

    def resolved_dict(self) -> dict[str, Any]:
        resolved = dataclasses.asdict(self)
        resolved["page_size"] = self.page_size or 1
        resolved["context_length"] = self.context_length or 4096
        resolved["mem_fraction_static"] = self.mem_fraction_static or 0.88
        resolved["chunked_prefill_size"] = self.chunked_prefill_size or 8192
        resolved["grammar_backend"] = self.grammar_backend or "xgrammar"
        resolved.update(CONTROL.resolved_overrides)
        return resolved


# --------------------------------------------------------------------------- io_struct.py


@dataclasses.dataclass(kw_only=True)
class OpenSessionReqInput:
    capacity_of_str_len: int
    session_id: str | None = None
    streaming: bool | None = None
    timeout: float | None = None


@dataclasses.dataclass(kw_only=True)
class CloseSessionReqInput:
    session_id: str


@dataclasses.dataclass
class LoadSnapshot:
    timestamp: float = 0.0
    dp_rank: int = 0
    num_running_reqs: int = 0
    num_waiting_reqs: int = 0
    num_used_tokens: int = 0
    max_total_num_tokens: int = 0
    token_usage: float = 0.0
    max_running_requests: int = 0


class KVEventsConfig:
    """Only what the plugin reads: which fields the pydantic model has (``install`` sets 0.5.23's
    ``bind``; a test drops it to play an older SGLang)."""

    model_fields: dict[str, Any] = {}


# --------------------------------------------------------------------------- the engine


@dataclasses.dataclass
class _Session:
    timeout: float | None
    history: list[int] = dataclasses.field(default_factory=list)
    inflight: bool = False
    close_on_finish: bool = False


@dataclasses.dataclass
class _ReqState:
    output_ids: list[int] = dataclasses.field(default_factory=list)
    aborted: bool = False


@dataclasses.dataclass
class SchedulerInitResult:
    scheduler_infos: list[dict[str, Any]]


class TokenizerManager:
    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.server_args = engine.server_args
        self.context_len = engine.server_args.resolved_dict()["context_length"]
        self.rid_to_state: dict[str, _ReqState] = {}
        self.sessions: dict[str, _Session] = {}
        self.aborts: list[str] = []
        self.session_calls: list[tuple[str, Any]] = []
        self.released: list[str] = []
        self.event_loop: asyncio.AbstractEventLoop | None = None
        self.sigterms: list[int] = []
        """SIGTERMs SGLang's own handler received."""
        if CONTROL.has_get_loads:
            self.get_loads = self._get_loads

    def auto_create_handle_loop(self) -> None:
        """As 0.5.23's: once, on the running loop, which takes SIGTERM (SGLang drains its own
        requests, then kills its processes) when this is the main thread."""
        if self.event_loop is not None:
            return
        self.event_loop = asyncio.get_running_loop()
        if threading.current_thread() is threading.main_thread():
            self.event_loop.add_signal_handler(signal.SIGTERM, self.sigterms.append, signal.SIGTERM)

    def abort_request(self, rid: str = "", abort_all: bool = False):
        self.aborts.append(rid)
        state = self.rid_to_state.get(rid)
        if state is not None and not CONTROL.ignore_aborts:
            state.aborted = True

    async def open_session(self, obj: OpenSessionReqInput, request=None):
        self.session_calls.append(("open", obj))
        if obj.streaming and not self.server_args.enable_streaming_session:
            raise ValueError(
                "Streaming sessions are disabled. Please relaunch with --enable-streaming-session."
            )
        if obj.session_id in self.sessions:
            return None
        self.sessions[obj.session_id] = _Session(obj.timeout)
        return obj.session_id

    async def close_session(self, obj: CloseSessionReqInput, request=None):
        """``SessionController.close``: deferred (``close_on_finish``) while a turn is running."""
        self.session_calls.append(("close", obj))
        session = self.sessions.get(obj.session_id)
        if session is not None and session.inflight:
            session.close_on_finish = True
        else:
            self.sessions.pop(obj.session_id, None)

    async def _get_loads(self, include: list[str] | None = None, dp_rank: int | None = None):
        running = len(self.rid_to_state)
        used = sum(len(s.output_ids) for s in self.rid_to_state.values()) + 10 * running
        return [
            LoadSnapshot(
                dp_rank=0,
                num_running_reqs=running,
                num_waiting_reqs=0,
                num_used_tokens=used,
                max_total_num_tokens=CONTROL.max_total_num_tokens,
                token_usage=used / CONTROL.max_total_num_tokens,
                max_running_requests=CONTROL.max_running_requests,
            )
        ]

    async def generate_request(self, call: dict[str, Any]):
        """``TokenizerManager.generate_request`` for one streamed ``input_ids`` request."""
        rid = call["rid"] or uuid.uuid4().hex
        session_params = call["session_params"]
        input_ids = list(call["input_ids"] or [])
        if not input_ids and not (session_params and session_params.get("id")):
            raise ValueError("input_ids cannot be empty.")
        if call["session_id"] is not None and session_params is not None:
            raise ValueError("session_id and session_params cannot both be set.")
        resolved = self.server_args.resolved_dict()
        incremental = resolved["incremental_streaming_output"]
        sampling = dict(call["sampling_params"] or {})
        grammars = [key for key in ("json_schema", "regex", "ebnf", "structural_tag") if sampling.get(key)]
        if len(grammars) > 1:  # SamplingParams.verify
            raise ValueError("Only one of json_schema, regex, ebnf, or structural_tag can be set.")
        CONTROL.sampling.append(sampling)
        state = self.rid_to_state[rid] = _ReqState()
        session = None
        context = input_ids
        try:
            if grammars:
                message = grammar_error(grammars[0], sampling[grammars[0]], resolved["grammar_backend"])
                if message is not None:  # GrammarManager: Req.set_finish_with_abort before any token
                    yield {
                        "output_ids": [0],
                        "meta_info": {
                            "id": rid,
                            "finish_reason": {
                                "type": "abort",
                                "message": message,
                                "status_code": 400,
                                "err_type": "BadRequestError",
                            },
                            "prompt_tokens": 1,
                            "completion_tokens": 1,
                            "cached_tokens": 0,
                        },
                    }
                    return
            if (
                call["priority"] is not None
                and not self.server_args.enable_priority_scheduling
                and self.server_args.abort_on_priority_when_disabled
            ):
                # Scheduler._set_or_validate_priority
                yield {
                    "output_ids": [],
                    "meta_info": {
                        "id": rid,
                        "finish_reason": {
                            "type": "abort",
                            "status_code": 503,
                            "message": "Using priority is disabled for this "
                            "server. Please send a new request without a priority.",
                        },
                    },
                }
                return
            if session_params is not None:
                sid = session_params["id"]
                session = self.sessions.get(sid)
                message = None
                if session is None:  # Scheduler: session lookup
                    message = f"Invalid request: session id {sid} does not exist"
                elif session.close_on_finish:
                    message = f"Invalid request: close was requested for session {sid}"
                elif session.inflight:  # Session.create_req
                    message = "Streaming session already has an active request."
                if message is not None:
                    session = None
                    # Req.set_finish_with_abort's defaults (the request runs as a one-token prefill;
                    # the ids an abort dict carries are not output)
                    yield {
                        "output_ids": [7],
                        "meta_info": {
                            "id": rid,
                            "finish_reason": {
                                "type": "abort",
                                "message": message,
                                "status_code": 400,
                                "err_type": "BadRequestError",
                            },
                            "prompt_tokens": 1,
                            "completion_tokens": 1,
                            "cached_tokens": 0,
                        },
                    }
                    return
                session.inflight = True
                context = session.history + input_ids
            logprobs = None
            if call["return_logprob"]:
                start = -1 if call["logprob_start_len"] is None else call["logprob_start_len"]
                if session is not None:
                    start = -1  # a streaming session ignores logprob_start_len
                if start > len(context):
                    yield {
                        "output_ids": [0],
                        "meta_info": {
                            "id": rid,
                            "finish_reason": {
                                "type": "abort",
                                "status_code": 400,
                                "err_type": "BadRequestError",
                                "message": f"req.logprob_start_len={start} is higher than the number of input tokens "
                                f"len(req.origin_input_ids)={len(context)}. Please use a smaller "
                                "logprob_start_len.",
                            },
                        },
                    }
                    return
                logprobs = _Logprobs(context, start, call["top_logprobs_num"] or 0)
            cached = len(session.history) if session is not None else CONTROL.cached_tokens
            output, finish = _generate(CONTROL.script(list(context)), sampling)
            sent = 0
            while True:
                while (
                    CONTROL.hold is not None
                    and not CONTROL.hold.is_set()
                    and not state.aborted
                    and len(state.output_ids) >= CONTROL.hold_after
                ):
                    await anyio.sleep(0.005)
                await anyio.lowlevel.checkpoint()
                if CONTROL.abort_after is not None and len(state.output_ids) >= CONTROL.abort_after[0]:
                    yield {
                        "output_ids": [],
                        "meta_info": {"id": rid, "finish_reason": CONTROL.abort_after[1]},
                    }
                    return
                if state.aborted:
                    ids = state.output_ids
                    yield {
                        "output_ids": ids[-1:] if incremental else ids,
                        "meta_info": {
                            "id": rid,
                            "finish_reason": {"type": "abort", "message": "Abort in waiting queue"},
                            "completion_tokens": len(ids),
                            "e2e_latency": 0.0,
                        },
                    }
                    return
                step = output[sent : sent + CONTROL.tokens_per_chunk]
                offset = len(state.output_ids)
                sent += len(step)
                state.output_ids.extend(step)
                done = sent >= len(output)
                meta = {
                    "id": rid,
                    "finish_reason": finish if done else None,
                    "prompt_tokens": len(context),
                    "completion_tokens": len(state.output_ids),
                    "cached_tokens": cached,
                }
                if logprobs is not None:
                    logprobs.add_output(step)
                    meta.update(logprobs.meta_info(offset if incremental else 0))
                ids = step if incremental else (list(state.output_ids) if done else state.output_ids)
                if done:
                    if session is not None:
                        session.history = context + state.output_ids
                    yield {"output_ids": ids, "meta_info": meta}
                    return
                yield {"output_ids": ids, "meta_info": meta}
        except BaseException:
            self.released.append(rid)  # _release_req_states_on_failure
            raise
        finally:
            if session is not None:
                session.inflight = False
                if session.close_on_finish:  # the reaper's deferred close
                    self.sessions.pop(session_params["id"], None)
            self.rid_to_state.pop(rid, None)


def grammar_error(kind: str, text: str, backend: str) -> str | None:
    """SGLang's abort message for a grammar ``backend`` cannot compile, else ``None``."""
    if backend == "none":
        return (
            "Grammar-based generation (json_schema, regex, ebnf, structural_tag) is not supported when "
            "the server is launched with --grammar-backend none"
        )
    key = {"json_schema": "json"}.get(kind, kind)
    error = None
    if kind == "json_schema":
        try:
            json.loads(text)
        except ValueError as exc:
            error = str(exc)
    elif kind == "regex":
        try:
            re.compile(text)
        except re.error as exc:
            error = str(exc)
    elif kind == "ebnf":
        ebnf = re.search(r"^\s*root\s*::=", text, re.MULTILINE) is not None
        lark = re.search(r"^\s*\??start\s*:", text, re.MULTILINE) is not None
        if backend == "outlines":
            error = "Unknown grammar error"  # InvalidGrammarObject(): outlines has no EBNF
        elif not (ebnf or (lark and backend == "llguidance")):
            error = "EBNF parse error: the root rule is not found"
    return None if error is None else f"Failed to compile {key} grammar: {error}"


def fake_logprobs(position: int, token: int, k: int) -> tuple[float, list[tuple[float, int, None]]]:
    """The fake model's logprob of ``token`` at ``position`` (0 = the first prompt token) and the
    ``k`` most likely there, most likely first: the row holds ``token`` at index ``position % k``
    on even positions, else other ids, all more likely than ``token``."""
    row = [(-0.25 * (j + 1), 5000 + 3 * position + j, None) for j in range(k)]
    if k and position % 2 == 0:
        j = position % k
        row[j] = (row[j][0], token, None)
        return row[j][0], row
    return -0.25 * (k + 1) - (token % 5), row


class _Logprobs:
    """One request's logprob lists, as the tokenizer manager's ``ReqState`` accumulates them."""

    def __init__(self, context: list[int], start: int, top: int) -> None:
        self.top = top
        self.context_len = len(context)
        self.input_token: list[tuple] = []
        self.input_top: list[Any] = []
        if 0 <= start < len(context):
            for position in range(start, len(context)):
                logprob, row = fake_logprobs(position, context[position], top)
                first = position == start
                self.input_token.append((None if first else logprob, context[position], None))
                self.input_top.append(None if first else row)
        self.output_token: list[tuple] = []
        self.output_top: list[Any] = []

    def add_output(self, ids: list[int]) -> None:
        for token in ids:
            logprob, row = fake_logprobs(self.context_len + len(self.output_token), token, self.top)
            self.output_token.append((logprob, token, None))
            self.output_top.append(row)

    def meta_info(self, offset: int) -> dict[str, Any]:
        """The logprob keys of one streamed dict; output lists from ``offset`` (the chunk's)."""
        meta: dict[str, Any] = {
            "input_token_logprobs": list(self.input_token),
            "output_token_logprobs": self.output_token[offset:],
            "output_token_logprobs_length": len(self.output_token),
        }
        if self.top > 0:
            meta["input_top_logprobs"] = list(self.input_top)
            meta["output_top_logprobs"] = self.output_top[offset:]
        return meta


def _generate(wishes: list[int], sampling: dict[str, Any]) -> tuple[list[int], dict[str, Any]]:
    """SGLang's stop rules over the script's tokens: the output (stop token kept) and finish_reason."""
    limit = sampling.get("max_new_tokens", 128)
    ignore_eos = sampling.get("ignore_eos", False)
    stops = set(sampling.get("stop_token_ids") or ()) | {EOS}
    min_new = sampling.get("min_new_tokens", 0)
    output: list[int] = []
    for token in wishes:
        if limit is not None and len(output) >= limit:
            return output, {"type": "length", "length": limit}
        output.append(token)
        if not ignore_eos and len(output) > min_new and token in stops:
            return output, {"type": "stop", "matched": token}
    return output, {"type": "length", "length": len(output)}


class Engine:
    """``sglang.Engine``: builds from ``server_args=`` or ``ServerArgs`` fields, records calls."""

    def __init__(self, **kwargs):
        if "server_args" in kwargs:
            server_args = kwargs["server_args"]
        else:
            if "log_level" not in kwargs:
                kwargs["log_level"] = "error"
            server_args = ServerArgs(**kwargs)
        self.server_args = server_args
        time.sleep(CONTROL.start_s)
        if CONTROL.fail_start:
            raise RuntimeError(CONTROL.fail_start)
        self.tokenizer_manager = TokenizerManager(self)
        self._scheduler_init_result = SchedulerInitResult(
            scheduler_infos=[
                {
                    "status": "ready",
                    "max_total_num_tokens": CONTROL.max_total_num_tokens,
                    "max_req_input_len": CONTROL.max_total_num_tokens - 1,
                    "startup_time": 0.0,
                }
            ]
        )
        self.generate_calls: list[dict[str, Any]] = []
        self.shutdowns = 0
        CONTROL.engines.append(self)

    async def async_generate(
        self,
        prompt: list[str] | str | None = None,
        sampling_params: list[dict] | dict | None = None,
        input_ids: list[list[int]] | list[int] | None = None,
        image_data: Any = None,
        audio_data: Any = None,
        video_data: Any = None,
        mm_hashes: list[str] | list[list[str]] | None = None,
        mm_content_hashes: list[str | None] | list[list[str | None]] | None = None,
        return_logprob: list[bool] | bool | None = False,
        logprob_start_len: list[int] | int | None = None,
        top_logprobs_num: list[int] | int | None = None,
        token_ids_logprob: list[list[int]] | list[int] | None = None,
        lora_path: list[str | None] | None = None,
        custom_logit_processor: list[str] | str | None = None,
        require_reasoning: bool = False,
        return_hidden_states: Any = False,
        return_routed_experts: bool = False,
        routed_experts_start_len: int = 0,
        stream: bool = False,
        bootstrap_host: list[str] | str | None = None,
        bootstrap_port: list[int] | int | None = None,
        bootstrap_room: list[int] | int | None = None,
        routed_dp_rank: int | None = None,
        disagg_prefill_dp_rank: int | None = None,
        kv_hints: dict | None = None,
        data_parallel_rank: int | None = None,
        external_trace_header: dict | None = None,
        rid: list[str] | str | None = None,
        session_params: dict | None = None,
        priority: int | None = None,
        session_id: str | None = None,
        *,
        cache_salt: list[str] | str | None = None,
    ):
        call = dict(locals())
        del call["self"]
        self.generate_calls.append(call)
        generator = self.tokenizer_manager.generate_request(call)
        if stream is True:
            return generator
        return await generator.__anext__()

    def shutdown(self):
        self.shutdowns += 1


# --------------------------------------------------------------------------- installing


def install(monkeypatch) -> Control:
    """Put the fake in ``sys.modules`` as ``sglang`` (undone by ``monkeypatch``); a fresh Control."""
    global CONTROL
    CONTROL = Control()
    KVEventsConfig.model_fields = {"publisher": None, "endpoint": None, "bind": None}
    modules = {
        "sglang": {"Engine": Engine},
        "sglang.srt": {},
        "sglang.srt.server_args": {"ServerArgs": ServerArgs},
        "sglang.srt.managers": {},
        "sglang.srt.managers.io_struct": {
            "OpenSessionReqInput": OpenSessionReqInput,
            "CloseSessionReqInput": CloseSessionReqInput,
        },
        "sglang.srt.disaggregation": {},
        "sglang.srt.disaggregation.kv_events": {"KVEventsConfig": KVEventsConfig},
    }
    for name, attrs in modules.items():
        module = types.ModuleType(name)
        module.__dict__.update(attrs)
        monkeypatch.setitem(sys.modules, name, module)
    return CONTROL
