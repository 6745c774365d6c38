"""OpenAI request and response types, with vLLM's extra parameters and NVIDIA's ``nvext``.

Requests decode straight from the body with msgspec (a wrong type, or an integer outside the range
its consumer takes, fails at decode time and names the field, see ``decode_request``);
``check_*`` then applies the value rules vLLM applies. Unknown top-level fields are ignored, as
OpenAI and vLLM ignore them (``ignored_fields`` names them for the log, as vLLM logs them); an
unknown field inside ``nvext`` (and its ``agent_hints``, ``session_control``, ``cache_control``)
is a 400 naming it, so a Dynamo extension dyn does not implement (a per-request router override,
say) is never dropped silently. Fields the serving path cannot honour yet (beam search,
``suffix``, a ``guided_decoding_backend`` other than "auto") are rejected with a 400 that names
them; ``token_rules`` checks ``logit_bias`` and ``allowed_token_ids`` against the vocabulary. Tools and structured outputs are checked by
``dyn.core.protocol.tools`` and ``dyn.core.protocol.structured``.

Responses are msgspec Structs encoded with ``msgspec.json``; the streaming hot path in
``dyn.core.frontend.responses`` writes its chunks from pre-encoded byte templates instead.
"""

from __future__ import annotations

import functools
import math
import re
from typing import Annotated, Any, Literal

import msgspec

from dyn.core.protocol.errors import ApiError, bad_request

# --------------------------------------------------------------------------- bounded integers

# JSON integers have no size; the request plane's msgpack carries at most 64 bits and engines take
# less. Each integer field is declared with the range its consumer can take, so a larger value is
# a 400 at decode time that names the field, never an overflow further down (a 500).
I32 = Annotated[int, msgspec.Meta(ge=-(2**31), le=2**31 - 1)]
I64 = Annotated[int, msgspec.Meta(ge=-(2**63), le=2**63 - 1)]
U32 = Annotated[int, msgspec.Meta(ge=0, le=2**32 - 1)]
U64_MAX = 2**64 - 1
WorkerId = Annotated[int, msgspec.Meta(ge=0)]
"""A worker instance id: unsigned 64-bit; msgspec's bounds stop at int64, so ``check_nvext``
checks the upper end."""
TokenId = U32
"""A token id: vocabularies are indexed by unsigned 32-bit integers."""


# --------------------------------------------------------------------------- nvext


class AgentHints(msgspec.Struct, forbid_unknown_fields=True):
    """Per-request scheduling hints (seed 002). ``priority``: larger is more important, on every
    backend (``dyn.core.protocol.priority`` converts it to the engine's convention)."""

    priority: I32 | None = None
    osl: U32 | None = None
    speculative_prefill: bool = False
    latency_sensitivity: float | None = None
    kv_overlap_score_credit: float | None = None
    """This request's ``--router-kv-overlap-score-credit`` (0 to 1) in the KV router's cost."""


SESSION_ACTIONS = ("open", "bind", "close")


class SessionControl(msgspec.Struct, forbid_unknown_fields=True):
    """``nvext.session_control`` (seed 003): ``action`` open | bind | close, or omitted on the
    turns in between; ``timeout`` is the idle timeout in seconds (open and bind)."""

    session_id: str
    action: Literal["open", "bind", "close"] | None = None
    timeout: U32 = 300


CACHE_TTL_MIN_S = 300
CACHE_TTL_MAX_S = 3600
_TTL_SHORTHANDS = {"5m": 300, "1h": 3600}


class CacheControl(msgspec.Struct, forbid_unknown_fields=True):
    """``nvext.cache_control``: pin the conversation's KV for ``ttl`` after generation."""

    type: Literal["ephemeral"] = "ephemeral"
    ttl: str | I64 | None = None

    def ttl_seconds(self) -> int:
        """``ttl`` in seconds: ``None`` is 300, "5m" 300, "1h" 3600, integer seconds (as a number
        or a string) clamped to [300, 3600]; ``ValueError`` for any other string."""
        ttl = self.ttl
        if ttl is None:
            return CACHE_TTL_MIN_S
        if isinstance(ttl, str):
            text = ttl.strip()
            if text in _TTL_SHORTHANDS:
                return _TTL_SHORTHANDS[text]
            if not (text.isascii() and text.isdigit()):
                raise ValueError(f'ttl must be integer seconds, "5m" or "1h", got {ttl!r}')
            ttl = int(text)
        return min(max(ttl, CACHE_TTL_MIN_S), CACHE_TTL_MAX_S)


EXTRA_FIELDS = ("worker_id", "timing")
ANNOTATIONS = ("formatted_prompt", "token_ids", "request_id", "llm_metrics")


TraceId = Annotated[str, msgspec.Meta(min_length=1, max_length=256)]


class AgentContext(msgspec.Struct, forbid_unknown_fields=True):
    """``nvext.agent_context`` (Dynamo's agent tracing): who made the request, recorded with it
    in the agent trace (``--agent-trace-file``). ``workflow_type_id``: the kind of workload
    (``coding_agent``); ``workflow_id``: the run; ``program_id``: one trajectory of the run (an
    agent or subagent); ``parent_program_id``: the trajectory that spawned it. Identity only: it
    changes no routing."""

    workflow_type_id: TraceId
    workflow_id: TraceId
    program_id: TraceId
    parent_program_id: TraceId | None = None


class NvExt(msgspec.Struct, forbid_unknown_fields=True):
    """NVIDIA's request extensions (seed 000); ``check_nvext`` holds the value rules."""

    greed_sampling: bool | None = None
    use_raw_prompt: bool | None = None
    annotations: list[str] | None = None
    backend_instance_id: WorkerId | None = None
    token_data: list[TokenId] | None = None
    max_thinking_tokens: U32 | None = None
    extra_fields: list[str] | None = None
    prefill_worker_id: WorkerId | None = None
    decode_worker_id: WorkerId | None = None
    dp_rank: U32 | None = None
    agent_hints: AgentHints | None = None
    cache_control: CacheControl | None = None
    session_control: SessionControl | None = None
    agent_context: AgentContext | None = None


def check_nvext(nvext: NvExt) -> None:
    """Value rules of ``nvext`` (types and integer ranges were checked at decode): a 400 naming
    the field."""

    def need(ok: bool, field: str, rule: str, value: Any) -> None:
        if not ok:
            raise bad_request(f"nvext.{field} {rule}, got {value!r}", param=f"nvext.{field}")

    for name in ("backend_instance_id", "prefill_worker_id", "decode_worker_id"):
        value = getattr(nvext, name)
        if value is not None:
            need(value <= U64_MAX, name, "must be an unsigned 64-bit worker instance id", value)
    if nvext.token_data is not None:
        need(bool(nvext.token_data), "token_data", "must hold at least one token id", [])
    for name, known in (("extra_fields", EXTRA_FIELDS), ("annotations", ANNOTATIONS)):
        for item in getattr(nvext, name) or ():
            need(item in known, name, f"entries must be among {', '.join(known)}", item)
    hints = nvext.agent_hints
    if hints is not None and hints.latency_sensitivity is not None:
        need(
            math.isfinite(hints.latency_sensitivity),
            "agent_hints.latency_sensitivity",
            "must be a finite number of seconds",
            hints.latency_sensitivity,
        )
    if hints is not None and hints.kv_overlap_score_credit is not None:
        need(
            0.0 <= hints.kv_overlap_score_credit <= 1.0,
            "agent_hints.kv_overlap_score_credit",
            "must be from 0.0 to 1.0",
            hints.kv_overlap_score_credit,
        )
    session = nvext.session_control
    if session is not None:
        need(
            bool(session.session_id.strip()),
            "session_control.session_id",
            "must not be empty",
            session.session_id,
        )
        need(session.timeout >= 1, "session_control.timeout", "must be at least 1 second", session.timeout)
    if nvext.cache_control is not None:
        try:
            nvext.cache_control.ttl_seconds()
        except ValueError as exc:
            raise bad_request(f"nvext.cache_control.{exc}", param="nvext.cache_control.ttl") from None


# --------------------------------------------------------------------------- requests


class StreamOptions(msgspec.Struct, forbid_unknown_fields=False):
    include_usage: bool = False
    continuous_usage_stats: bool = False


class _GenerationRequest(msgspec.Struct, kw_only=True, forbid_unknown_fields=False):
    """Fields shared by chat and text completions (OpenAI's, then vLLM's extras)."""

    model: str | None = None
    max_tokens: I64 | None = None
    temperature: float | None = None
    top_p: float | None = None
    n: I32 = 1
    stream: bool = False
    stream_options: StreamOptions | None = None
    stop: str | list[str] | None = None
    seed: I64 | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    logit_bias: dict[str, float] | None = None
    user: str | None = None
    # vLLM sampling extras
    use_beam_search: bool = False
    best_of: I32 | None = None
    top_k: I32 | None = None
    min_p: float | None = None
    repetition_penalty: float | None = None
    length_penalty: float = 1.0
    stop_token_ids: list[TokenId] | None = None
    include_stop_str_in_output: bool = False
    ignore_eos: bool = False
    min_tokens: I64 = 0
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    truncate_prompt_tokens: I64 | None = None
    allowed_token_ids: list[I64] | None = None
    prompt_logprobs: I32 | None = None
    # vLLM extra parameters
    priority: I32 = 0
    request_id: str | None = None
    response_format: dict[str, Any] | None = None
    guided_json: Any = None
    guided_regex: str | None = None
    guided_choice: list[str] | None = None
    guided_grammar: str | None = None
    guided_decoding_backend: str | None = None
    guided_whitespace_pattern: str | None = None
    structured_outputs: dict[str, Any] | None = None
    nvext: NvExt | None = None

    @property
    def generations(self) -> int:
        """Generations per prompt: ``best_of`` when it asks for more than ``n`` (the best ``n``
        of them are answered), else ``n``."""
        return self.best_of if self.best_of is not None and self.best_of > self.n else self.n


class ChatCompletionRequest(_GenerationRequest, kw_only=True):
    """``POST /v1/chat/completions``. ``messages`` stay plain dicts: the chat template reads them
    as the client sent them (``check_chat`` validates their shape)."""

    messages: list[dict[str, Any]]
    max_completion_tokens: I64 | None = None
    logprobs: bool = False
    top_logprobs: I32 | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    echo: bool = False
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    add_special_tokens: bool = False
    documents: list[dict[str, str]] | None = None
    chat_template: str | None = None
    chat_template_kwargs: dict[str, Any] | None = None


class CompletionRequest(_GenerationRequest, kw_only=True):
    """``POST /v1/completions``: one prompt (text or token ids) or a batch of them."""

    prompt: str | list[Any]
    """Text, token ids, or a batch of either (``check_completion`` checks the list's shape)."""
    echo: bool = False
    logprobs: I32 | None = None
    suffix: str | None = None
    add_special_tokens: bool = True


_PATH_RE = re.compile(r" - at `\$(.*)`$")
_MISSING_RE = re.compile(r"missing required field `([^`]+)`")
_UNKNOWN_RE = re.compile(r"unknown field `([^`]+)`")


def decode_request(body: bytes, kind: type[msgspec.Struct]) -> Any:
    """Decode a JSON body into ``kind``; malformed JSON, a wrong type or an integer out of its
    field's range is a 400 naming the field. Invalid UTF-8 in a string the request uses and JSON
    nested deeper than the decoder's recursion limit (which it reaches in microseconds) are 400s
    too: nothing a client sends here is a 500."""
    try:
        return msgspec.json.decode(body, type=kind)
    except UnicodeDecodeError as exc:
        raise bad_request(
            f"Invalid JSON body: a string is not valid UTF-8 ({exc.reason} at byte "
            f"{exc.start} of the string); send the body as UTF-8"
        ) from None
    except RecursionError:
        raise bad_request(
            "Invalid JSON body: nested too deeply; send at most a few hundred levels of arrays and objects"
        ) from None
    except msgspec.ValidationError as exc:
        text = str(exc)
        match = _PATH_RE.search(text)
        param = match.group(1).lstrip(".") if match else None
        named = _MISSING_RE.search(text) or _UNKNOWN_RE.search(text)
        if named:
            param = f"{param}.{named.group(1)}" if param else named.group(1)
        if param and _UNKNOWN_RE.search(text):
            raise bad_request(
                f"Invalid request: unknown field '{param}': this server does not implement it "
                "(extension fields are refused, never ignored silently); remove it",
                param=param,
            ) from None
        message = _PATH_RE.sub("", text)
        if param:
            message = f"{message} at '{param}'"
        raise bad_request(f"Invalid request: {message}", param=param) from None
    except msgspec.DecodeError as exc:
        raise bad_request(f"Invalid JSON body: {exc}") from None


_TOP_LEVEL = msgspec.json.Decoder(dict[str, msgspec.Raw])


@functools.cache
def _field_names(kind: type[msgspec.Struct]) -> frozenset[str]:
    return frozenset(kind.__struct_fields__)


def ignored_fields(body: bytes, kind: type[msgspec.Struct]) -> list[str]:
    """The top-level fields of ``body`` (a JSON object ``decode_request`` accepted as ``kind``)
    that ``kind`` does not have: ignored, and worth a warning, as vLLM logs them. Reads the keys
    only (about a microsecond per KiB)."""
    known = _field_names(kind)
    return sorted(key for key in _TOP_LEVEL.decode(body) if key not in known)


def _range(req: _GenerationRequest, name: str, ok: bool, rule: str) -> None:
    if not ok:
        raise bad_request(f"{name} {rule}, got {getattr(req, name)!r}", param=name)


DEFAULT_MAX_LOGPROBS = 20
"""vLLM's ``--max-logprobs`` default: the most top logprobs a request may ask for."""


def check_generation(req: _GenerationRequest, max_logprobs: int = DEFAULT_MAX_LOGPROBS) -> None:
    """vLLM's value rules for the shared fields; unsupported features are a 400 naming them."""
    _range(req, "n", req.n >= 1, "must be at least 1")  # the most: --max-n (dyn.core.frontend.limits)
    if req.max_tokens is not None:
        _range(req, "max_tokens", req.max_tokens >= 1, "must be at least 1")
    if req.temperature is not None:
        _range(req, "temperature", 0 <= req.temperature <= 2, "must be between 0 and 2")
    if req.top_p is not None:
        _range(req, "top_p", 0 < req.top_p <= 1, "must be in (0, 1]")
    if req.top_k is not None:
        _range(req, "top_k", req.top_k == -1 or req.top_k >= 0, "must be -1 (disable) or at least 0")
    if req.min_p is not None:
        _range(req, "min_p", 0 <= req.min_p <= 1, "must be between 0 and 1")
    if req.repetition_penalty is not None:
        _range(req, "repetition_penalty", 0 < req.repetition_penalty <= 2, "must be in (0, 2]")
    for name in ("presence_penalty", "frequency_penalty"):
        value = getattr(req, name)
        if value is not None:
            _range(req, name, -2 <= value <= 2, "must be between -2 and 2")
    _range(req, "min_tokens", req.min_tokens >= 0, "must be at least 0")
    if req.max_tokens is not None and req.min_tokens > req.max_tokens:
        raise bad_request(
            f"min_tokens ({req.min_tokens}) must not exceed max_tokens ({req.max_tokens})", param="min_tokens"
        )
    if req.truncate_prompt_tokens is not None:
        _range(req, "truncate_prompt_tokens", req.truncate_prompt_tokens >= 1, "must be at least 1")
    if req.stream_options is not None and not req.stream:
        raise bad_request("stream_options is only allowed with stream=true", param="stream_options")
    if req.prompt_logprobs is not None:
        _logprobs_range(req, "prompt_logprobs", req.prompt_logprobs, max_logprobs)
    if req.nvext is not None:
        check_nvext(req.nvext)
    if req.use_beam_search:
        _beam_search_rules(req, max_logprobs)
    _best_of_rules(req)
    _unsupported(req)


def _logprobs_range(req: _GenerationRequest, name: str, value: int, max_logprobs: int) -> None:
    _range(
        req,
        name,
        0 <= value <= max_logprobs,
        f"must be between 0 and {max_logprobs} (the server's --max-logprobs)",
    )


def _beam_search_rules(req: _GenerationRequest, max_logprobs: int) -> None:
    """What beam search (run by the frontend: ``dyn.core.frontend.beam_search``) needs: each step
    asks the engine for ``2 * n`` top logprobs, within ``--max-logprobs`` as in vLLM's engine."""
    if 2 * req.n > max_logprobs:
        raise bad_request(
            f"beam search keeps n={req.n} beams and asks the engine for 2n = {2 * req.n} top logprobs "
            f"per step; this server allows at most {max_logprobs} (--max-logprobs): send n <= "
            f"{max_logprobs // 2}",
            param="n",
        )
    if req.prompt_logprobs is not None:
        raise _not_supported("prompt_logprobs", "prompt_logprobs with beam search")
    if req.nvext is not None and req.nvext.session_control is not None:
        raise _not_supported("nvext.session_control", "a streaming session with beam search")


def _best_of_rules(req: _GenerationRequest) -> None:
    """``best_of`` (OpenAI's, and vLLM's V0 engine's): at least ``n``; more than ``n`` cannot be
    streamed (the best are known when all are done) nor combined with beam search (whose ``n``
    is its width)."""
    best_of = req.best_of
    if best_of is None:
        return
    if best_of < req.n:
        raise bad_request(f"best_of must be at least n ({req.n}), got {best_of}", param="best_of")
    if best_of > req.n and req.stream:
        raise bad_request(
            "best_of greater than n cannot be streamed: the best n are known once all best_of are "
            "done; send stream=false, or best_of equal to n",
            param="best_of",
        )
    if best_of > req.n and req.use_beam_search:
        raise bad_request(
            "best_of does not combine with use_beam_search, whose n is the number of beams: drop best_of",
            param="best_of",
        )


def _unsupported(req: _GenerationRequest) -> None:
    if req.guided_decoding_backend not in (None, "auto"):
        raise _not_supported(
            "guided_decoding_backend",
            f"choosing the structured-output backend per request ({req.guided_decoding_backend!r}; "
            "the worker's engine uses its own, as vLLM V1 does)",
        )


LOGIT_BIAS_LIMIT = 100.0
"""A ``logit_bias`` value beyond it is clamped to it, as vLLM does."""


def token_rules(
    req: _GenerationRequest, vocab_size: int
) -> tuple[dict[int, float] | None, tuple[int, ...] | None]:
    """``(logit_bias, allowed_token_ids)`` as the engine takes them, by vLLM's rules: a bias key
    is a token id written as an integer and its value is clamped to +-``LOGIT_BIAS_LIMIT``;
    ``allowed_token_ids`` is not empty (duplicates are dropped); every id is in
    ``[0, vocab_size)``. Anything else is a 400 naming the parameter and the ids at fault. Either
    holding more entries than the vocabulary has ids is refused before any is looked at: it
    cannot be valid, and a 32 MB body holds millions of them."""
    for name, given in (("logit_bias", req.logit_bias), ("allowed_token_ids", req.allowed_token_ids)):
        if given is not None and len(given) > vocab_size:
            raise bad_request(
                f"{name} holds {len(given)} entries, more than the vocabulary's {vocab_size} token ids",
                param=name,
            )
    bias = None
    if req.logit_bias:
        bias, bad = {}, []
        for key, value in req.logit_bias.items():
            try:
                token = int(key)
            except ValueError:
                bad.append(key)
                continue
            if not 0 <= token < vocab_size:
                bad.append(key)
            bias[token] = min(LOGIT_BIAS_LIMIT, max(-LOGIT_BIAS_LIMIT, value))
        if bad:
            raise bad_request(
                f"logit_bias keys must be token ids in [0, {vocab_size}); not {_some(bad)}",
                param="logit_bias",
            )
    allowed = None
    if req.allowed_token_ids is not None:
        if not req.allowed_token_ids:
            raise bad_request("allowed_token_ids must not be empty", param="allowed_token_ids")
        allowed = tuple(dict.fromkeys(req.allowed_token_ids))
        bad_ids = [token for token in allowed if not 0 <= token < vocab_size]
        if bad_ids:
            raise bad_request(
                f"allowed_token_ids must be token ids in [0, {vocab_size}); not {_some(bad_ids)}",
                param="allowed_token_ids",
            )
    return bias, allowed


def _some(values: list) -> str:
    """The first few of ``values`` for an error message (a request may hold thousands)."""
    shown = ", ".join(repr(v) for v in values[:5])
    return shown + (f" and {len(values) - 5} more" if len(values) > 5 else "")


def _not_supported(param: str, what: str) -> ApiError:
    return bad_request(
        f"{what} is not supported by this server yet; remove '{param}'",
        param=param,
        code="unsupported_parameter",
    )


def check_chat(req: ChatCompletionRequest, max_logprobs: int = DEFAULT_MAX_LOGPROBS) -> None:
    """Rules of the chat endpoint on top of ``check_generation``."""
    check_generation(req, max_logprobs)
    if not req.messages:
        raise bad_request("messages must hold at least one message", param="messages")
    for i, message in enumerate(req.messages):
        role = message.get("role")
        if not isinstance(role, str):
            raise bad_request(f"messages[{i}].role must be a string", param=f"messages[{i}].role")
        content = message.get("content")
        if content is not None and not isinstance(content, (str, list)):
            raise bad_request(
                f"messages[{i}].content must be a string, a list of content parts or null",
                param=f"messages[{i}].content",
            )
    if req.max_completion_tokens is not None:
        _range(req, "max_completion_tokens", req.max_completion_tokens >= 1, "must be at least 1")
    if req.top_logprobs is not None:
        if not req.logprobs:
            raise bad_request("top_logprobs needs logprobs=true", param="top_logprobs")
        _logprobs_range(req, "top_logprobs", req.top_logprobs, max_logprobs)
    if req.add_generation_prompt and req.continue_final_message:
        raise bad_request(
            "continue_final_message cannot be used together with "
            "add_generation_prompt=true; set add_generation_prompt to false",
            param="continue_final_message",
        )


def check_completion(req: CompletionRequest, max_logprobs: int = DEFAULT_MAX_LOGPROBS) -> None:
    """Rules of the completions endpoint on top of ``check_generation``."""
    check_generation(req, max_logprobs)
    if req.suffix is not None:
        raise _not_supported("suffix", "suffix")
    if req.logprobs is not None:
        _logprobs_range(req, "logprobs", req.logprobs, max_logprobs)
    prompt = req.prompt
    if prompt == "" or prompt == []:
        raise bad_request("prompt must not be empty", param="prompt")
    if isinstance(prompt, list) and not (
        all(type(p) is int for p in prompt)
        or all(isinstance(p, str) for p in prompt)
        or all(isinstance(p, list) and p and all(type(t) is int for t in p) for p in prompt)
    ):
        raise bad_request(
            "prompt must be a string, a list of strings, a list of token ids or a "
            "list of non-empty lists of token ids",
            param="prompt",
        )


# --------------------------------------------------------------------------- responses


class PromptTokensDetails(msgspec.Struct):
    cached_tokens: int = 0


class UsageInfo(msgspec.Struct):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails | None = None


class FunctionCallOut(msgspec.Struct):
    name: str
    arguments: str
    """JSON text, as OpenAI sends it."""


class ToolCallOut(msgspec.Struct):
    id: str
    function: FunctionCallOut
    type: str = "function"


class ChatMessageOut(msgspec.Struct, omit_defaults=True):
    """The assistant's message: ``content`` is always sent (null when there is none);
    ``reasoning_content`` (or ``reasoning``, per ``--reasoning-field-name``) and ``tool_calls``
    only when the output had them."""

    role: str
    content: str | None
    reasoning_content: str | None = None
    tool_calls: list[ToolCallOut] = []
    reasoning: str | None = None


class ChatChoice(msgspec.Struct):
    index: int
    message: ChatMessageOut
    finish_reason: str | None
    logprobs: msgspec.Raw | None = None
    """``{"content": [...]}`` when logprobs were asked for (pre-encoded JSON)."""
    stop_reason: int | str | None = None


class ChatCompletionResponse(msgspec.Struct):
    id: str
    created: int
    model: str
    choices: list[ChatChoice]
    usage: UsageInfo
    object: str = "chat.completion"
    prompt_logprobs: msgspec.Raw | msgspec.UnsetType = msgspec.UNSET
    """vLLM's: one entry per prompt token when asked for (pre-encoded JSON)."""
    nvext: msgspec.Raw | msgspec.UnsetType = msgspec.UNSET


class CompletionChoice(msgspec.Struct):
    index: int
    text: str
    finish_reason: str | None
    logprobs: msgspec.Raw | None = None
    """``{"tokens", "token_logprobs", "top_logprobs", "text_offset"}`` when asked for."""
    stop_reason: int | str | None = None
    prompt_logprobs: msgspec.Raw | msgspec.UnsetType = msgspec.UNSET


class CompletionResponse(msgspec.Struct):
    id: str
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: UsageInfo
    object: str = "text_completion"
    nvext: msgspec.Raw | msgspec.UnsetType = msgspec.UNSET


class ModelCard(msgspec.Struct):
    id: str
    created: int
    owned_by: str = "dyn"
    root: str | None = None
    parent: str | None = None
    """The base model of a LoRA adapter (None for a base model), as vLLM lists adapters."""
    max_model_len: int | None = None
    object: str = "model"


class ModelList(msgspec.Struct):
    data: list[ModelCard]
    object: str = "list"
