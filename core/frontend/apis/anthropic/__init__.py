"""Anthropic's Messages API (``/v1/messages``, ``/v1/messages/count_tokens``), as Claude Code
speaks it: ``protocol`` (the request, response and error types), ``adapter`` (a Messages request
as the chat request the core prepares), ``wire`` (``MessagesWire``: the message and its named SSE
events), ``errors`` (Anthropic's error shape) and ``endpoints``. What is served and what is
ignored: ``docs/api-anthropic.md``."""
