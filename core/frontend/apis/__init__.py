"""The APIs the frontend speaks, one folder each, over one generation core
(``dyn.core.frontend.generation``).

An API's folder holds its endpoints (entries of ``dyn.core.frontend.endpoints.ENDPOINTS``), the
adapter that turns its request into the core's (a chat request for messages, a completions
request for a prompt) and its ``Wire``, which writes the core's per-choice output as the API's
events and bodies:

- ``chat_completions``: ``/v1/chat/completions`` and ``/v1/completions`` (OpenAI, vLLM's extras, nvext);
- ``responses``: ``/v1/responses`` (OpenAI's Responses API: Codex, the Agents SDK);
- ``anthropic``: ``/v1/messages`` (Anthropic's Messages API: Claude Code).
"""
