"""How much work one request may ask of the frontend: the ``--max-*`` flags.

Every bound is checked before the work it bounds (bytes before tokenizing, counts before fanning
out, the size of a whole response before generating it), and a request over one is a 400 that
names the field and the flag that raises the limit. ``chat_prompt_bytes`` and ``completion_prompt_bytes`` walk
the decoded request once, in time proportional to its size, and stop as soon as a bound is
crossed; ``check_response_bytes`` bounds what a non-streaming response may hold once the prompts
(and so every choice's ``max_tokens``) are known.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from dyn.core.frontend.media import is_media_part
from dyn.core.protocol.errors import ApiError, bad_request
from dyn.core.protocol.openai import ChatCompletionRequest, CompletionRequest, _GenerationRequest

MIN_PROMPT_BYTES = 1 << 20
MAX_RESPONSE_BYTES = 64 << 20
"""The default ``--max-response-bytes``: the largest non-streaming response a request may ask for."""
TOKEN_BYTES = 4
LOGPROB_ENTRY_BYTES = 40
"""Lower bounds on what one output token adds to a JSON response: its text, and each logprob
entry (the token's own and each of its top alternatives: a token string, a number, and in chat
its bytes; dyn-tiny's average is 74 in chat, 33 in completions). An estimate from these never
exceeds the real size by much, so a refused request would have been over the cap."""
BYTES_PER_TOKEN = 32
"""The default ``--max-prompt-bytes``: this many bytes per token of the context length (no
tokenizer writes a token in more), at least ``MIN_PROMPT_BYTES``."""


@dataclass(frozen=True, slots=True)
class RequestLimits:
    """The frontend's per-request bounds. ``max_prompt_bytes`` None: derived from the model's
    context length (``prompt_bytes_limit``)."""

    max_n: int = 128
    max_prompts: int = 1024
    max_prompt_bytes: int | None = None
    max_stop_strings: int = 64
    max_stop_string_chars: int = 4096
    trust_request_chat_template: bool = False
    max_render_seconds: float = 2.0
    """Longest a chat template may take to render one request (the model's or the request's)."""
    max_response_bytes: int = MAX_RESPONSE_BYTES
    """Largest non-streaming response one request may ask for (``check_response_bytes``)."""

    def prompt_bytes_limit(self, context_length: int) -> int:
        """``max_prompt_bytes``, or 32 bytes per token of ``context_length`` and at least 1 MiB."""
        if self.max_prompt_bytes is not None:
            return self.max_prompt_bytes
        return max(BYTES_PER_TOKEN * context_length, MIN_PROMPT_BYTES)


def chat_prompt_bytes(
    req: ChatCompletionRequest, limits: RequestLimits, byte_limit: int, context_length: int
) -> int:
    """Refuse a chat request over a bound (``ApiError`` 400); return the bytes of its prompt
    text (messages, tools, documents, chat_template_kwargs and a request chat_template)."""
    _check_fan_out(req, 1, limits, "n")
    _check_stops(req, limits)
    kwargs = req.chat_template_kwargs or {}
    if not limits.trust_request_chat_template and (
        req.chat_template is not None or kwargs.get("chat_template") is not None
    ):
        raise bad_request(
            "this server renders prompts with its own chat template only: remove "
            "'chat_template' from the request, or start the frontend with "
            "--trust-request-chat-template to accept one",
            param="chat_template",
        )
    nvext = req.nvext
    if nvext is not None and nvext.token_data is not None:
        _check_token_count(len(nvext.token_data), context_length, "nvext.token_data")
    size = json_size(req.messages, byte_limit, skip=is_media_part)  # media have bounds of their own
    size += json_size((req.tools, req.documents, req.chat_template_kwargs, req.chat_template), byte_limit)
    if size > byte_limit:
        raise _too_many_bytes("messages", "messages, tools and documents", byte_limit)
    return size


def completion_prompt_bytes(
    req: CompletionRequest, limits: RequestLimits, byte_limit: int, context_length: int
) -> int:
    """Refuse a completions request over a bound (``ApiError`` 400); return the bytes of its
    prompt text."""
    prompt = req.prompt
    if isinstance(prompt, str) or not prompt or not isinstance(prompt[0], (str, list)):
        items: list[Any] = [prompt]
    else:
        items = prompt
    _check_fan_out(req, len(items), limits, "prompt" if len(items) > 1 else "n")
    _check_stops(req, limits)
    size = 0
    for item in items:
        if isinstance(item, str):
            size += _str_bytes(item, byte_limit - size)
            if size > byte_limit:
                raise _too_many_bytes("prompt", "prompt", byte_limit)
        elif isinstance(item, list):
            _check_token_count(len(item), context_length, "prompt")
    return size


def check_response_bytes(
    max_tokens: list[int],
    prompt_tokens: list[int],
    n: int,
    top_logprobs: int | None,
    prompt_logprobs: int | None,
    limit: int,
    *,
    echo_bytes: int = 0,
) -> None:
    """Refuse (``ApiError`` 400) a non-streaming request whose whole response could be larger than
    ``limit`` bytes: each prompt's ``n`` choices of up to ``max_tokens`` tokens, each token with
    ``top_logprobs + 1`` logprob entries when logprobs are asked for (``None``: not), each
    prompt's own logprobs, and ``echo_bytes`` of echoed prompt text. A streamed response is sent
    as it is made and is not bounded here."""
    per_token = TOKEN_BYTES + (0 if top_logprobs is None else (top_logprobs + 1) * LOGPROB_ENTRY_BYTES)
    tokens = n * sum(max_tokens)
    size = tokens * per_token + echo_bytes
    if prompt_logprobs is not None:
        size += sum(prompt_tokens) * (prompt_logprobs + 1) * LOGPROB_ENTRY_BYTES
    if size <= limit:
        return
    logprobs = "" if top_logprobs is None else f" with {top_logprobs + 1} logprob entries each"
    raise bad_request(
        f"this response could hold {tokens} tokens ({n} choice(s) x max_tokens{logprobs}), at "
        f"least {_bytes(size)} of JSON; this server returns at most {_bytes(limit)} in one "
        'response. Stream it ("stream": true), lower max_tokens, n or the logprobs asked for, or '
        "raise --max-response-bytes",
        param="max_tokens",
    )


def _bytes(size: int) -> str:
    return f"{size / (1 << 20):.0f} MiB" if size >= 1 << 20 else f"{size} bytes"


def json_size(value: Any, limit: int, skip: Callable[[dict], Any] | None = None) -> int:
    """About how many bytes ``value`` (decoded JSON) takes as JSON text: strings as UTF-8 plus
    quotes, every other value and separator a few bytes. Stops counting once past ``limit``.
    ``skip``: objects it is true of count as empty (media parts, whose size is bounded apart)."""
    size = 0
    stack = [value]
    pop, push = stack.pop, stack.append
    while stack:
        item = pop()
        if isinstance(item, str):
            size += 2 + (len(item) if item.isascii() else _str_bytes(item, limit - size))
        elif isinstance(item, dict):
            size += 2
            if skip is not None and skip(item):
                continue
            for key, val in item.items():
                key = key if isinstance(key, str) else str(key)
                size += 4 + (len(key) if key.isascii() else _str_bytes(key, limit))
                push(val)
        elif isinstance(item, (list, tuple)):
            size += 2 + len(item)
            stack.extend(item)
        else:
            size += 4
        if size > limit:
            break
    return size


def _str_bytes(text: str, room: int) -> int:
    """UTF-8 length of ``text``; encoded only when its length in characters leaves it in doubt."""
    if text.isascii() or len(text) > room:
        return len(text)
    return len(text.encode("utf-8", "surrogatepass"))


def _check_fan_out(req: _GenerationRequest, prompts: int, limits: RequestLimits, param: str) -> None:
    count, name = (req.generations, "best_of") if req.generations > req.n else (req.n, "n")
    if count > limits.max_n:
        raise bad_request(
            f"{name} is {count}; this server allows at most {limits.max_n} choices per request "
            "(raise it with --max-n)",
            param=name,
        )
    if prompts * count > limits.max_prompts:
        asked = f"{prompts} prompts x {name}={count}" if prompts > 1 else f"{name}={count}"
        raise bad_request(
            f"this request asks for {prompts * count} generations ({asked}); this server "
            f"allows at most {limits.max_prompts} per request (raise it with --max-prompts)",
            param=param,
        )


def _check_stops(req: _GenerationRequest, limits: RequestLimits) -> None:
    stop = req.stop
    if stop is None:
        return
    stops = [stop] if isinstance(stop, str) else stop
    if len(stops) > limits.max_stop_strings:
        raise bad_request(
            f"stop holds {len(stops)} strings; this server allows at most "
            f"{limits.max_stop_strings} (raise it with --max-stop-strings)",
            param="stop",
        )
    for i, s in enumerate(stops):
        if len(s) > limits.max_stop_string_chars:
            where = "stop" if isinstance(stop, str) else f"stop[{i}]"
            raise bad_request(
                f"{where} is {len(s)} characters long; this server allows stop strings of at "
                f"most {limits.max_stop_string_chars} (raise it with --max-stop-string-chars)",
                param=where,
            )


def _check_token_count(count: int, context_length: int, param: str) -> None:
    if count > context_length:
        raise bad_request(
            f"This model's maximum context length is {context_length} tokens. However, {param} "
            f"holds {count} token ids; send at most {context_length}.",
            param=param,
            code="context_length_exceeded",
        )


def _too_many_bytes(param: str, what: str, limit: int) -> ApiError:
    return bad_request(
        f"the prompt text of this request ({what}) is more than {limit} bytes, the most this "
        "server accepts (raise it with --max-prompt-bytes)",
        param=param,
    )
