"""Score templates: how a cross-encoder's (query, document) pair becomes one prompt when the
server is given a ``--chat-template``, as vLLM 0.32's cross-encoder scoring does it
(``vllm/entrypoints/pooling/scoring/io_processor.py``). LLM rerankers (Qwen3-Reranker and its
kin) are trained on such a prompt: a fixed instruction, the query and the document, in their own
chat format.

Contract:
- Only a template the server was given is applied (``Preprocessor.template_given``): vLLM does not
  trust a tokenizer's own chat template here (many rerankers inherit a base LLM's). Without one,
  the pair is the tokenizer's pair encoding or the texts joined (``dyn.core.model.classes``).
- The template sees two messages, ``{"role": "query", "content": query}`` and
  ``{"role": "document", "content": document}``, no generation prompt, and the request's
  ``chat_template_kwargs`` as variables, with ``instruction`` added from the request's field when
  the arguments do not set it. ``chat_template``, ``tools`` and ``tokenize`` are refused there, as
  vLLM refuses them. The text is tokenized with the tokenizer's special tokens.
- Bounded: the pairs' text by ``check_texts`` before anything runs, all the renderings of one
  request together by ``--max-render-seconds``, each rendering's size by the preprocessor's
  render limits, and the rendered text in all by what ``MAX_EMBED_TOKENS`` tokens can hold
  (``BYTES_PER_TOKEN`` bytes each at most). Rendered and tokenized in a thread. Any failure is a
  400 that says what to fix.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

import anyio.to_thread

from dyn.core.frontend.chat_template import ChatTemplateError, RenderLimitError, RenderLimits
from dyn.core.frontend.limits import BYTES_PER_TOKEN
from dyn.core.frontend.pooling import check_texts
from dyn.core.protocol.embeddings import MAX_EMBED_TOKENS
from dyn.core.protocol.errors import bad_request

if TYPE_CHECKING:
    from dyn.core.frontend.preprocessor import Preprocessor

RESERVED_KWARGS = frozenset(("chat_template", "tools", "tokenize"))
"""Template arguments a scoring request may not set: the scorer fixes them."""
MAX_RENDERED_CHARS = MAX_EMBED_TOKENS * BYTES_PER_TOKEN
"""More rendered text than this holds more tokens than one request may pool."""


def template_kwargs(kwargs: dict[str, Any] | None, instruction: str | None) -> dict[str, Any]:
    """The template's variables: the request's ``chat_template_kwargs`` with its ``instruction``
    added unless they set one (vLLM folds the field in so); a 400 for a reserved name."""
    merged = dict(kwargs or {})
    if reserved := sorted(RESERVED_KWARGS & merged.keys()):
        raise bad_request(
            f"chat_template_kwargs sets {', '.join(reserved)}, which scoring fixes itself; remove "
            f"{'it' if len(reserved) == 1 else 'them'}",
            param="chat_template_kwargs",
        )
    if instruction is not None:
        merged.setdefault("instruction", instruction)
    return merged


async def tokenize_scored(
    preprocessor: Preprocessor, pairs: list[tuple[str, str]], kwargs: dict[str, Any], param: str
) -> list[list[int]]:
    """Each pair rendered with the server's ``--chat-template`` and tokenized (see the module
    docstring); ``param`` names the inputs in a 400."""
    check_texts(pairs, preprocessor, param)
    template = preprocessor.chat_template
    assert template is not None and preprocessor.template_given
    tokenizer = preprocessor.tokenizer
    limits = preprocessor.render_limits

    def render_all() -> list[list[int]] | str:
        deadline = time.monotonic() + limits.max_seconds
        late = f"rendering the pairs took more than {limits.max_seconds:g} s (--max-render-seconds)"
        texts, size = [], 0
        for query, document in pairs:
            left = deadline - time.monotonic()
            if left <= 0:
                return late
            try:
                text = template.render(
                    [{"role": "query", "content": query}, {"role": "document", "content": document}],
                    add_generation_prompt=False,
                    extra_kwargs=kwargs,
                    bos_token=tokenizer.bos_token,
                    eos_token=tokenizer.eos_token,
                    limits=RenderLimits(limits.max_chars, left),
                )
            except RenderLimitError as exc:
                if time.monotonic() >= deadline:
                    return late
                return f"the score template could not render a pair within this server's bounds: {exc}"
            except ChatTemplateError as exc:
                return f"the score template failed on a pair: {exc}"
            size += len(text)
            if size > MAX_RENDERED_CHARS:
                return (
                    f"the rendered pairs hold more than {MAX_RENDERED_CHARS} characters, more than "
                    f"the {MAX_EMBED_TOKENS} tokens one request may score: split the request"
                )
            texts.append(text)
        return [tokenizer.encode(text, add_special_tokens=True) for text in texts]

    rendered = await anyio.to_thread.run_sync(render_all)
    if isinstance(rendered, str):
        raise bad_request(rendered, param="chat_template_kwargs" if kwargs else param)
    return rendered
