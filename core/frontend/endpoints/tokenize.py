"""``POST /tokenize``: a text prompt or chat messages as the served model's token ids (vLLM's
endpoint; the shapes are in ``dyn.core.protocol.tokenize``).

Messages go through the frontend's own preprocessor with a chat completion's checks, bounds,
template and options, so the ``tokens`` are exactly the prompt a chat completion with the same
fields sends (its ``usage.prompt_tokens`` is their ``count``). As in vLLM, a prompt longer than
the context is not refused: ``count`` and ``max_model_len`` let the client see it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from dyn.core.frontend.endpoints.generate import warn_ignored
from dyn.core.frontend.endpoints.json_post import JsonEndpoint
from dyn.core.protocol.openai import ChatCompletionRequest, check_chat
from dyn.core.protocol.tokenize import TokenizeChatRequest, TokenizeResponse, tokenize_request

if TYPE_CHECKING:
    from dyn.core.frontend.app import FrontendApp


async def _tokenize(app: FrontendApp, body: bytes) -> TokenizeResponse:
    req = tokenize_request(body)
    warn_ignored(body, type(req), "to /tokenize")
    service = app.models.resolve(req.model)
    preprocessor = service.preprocessor
    if isinstance(req, TokenizeChatRequest):
        chat = ChatCompletionRequest(
            messages=req.messages,
            add_generation_prompt=req.add_generation_prompt,
            continue_final_message=req.continue_final_message,
            add_special_tokens=req.add_special_tokens,
            chat_template=req.chat_template,
            chat_template_kwargs=req.chat_template_kwargs,
            tools=req.tools,
            documents=req.documents,
        )
        check_chat(chat, service.outputs.max_logprobs)
        tokens = await preprocessor.tokenize_chat_async(chat)
    else:
        tokens = await preprocessor.tokenize_text_async(req.prompt, req.add_special_tokens)
    strs = None
    if req.return_token_strs:
        tokenizer = preprocessor.tokenizer
        strs = [tokenizer.id_to_token(t) or "" for t in tokens]
    return TokenizeResponse(len(tokens), preprocessor.info.context_length, tokens, strs)


ENDPOINT = JsonEndpoint("/tokenize", _tokenize)
