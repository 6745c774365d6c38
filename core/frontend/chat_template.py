"""Chat templates: a model's Jinja template rendered the way vLLM renders it through transformers'
``apply_chat_template(..., tokenize=False)``, without importing transformers.

Contract:
- A template compiles once, in the sandbox transformers uses (``ImmutableSandboxedEnvironment`` with
  trim_blocks, lstrip_blocks, loop controls and the ``{% generation %}`` tag; ``raise_exception``,
  ``strftime_now``, ``dict``, ``namespace`` and transformers' ``tojson`` filter). ``compile_template``
  keeps the last 32 sources, so a client's own template (vLLM's per-request ``chat_template``)
  compiles once however often it is sent.
- Messages are first normalised as vLLM normalises them for the template's content format
  (``ContentFormat``; ``auto``, the default, picks "openai" for a template that iterates over a
  message's content, else "string"). Content may be a string, None, or a list of OpenAI content
  parts. In the "string" format the texts are joined with "\\n" (None: ""); in the "openai"
  format content is always a list of parts (a string is one text part; None: no parts), text as
  ``{"type": "text", "text": ...}`` and media as ``{"type": "image"}`` (``audio``, ``video``).
  Media parts (``image_url``, ``input_audio``, ``audio_url``, ``video_url``) are refused unless
  the caller names the model's placeholder for their modality (``render(media=...)``); in the
  "string" format each item's placeholder stands on a line of its own before the text. Only role, content, name, the assistant's
  tool_calls (JSON-string arguments parsed into objects) and reasoning, and the tool's tool_call_id
  are kept. Then, as transformers does, keys whose value is None are dropped and reasoning is
  copied under ``reasoning_content`` and ``thinking``. A system message loses Claude Code's
  ``x-anthropic-billing-header`` line, as vLLM drops it (``BILLING_HEADER``).
- ``continue_final_message`` cuts the rendering right after the final message's content, found
  with transformers' marker (so the prefilled text is continued, not closed).
- Anything the template or the messages get wrong raises ``ChatTemplateError`` with a message for
  the client; the caller turns it into a 400.
- Rendering is bounded (``RenderLimits``), whoever wrote the template: no string, list or number the
  template builds, and not the output, may pass ``max_chars`` characters (``*``, ``**``, ``+``, ``%``,
  ``~``, padding and joining methods and filters are checked before they run), and a rendering
  that runs past ``max_seconds`` stops (checked at calls and loop iterations). Either raises
  ``RenderLimitError``.
"""

from __future__ import annotations

import json
import re
import string
import threading
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from functools import lru_cache
from itertools import islice
from typing import Any, Literal

import jinja2
import jinja2.ext
import jinja2.filters
import jinja2.nodes
import jinja2.runtime
import jinja2.utils
from jinja2.compiler import CodeGenerator, Frame, optimizeconst
from jinja2.lexer import Token
from jinja2.sandbox import ImmutableSandboxedEnvironment
from markupsafe import soft_str

from dyn.core.frontend.media import part_modality

_CONTINUE_TAG = "CONTINUE_FINAL_MESSAGE_TAG "
"""transformers' marker appended to the final message to find where its content ends."""

_TEXT_PARTS = {
    "text": "text",
    "input_text": "text",
    "output_text": "text",
    "refusal": "refusal",
    "thinking": "thinking",
}
"""Content part type -> the key holding its text (vLLM's text-like parts)."""

ContentFormat = Literal["auto", "string", "openai"]
"""vLLM's ``--chat-template-content-format``: message content as a string (text parts joined), as
a list of parts (``{"type": "text", "text": ...}``), or chosen by the template (``auto``: parts
when it loops over a message's content, as vLLM detects)."""

_ITERATES_CONTENT = re.compile(r"\{%-?\s*for\s+\w+\s+in\s+\w+(?:\[\s*['\"]content['\"]\s*\]|\.content\b)")
"""A template that loops over a message's content reads the parts (vLLM's "openai" format)."""

BILLING_HEADER = "x-anthropic-billing-header"
"""Claude Code's attribution line at the head of its system prompt. Its ``cch`` value changes on
every request, so a prompt that keeps it misses the prefix cache from there on: vLLM drops it from
system messages, and so does ``conversation``, whichever API brought it (a gateway may translate
Claude Code's requests into chat completions)."""

_REASONING_FIELDS = ("reasoning_content", "thinking", "reasoning")

_CACHE_SIZE = 32
_MAX_CACHED_SOURCE = 64 * 1024
"""A request template longer than this is compiled for its request only (``request_template``)."""
_MAX_INT_BITS = 1 << 16
"""The largest integer a template may compute (about 20,000 digits)."""
_MAX_INDENT = 64
_OUTPUT_BATCH = 1024


class ChatTemplateError(ValueError):
    """A template or the messages rendered with it cannot produce a prompt; the message says why."""


class RenderLimitError(ChatTemplateError):
    """A rendering would build more than ``RenderLimits`` allow."""


@dataclass(frozen=True, slots=True)
class RenderLimits:
    """The most one rendering may build and how long it may run."""

    max_chars: int = 8 << 20
    """Longest output, and longest string or list built on the way."""
    max_seconds: float = 2.0


class ChatTemplate:
    """One compiled chat template; immutable, so one instance serves every request concurrently."""

    __slots__ = ("source", "reads_parts", "_template", "_globals")

    def __init__(self, source: str) -> None:
        self.source = source
        self.reads_parts = _ITERATES_CONTENT.search(source) is not None
        """The template loops over a message's content parts (vLLM's "openai" content format)."""
        try:
            self._template = _environment().from_string(source)
        except jinja2.TemplateSyntaxError as e:
            raise ChatTemplateError(f"line {e.lineno}: {e.message}") from None
        except jinja2.TemplateError as e:
            raise ChatTemplateError(str(e)) from None
        # the template's globals (a ChainMap over the environment's) as one plain dict: jinja2
        # merges them into every render's context, and iterating a ChainMap took 11 us of a
        # 26 us render of a one-message chat
        self._globals: dict[str, Any] = dict(self._template.globals)

    def render(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        add_generation_prompt: bool = True,
        continue_final_message: bool = False,
        tools: Sequence[Mapping[str, Any]] | None = None,
        documents: Sequence[Mapping[str, Any]] | None = None,
        extra_kwargs: Mapping[str, Any] | None = None,
        bos_token: str | None = None,
        eos_token: str | None = None,
        special_tokens: Mapping[str, str] | None = None,
        limits: RenderLimits = RenderLimits(),
        media: Mapping[str, str] | None = None,
        content_format: ContentFormat = "auto",
    ) -> str:
        """The prompt text for ``messages``, rendered within ``limits``.

        Template variables: ``special_tokens`` (a tokenizer's named special tokens), then
        ``bos_token``/``eos_token``, then ``extra_kwargs`` (vLLM's ``chat_template_kwargs``), which
        may also override add_generation_prompt, continue_final_message, tools and documents, as in
        vLLM, but never ``messages``. ``media``: modality -> the model's placeholder text for one
        item (``{"image": "<image>"}``); media parts of other modalities are refused.
        ``content_format``: how content reaches the template (``ContentFormat``).
        """
        variables: dict[str, Any] = dict(special_tokens) if special_tokens else {}
        if bos_token is not None:
            variables["bos_token"] = bos_token
        if eos_token is not None:
            variables["eos_token"] = eos_token
        if extra_kwargs:
            if "messages" in extra_kwargs:
                raise ChatTemplateError(
                    "chat_template_kwargs cannot set 'messages'; remove it and send the "
                    "conversation in 'messages'"
                )
            variables.update(extra_kwargs)
            add_generation_prompt = variables.pop("add_generation_prompt", add_generation_prompt)
            continue_final_message = variables.pop("continue_final_message", continue_final_message)
            tools = variables.pop("tools", tools)
            documents = variables.pop("documents", documents)
        if continue_final_message and add_generation_prompt:
            raise ChatTemplateError(
                "continue_final_message cannot be used together with add_generation_prompt; "
                "set add_generation_prompt to false"
            )
        _check_dicts("tools", tools)
        _check_dicts("documents", documents)

        parts = self.reads_parts if content_format == "auto" else content_format == "openai"
        chat = conversation(messages, media, parts)
        if not chat:
            raise ChatTemplateError(
                "cannot apply the chat template to an empty conversation; send at least one message"
            )
        final = ""
        if continue_final_message:
            content = chat[-1].get("content", "")
            if "content" not in self.source:
                raise ChatTemplateError(
                    'continue_final_message is set but the chat template never reads "content"'
                )
            if isinstance(content, str):
                final = content
                chat[-1]["content"] = final + _CONTINUE_TAG
            else:  # parts: the last text part is continued, as transformers does
                last = next((p for p in reversed(content) if "text" in p), None)
                if last is None or content[-1] is not last:
                    raise ChatTemplateError(
                        "continue_final_message cannot continue a final message that ends with "
                        "an image, audio or video; end it with text"
                    )
                final = last["text"]
                last["text"] = final + _CONTINUE_TAG

        try:
            text = self._generate(
                limits,
                messages=chat,
                tools=tools,
                documents=documents,
                add_generation_prompt=add_generation_prompt,
                **variables,
            )
        except ChatTemplateError:
            raise
        except jinja2.TemplateError as e:
            raise ChatTemplateError(str(e)) from None
        except (
            TypeError,
            ValueError,
            KeyError,
            IndexError,
            AttributeError,
            ArithmeticError,
            RecursionError,
        ) as e:
            raise ChatTemplateError(f"the chat template failed ({type(e).__name__}: {e})") from None

        if continue_final_message:
            tag = _CONTINUE_TAG.strip()
            if final.strip() not in text or tag not in text:
                raise ChatTemplateError(
                    "continue_final_message is set but the final message does not appear in "
                    "the rendered chat; the chat template drops part of it"
                )
            at = text.rindex(tag)
            text = text[:at] if text.startswith(_CONTINUE_TAG, at) else text[:at].rstrip()
        return text

    def _generate(self, limits: RenderLimits, **variables: Any) -> str:
        """The template's output, taken a batch of chunks at a time and measured before it is
        joined (a loop may print the same long string many times)."""
        budget = _Budget(limits)
        outer = getattr(_active, "budget", None)
        _active.budget = budget
        try:
            template = self._template
            # what ``template.new_context(variables)`` makes, from plain dicts
            context = jinja2.runtime.new_context(
                template.environment,
                template.name,
                template.blocks,
                {**self._globals, **variables},
                shared=True,
                globals=self._globals,
            )
            chunks = template.root_render_func(context)
            out: list[str] = []
            size = 0
            while batch := list(islice(chunks, _OUTPUT_BATCH)):
                size += sum(map(len, batch))
                if size > budget.max_chars:
                    raise budget.too_large("its output")
                out += batch
            return "".join(out)
        finally:
            _active.budget = outer


@lru_cache(maxsize=_CACHE_SIZE)
def compile_template(source: str) -> ChatTemplate:
    """The compiled template for ``source``, from a cache of the last 32 sources.
    Raises ChatTemplateError when it does not compile (errors are not cached)."""
    return ChatTemplate(source)


def request_template(source: str) -> ChatTemplate:
    """A client's template: from ``compile_template``'s cache when it is of a usual size (under
    64 KiB), else compiled for this request only, so the cache holds no more than 2 MiB of sources."""
    if len(source) > _MAX_CACHED_SOURCE:
        return ChatTemplate(source)
    return compile_template(source)


def conversation(
    messages: Sequence[Mapping[str, Any]],
    media: Mapping[str, str] | None = None,
    parts: bool = False,
) -> list[dict[str, Any]]:
    """Fresh message dicts as the template sees them (see the module docstring); the input is not
    changed. ``media``: the placeholder per modality the model takes; ``parts``: the "openai"
    content format, content as a list of parts (else the "string" one)."""
    chat: list[dict[str, Any]] = []
    for i, message in enumerate(messages):
        if not isinstance(message, Mapping):
            raise ChatTemplateError(f"messages[{i}] must be an object with a role and content")
        role = message.get("role")
        if not isinstance(role, str):
            raise ChatTemplateError(f"messages[{i}].role must be a string")
        content = message.get("content")
        if role == "system":
            content = _without_billing_header(content)
        msg: dict[str, Any] = {"role": role, "content": _content(content, i, media, parts)}
        if role == "assistant":
            if (tool_calls := message.get("tool_calls")) is not None:
                msg["tool_calls"] = _tool_calls(tool_calls, i)
            reasoning = message.get("reasoning") or message.get("reasoning_content")
            if reasoning is not None:
                msg["reasoning"] = reasoning
                msg["reasoning_content"] = reasoning
        elif role == "tool" and (tool_call_id := message.get("tool_call_id")) is not None:
            msg["tool_call_id"] = tool_call_id
        if isinstance(name := message.get("name"), str):
            msg["name"] = name
        reasoning = next((msg[k] for k in _REASONING_FIELDS if msg.get(k) is not None), None)
        if reasoning is not None:
            msg = {"thinking": reasoning, **msg, "reasoning_content": reasoning}
        chat.append(msg)
    return chat


def without_billing_header(text: str) -> str:
    """``text`` without a leading ``BILLING_HEADER`` line ("" when nothing follows it)."""
    return text.partition("\n")[2] if text.startswith(BILLING_HEADER) else text


def _without_billing_header(content: Any) -> Any:
    """A system message's content, each text (a string, or a text part's) that starts with the
    billing line cut after it, and dropped when nothing is left (vLLM's rule)."""
    if isinstance(content, str):
        return without_billing_header(content)
    if not isinstance(content, list):
        return content
    kept = []
    for part in content:
        text = part if isinstance(part, str) else part.get("text") if isinstance(part, Mapping) else None
        if isinstance(text, str) and text.startswith(BILLING_HEADER):
            rest = without_billing_header(text)
            if rest:
                kept.append(rest if isinstance(part, str) else {**part, "text": rest})
            continue
        kept.append(part)
    return kept


def _content(
    content: Any, i: int, media: Mapping[str, str] | None, parts: bool
) -> str | list[dict[str, str]]:
    """A message's content as the template sees it (see the module docstring)."""
    if content is None:
        return [] if parts else ""
    if isinstance(content, str):
        return [{"type": "text", "text": content}] if parts else content
    if not isinstance(content, list):
        raise ChatTemplateError(f"messages[{i}].content must be a string, a list of content parts or null")
    texts: list[str] = []
    items: list[dict[str, str]] = []
    placeholders: list[str] = []
    for j, part in enumerate(content):
        if isinstance(part, str):
            text: Any = part
        elif isinstance(part, Mapping):
            kind = part.get("type")
            modality = part_modality(part)
            if modality is not None:
                placeholder = media.get(modality) if media is not None else None
                if placeholder is None:
                    raise ChatTemplateError(
                        f"messages[{i}].content[{j}]: this model takes no {modality} input (a "
                        f"{kind!r} part); send text, or serve a model that takes {modality}s"
                    )
                items.append({"type": modality})
                placeholders.append(placeholder)
                continue
            key = _TEXT_PARTS.get(kind) if isinstance(kind, str) else None
            if key is None:
                what = f"a {kind!r} part" if isinstance(kind, str) else "a part without a text 'type'"
                raise ChatTemplateError(
                    f"messages[{i}].content[{j}]: {what} is not supported by this server; send "
                    "text, image_url, input_audio, audio_url or video_url parts"
                )
            text = part.get(key)
            if text is None:
                continue
        else:
            raise ChatTemplateError(f"messages[{i}].content[{j}] must be a content part object")
        if not isinstance(text, str):
            raise ChatTemplateError(f"messages[{i}].content[{j}]: the text must be a string")
        if text:
            texts.append(text)
            items.append({"type": "text", "text": text})
    if parts:
        return items
    if not placeholders:
        return "\n".join(texts)
    return "\n".join([*placeholders, "\n".join(texts)] if texts else placeholders)


def _tool_calls(tool_calls: Any, i: int) -> Any:
    """vLLM's rule: templates get tool call arguments as objects, so JSON strings are parsed
    (empty or missing -> {})."""
    if not isinstance(tool_calls, list):
        return tool_calls
    out: list[Any] = []
    for j, call in enumerate(tool_calls):
        function = call.get("function") if isinstance(call, Mapping) else None
        if not isinstance(function, Mapping):
            out.append(call)
            continue
        args = function.get("arguments")
        if not args:
            args = {}
        elif not isinstance(args, (dict, list)):
            try:
                args = json.loads(args)
            except (ValueError, TypeError):
                raise ChatTemplateError(
                    f"messages[{i}].tool_calls[{j}].function.arguments is not valid JSON; "
                    f"send the arguments as a JSON object string"
                ) from None
        out.append({**call, "function": {**function, "arguments": args}})
    return out


def _check_dicts(what: str, items: Any) -> None:
    if items is None:
        return
    if not isinstance(items, (list, tuple)) or not all(isinstance(t, Mapping) for t in items):
        raise ChatTemplateError(f"{what} must be a list of JSON objects")


# --------------------------------------------------------------------------- the sandbox


def _raise_exception(message: Any) -> None:
    raise jinja2.TemplateError(message)


def _tojson(
    x: Any,
    ensure_ascii: bool = False,
    indent: int | str | None = None,
    separators: tuple[str, str] | None = None,
    sort_keys: bool = False,
) -> str:
    # transformers' variant: no HTML escaping, and json.dumps' formatting options
    budget = _budget()
    width = indent if isinstance(indent, int) else len(indent) if isinstance(indent, str) else 0
    if width > _MAX_INDENT or (separators and sum(len(str(s)) for s in separators) > _MAX_INDENT):
        raise RenderLimitError(f"tojson indents and separators are limited to {_MAX_INDENT} characters")
    budget.check(_text_size(x, budget.max_chars, width), "a JSON string")
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _strftime_now(format: str) -> str:
    return datetime.now().strftime(format)


class _TemplateDict:
    """``dict`` for templates, without attribute access to the real type."""

    def __call__(self, *args: Any, **kwargs: Any) -> dict[Any, Any]:
        return dict(*args, **kwargs)

    def fromkeys(self, *args: Any, **kwargs: Any) -> dict[Any, Any]:
        return dict.fromkeys(*args, **kwargs)


class _TemplateNamespace(jinja2.utils.Namespace):
    """``namespace`` that refuses underscore attributes, as transformers' does."""

    def __init__(*args: Any, **kwargs: Any) -> None:
        self, args = args[0], args[1:]
        attrs = dict(*args, **kwargs)
        for name in attrs:
            _TemplateNamespace._check_name(name)
        jinja2.utils.Namespace.__init__(self, attrs)

    def __setitem__(self, name: str, value: Any) -> None:
        _TemplateNamespace._check_name(name)
        jinja2.utils.Namespace.__setitem__(self, name, value)

    @staticmethod
    def _check_name(name: Any) -> None:
        if isinstance(name, str) and name.startswith("_"):
            raise jinja2.exceptions.SecurityError(
                f"Chat templates cannot store underscore-prefixed attributes on a namespace, but got {name!r}. "
                "Please rename the attribute."
            )


class _GenerationBlock(jinja2.ext.Extension):
    """transformers' ``{% generation %}...{% endgeneration %}`` (it marks assistant tokens for training
    masks); here it renders its body, in the same scope transformers gives it."""

    tags = {"generation"}

    def parse(self, parser: jinja2.parser.Parser) -> jinja2.nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

    @staticmethod
    def _body(caller: Any) -> str:
        return caller()


# --------------------------------------------------------------------------- render limits


class _Budget:
    """The limits of the rendering running on this thread, and its deadline."""

    __slots__ = ("max_chars", "max_seconds", "deadline", "ticks")

    def __init__(self, limits: RenderLimits) -> None:
        self.max_chars = limits.max_chars
        self.max_seconds = limits.max_seconds
        self.deadline = time.monotonic() + limits.max_seconds
        self.ticks = 0

    def tick(self) -> None:
        self.ticks += 1
        if not self.ticks & 63 and time.monotonic() > self.deadline:
            raise self.expired()

    def expired(self) -> RenderLimitError:
        return RenderLimitError(
            f"rendering the chat template took more than {self.max_seconds:g} s; the "
            "template or the messages ask for too much work"
        )

    def check(self, size: int, what: str) -> None:
        if size > self.max_chars:
            raise self.too_large(what)

    def too_large(self, what: str) -> RenderLimitError:
        return RenderLimitError(
            f"the chat template would make {what} longer than {self.max_chars} characters, "
            "the most one rendering may build"
        )


_active = threading.local()
_UNTIMED = RenderLimits(max_seconds=float("inf"))


def _budget() -> _Budget:
    """The running rendering's budget; outside one (constant folding while compiling), the
    default size limits without a deadline."""
    budget = getattr(_active, "budget", None)
    return budget if budget is not None else _Budget(_UNTIMED)


def _text_size(value: Any, limit: int, indent: int = 0) -> int:
    """About how many characters ``str(value)`` (or its JSON, with ``indent``) would take, counted
    without building it; stops counting once past ``limit``."""
    size = 0
    stack = [(value, 1)]
    while stack and size <= limit:
        item, depth = stack.pop()
        size += depth * indent
        if isinstance(item, str):
            size += len(item) + 2
        elif isinstance(item, Mapping):
            size += 2 + 2 * len(item)
            stack.extend((key, depth + 1) for key in item)
            stack.extend((val, depth + 1) for val in item.values())
        elif isinstance(item, (list, tuple, set, frozenset)):
            size += 2 + 2 * len(item)
            stack.extend((x, depth + 1) for x in item)
        elif isinstance(item, int):
            size += item.bit_length() // 3 + 2
        else:
            size += 8
    return size


def _sized(value: Any) -> int | None:
    return len(value) if isinstance(value, (str, list, tuple)) else None


_PRINTF_SPEC = re.compile(r"%(?:\([^)]*\))?[-#0 +]*(\*|\d*)(?:\.(\*|\d*))?[hlL]?[a-zA-Z%]")


def _check_printf(fmt: str, args: Any, budget: _Budget) -> None:
    """``fmt % args`` must not pad or print past the limit (``%999999999d``, ``%*d``, ``%.9999999f``)."""
    for spec in _PRINTF_SPEC.finditer(fmt):
        for part in spec.groups():
            if part == "*":
                for arg in args if isinstance(args, tuple) else (args,):
                    if isinstance(arg, int):
                        budget.check(arg, "a formatted string")
            elif part:
                budget.check(int(part), "a formatted string")
    budget.check(len(fmt) + _text_size(args, budget.max_chars), "a formatted string")


def _check_format(fmt: str, args: tuple, kwargs: Mapping[str, Any], budget: _Budget) -> None:
    """``fmt.format(...)`` must not pad past the limit (``{:>999999999}``, ``{:{}}``)."""
    try:
        fields = list(string.Formatter().parse(fmt))
    except ValueError:
        return  # format() raises the same error itself
    for _, _, spec, _ in fields:
        if not spec:
            continue
        for digits in re.findall(r"\d+", spec):
            budget.check(int(digits), "a formatted string")
        if "{" in spec:
            for arg in (*args, *kwargs.values()):
                if isinstance(arg, int):
                    budget.check(arg, "a formatted string")
    budget.check(len(fmt) + _text_size((args, kwargs), budget.max_chars), "a formatted string")


def _check_binop(operator: str, left: Any, right: Any, budget: _Budget) -> None:
    if operator == "*":
        if isinstance(left, int) and isinstance(right, int):
            if left.bit_length() + right.bit_length() > _MAX_INT_BITS:
                raise _too_big_number()
            return
        for seq, times in ((left, right), (right, left)):
            size = _sized(seq)
            if size is not None and isinstance(times, int):
                budget.check(size * times, "a repeated string or list")
    elif operator == "**":
        if (
            isinstance(left, int)
            and isinstance(right, int)
            and right > 0
            and left not in (0, 1, -1)
            and left.bit_length() * right > _MAX_INT_BITS
        ):
            raise _too_big_number()
    elif operator == "+":
        a, b = _sized(left), _sized(right)
        if a is not None and b is not None:
            budget.check(a + b, "a joined string or list")
    elif operator == "%" and isinstance(left, str):
        _check_printf(left, right, budget)


def _too_big_number() -> RenderLimitError:
    return RenderLimitError(
        f"the chat template would compute a number of more than {_MAX_INT_BITS} bits, the "
        "largest one rendering may"
    )


def _check_str_method(
    owner: str, name: str, args: tuple, kwargs: Mapping[str, Any], budget: _Budget
) -> tuple:
    """Check a string method that can build a longer string; return the arguments to call it
    with (``join``'s iterable read into a list, so it is measured and joined once)."""
    if name in ("center", "ljust", "rjust", "zfill"):
        width = args[0] if args else kwargs.get("width")
        if isinstance(width, int):
            budget.check(width, "a padded string")
    elif name == "expandtabs":
        tabsize = args[0] if args else kwargs.get("tabsize", 8)
        if isinstance(tabsize, int):
            budget.check(len(owner) + owner.count("\t") * tabsize, "a string with tabs expanded")
    elif name == "replace" and len(args) >= 2 and isinstance(args[0], str) and isinstance(args[1], str):
        old, new = args[0], args[1]
        if len(new) > len(old):
            count = owner.count(old) if old else len(owner) + 1
            if len(args) > 2 and isinstance(args[2], int) and args[2] >= 0:
                count = min(count, args[2])
            budget.check(len(owner) + count * (len(new) - len(old)), "a string with replacements")
    elif name == "join" and args:
        items = list(args[0])
        budget.check(
            len(owner) * max(len(items) - 1, 0) + sum(len(i) if isinstance(i, str) else 0 for i in items),
            "a joined string",
        )
        return (items, *args[1:])
    elif name in ("format", "format_map"):
        _check_format(
            owner,
            args if name == "format" else (),
            kwargs if name == "format" else (args[0] if args and isinstance(args[0], Mapping) else {}),
            budget,
        )
    return args


class _BoundedCodeGenerator(CodeGenerator):
    """Jinja's code generator, but ``~`` joins through ``environment.bounded_concat``."""

    @optimizeconst
    def visit_Concat(self, node: jinja2.nodes.Concat, frame: Frame) -> None:
        if frame.eval_ctx.volatile or frame.eval_ctx.autoescape:
            super().visit_Concat(node, frame)
            return
        self.write("environment.bounded_concat((")
        for arg in node.nodes:
            self.visit(arg, frame)
            self.write(", ")
        self.write("))")


_TICK_FILTER = "dyn_loop_budget"


class _LoopBudget(jinja2.ext.Extension):
    """Every ``{% for %}`` body starts with a budget check (``{% set dyn_loop_budget = none |
    dyn_loop_budget %}``), so nested loops that print nothing still stop at the deadline."""

    def filter_stream(self, stream: jinja2.lexer.TokenStream) -> Iterator[Token]:
        state = 0  # 1: a block tag opened; 2: it is a for statement
        for token in stream:
            yield token
            if token.type == "block_begin":
                state = 1
            elif state == 1:
                state = 2 if token.test("name:for") else 0
            elif state == 2 and token.type == "block_end":
                state = 0
                line = token.lineno
                yield Token(line, "block_begin", "{%")
                yield Token(line, "name", "set")
                yield Token(line, "name", _TICK_FILTER)
                yield Token(line, "assign", "=")
                yield Token(line, "name", "none")
                yield Token(line, "pipe", "|")
                yield Token(line, "name", _TICK_FILTER)
                yield Token(line, "block_end", "%}")


@jinja2.pass_context  # a context filter is never folded into a constant while compiling
def _loop_tick(_context: Any, _value: Any) -> None:
    budget = _active.budget
    budget.ticks += 1
    if not budget.ticks & 63 and time.monotonic() > budget.deadline:
        raise budget.expired()


class _BoundedEnvironment(ImmutableSandboxedEnvironment):
    """transformers' sandbox, with every operation that can build a large value checked first
    against the running rendering's ``RenderLimits``."""

    intercepted_binops = frozenset({"*", "**", "+", "%"})
    code_generator_class = _BoundedCodeGenerator

    def call_binop(self, context: jinja2.runtime.Context, operator: str, left: Any, right: Any) -> Any:
        if left.__class__ is not int or right.__class__ is not int or operator in ("*", "**"):
            _check_binop(operator, left, right, _budget())
        return self.binop_table[operator](left, right)

    def call(__self, __context: jinja2.runtime.Context, __obj: Any, *args: Any, **kwargs: Any) -> Any:
        budget = _budget()
        budget.tick()
        target = getattr(__obj, "__wrapped__", __obj)  # the sandbox wraps str.format
        owner = getattr(target, "__self__", None)
        if isinstance(owner, str):
            args = _check_str_method(owner, getattr(target, "__name__", ""), args, kwargs, budget)
        return super().call(__context, __obj, *args, **kwargs)

    def bounded_concat(self, values: Iterable[Any]) -> str:
        budget = _budget()
        parts = []
        size = 0
        for value in values:
            if not isinstance(value, str):
                budget.check(size + _text_size(value, budget.max_chars), "a joined string")
                value = str(value)
            size += len(value)
            budget.check(size, "a joined string")
            parts.append(value)
        return "".join(parts)


def _finalize(value: Any) -> Any:
    """Every ``{{ value }}``: a container is measured before it is printed."""
    if value.__class__ is not str and not isinstance(value, (str, int, float, jinja2.Undefined)):
        budget = _budget()
        budget.check(_text_size(value, budget.max_chars), "a printed value")
    return value


def _bounded_filters() -> dict[str, Any]:
    """Jinja's filters that can build much more than they are given, checked first."""
    f = jinja2.filters

    def center(value: Any, width: int = 80) -> str:
        if isinstance(width, int):
            _budget().check(width, "a padded string")
        return f.do_center(value, width)

    def indent(s: Any, width: int | str = 4, first: bool = False, blank: bool = False) -> str:
        text = str(s)
        pad = width if isinstance(width, int) else len(str(width))
        _budget().check(len(text) + (text.count("\n") + 1) * pad, "an indented string")
        return f.do_indent(text, width, first, blank)

    @jinja2.pass_environment
    def wordwrap(
        environment: Any,
        s: str,
        width: int = 79,
        break_long_words: bool = True,
        wrapstring: str | None = None,
        break_on_hyphens: bool = True,
    ) -> str:
        lines = len(s) // max(width, 1) + s.count("\n") + 1 if isinstance(width, int) else 1
        _budget().check(len(s) + lines * len(wrapstring or "\n"), "a wrapped string")
        return f.do_wordwrap(environment, s, width, break_long_words, wrapstring, break_on_hyphens)

    def format_(value: str, *args: Any, **kwargs: Any) -> str:
        _check_printf(str(value), kwargs or args, _budget())
        return f.do_format(value, *args, **kwargs)

    @jinja2.pass_eval_context
    def replace(eval_ctx: Any, s: str, old: str, new: str, count: int | None = None) -> str:
        limit = -1 if count is None else count
        _check_str_method(str(s), "replace", (str(old), str(new), limit), {}, _budget())
        return f.do_replace(eval_ctx, s, old, new, count)

    @jinja2.pass_eval_context
    def join(eval_ctx: Any, value: Iterable[Any], d: str = "", attribute: Any = None) -> str:
        items = list(value)
        budget = _budget()
        budget.check(len(d) * max(len(items) - 1, 0) + _text_size(items, budget.max_chars), "a joined string")
        return f.do_join(eval_ctx, items, d, attribute)

    def batch(value: Iterable[Any], linecount: int, fill_with: Any = None) -> Any:
        if fill_with is not None and isinstance(linecount, int):
            _budget().check(linecount, "a batch")
        return f.do_batch(value, linecount, fill_with)

    def slice_(value: Any, slices: int, fill_with: Any = None) -> Any:
        if isinstance(slices, int):
            _budget().check(slices, "a list of slices")
        return f.do_slice(value, slices, fill_with)

    def string_(value: Any) -> str:
        budget = _budget()
        budget.check(_text_size(value, budget.max_chars), "a printed value")
        return soft_str(value)

    @jinja2.pass_environment
    def sum_(environment: Any, iterable: Iterable[Any], attribute: Any = None, start: Any = 0) -> Any:
        if _sized(start) is not None:
            items = list(iterable)
            budget = _budget()
            budget.check(_text_size(items, budget.max_chars), "a summed string or list")
            iterable = items
        return f.do_sum(environment, iterable, attribute, start)

    return {
        "center": center,
        "indent": indent,
        "wordwrap": wordwrap,
        "format": format_,
        "replace": replace,
        "join": join,
        "batch": batch,
        "slice": slice_,
        "string": string_,
        "sum": sum_,
        "pprint": string_,
        _TICK_FILTER: _loop_tick,
    }


def _lipsum(n: int = 5, html: bool = True, min: int = 20, max: int = 100) -> str:
    if not all(isinstance(x, int) for x in (n, min, max)) or n > 100 or max > 1000:
        raise RenderLimitError("lipsum() is limited to 100 paragraphs of 1000 words")
    return jinja2.utils.generate_lorem_ipsum(n, html, min, max)


@lru_cache(maxsize=1)
def _environment() -> ImmutableSandboxedEnvironment:
    env = _BoundedEnvironment(
        trim_blocks=True,
        lstrip_blocks=True,
        finalize=_finalize,
        extensions=[_GenerationBlock, jinja2.ext.loopcontrols, _LoopBudget],
    )
    env.filters.update(_bounded_filters())
    env.globals["lipsum"] = _lipsum
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    env.globals["dict"] = _TemplateDict()
    env.globals["namespace"] = _TemplateNamespace
    return env
