"""The catalogue of every message that crosses a process boundary in dyn.

One place to read the protocol (SGLang's io_struct.py habit). The families:

- **Request plane** (frontend/router DEALER -> worker ROUTER, ZMQ multipart ``[kind, payload]``):
  ``GenerateRequest``, ``CancelRequest`` go to the worker; ``TokenChunk``, ``Finish``,
  ``ErrorReply`` come back, one per message or several in one ``ReplyBatch``. Control calls
  (``SessionControlRequest``, ``PinPrefixRequest``) are answered by one ``ControlReply`` or one
  ``ErrorReply`` (code ``unsupported`` when the engine does not offer the call). The one-byte
  ``EmbedRequest`` (embeddings of tokenized inputs) is a control-style call too, answered by one
  ``EmbedReply`` or one ``ErrorReply``. The one-byte
  ``kind`` frame (``KIND_*``) names the struct, so a receiver dispatches without decoding and
  decodes with a typed decoder (a malformed payload fails at the boundary). ``request_id`` ties
  replies to their request; it is unique per client connection, not globally.
- **Router plane** (frontend DEALER -> ``dyn router`` ROUTER, ``[kind, payload]`` like the request
  plane): ``RouteQuery`` is answered by ``RouteAnswer`` or ``RouteRefused`` (matched by
  ``query_id``); the frontend then reports the stream's progress with ``RouteProgress`` so the
  router's load model stays true. Replica sync (router PUB -> peer SUB): ``ActiveSequenceEvent``.
- **Indexer plane** (router DEALER -> ``dyn indexer`` ROUTER): ``OverlapQuery`` is answered by
  ``OverlapAnswer`` or ``OverlapRefused``.
- **Load metrics** (worker metrics PUB, topic ``load-metrics``): ``LoadMetrics``.
- **Agent trace** (each HTTP worker process -> the one that writes ``--agent-trace-file``, a pipe
  per worker carrying msgpack lists): ``AgentTraceEntry``.
- **Discovery** (JSON records in the discovery store): ``WorkerRecord`` with ``WorkerEndpoints``.

KV events are not here: they follow vLLM's wire format exactly, so that real engines and dyn's
mocker share one decoder; see ``dyn.core.kv.events``.

Hot-path structs are ``array_like`` msgpack arrays with ``omit_defaults``; new fields go at the
end with a default so older peers still decode newer messages.
"""

from __future__ import annotations

from typing import Any, Literal, get_args

import msgspec

# --------------------------------------------------------------------------- request plane


class SamplingParams(msgspec.Struct, array_like=True, omit_defaults=True, gc=False, frozen=True):
    """Sampling parameters forwarded to the engine. ``None`` means the engine's default.

    ``logit_bias``: token id -> a bias in [-100, 100] added to its logit (OpenAI's, as vLLM reads
    it); ``allowed_token_ids``: the only tokens that may be sampled (vLLM's). The frontend checks
    that every id is in the vocabulary and that ``allowed_token_ids`` is not empty."""

    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    seed: int | None = None
    repetition_penalty: float | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    length_penalty: float | None = None
    logit_bias: dict[int, float] | None = None
    allowed_token_ids: tuple[int, ...] | None = None


class StopConditions(msgspec.Struct, array_like=True, omit_defaults=True, gc=False, frozen=True):
    """When generation ends. ``max_tokens=None`` means: until EOS or the context length.

    ``stop_token_ids`` end generation even with ``ignore_eos`` (vLLM semantics); neither EOS
    nor stop tokens end it before ``min_tokens`` tokens were generated.
    """

    max_tokens: int | None = None
    min_tokens: int = 0
    ignore_eos: bool = False
    stop_token_ids: list[int] = []


CONSTRAINT_KINDS = ("json", "json_object", "regex", "choice", "grammar")


class OutputConstraint(msgspec.Struct, array_like=True, omit_defaults=True, gc=False, frozen=True):
    """Structured output the engine must produce, validated once by the frontend
    (``dyn.core.protocol.structured``); each engine enforces it its own way.

    ``kind`` (one of ``CONSTRAINT_KINDS``) says what ``spec`` holds:

    - ``json``: a JSON Schema, as JSON text; the output is one JSON value valid under it;
    - ``json_object``: ``spec`` is empty; the output is one JSON object;
    - ``regex``: a regular expression the whole output matches;
    - ``choice``: ``choices`` holds the strings; the output is exactly one of them;
    - ``grammar``: a context-free grammar: GBNF-style EBNF (``root ::= ...``, as vLLM's default
      backend and SGLang's ``ebnf`` read it) or Lark (``start: ...``).

    ``whitespace_pattern``: vLLM's ``guided_whitespace_pattern`` for JSON (``None``: the engine's
    default).
    """

    kind: str
    spec: str = ""
    choices: tuple[str, ...] = ()
    whitespace_pattern: str | None = None


class ToolSpec(msgspec.Struct, array_like=True, omit_defaults=True, gc=False, frozen=True):
    """One tool a request offers the model, as a hint to engines that act on it (the mocker's
    ``--tool-call-rate``); real engines see the tools only through the rendered prompt.
    ``parameters`` is the tool's JSON Schema as JSON text."""

    name: str
    parameters: str = "{}"


DisaggregationMode = Literal["agg", "prefill", "decode"]
"""A worker's role (``--disaggregation-mode``): ``agg`` does both phases of a request, ``prefill``
computes prompts' KV for decode workers, ``decode`` receives it and generates."""


class KvTransfer(msgspec.Struct, array_like=True, omit_defaults=True, gc=False, frozen=True):
    """The hand-off between the two phases of a disaggregated request.

    On a prefill request (``GenerateRequest.kv_transfer`` with ``phase="prefill"``), the worker
    computes the prompt's KV, keeps it for a decode worker to pull, emits at most one token, and
    answers with the descriptor in ``Finish.kv_transfer`` (``phase="decode"``). The decode request
    carries that descriptor: the decode worker receives the prompt's blocks it does not hold from
    ``source_instance_id`` and generates. ``prompt_tokens``: how many prompt tokens' KV the
    prefill worker holds; ``params``: the engine's own hand-off as JSON text (vLLM's
    ``kv_transfer_params``), empty when the engine needs none."""

    phase: Literal["prefill", "decode"]
    source_instance_id: int = 0
    prompt_tokens: int = 0
    params: str = ""


MediaModality = Literal["image", "audio", "video"]


class MediaItem(msgspec.Struct, array_like=True, omit_defaults=True, gc=False, frozen=True):
    """One image (audio clip, video) of a prompt, as the frontend loaded and checked it.

    ``data``: its encoded bytes as the client sent them (PNG, JPEG, WAV, MP4, ...; ``mime`` names
    the format); ``mm_hash``: 64 lowercase hex characters identifying the content (SHA-256 of
    ``data``), the identifier vLLM is given (``multi_modal_uuids``) and reports back in its KV
    events' ``extra_keys``, and the one whose first 16 hex characters (as a u64) enter the KV block
    hashes of the blocks its placeholder tokens fall in (``dyn.core.kv.hashing``). ``offset`` and
    ``length``: where its placeholder tokens are in the request's ``token_ids`` (Gemma 3's
    neighbours share the newline token between them). ``source``: the tokens the span stands for
    in the prompt the chat template wrote, where they are more than the modality's placeholder
    token (Gemma 3's: the template's newlines merged into the span's ends), for an engine that
    expands the placeholder itself; empty: that placeholder token alone."""

    modality: MediaModality
    data: bytes
    mime: str
    mm_hash: str
    offset: int
    length: int
    source: list[int] = []


class GenerateRequest(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    """Generate tokens for a tokenized prompt."""

    request_id: str
    token_ids: list[int]
    sampling: SamplingParams = SamplingParams()
    stop: StopConditions = StopConditions()
    priority: int | None = None
    """In the engine's own convention (``WorkerRecord.priority_order``); the frontend converts
    the client's priority once (``dyn.core.protocol.priority``)."""
    dp_rank: int | None = None
    lora_name: str | None = None
    session_id: str | None = None
    """A streaming session opened on this worker (``SessionControlRequest``): the request
    appends to the session's held KV instead of going through the prefix cache alone."""
    max_thinking_tokens: int | None = None
    """Most reasoning tokens before the engine ends the thinking section (``None``: no cap)."""
    constraint: OutputConstraint | None = None
    """Structured output the engine must follow (``None``: free text)."""
    logprobs: int | None = None
    """Return each output token's log-probability and this many top alternatives (0: the
    token's own only); ``None``: no logprobs (``TokenChunk.logprobs`` stays empty)."""
    prompt_logprobs: int | None = None
    """Return each prompt token's log-probability and this many top alternatives, in
    ``Finish.prompt_logprobs``; ``None``: none."""
    tools: list[ToolSpec] = []
    """The request's tools when the model may call one (``tool_choice`` auto); sent only to
    workers that advertise ``FEATURE_TOOL_HINTS``."""
    kv_transfer: KvTransfer | None = None
    """Disaggregated serving (see ``KvTransfer``): a prefill request, or a decode request with
    the prefill worker's descriptor; ``None``: the worker does both phases."""
    media: list[MediaItem] = []
    """The prompt's images (audio, video) in the order of their placeholders in ``token_ids``;
    sent only to workers that list ``media`` in their features."""


class CancelRequest(msgspec.Struct, array_like=True, gc=False):
    """Abort a request; the worker answers with a ``Finish(reason="cancelled")`` if it was live."""

    request_id: str


class TokenLogprobs(msgspec.Struct, array_like=True, gc=False):
    """Log-probabilities at one position: the chosen token's ``logprob`` and the ``top`` most
    likely tokens there, most likely first, as ``top_ids[i]`` with ``top_logprobs[i]`` (as many as
    the request asked for; the chosen token may be among them). ``rank``: the chosen token's
    1-based rank among all tokens at that position (0: the engine does not know it)."""

    logprob: float
    top_ids: list[int] = []
    top_logprobs: list[float] = []
    rank: int = 0


class TokenChunk(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    """New output tokens of one request, in order; several when the engine made several.
    ``logprobs``: one entry per token when the request asked for logprobs, else empty."""

    request_id: str
    token_ids: list[int]
    logprobs: list[TokenLogprobs] = []


class EngineTiming(msgspec.Struct, array_like=True, omit_defaults=True, gc=False, frozen=True):
    """Where the request's time went inside the worker, in milliseconds since the worker got it.

    ``queue_ms``: received -> first scheduled; ``prefill_ms``: first scheduled -> first token;
    ``decode_ms``: first token -> finish.
    """

    queue_ms: float = 0.0
    prefill_ms: float = 0.0
    decode_ms: float = 0.0


class Usage(msgspec.Struct, array_like=True, gc=False):
    """Token accounting. ``cached_tokens`` counts prompt tokens served from the prefix cache."""

    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int = 0


FinishReason = Literal["stop", "length", "cancelled", "error"]
PriorityOrder = Literal["lower_first", "higher_first"]
"""Which engine priority values are served first (``WorkerRecord.priority_order``)."""


class Finish(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    """The last message of a request and why it ended (a reason outside ``FinishReason`` is a
    malformed message).

    ``stop_token_id`` is the EOS or stop token that ended it (not part of the output), if any.
    """

    request_id: str
    reason: FinishReason
    usage: Usage
    timing: EngineTiming = EngineTiming()
    stop_token_id: int | None = None
    prompt_logprobs: list[TokenLogprobs | None] | None = None
    """One entry per prompt token when the request asked for prompt logprobs (the first is
    ``None``: nothing precedes it), else ``None``."""
    kv_transfer: KvTransfer | None = None
    """A prefill request's answer: where its decode worker gets the prompt's KV (``KvTransfer``)."""


class ErrorReply(msgspec.Struct, array_like=True, gc=False):
    """A request failed, or a frame could not be understood (then ``request_id`` may be empty).

    ``code`` is a stable machine word (``bad_request``, ``unknown_kind``, ``engine_error``,
    ``duplicate_request``); ``message`` says what to fix.
    """

    request_id: str
    code: str
    message: str


class SessionControlRequest(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    """Open or close a streaming session on the worker (SGLang's ``open_session`` /
    ``close_session``). ``action``: open | close. ``timeout_s``: the session's idle timeout on the
    worker (open only). Answered by ``ControlReply`` (``value`` 1 when something changed)."""

    request_id: str
    action: str
    """Kept a plain string: a worker answers an unknown action with an error naming the request,
    which a decoding failure could not do."""
    session_id: str
    timeout_s: float = 0.0


class PinPrefixRequest(msgspec.Struct, array_like=True, gc=False):
    """Protect the cached KV blocks of ``token_ids``' prefix from eviction for ``ttl_s`` seconds.
    Answered by ``ControlReply`` whose ``value`` is the number of blocks pinned."""

    request_id: str
    token_ids: list[int]
    ttl_s: float


class ControlReply(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    """A control call succeeded; ``value`` and ``message`` depend on the call."""

    request_id: str
    value: int = 0
    message: str = ""


PoolingTask = Literal["embed", "classify", "token_embed", "token_classify"]
"""vLLM's pooling tasks: one vector per input (``embed``, ``classify``), or one row per token of
each input (``token_embed``: each token's embedding; ``token_classify``: each token's class
probabilities)."""
POOLING_TASKS: tuple[PoolingTask, ...] = get_args(PoolingTask)
TOKEN_TASKS: frozenset[PoolingTask] = frozenset(("token_embed", "token_classify"))
CLASSIFY_TASKS: frozenset[PoolingTask] = frozenset(("classify", "token_classify"))
"""The tasks of a classification model (the others embed)."""


class EmbedRequest(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    """Pool each tokenized input of ``prompts`` (one vector per input, in order) with ``task``:
    ``embed`` or ``token_embed`` (embeddings; sent only to workers that list ``embed`` in their
    features), ``classify`` or ``token_classify`` (a classification model's class probabilities;
    only to workers that list ``classify``). For a token task an input's vector is its rows, one
    per token, laid end to end (``len(prompt)`` rows of equal width). Answered by one
    ``EmbedReply``, or an ``ErrorReply`` (``unsupported`` from an engine that does not pool so).
    ``activation`` False: the pooler's output without its activation (vLLM's ``use_activation:
    false``): an embedding not normalized, a classifier's logits instead of its probabilities."""

    request_id: str
    prompts: list[list[int]]
    task: PoolingTask = "embed"
    activation: bool = True


class EmbedReply(msgspec.Struct, array_like=True, gc=False):
    """The vectors of an ``EmbedRequest``'s inputs, in the order of its ``prompts``;
    ``prompt_tokens``: the tokens the engine embedded, all inputs together."""

    request_id: str
    embeddings: list[list[float]]
    prompt_tokens: int = 0


class ReplyBatch(msgspec.Struct, array_like=True, gc=False):
    """Several replies to one client in one message (kind ``B``), so a worker sends one message per
    client per forward pass instead of one per request.

    Wire form: the msgpack array ``[chunks, finishes, errors]`` of three arrays (maybe empty;
    trailing ones may be left out) holding the single structs' own array forms, so it decodes in
    one typed pass. A receiver applies ``chunks`` in list order, then ``finishes``, then
    ``errors``; so a sender keeps each request's replies in order within ``chunks`` and never
    puts a reply to a request after that request's ``Finish``/``ErrorReply`` in the same batch
    (it starts a new batch instead; see ``codec.encode_replies``). Receivers accept this kind and
    the single kinds interchangeably.
    """

    chunks: list[TokenChunk] = []
    finishes: list[Finish] = []
    errors: list[ErrorReply] = []


KIND_GENERATE = b"G"
KIND_CANCEL = b"C"
KIND_TOKENS = b"T"
KIND_FINISH = b"F"
KIND_ERROR = b"E"
KIND_BATCH = b"B"
KIND_SESSION = b"S"
KIND_PIN = b"N"
KIND_CONTROL_REPLY = b"K"
KIND_EMBED = b"M"
KIND_EMBED_REPLY = b"V"

REQUEST_KINDS: dict[bytes, type[msgspec.Struct]] = {
    KIND_GENERATE: GenerateRequest,
    KIND_CANCEL: CancelRequest,
    KIND_SESSION: SessionControlRequest,
    KIND_PIN: PinPrefixRequest,
    KIND_EMBED: EmbedRequest,
}
REPLY_KINDS: dict[bytes, type[msgspec.Struct]] = {
    KIND_TOKENS: TokenChunk,
    KIND_FINISH: Finish,
    KIND_ERROR: ErrorReply,
    KIND_BATCH: ReplyBatch,
    KIND_CONTROL_REPLY: ControlReply,
    KIND_EMBED_REPLY: EmbedReply,
}

# --------------------------------------------------------------------------- router plane


class RouteQuery(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    """Ask a ``dyn router`` where one engine request should go (fields as ``RouteRequest``), or a
    group of them admitted as one unit (``siblings``: the other choices and prompts of one client
    request, with the same routing fields). ``query_id`` is unique per client connection;
    ``request_id`` (and each sibling id) names a booking."""

    query_id: int
    request_id: str
    token_ids: list[int]
    instance_id: int | None = None
    dp_rank: int | None = None
    priority: int | None = None
    lora_name: str | None = None
    latency_sensitivity: float | None = None
    expected_output_tokens: int | None = None
    siblings: list[str] = []
    """Request ids routed with this one as one unit; member ``i`` of the group is
    ``siblings[i - 1]``, member 0 this query's own ``request_id``."""
    sibling_prompts: list[int] = []
    """Per sibling, its prompt: 0 is ``token_ids``, ``i`` is ``prompts[i - 1]`` (empty: all 0)."""
    prompts: list[list[int]] = []
    reports_start: bool = False
    """The client reports ``RouteProgress`` "started" when it sends each request to its worker;
    without it the router counts the answer as the start."""
    prefill_instance_id: int | None = None
    """A disaggregated request's prefill worker, named (``instance_id`` then names its decode worker)."""
    prompt_media: list[list[tuple[int, int, int]]] = []
    """Per prompt (0: ``token_ids``, ``i``: ``prompts[i - 1]``), its media as ``(offset, length,
    key)`` (``RouteRequest.media``); empty: no prompt has media."""
    overlap_score_credit: float | None = None
    """The group's overlap credit in the router's cost, from 0 to 1 (``RouteOverrides``;
    ``agent_hints.kv_overlap_score_credit``); None: the router's own."""


class RouteAnswer(msgspec.Struct, array_like=True, gc=False):
    """The router booked the request on ``(instance_id, dp_rank)`` (and, disaggregated, its
    prefill stage on ``(prefill_instance_id, prefill_dp_rank)``). A group is answered with one
    ``RouteAnswer`` per member, sent together once every member is booked."""

    query_id: int
    instance_id: int
    dp_rank: int
    overlap_blocks: int
    cached_tokens: int
    block_size: int = 0
    queue_depth: int = 0
    """Requests waiting in the router queue when this one arrived."""
    member: int = -1
    """Which member of the query's group this books (0: the query's own request); -1 from a
    router that predates groups and answers the query's own request only."""
    prefill_instance_id: int = -1
    """A disaggregated request's prefill worker (``instance_id`` is then its decode worker; -1:
    none, the worker does both phases) and its rank. ``overlap_blocks``, ``cached_tokens``,
    ``host_blocks`` and ``disk_blocks`` are then the prefill worker's."""
    prefill_dp_rank: int = 0
    host_blocks: int = 0
    """The prompt's blocks after its ``overlap_blocks`` (device) found in the worker's host tier
    (``cached_tokens`` counts them at the router's host weight)."""
    disk_blocks: int = 0
    """The blocks after those found in its disk and external tiers."""


class RouteRefused(msgspec.Struct, array_like=True, gc=False):
    """The request (a group: all of it) cannot be routed. ``code``: no_workers |
    worker_not_found | all_busy | queue_full | target_required | bad_request | cancelled (the
    client withdrew it) | error. ``query_id`` -1: a message the router could not take;
    ``query_id`` 0 (never a query's) with code ``probe``: the router checking that the client is
    still connected, which clients ignore."""

    query_id: int
    code: str
    message: str


RouteEvent = Literal["started", "first_token", "progress", "finished"]


class RouteProgress(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    """A routed stream's progress: ``event`` is started (sent to its worker), first_token,
    progress (``output_tokens`` so far) or finished (the booking is freed; a query of the
    client still waiting for its answer is withdrawn, its whole group with it)."""

    request_id: str
    event: RouteEvent
    output_tokens: int = 0


class ActiveSequenceEvent(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    """Replica sync: one router's booking change, applied by its peers. ``event``: add (with the
    request's tracked block hashes, prompt local and sequence hashes for approximate indexes,
    lengths and cached tokens), prefill_done, output (``output_tokens`` so far) or free."""

    router_id: str
    request_id: str
    instance_id: int
    dp_rank: int
    event: str
    tracked_hashes: list[int] = []
    local_hashes: list[int] = []
    seq_hashes: list[int] = []
    isl_tokens: int = 0
    cached_tokens: int = 0
    expected_output_tokens: int | None = None
    output_tokens: int = 0


KIND_ROUTE_QUERY = b"Q"
KIND_ROUTE_ANSWER = b"A"
KIND_ROUTE_REFUSED = b"R"
KIND_ROUTE_PROGRESS = b"P"
ROUTER_KINDS: dict[bytes, type[msgspec.Struct]] = {
    KIND_ROUTE_QUERY: RouteQuery,
    KIND_ROUTE_ANSWER: RouteAnswer,
    KIND_ROUTE_REFUSED: RouteRefused,
    KIND_ROUTE_PROGRESS: RouteProgress,
}
ACTIVE_SEQUENCES_TOPIC = b"active-sequences"

# --------------------------------------------------------------------------- indexer plane


class OverlapQuery(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    """How many leading blocks of a prompt each worker caches. Give ``token_ids`` (hashed by the
    indexer with its block size and ``lora_name``) or the local ``block_hashes`` directly."""

    query_id: int
    token_ids: list[int] | None = None
    block_hashes: list[int] | None = None
    lora_name: str | None = None


class OverlapAnswer(msgspec.Struct, array_like=True, gc=False):
    """Matched prefix blocks per ``(instance_id, dp_rank, blocks)``; workers absent matched 0.
    ``tiers``: per ``(instance_id, dp_rank, host_blocks, disk_blocks)``, the blocks that continue
    that rank's device match in its host tier, then in its disk and external tiers; ranks absent
    have none (and an indexer that predates tiers sends none)."""

    query_id: int
    block_size: int
    scores: list[tuple[int, int, int]]
    tiers: list[tuple[int, int, int, int]] = []


class OverlapRefused(msgspec.Struct, array_like=True, gc=False):
    query_id: int
    message: str


KIND_OVERLAP_QUERY = b"q"
KIND_OVERLAP_ANSWER = b"a"
KIND_OVERLAP_REFUSED = b"r"
INDEXER_KINDS: dict[bytes, type[msgspec.Struct]] = {
    KIND_OVERLAP_QUERY: OverlapQuery,
    KIND_OVERLAP_ANSWER: OverlapAnswer,
    KIND_OVERLAP_REFUSED: OverlapRefused,
}

KIND_OF: dict[type[msgspec.Struct], bytes] = {
    cls: kind for kind, cls in (REQUEST_KINDS | REPLY_KINDS | ROUTER_KINDS | INDEXER_KINDS).items()
}

# --------------------------------------------------------------------------- load metrics

LOAD_METRICS_TOPIC = b"load-metrics"


class LoadMetrics(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    """One worker rank's load, published on its metrics PUB under ``LOAD_METRICS_TOPIC``.

    ``num_preempted`` and ``num_passes`` are cumulative counters since the worker started.
    """

    instance_id: int
    dp_rank: int
    ts: float
    num_running: int
    num_waiting: int
    active_kv_blocks: int
    total_kv_blocks: int
    kv_usage: float
    num_preempted: int = 0
    num_passes: int = 0
    """Forward passes run since the worker started (cumulative)."""
    num_streaming_sessions: int = 0
    """Streaming sessions open on this rank."""
    streaming_session_held_tokens: int = 0
    """Tokens of KV held in streaming-session slots."""


# --------------------------------------------------------------------------- agent trace


class AgentTraceEntry(msgspec.Struct, array_like=True, omit_defaults=True):
    """One finished choice's agent-trace row (``dyn.core.frontend.agent_trace``) before the
    trace's one writer dates it: sent by each HTTP worker process of ``dyn frontend
    --num-http-workers N`` to the process that writes the file (a pipe of its own), and handed
    straight to the writer in a single frontend.

    ``head``: the row's replay fields but ``timestamp`` (``input_length``, ``output_length``,
    ``hash_ids``, ``block_size``); ``tail``: the rest (``request_id`` ...). ``received`` and
    ``ended`` are ``time.perf_counter()`` values, CLOCK_MONOTONIC on Linux: one clock for every
    process of the host, so the writer dates rows from every process against the first one
    (``timestamp``) and a session's turns against its previous one's end (``delay_ms``)."""

    head: dict[str, Any]
    tail: dict[str, Any]
    received: float
    ended: float
    session: str | None = None


# --------------------------------------------------------------------------- discovery


class WorkerEndpoints(msgspec.Struct, omit_defaults=True):
    """ZMQ endpoints a worker advertises (``tcp://host:port``). ``None``: not offered."""

    request: str
    kv_events: str | None = None
    kv_replay: str | None = None
    metrics: str | None = None
    kv_events_plain: bool = False
    """The KV-event sockets are the engine's own (vLLM, SGLang), in plain ZMQ: a worker without
    ``--plane-keys``. Under the keys subscribers refuse such a record (a dyn worker relays its
    engine's events over CurveZMQ instead, ``dyn.core.worker.kv_relay``)."""


class WorkerRecord(msgspec.Struct, omit_defaults=True):
    """One worker instance as the discovery store holds it (JSON).

    ``kv_events_topic`` is the topic the KV-event PUB sends under; ``dp_size`` ranks share one
    instance id and are told apart by the ``data_parallel_rank`` of each event batch.
    """

    instance_id: int
    namespace: str
    model_name: str
    engine: str
    endpoints: WorkerEndpoints
    block_size: int
    total_kv_blocks: int
    max_num_batched_tokens: int
    dp_size: int = 1
    kv_events_topic: str = "kv-events"
    context_length: int | None = None
    pid: int | None = None
    started_at: float = 0.0
    version: str = ""
    priority_order: PriorityOrder = "lower_first"
    """How the engine reads ``GenerateRequest.priority``: ``lower_first`` (vLLM; SGLang with
    ``--schedule-low-priority-values-first``) or ``higher_first`` (SGLang's default)."""
    features: list[str] = []
    """Optional calls the engine serves: ``streaming_sessions``, ``pin_prefix``, ``tool_hints``
    (send it ``GenerateRequest.tools``), ``embed`` (``EmbedRequest``), ``pooling_only`` (it
    embeds and does not generate: ``--runner pooling``)."""
    tool_call_parser: str | None = None
    """How the served model writes tool calls (``--dyn-tool-call-parser``): a tool-call parser
    name the frontend uses unless it was given its own ``--tool-call-parser``."""
    reasoning_parser: str | None = None
    """How the served model writes its reasoning (``--dyn-reasoning-parser``), likewise."""
    model_path: str | None = None
    """Where the worker read its model's tokenizer and config (``--model-path``; None: the embedded
    dyn-tiny): a frontend that meets a model it does not serve yet loads the model from there."""
    tokenizer_path: str | None = None
    """Where the worker read its model's tokenizer files when not in ``model_path``
    (``--tokenizer``): a frontend that loads the model loads its tokenizer from there."""
    aliases: list[str] = []
    """Other names requests may use for ``model_name`` (``--served-model-name``'s names after the
    first)."""
    loras: dict[str, str] = {}
    """The LoRA adapters the worker serves (``--lora-modules``), name to path: a request whose
    ``model`` names one runs on the base model with it (``GenerateRequest.lora_name``)."""
    disaggregation_mode: DisaggregationMode = "agg"
    """The worker's role (``--disaggregation-mode``): a model with live ``prefill`` or ``decode``
    workers is served disaggregated (``dyn.core.router.disagg``)."""
    device: str | None = None
    """What the engine computes on: ``cpu``, or an accelerator's name (``cuda``, ...); None:
    not said (routed as an accelerator). ``--router-mode device-aware-weighted`` weighs CPU
    workers against the others."""
