"""``DynStorageConnector``: the vLLM KV connector of dyn's ``--kv-connector storage`` (the default
on vLLM's CPU platform; ``plugins.vllm.disagg`` says why).

It is vLLM's reference storage connector (``ExampleConnector``, formerly
``SharedStorageConnector``, ``vllm/distributed/kv_transfer/kv_connector/v1/example_connector.py``):
the prefill worker writes each attention layer's KV of a prompt's block-aligned prefix to
safetensors files under ``shared_storage_path``, one directory per prompt named by a hash of its
tokens, during the forward pass that computes it; the decode worker injects those files into the
blocks it allocated for the same prompt, in its own first forward pass. Nothing waits across
engine steps, so neither engine keeps stepping after its request is done. vLLM loads this class in
the engine core through ``kv_connector_module_path`` (this module).

What dyn changes, in the scheduler-side hooks only (the files and the worker-side load and save
are vLLM's):

- KV moves only for the requests that ask, as with vLLM's NIXL connector: a request whose
  ``kv_transfer_params`` hold ``do_remote_decode`` (a prefill request) is stored, and only when its
  whole block-aligned prompt is computed in its first step (a chunked prefill would store blocks not
  yet written: its decode worker then prefills locally); a request whose params hold ``STORAGE_KEY``
  (a decode request) loads. The reference connector stores and loads every request.
- A stored request answers with ``{STORAGE_KEY: path, "prompt_tokens": N}`` (``request_finished``),
  the params of its decode request.
- A load counts only the tokens beyond those the decode worker's prefix cache holds, and never
  below zero (the reference count goes negative when the local cache covers the prompt's last full
  block, which the scheduler cannot take).

Bounded: after each store the prefill worker removes the oldest prompts' directories (by
modification time) beyond ``MAX_STORED_PROMPTS``, so the store holds the prompts of the last
requests only; a decode request whose prompt was removed before it read it prefills that prompt
itself (its scheduler finds no match).
"""

from __future__ import annotations

import logging
from typing import Any

from vllm.distributed.kv_transfer.kv_connector.v1.example_connector import (
    ExampleConnector,
    ExampleConnectorMetadata,
    align_to_block_size,
)

from dyn.plugins.vllm.disagg import MAX_STORED_PROMPTS, STORAGE_KEY, prune

log = logging.getLogger(__name__)

STORE_KEY = "do_remote_decode"
"""The ``kv_transfer_params`` key of a prefill request: store the prompt's KV."""


def stored_tokens(num_prompt_tokens: int, block_size: int) -> int:
    """How many leading prompt tokens' KV the store holds for a prompt: whole blocks, leaving at
    least one prompt token for the decode worker to compute (vLLM samples from its output)."""
    return max(0, align_to_block_size(num_prompt_tokens - 1, block_size))


def _params(request: Any) -> dict[str, Any]:
    params = getattr(request, "kv_transfer_params", None)
    return params if isinstance(params, dict) else {}


class DynStorageConnector(ExampleConnector):
    """vLLM's storage connector, moving KV only for prefill (store) and decode (load) requests."""

    def __init__(self, vllm_config: Any, role: Any, kv_cache_config: Any = None) -> None:
        super().__init__(vllm_config=vllm_config, role=role, kv_cache_config=kv_cache_config)
        self._to_store: set[str] = set()
        """Prefill requests allocated, before their first step."""
        self._stored: set[str] = set()
        """Prefill requests whose KV is written."""

    def get_num_new_matched_tokens(self, request: Any, num_computed_tokens: int) -> tuple[int | None, bool]:
        if STORAGE_KEY not in _params(request) or not self._found_match_for_request(request):
            return 0, False
        stored = stored_tokens(len(request.prompt_token_ids or []), self._block_size)
        return max(0, stored - num_computed_tokens), False

    def update_state_after_alloc(self, request: Any, blocks: Any, num_external_tokens: int) -> None:
        super().update_state_after_alloc(request, blocks, num_external_tokens)
        if _params(request).get(STORE_KEY):
            self._to_store.add(request.request_id)

    def build_connector_meta(self, scheduler_output: Any) -> ExampleConnectorMetadata:
        meta = ExampleConnectorMetadata()
        for new_req in scheduler_output.scheduled_new_reqs:
            rid = new_req.req_id
            token_ids = new_req.prompt_token_ids or []
            mm_hashes = [f.identifier for f in new_req.mm_features]
            if rid in self._requests_need_load:
                meta.add_request(token_ids, new_req.block_ids[0], self._block_size, False, mm_hashes)
            elif rid in self._to_store:
                self._to_store.discard(rid)
                done = new_req.num_computed_tokens + scheduler_output.num_scheduled_tokens.get(rid, 0)
                if done < stored_tokens(len(token_ids), self._block_size):
                    log.warning(
                        "request %s: its prompt is prefilled in chunks, so its KV is not stored; "
                        "its decode worker prefills it again",
                        rid,
                    )
                    continue
                if not self._found_match_for_prompt(token_ids, mm_hashes):
                    meta.add_request(token_ids, new_req.block_ids[0], self._block_size, True, mm_hashes)
                self._stored.add(rid)
        # a load resumed after preemption, as the reference connector handles it
        cached = scheduler_output.scheduled_cached_reqs
        for i, rid in enumerate(cached.req_ids):
            if rid not in cached.resumed_req_ids or rid not in self._requests_need_load:
                continue
            request = self._requests_need_load[rid]
            total = cached.num_computed_tokens[i] + scheduler_output.num_scheduled_tokens[rid]
            block_ids = cached.new_block_ids[i]
            assert block_ids is not None
            meta.add_request(
                request.all_token_ids[:total],
                block_ids[0],
                self._block_size,
                False,
                [f.identifier for f in request.mm_features],
            )
        self._requests_need_load.clear()
        return meta

    def request_finished(self, request: Any, block_ids: list[int]) -> tuple[bool, dict[str, Any] | None]:
        rid = request.request_id
        self._to_store.discard(rid)
        if rid not in self._stored:
            return False, None
        self._stored.discard(rid)
        prune(self._storage_path, MAX_STORED_PROMPTS)
        return False, {STORAGE_KEY: self._storage_path, "prompt_tokens": len(request.prompt_token_ids or [])}
