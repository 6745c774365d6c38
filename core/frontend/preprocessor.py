"""Turning an OpenAI request into engine requests: template, tokenize, truncate, check the
context, map sampling and stop parameters.

``Preprocessor`` is built once per served model (tokenizer loaded, chat template compiled) and is
pure CPU work with no I/O, so the frontend calls it inline. The output, ``Prompt``, is what every
choice of the request shares; ``engine_request`` makes the per-choice ``GenerateRequest``.
"""

from __future__ import annotations

from dataclasses import dataclass

import msgspec

from dyn.core.frontend.chat_template import ChatTemplate, ChatTemplateError, compile_template
from dyn.core.frontend.tokenizer import Tokenizer
from dyn.core.messages import GenerateRequest, SamplingParams, StopConditions
from dyn.core.model.info import ModelInfo
from dyn.core.protocol.errors import bad_request
from dyn.core.protocol.openai import ChatCompletionRequest, CompletionRequest, _GenerationRequest


@dataclass(slots=True)
class Prompt:
    """One tokenized prompt and the generation settings of the request it came from."""

    token_ids: list[int]
    text: str | None
    """The prompt as text (rendered template or the client's text); None when given as ids."""
    sampling: SamplingParams
    stop: StopConditions
    stop_strings: list[str]


class Preprocessor:
    """Template + tokenizer + context rules of one model."""

    def __init__(self, info: ModelInfo, tokenizer: Tokenizer | None = None) -> None:
        self.info = info
        self.tokenizer = tokenizer or Tokenizer.from_model(info)
        source = self.tokenizer.chat_template
        self.chat_template: ChatTemplate | None = compile_template(source) if source else None

    # ----------------------------------------------------------------- chat

    def chat(self, req: ChatCompletionRequest) -> Prompt:
        nvext = req.nvext
        if nvext is not None and nvext.token_data is not None:
            return self._finish(req, list(nvext.token_data), None, req.max_completion_tokens)
        template = self.chat_template
        if req.chat_template is not None:
            try:
                template = compile_template(req.chat_template)
            except ChatTemplateError as exc:
                raise bad_request(f"chat_template does not compile: {exc}", param="chat_template") from None
        if template is None:
            raise bad_request(f"model {self.info.name!r} has no chat template; pass one in "
                              "'chat_template' or use /v1/completions", param="chat_template")
        try:
            text = template.render(
                req.messages, add_generation_prompt=req.add_generation_prompt,
                continue_final_message=req.continue_final_message, tools=req.tools,
                documents=req.documents, extra_kwargs=req.chat_template_kwargs,
                bos_token=self.tokenizer.bos_token, eos_token=self.tokenizer.eos_token)
        except ChatTemplateError as exc:
            raise bad_request(f"messages could not be rendered with the chat template: {exc}",
                              param="messages") from None
        token_ids = self.tokenizer.encode(text, add_special_tokens=req.add_special_tokens)
        return self._finish(req, token_ids, text, req.max_completion_tokens)

    # ----------------------------------------------------------------- completions

    def completions(self, req: CompletionRequest) -> list[Prompt]:
        """One ``Prompt`` per prompt of the (possibly batched) request."""
        prompt = req.prompt
        if isinstance(prompt, str):
            items: list[str | list[int]] = [prompt]
        elif prompt and isinstance(prompt[0], int):
            items = [prompt]  # type: ignore[list-item]
        else:
            items = list(prompt)  # type: ignore[arg-type]
        prompts = []
        for item in items:
            if isinstance(item, str):
                ids = self.tokenizer.encode(item, add_special_tokens=req.add_special_tokens)
                prompts.append(self._finish(req, ids, item, None))
            else:
                if not item:
                    raise bad_request("prompt must not be empty", param="prompt")
                prompts.append(self._finish(req, list(item), None, None))
        return prompts

    # ----------------------------------------------------------------- shared rules

    def _finish(self, req: _GenerationRequest, token_ids: list[int], text: str | None,
                max_completion_tokens: int | None) -> Prompt:
        vocab = self.info.vocab_size
        if token_ids and (min(token_ids) < 0 or max(token_ids) >= vocab):
            raise bad_request(f"prompt token ids must be in [0, {vocab})", param="prompt")
        if req.truncate_prompt_tokens is not None and len(token_ids) > req.truncate_prompt_tokens:
            token_ids = token_ids[-req.truncate_prompt_tokens:]
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
        sampling = SamplingParams(
            temperature=0.0 if greedy else req.temperature, top_p=req.top_p,
            top_k=req.top_k, min_p=req.min_p, seed=req.seed,
            repetition_penalty=req.repetition_penalty, presence_penalty=req.presence_penalty,
            frequency_penalty=req.frequency_penalty,
            length_penalty=None if req.length_penalty == 1.0 else req.length_penalty)
        stop = StopConditions(max_tokens=max_tokens, min_tokens=req.min_tokens,
                              ignore_eos=req.ignore_eos, stop_token_ids=req.stop_token_ids or [])
        stop_strings = [req.stop] if isinstance(req.stop, str) else [s for s in (req.stop or []) if s]
        return Prompt(token_ids, text, sampling, stop, stop_strings)

    def _too_long(self, prompt_tokens: int, max_tokens: int):
        context = self.info.context_length
        return bad_request(
            f"This model's maximum context length is {context} tokens. However, you requested "
            f"{prompt_tokens + max_tokens} tokens ({prompt_tokens} in the messages, {max_tokens} in "
            "the completion). Please reduce the length of the messages or completion.",
            param="messages", code="context_length_exceeded")


def engine_request(request_id: str, prompt: Prompt, choice: int, priority: int | None) -> GenerateRequest:
    """The engine request for choice ``choice`` of ``prompt`` (seeded choices get distinct seeds)."""
    sampling = prompt.sampling
    if choice and sampling.seed is not None:
        sampling = msgspec.structs.replace(sampling, seed=sampling.seed + choice)
    return GenerateRequest(request_id=request_id, token_ids=prompt.token_ids, sampling=sampling,
                           stop=prompt.stop, priority=priority)
