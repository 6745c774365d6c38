"""A request's images (``GenerateRequest.media``) as vLLM 0.32 takes them beside a token prompt.

Followed from vLLM 0.32 (``vllm/inputs/llm.py``, ``vllm/multimodal/processing/processor.py``,
``vllm/renderers/base.py``, ``vllm/v1/core/kv_cache_utils.py``):

- vLLM takes a token prompt with ``multi_modal_data={"image": [PIL.Image, ...]}`` and
  ``multi_modal_uuids={"image": [identifier, ...]}`` (``TokensPrompt``). Its multimodal
  processor always expands each image's one placeholder token (the model's image token: Idefics3's
  and LLaVA's ``<image>``, Qwen2-VL's ``<|image_pad|>``) into the image's N placeholder tokens
  (``BaseMultiModalProcessor.apply``): it does not recognise placeholders that are already
  expanded, and given them it expands the first token of the run again.
- dyn's frontend sends the expanded prompt (the KV router hashes the blocks the engine will
  cache), with each item's span (``MediaItem.offset``/``length``). So the worker collapses each
  span back to the model's image token (``collapse``), has vLLM's renderer expand it
  (``AsyncLLM.renderer.render_cmpl_async``, the step ``AsyncLLM.generate`` would run), and checks
  that vLLM's prompt is the request's, token for token and span for span (``check_expansion``):
  the frontend's placeholder count and vLLM's must agree, or the router's block hashes and the
  prompt usage would be wrong. The rendered input then goes to ``AsyncLLM.generate`` as is.
- Each item's ``mm_hash`` is its ``multi_modal_uuids`` entry: vLLM's identity for the item in its
  processor and encoder caches and in its prefix-cache block hashes, and what its KV events'
  ``BlockStored.extra_keys`` carry, per block, as ``[identifier, offset of the item's first
  placeholder token relative to the block's first token]`` pairs (negative in the blocks after
  the one the item starts in; ``to_event_extra_keys``, ``_gen_mm_extra_hash_keys``).
- Images are decoded with Pillow here (vLLM converts them to RGB itself); audio and video are
  refused: vLLM takes audio as decoded samples and a sample rate and video as decoded frames, and
  this worker has no decoder for either.

Every error a request can cause is a ``MediaError`` with a sentence for the client.
"""

from __future__ import annotations

import io
import re
from collections.abc import Mapping, Sequence
from typing import Any

from dyn.core.messages import GenerateRequest, MediaItem

_MM_HASH = re.compile(r"[0-9a-f]{64}")
_DECODERS = {
    "audio": "decoded samples and a sample rate (soundfile or librosa)",
    "video": "decoded frames (a video decoder such as PyAV or OpenCV)",
}


class MediaError(ValueError):
    """A request's media this worker cannot pass to vLLM; the message is for the client."""


def image_input(model_config: Any, mm_processor: Any = None) -> bool:
    """Whether the model vLLM loaded (its ``ModelConfig``) takes images in a decoder-only prompt:
    a multimodal model whose processor handles images (``mm_processor``, the renderer's, when
    known), not disabled by ``--limit-mm-per-prompt '{"image": 0}'`` or
    ``--language-model-only``."""
    if not getattr(model_config, "is_multimodal_model", False) or getattr(
        model_config, "is_encoder_decoder", False
    ):
        return False
    mm_config = getattr(model_config, "multimodal_config", None)
    if mm_config is not None and mm_config.get_limit_per_prompt("image") <= 0:
        return False
    info = getattr(mm_processor, "info", None)
    return info is None or "image" in info.get_supported_mm_limits()


def image_token(hf_config: Any) -> int | None:
    """The model's image placeholder token id from its Hugging Face config (``image_token_id``,
    or LLaVA's ``image_token_index``); ``None`` if it names none."""
    for name in ("image_token_id", "image_token_index"):
        value = getattr(hf_config, name, None)
        if isinstance(value, int):
            return value
    return None


def check_media(request: GenerateRequest) -> None:
    """``MediaError`` unless every item is an image with a well-formed ``mm_hash`` and the spans
    lie inside the prompt, in order, without overlapping."""
    end = 0
    for i, item in enumerate(request.media):
        if item.modality != "image":
            decoder = _DECODERS.get(item.modality, "a decoder")
            raise MediaError(
                f"media item {i} is {item.modality}: dyn's vLLM worker passes images only; vLLM takes "
                f"{item.modality} as {decoder}, and this worker does not decode it"
            )
        if not _MM_HASH.fullmatch(item.mm_hash):
            raise MediaError(
                f"media item {i}: mm_hash must be 64 lowercase hex characters, got {item.mm_hash!r}"
            )
        if item.length < 1 or item.offset < end or item.offset + item.length > len(request.token_ids):
            raise MediaError(
                f"media item {i}: its placeholder tokens [{item.offset}, {item.offset + item.length}) "
                f"must be non-empty, inside the {len(request.token_ids)}-token prompt and after the "
                "previous item's"
            )
        end = item.offset + item.length


def decode_images(media: Sequence[MediaItem]) -> list[Any]:
    """Each item's bytes decoded with Pillow (``PIL.Image.Image``, fully loaded); ``MediaError``
    names the first that Pillow cannot read. Costs milliseconds per image: run it in a thread."""
    from PIL import Image

    images = []
    for i, item in enumerate(media):
        # Pillow raises many types for a bad file: UnidentifiedImageError, OSError, ...
        try:
            image = Image.open(io.BytesIO(item.data))
            image.load()
        except Exception as exc:
            raise MediaError(f"media item {i} ({item.mime}): not an image Pillow can decode: {exc}") from None
        images.append(image)
    return images


def collapse(token_ids: Sequence[int], media: Sequence[MediaItem], placeholder: int | None) -> list[int]:
    """``token_ids`` with each item's span replaced by one ``placeholder`` token (the model's
    image token), the prompt vLLM's processor expands; ``None``: the span's first token."""
    out: list[int] = []
    start = 0
    for item in media:
        out += token_ids[start : item.offset]
        out.append(token_ids[item.offset] if placeholder is None else placeholder)
        start = item.offset + item.length
    out += token_ids[start:]
    return out


def prompt_fields(request: GenerateRequest, images: list[Any], placeholder: int | None) -> dict[str, Any]:
    """``TokensPrompt`` fields for an image request: the collapsed tokens, the images, and their
    ``mm_hash`` identifiers."""
    return {
        "prompt_token_ids": collapse(request.token_ids, request.media, placeholder),
        "multi_modal_data": {"image": images},
        "multi_modal_uuids": {"image": [item.mm_hash for item in request.media]},
    }


def check_expansion(request: GenerateRequest, rendered: Mapping[str, Any]) -> None:
    """``MediaError`` unless vLLM's rendered input (``prompt_token_ids`` and
    ``mm_placeholders["image"]``, ranges with ``offset`` and ``length``) is exactly the request's
    prompt and spans."""
    ranges = sorted(rendered.get("mm_placeholders", {}).get("image", []), key=lambda r: r.offset)
    for i, (item, got) in enumerate(zip(request.media, ranges, strict=False)):
        if (got.offset, got.length) != (item.offset, item.length):
            raise MediaError(
                f"image {i}: the request has {item.length} placeholder tokens at position "
                f"{item.offset}, vLLM's processor for this model makes {got.length} at position "
                f"{got.offset}; the frontend must expand each image as the model's processor does"
            )
    if len(ranges) != len(request.media):
        raise MediaError(
            f"vLLM placed {len(ranges)} images in the prompt, the request has {len(request.media)}"
        )
    tokens = list(rendered.get("prompt_token_ids", ()))
    if tokens != list(request.token_ids):
        at = next((i for i, (a, b) in enumerate(zip(tokens, request.token_ids)) if a != b), None)
        if at is None:
            at = min(len(tokens), len(request.token_ids))
        raise MediaError(
            f"vLLM's prompt ({len(tokens)} tokens) differs from the request's ({len(request.token_ids)}) "
            f"from position {at}: the placeholder tokens must be the ones the model's processor writes"
        )
