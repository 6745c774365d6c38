"""OpenAI's Responses API (``POST /v1/responses``, ``GET`` and ``DELETE /v1/responses/{id}``), the
API Codex and the OpenAI Agents SDK's default model speak.

A request is turned into a chat request (``adapter``: input items -> messages, function tools,
``text.format`` -> structured outputs, ``reasoning.effort`` -> the chat template) and prepared by
``OpenAIService.prepare_chat`` like any chat completion; ``ResponsesWire`` writes the generation
as Responses output items and events. Responses are kept, bounded, in a ``ResponseStore`` (one per
app) for ``previous_response_id`` and ``GET``. ``protocol`` holds the request and response types.
"""
