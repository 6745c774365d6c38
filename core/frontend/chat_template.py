"""Chat templates: a model's Jinja template rendered the way vLLM renders it through transformers'
``apply_chat_template(..., tokenize=False)``, without importing transformers.

Contract:
- A template compiles once, in the sandbox transformers uses (``ImmutableSandboxedEnvironment`` with
  trim_blocks, lstrip_blocks, loop controls and the ``{% generation %}`` tag; ``raise_exception``,
  ``strftime_now``, ``dict``, ``namespace`` and transformers' ``tojson`` filter). ``compile_template``
  keeps the last 32 sources, so a client's own template (vLLM's per-request ``chat_template``)
  compiles once however often it is sent.
- Messages are first normalised as vLLM does for the "string" content format: content may be a
  string, None (""), or a list of OpenAI content parts whose texts are joined with "\\n"; any other
  part (image_url, input_audio, ...) is refused. Only role, content, name, the assistant's
  tool_calls (JSON-string arguments parsed into objects) and reasoning, and the tool's tool_call_id
  are kept. Then, as transformers does, keys whose value is None are dropped and reasoning is
  copied under ``reasoning_content`` and ``thinking``.
- ``continue_final_message`` cuts the rendering right after the final message's content, found
  with transformers' marker (so the prefilled text is continued, not closed).
- Anything the template or the messages get wrong raises ``ChatTemplateError`` with a message for
  the client; the caller turns it into a 400.
"""
from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import datetime
from functools import lru_cache
from typing import Any

import jinja2
import jinja2.ext
import jinja2.nodes
import jinja2.utils
from jinja2.sandbox import ImmutableSandboxedEnvironment

_CONTINUE_TAG = "CONTINUE_FINAL_MESSAGE_TAG "
"""transformers' marker appended to the final message to find where its content ends."""

_TEXT_PARTS = {"text": "text", "input_text": "text", "output_text": "text", "refusal": "refusal",
               "thinking": "thinking"}
"""Content part type -> the key holding its text (vLLM's text-like parts)."""

_REASONING_FIELDS = ("reasoning_content", "thinking", "reasoning")

_CACHE_SIZE = 32


class ChatTemplateError(ValueError):
    """A template or the messages rendered with it cannot produce a prompt; the message says why."""


class ChatTemplate:
    """One compiled chat template; immutable, so one instance serves every request concurrently."""

    __slots__ = ("source", "_template")

    def __init__(self, source: str) -> None:
        self.source = source
        try:
            self._template = _environment().from_string(source)
        except jinja2.TemplateSyntaxError as e:
            raise ChatTemplateError(f"line {e.lineno}: {e.message}") from None
        except jinja2.TemplateError as e:
            raise ChatTemplateError(str(e)) from None

    def render(self, messages: Sequence[Mapping[str, Any]], *, add_generation_prompt: bool = True,
               continue_final_message: bool = False, tools: Sequence[Mapping[str, Any]] | None = None,
               documents: Sequence[Mapping[str, Any]] | None = None,
               extra_kwargs: Mapping[str, Any] | None = None, bos_token: str | None = None,
               eos_token: str | None = None, special_tokens: Mapping[str, str] | None = None) -> str:
        """The prompt text for ``messages``.

        Template variables: ``special_tokens`` (a tokenizer's named special tokens), then
        ``bos_token``/``eos_token``, then ``extra_kwargs`` (vLLM's ``chat_template_kwargs``), which
        may also override add_generation_prompt, continue_final_message, tools and documents, as in
        vLLM, but never ``messages``.
        """
        variables: dict[str, Any] = dict(special_tokens) if special_tokens else {}
        if bos_token is not None:
            variables["bos_token"] = bos_token
        if eos_token is not None:
            variables["eos_token"] = eos_token
        if extra_kwargs:
            if "messages" in extra_kwargs:
                raise ChatTemplateError("chat_template_kwargs cannot set 'messages'; remove it and send the "
                                        "conversation in 'messages'")
            variables.update(extra_kwargs)
            add_generation_prompt = variables.pop("add_generation_prompt", add_generation_prompt)
            continue_final_message = variables.pop("continue_final_message", continue_final_message)
            tools = variables.pop("tools", tools)
            documents = variables.pop("documents", documents)
        if continue_final_message and add_generation_prompt:
            raise ChatTemplateError("continue_final_message cannot be used together with add_generation_prompt; "
                                    "set add_generation_prompt to false")
        _check_dicts("tools", tools)
        _check_dicts("documents", documents)

        chat = conversation(messages)
        if not chat:
            raise ChatTemplateError("cannot apply the chat template to an empty conversation; send at least "
                                    "one message")
        final = ""
        if continue_final_message:
            final = chat[-1].get("content", "")
            if "content" not in self.source:
                raise ChatTemplateError('continue_final_message is set but the chat template never reads '
                                        '"content"')
            chat[-1]["content"] = final + _CONTINUE_TAG

        try:
            text = self._template.render(messages=chat, tools=tools, documents=documents,
                                         add_generation_prompt=add_generation_prompt, **variables)
        except jinja2.TemplateError as e:
            raise ChatTemplateError(str(e)) from None
        except (TypeError, ValueError, KeyError, IndexError, AttributeError, ArithmeticError) as e:
            raise ChatTemplateError(f"the chat template failed ({type(e).__name__}: {e})") from None

        if continue_final_message:
            tag = _CONTINUE_TAG.strip()
            if final.strip() not in text or tag not in text:
                raise ChatTemplateError("continue_final_message is set but the final message does not appear in "
                                        "the rendered chat; the chat template drops part of it")
            at = text.rindex(tag)
            text = text[:at] if text.startswith(_CONTINUE_TAG, at) else text[:at].rstrip()
        return text


@lru_cache(maxsize=_CACHE_SIZE)
def compile_template(source: str) -> ChatTemplate:
    """The compiled template for ``source``, from a cache of the last 32 sources.
    Raises ChatTemplateError when it does not compile (errors are not cached)."""
    return ChatTemplate(source)


def conversation(messages: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Fresh message dicts as the template sees them (see the module docstring); the input is not changed."""
    chat: list[dict[str, Any]] = []
    for i, message in enumerate(messages):
        if not isinstance(message, Mapping):
            raise ChatTemplateError(f"messages[{i}] must be an object with a role and content")
        role = message.get("role")
        if not isinstance(role, str):
            raise ChatTemplateError(f"messages[{i}].role must be a string")
        msg: dict[str, Any] = {"role": role, "content": _text_content(message.get("content"), i)}
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


def _text_content(content: Any, i: int) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise ChatTemplateError(f"messages[{i}].content must be a string, a list of content parts or null")
    texts: list[str] = []
    for j, part in enumerate(content):
        if isinstance(part, str):
            text: Any = part
        elif isinstance(part, Mapping):
            kind = part.get("type")
            key = _TEXT_PARTS.get(kind) if isinstance(kind, str) else None
            if key is None:
                what = f"a {kind!r} part" if isinstance(kind, str) else "a part without a text 'type'"
                raise ChatTemplateError(f"messages[{i}].content[{j}]: only text content is supported by this "
                                        f"server, got {what}; send text parts only")
            text = part.get(key)
            if text is None:
                continue
        else:
            raise ChatTemplateError(f"messages[{i}].content[{j}] must be a content part object")
        if not isinstance(text, str):
            raise ChatTemplateError(f"messages[{i}].content[{j}]: the text must be a string")
        if text:
            texts.append(text)
    return "\n".join(texts)


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
                raise ChatTemplateError(f"messages[{i}].tool_calls[{j}].function.arguments is not valid JSON; "
                                        f"send the arguments as a JSON object string") from None
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


def _tojson(x: Any, ensure_ascii: bool = False, indent: int | str | None = None,
            separators: tuple[str, str] | None = None, sort_keys: bool = False) -> str:
    # transformers' variant: no HTML escaping, and json.dumps' formatting options
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

    def __init__(*args: Any, **kwargs: Any) -> None:  # noqa: N805 (same signature trick as jinja's Namespace)
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
                "Please rename the attribute.")


class _GenerationBlock(jinja2.ext.Extension):
    """transformers' ``{% generation %}...{% endgeneration %}`` (it marks assistant tokens for training
    masks); here it renders its body, in the same scope transformers gives it."""

    tags = {"generation"}

    def parse(self, parser: jinja2.parser.Parser) -> jinja2.nodes.CallBlock:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

    @staticmethod
    def _body(caller: Any) -> str:
        return caller()


@lru_cache(maxsize=1)
def _environment() -> ImmutableSandboxedEnvironment:
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[_GenerationBlock, jinja2.ext.loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    env.globals["dict"] = _TemplateDict()
    env.globals["namespace"] = _TemplateNamespace
    return env
