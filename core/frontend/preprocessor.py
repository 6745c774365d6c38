"""Turning an OpenAI request into engine requests: template, tokenize, truncate, check the
context, map sampling and stop parameters.

``Preprocessor`` is built once per served model (tokenizer loaded, chat template compiled) and is
pure CPU work with no I/O. Its bounds (``RequestLimits``) are checked before any of that work, on
the request as decoded. The event loop calls ``chat_async`` / ``completions_async``: a request with
little text is preprocessed inline (a thread hop would cost more than the work), except that its
text (a short chat prompt, a completions prompt) is tokenized in the encode thread, in batches with
the prompts queued meanwhile (``dyn.core.frontend.encode_thread``); a larger request goes to a
worker thread, a few at a time, so the loop keeps answering. The output, ``Prompt``, is what every
choice of the request shares; ``engine_request`` makes the per-choice ``GenerateRequest``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol

import anyio
import anyio.to_thread
import msgspec

from dyn.core.frontend import limits as bounds
from dyn.core.frontend.chat_template import (
    ChatTemplate,
    ChatTemplateError,
    ContentFormat,
    RenderLimitError,
    RenderLimits,
    compile_template,
    request_template,
)
from dyn.core.frontend.detokenizer import StopMatcher, stop_matcher
from dyn.core.frontend.limits import RequestLimits
from dyn.core.frontend.tokenizer import Tokenizer
from dyn.core.messages import (
    GenerateRequest,
    MediaItem,
    MediaModality,
    OutputConstraint,
    SamplingParams,
    StopConditions,
    ToolSpec,
)
from dyn.core.model.info import ModelInfo
from dyn.core.model.multimodal import (
    COUNT_ERRORS,
    MediaProcessing,
    placeholder_ids,
    placeholder_rules,
    uncounted_modalities,
)
from dyn.core.model.newlines import Newlines, UnplacedItemError, merge_newlines
from dyn.core.model.vision import ImageTokens
from dyn.core.protocol.errors import ApiError, bad_request
from dyn.core.protocol.openai import ChatCompletionRequest, CompletionRequest, _GenerationRequest, token_rules


class MediaInput(Protocol):
    """A media part as the frontend loaded it (``dyn.core.frontend.media.LoadedMedia``)."""

    @property
    def modality(self) -> MediaModality: ...
    @property
    def data(self) -> bytes: ...
    @property
    def mime(self) -> str: ...
    @property
    def mm_hash(self) -> str: ...
    @property
    def width(self) -> int | None: ...
    @property
    def height(self) -> int | None: ...
    @property
    def frames(self) -> int | None: ...
    @property
    def sample_rate(self) -> int | None: ...
    @property
    def param(self) -> str: ...


@dataclass(slots=True)
class Prompt:
    """One tokenized prompt and the generation settings of the request it came from."""

    token_ids: list[int]
    text: str | None
    """The prompt as text (rendered template or the client's text); None when given as ids."""
    sampling: SamplingParams
    stop: StopConditions
    stop_strings: list[str]
    pretokenized: bool = False
    """The client gave token ids (``nvext.token_data`` or a token prompt): nothing was tokenized."""
    max_thinking_tokens: int | None = None
    stop_matcher: StopMatcher | None = None
    """``stop_strings`` compiled (built here, off the event loop when they are long)."""
    media: list[MediaItem] = dataclasses.field(default_factory=list)
    """The images (audio, video) of the messages, at their placeholder tokens in ``token_ids``."""


INLINE_WORK_BYTES = 4096
"""Requests with at most this many bytes of prompt text and stop strings are preprocessed on the
event loop. Measured on dyn-tiny (2 cores, loaded): rendering + tokenizing a chat costs about
250 ns a byte (55 us at 64 bytes, 290 us at 1 KiB, 1.0 ms at 4 KiB, 1.8 ms at 8 KiB) and a hop to a
worker thread and back about 52 us, so up to 4 KiB the hop would add 5% or more to the work,
and the loop is never held for more than about a millisecond."""
PREPROCESS_THREADS = 4
"""Larger requests preprocessed at once; the others wait their turn."""


class Preprocessor:
    """Template + tokenizer + context rules of one model."""

    def __init__(
        self,
        info: ModelInfo,
        tokenizer: Tokenizer | None = None,
        chat_template: str | None = None,
        limits: RequestLimits | None = None,
        default_template_kwargs: Mapping[str, Any] | None = None,
        content_format: ContentFormat = "auto",
        exclude_tools_when_none: bool = False,
        media_processing: MediaProcessing | None = None,
    ) -> None:
        """``chat_template``: a template source that replaces the model's (``--chat-template``);
        ``ChatTemplateError`` when it does not compile. ``limits``: the per-request bounds
        (default ``RequestLimits()``). ``default_template_kwargs``: chat template arguments every
        request gets unless it sets them itself (vLLM's ``--default-chat-template-kwargs``).
        ``content_format``: how message content reaches the template (vLLM's
        ``--chat-template-content-format``); ``exclude_tools_when_none``: see the attribute;
        ``media_processing``: how the engine processes media beyond the model's files (vLLM's
        ``--mm-processor-kwargs`` and ``--media-io-kwargs``), for counting placeholders."""
        self.content_format: ContentFormat = content_format
        self.exclude_tools_when_none = exclude_tools_when_none
        """A request with ``tool_choice: "none"`` renders no tools (vLLM's
        ``--exclude-tools-when-tool-choice-none``)."""
        self.default_template_kwargs = dict(default_template_kwargs or {})
        self.info = info
        """The model as served: ``model_info`` with the context the live workers serve (``cap_context``)."""
        self.model_info = info
        """The model's own metadata, context included."""
        self.tokenizer = tokenizer or Tokenizer.from_model(info)
        source = chat_template if chat_template is not None else self.tokenizer.chat_template
        self.chat_template: ChatTemplate | None = compile_template(source) if source else None
        self.template_given = chat_template is not None
        """The template is the server's ``--chat-template``, not the tokenizer's own (scoring
        applies only such a one: ``dyn.core.frontend.score_template``)."""
        self._late_system: bool | None = None
        """``accepts_late_system``, once probed."""
        self._newlines: Newlines | Literal[False] | None = None
        """The tokenizer's newline tokens, once read for a model whose images merge with them
        (False: it has none)."""
        self.limits = limits or RequestLimits()
        self.prompt_bytes = self.limits.prompt_bytes_limit(info.context_length)
        """The most bytes of prompt text one request may send."""
        self.render_limits = RenderLimits(
            max_chars=4 * self.prompt_bytes + (1 << 20), max_seconds=self.limits.max_render_seconds
        )
        """What rendering one request may build: room for the prompt text four times over (tools
        as indented JSON) plus the template's own text."""
        self._limiter: anyio.CapacityLimiter | None = None
        self._tokenizer_fits = self.tokenizer.vocab_size <= info.vocab_size
        """Every id the tokenizer can give is in the model's vocabulary: only ids a client sent
        need the range check."""
        self.media_rules = placeholder_rules(info, media_processing)
        """The placeholder rule of each modality the model takes (empty: text only)."""
        self.placeholders = {m: rule.placeholder for m, rule in self.media_rules.items()} or None
        """What the chat template writes for each modality the model takes."""
        self.uncounted_media = uncounted_modalities(info, self.media_rules)
        """The modalities the model takes whose placeholders dyn cannot count, with its family."""

    def cap_context(self, workers_context: int | None) -> None:
        """Serve at most ``workers_context`` tokens of context: the smallest a live worker advertises
        (its ``--max-model-len``; None: none does). ``info.context_length`` becomes the smaller of
        it and the model's own, so a request over a worker's limit is a 400 here, and
        ``/v1/models`` and ``/tokenize`` report it, as vLLM's do."""
        own = self.model_info.context_length
        context = own if workers_context is None else min(own, workers_context)
        if context == own:
            self.info = self.model_info
        elif context != self.info.context_length:
            self.info = dataclasses.replace(self.model_info, context_length=context)

    # ----------------------------------------------------------------- bounds and threads

    def chat_work_bytes(self, req: ChatCompletionRequest) -> int:
        """Refuse a chat request over a ``RequestLimits`` bound (``ApiError`` 400); return the
        bytes of text preprocessing it will read (prompt text and stop strings)."""
        size = bounds.chat_prompt_bytes(req, self.limits, self.prompt_bytes, self.info.context_length)
        return size + _stop_chars(req)

    def completion_work_bytes(self, req: CompletionRequest) -> int:
        """As ``chat_work_bytes``, for a completions request."""
        size = bounds.completion_prompt_bytes(req, self.limits, self.prompt_bytes, self.info.context_length)
        return size + _stop_chars(req)

    async def chat_async(self, req: ChatCompletionRequest, media: Sequence[MediaInput] = ()) -> Prompt:
        """``chat`` for the event loop: the bounds checked here; a small request rendered inline
        and tokenized by ``Tokenizer.encode_chat_async``, a larger one (or one with media) all
        in a preprocessing thread. ``media``: the messages' media parts as loaded, in order."""
        if self.chat_work_bytes(req) > INLINE_WORK_BYTES or media:
            return await anyio.to_thread.run_sync(self._chat, req, media, limiter=self._threads())
        nvext = req.nvext
        if nvext is not None and (nvext.token_data is not None or nvext.use_raw_prompt):
            return self._chat(req)
        text = self._render(req, req.messages, req.add_generation_prompt, req.continue_final_message)
        token_ids = await self.tokenizer.encode_chat_async(text, add_special_tokens=req.add_special_tokens)
        return self._finish(req, token_ids, text, req.max_completion_tokens)

    async def completions_async(self, req: CompletionRequest) -> list[Prompt]:
        """``completions`` for the event loop, as ``chat_async``: the texts of a small request are
        tokenized by ``Tokenizer.encode_async``."""
        if self.completion_work_bytes(req) > INLINE_WORK_BYTES:
            return await anyio.to_thread.run_sync(self._completions, req, limiter=self._threads())
        prompts = []
        for item in _completion_items(req):
            ids = None
            if isinstance(item, str):
                ids = await self.tokenizer.encode_async(item, add_special_tokens=req.add_special_tokens)
            prompts.append(self._completion(req, item, ids))
        return prompts

    async def tokenize_chat_async(self, req: ChatCompletionRequest) -> list[int]:
        """The token ids a chat completion of ``req`` sends for its messages (the same bounds,
        template and options), without the context-length rule: ``/tokenize`` reports the count
        and the context length instead, as vLLM's does."""
        if self.chat_work_bytes(req) <= INLINE_WORK_BYTES:
            return self._chat_tokens(req)
        return await anyio.to_thread.run_sync(self._chat_tokens, req, limiter=self._threads())

    async def tokenize_text_async(self, text: str, add_special_tokens: bool) -> list[int]:
        """``text`` tokenized as a completion prompt is, under the same byte bound."""
        size = bounds.json_size(text, self.prompt_bytes)
        if size > self.prompt_bytes:
            raise bad_request(
                f"prompt is more than {self.prompt_bytes} bytes, the most this server accepts "
                "(raise it with --max-prompt-bytes)",
                param="prompt",
            )
        if size <= INLINE_WORK_BYTES:
            return self.tokenizer.encode(text, add_special_tokens=add_special_tokens)
        return await anyio.to_thread.run_sync(
            self.tokenizer.encode, text, add_special_tokens, limiter=self._threads()
        )

    async def detokenize_async(self, token_ids: list[int]) -> str:
        """``token_ids`` as text, special tokens kept (as vLLM's ``/detokenize``)."""
        if len(token_ids) <= INLINE_WORK_BYTES // 4:
            return self.tokenizer.decode(token_ids, False)
        return await anyio.to_thread.run_sync(
            self.tokenizer.decode, token_ids, False, limiter=self._threads()
        )

    async def next_turn_prefix_async(self, req: ChatCompletionRequest, reply: str) -> list[int] | None:
        """``next_turn_prefix`` in a preprocessing thread; None at once when every thread is busy
        (a speculative prefill is worth less than the requests waiting for one)."""
        limiter = self._threads()
        if limiter.borrowed_tokens >= limiter.total_tokens:
            return None
        return await anyio.to_thread.run_sync(self.next_turn_prefix, req, reply, limiter=limiter)

    def _threads(self) -> anyio.CapacityLimiter:
        if self._limiter is None:
            self._limiter = anyio.CapacityLimiter(PREPROCESS_THREADS)
        return self._limiter

    # ----------------------------------------------------------------- chat

    def chat(self, req: ChatCompletionRequest) -> Prompt:
        """The prompt of a chat request: ``nvext.token_data`` as given; with
        ``nvext.use_raw_prompt`` the last message's text tokenized without the template; else
        the messages rendered with the chat template. Bounds checked first (``chat_work_bytes``)."""
        self.chat_work_bytes(req)
        return self._chat(req)

    def _chat(self, req: ChatCompletionRequest, media: Sequence[MediaInput] = ()) -> Prompt:
        nvext = req.nvext
        if media and nvext is not None and (nvext.token_data is not None or nvext.use_raw_prompt):
            raise bad_request(
                "nvext.token_data and nvext.use_raw_prompt send the prompt as is: they cannot carry "
                "the messages' images; drop one of the two",
                param="nvext",
            )
        if nvext is not None and nvext.token_data is not None:
            return self._finish(
                req, list(nvext.token_data), None, req.max_completion_tokens, pretokenized=True
            )
        if nvext is not None and nvext.use_raw_prompt:
            text = _message_text(req.messages[-1])
            token_ids = self.tokenizer.encode(text, add_special_tokens=req.add_special_tokens)
            return self._finish(req, token_ids, text, req.max_completion_tokens)
        text = self._render(req, req.messages, req.add_generation_prompt, req.continue_final_message)
        token_ids = self.tokenizer.encode_chat(text, add_special_tokens=req.add_special_tokens)
        if not media:
            return self._finish(req, token_ids, text, req.max_completion_tokens)
        token_ids, items = self._placed(token_ids, media)
        return self._finish(req, token_ids, text, req.max_completion_tokens, media=items)

    def _placed(self, token_ids: list[int], media: Sequence[MediaInput]) -> tuple[list[int], list[MediaItem]]:
        """The prompt with each item's one placeholder token replaced by the tokens the model
        reads for that item (its modality's ``placeholder_ids``), and where each item now is."""
        rules = self.media_rules
        kinds = sorted({item.modality for item in media})
        if not_taken := [m for m in kinds if m not in rules]:
            raise bad_request(
                f"model {self.info.name!r} takes no {' or '.join(not_taken)} input", param="messages"
            )
        ids = {rules[m].token_id for m in kinds}
        at = [i for i, token in enumerate(token_ids) if token in ids]
        if [token_ids[i] for i in at] != [rules[item.modality].token_id for item in media]:
            tokens = ", ".join(f"{m}: {rules[m].token!r}" for m in kinds)
            raise bad_request(
                f"the chat template wrote {len(at)} placeholder(s) ({tokens}) for {len(media)} media "
                "item(s), not one per item in their order; send the media in messages the template renders",
                param="messages",
            )
        out: list[int] = []
        items: list[MediaItem] = []
        start = 0
        context = self.info.context_length
        for position, item in zip(at, media, strict=True):
            rule = rules[item.modality]
            try:
                # counted before its tokens are built: an item longer than the whole context is
                # refused without building it (a model's files may state any count)
                if (count := rule.tokens_for(item)) > context:
                    raise bad_request(
                        f"{item.param}: the {item.modality} takes {count} tokens, more than the "
                        f"model's context of {context}; send a smaller one",
                        param=item.param,
                    )
                placed = placeholder_ids(rule, item, count, self._encode_plain)
            except COUNT_ERRORS as exc:
                raise bad_request(f"{item.param}: {exc}", param=item.param) from None
            out += token_ids[start:position]
            items.append(MediaItem(item.modality, item.data, item.mime, item.mm_hash, len(out), len(placed)))
            out += placed
            start = position + 1
        out += token_ids[start:]
        image = rules.get("image")
        if isinstance(image, ImageTokens) and image.merges_newlines:
            return self._merge_newlines(out, items, media, image.token_id)
        return out, items

    def _merge_newlines(
        self, token_ids: list[int], items: list[MediaItem], media: Sequence[MediaInput], placeholder: int
    ) -> tuple[list[int], list[MediaItem]]:
        """Gemma 3's images: the prompt with the newlines they are written with merged with the
        prompt's own, and each item where vLLM places it (``dyn.core.model.newlines``)."""
        if self._newlines is None:
            self._newlines = Newlines.of(self._encode_plain) or False
        if self._newlines is False:
            raise bad_request(
                f"model {self.info.name!r} writes its images with newlines that its tokenizer does not "
                "have one token for (one to four newlines): it cannot take images",
                param="messages",
            )
        try:
            merged = merge_newlines(
                token_ids, [(i.offset, i.length) for i in items], placeholder, self._newlines
            )
        except UnplacedItemError as exc:
            raise bad_request(f"{media[exc.item].param}: {exc}", param=media[exc.item].param) from None
        placed = [
            msgspec.structs.replace(item, offset=offset, length=length, source=source)
            for item, (offset, length), source in zip(items, merged.spans, merged.sources, strict=True)
        ]
        return merged.token_ids, placed

    def _encode_plain(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False)

    def _chat_tokens(self, req: ChatCompletionRequest) -> list[int]:
        text = self._render(req, req.messages, req.add_generation_prompt, req.continue_final_message)
        return self.tokenizer.encode_chat(text, add_special_tokens=req.add_special_tokens)

    def next_turn_prefix(self, req: ChatCompletionRequest, reply: str) -> list[int] | None:
        """The tokens the next turn of this conversation starts with: the messages plus the
        assistant's ``reply``, rendered without a generation prompt (the template drops thinking
        from earlier turns as it would in the next request). ``None`` when the request was not
        rendered from its messages or the prefix does not fit the context."""
        nvext = req.nvext
        if nvext is not None and (nvext.token_data is not None or nvext.use_raw_prompt):
            return None
        messages = [*req.messages, {"role": "assistant", "content": reply}]
        try:
            text = self._render(req, messages, False, False)
        except ApiError:
            return None
        token_ids = self.tokenizer.encode_chat(text, add_special_tokens=req.add_special_tokens)
        if not token_ids or len(token_ids) >= self.info.context_length:
            return None
        return token_ids

    def accepts_late_system(self) -> bool:
        """Whether the model's chat template renders a system message after the conversation's
        first turns (Claude Code sends such reminders; Gemma's and Mistral's templates, among
        others, raise on them). Probed once, with a five-message conversation."""
        if self._late_system is None:
            probe = [
                {"role": "system", "content": "a"},
                {"role": "user", "content": "b"},
                {"role": "assistant", "content": "c"},
                {"role": "system", "content": "d"},
                {"role": "user", "content": "e"},
            ]
            try:
                self._render(ChatCompletionRequest(messages=probe, model=self.info.name), probe, True, False)
                self._late_system = True
            except ApiError:
                self._late_system = False
        return self._late_system

    def template_kwargs(self, req: ChatCompletionRequest) -> dict[str, Any] | None:
        """The chat template arguments ``req`` renders with: the defaults, then its own."""
        if not self.default_template_kwargs:
            return req.chat_template_kwargs
        return {**self.default_template_kwargs, **(req.chat_template_kwargs or {})}

    def _render(
        self,
        req: ChatCompletionRequest,
        messages: list[dict],
        add_generation_prompt: bool,
        continue_final_message: bool,
    ) -> str:
        template = self.chat_template
        kwargs = self.template_kwargs(req)
        source = req.chat_template
        if kwargs and kwargs.get("chat_template") is not None:  # vLLM: the kwarg wins
            kwargs = dict(kwargs)
            source = kwargs.pop("chat_template")
        if source is not None:
            if not isinstance(source, str):
                raise bad_request("chat_template must be a string", param="chat_template")
            try:
                template = request_template(source)
            except ChatTemplateError as exc:
                raise bad_request(f"chat_template does not compile: {exc}", param="chat_template") from None
        if template is None:
            raise bad_request(
                f"model {self.info.name!r} has no chat template; pass one in "
                "'chat_template' or use /v1/completions",
                param="chat_template",
            )
        try:
            return template.render(
                messages,
                add_generation_prompt=add_generation_prompt,
                continue_final_message=continue_final_message,
                tools=None if self.exclude_tools_when_none and req.tool_choice == "none" else req.tools,
                documents=req.documents,
                extra_kwargs=kwargs,
                bos_token=self.tokenizer.bos_token,
                eos_token=self.tokenizer.eos_token,
                limits=self.render_limits,
                media=self.placeholders,
                content_format=self.content_format,
            )
        except RenderLimitError as exc:
            whose = "the request's chat_template" if source is not None else "the model's chat template"
            raise bad_request(
                f"the messages could not be rendered with {whose}: {exc}",
                param="chat_template" if source is not None else "messages",
            ) from None
        except ChatTemplateError as exc:
            raise bad_request(
                f"messages could not be rendered with the chat template: {exc}", param="messages"
            ) from None

    # ----------------------------------------------------------------- completions

    def completions(self, req: CompletionRequest) -> list[Prompt]:
        """One ``Prompt`` per prompt of the (possibly batched) request; bounds checked first
        (``completion_work_bytes``)."""
        self.completion_work_bytes(req)
        return self._completions(req)

    def _completions(self, req: CompletionRequest) -> list[Prompt]:
        return [
            self._completion(
                req,
                item,
                self.tokenizer.encode(item, add_special_tokens=req.add_special_tokens)
                if isinstance(item, str)
                else None,
            )
            for item in _completion_items(req)
        ]

    def _completion(self, req: CompletionRequest, item: str | list[int], ids: list[int] | None) -> Prompt:
        """The prompt of one of a completions request's prompts: a text (tokenized as ``ids``)
        or token ids."""
        if isinstance(item, str):
            return self._finish(req, ids or [], item, None)
        if not item:
            raise bad_request("prompt must not be empty", param="prompt")
        return self._finish(req, list(item), None, None, pretokenized=True)

    # ----------------------------------------------------------------- shared rules

    def _finish(
        self,
        req: _GenerationRequest,
        token_ids: list[int],
        text: str | None,
        max_completion_tokens: int | None,
        pretokenized: bool = False,
        media: list[MediaItem] | None = None,
    ) -> Prompt:
        vocab = self.info.vocab_size
        if (pretokenized or not self._tokenizer_fits) and (
            token_ids and (min(token_ids) < 0 or max(token_ids) >= vocab)
        ):
            raise bad_request(f"prompt token ids must be in [0, {vocab})", param="prompt")
        if req.truncate_prompt_tokens is not None and len(token_ids) > req.truncate_prompt_tokens:
            cut = len(token_ids) - req.truncate_prompt_tokens
            if media and media[0].offset < cut:
                raise bad_request(
                    f"truncate_prompt_tokens={req.truncate_prompt_tokens} would cut into an image's "
                    "placeholder tokens; keep more tokens or send fewer images",
                    param="truncate_prompt_tokens",
                )
            token_ids = token_ids[cut:]
            media = [msgspec.structs.replace(m, offset=m.offset - cut) for m in media or ()]
            text = None
        if not token_ids:
            raise bad_request("the prompt is empty after tokenization", param="prompt")
        context = self.info.context_length
        max_tokens = max_completion_tokens if max_completion_tokens is not None else req.max_tokens
        room = context - len(token_ids)
        if max_tokens is None:
            if room < 1:
                raise self._too_long(len(token_ids), 0)
            max_tokens = room
        elif max_tokens > room:
            raise self._too_long(len(token_ids), max_tokens)
        greedy = req.nvext is not None and req.nvext.greed_sampling
        logit_bias, allowed_token_ids = token_rules(req, vocab)
        sampling = SamplingParams(
            temperature=0.0 if greedy else req.temperature,
            top_p=req.top_p,
            top_k=req.top_k,
            min_p=req.min_p,
            seed=req.seed,
            repetition_penalty=req.repetition_penalty,
            presence_penalty=req.presence_penalty,
            frequency_penalty=req.frequency_penalty,
            length_penalty=None if req.length_penalty == 1.0 else req.length_penalty,
            logit_bias=logit_bias,
            allowed_token_ids=allowed_token_ids,
        )
        stop = StopConditions(
            max_tokens=max_tokens,
            min_tokens=req.min_tokens,
            ignore_eos=req.ignore_eos,
            stop_token_ids=req.stop_token_ids or [],
        )
        stop_strings = [req.stop] if isinstance(req.stop, str) else [s for s in (req.stop or []) if s]
        thinking = req.nvext.max_thinking_tokens if req.nvext is not None else None
        matcher = stop_matcher(stop_strings) if stop_strings else None
        return Prompt(
            token_ids, text, sampling, stop, stop_strings, pretokenized, thinking, matcher, media or []
        )

    def _too_long(self, prompt_tokens: int, max_tokens: int):
        context = self.info.context_length
        return bad_request(
            f"This model's maximum context length is {context} tokens. However, you requested "
            f"{prompt_tokens + max_tokens} tokens ({prompt_tokens} in the messages, {max_tokens} in "
            "the completion). Please reduce the length of the messages or completion.",
            param="messages",
            code="context_length_exceeded",
        )


def engine_request(
    request_id: str,
    prompt: Prompt,
    choice: int,
    priority: int | None,
    session_id: str | None = None,
    *,
    constraint: OutputConstraint | None = None,
    logprobs: int | None = None,
    prompt_logprobs: int | None = None,
    tools: list[ToolSpec] | None = None,
    lora_name: str | None = None,
) -> GenerateRequest:
    """The engine request for choice ``choice`` of ``prompt`` (seeded choices get distinct
    seeds); ``priority`` is already in the engine's convention; ``lora_name``: the adapter it
    runs with."""
    sampling = prompt.sampling
    if choice and sampling.seed is not None:
        sampling = msgspec.structs.replace(sampling, seed=sampling.seed + choice)
    return GenerateRequest(
        request_id=request_id,
        token_ids=prompt.token_ids,
        sampling=sampling,
        stop=prompt.stop,
        priority=priority,
        session_id=session_id,
        max_thinking_tokens=prompt.max_thinking_tokens,
        constraint=constraint,
        logprobs=logprobs,
        prompt_logprobs=prompt_logprobs,
        tools=tools or [],
        lora_name=lora_name,
        media=prompt.media,
    )


def _stop_chars(req: _GenerationRequest) -> int:
    stop = req.stop
    if stop is None:
        return 0
    return len(stop) if isinstance(stop, str) else sum(map(len, stop))


def _message_text(message: dict) -> str:
    """A message's content as text (the text parts of a list of content parts, joined)."""
    content = message.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content if isinstance(p, dict) and p.get("type") == "text")
    return ""


def _completion_items(req: CompletionRequest) -> list[str | list[int]]:
    """A completions request's prompts: one text, one list of ids, or a batch of either."""
    prompt = req.prompt
    if isinstance(prompt, str):
        return [prompt]
    if prompt and isinstance(prompt[0], int):
        return [prompt]
    return list(prompt)
