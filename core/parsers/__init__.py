"""Output parsers: turning a model's raw text into what the OpenAI API returns.

Models write their reasoning and their tool calls as text in formats of their own (``<think>``
sections, ``<tool_call>`` JSON, Python-style calls, Harmony channels, ...). A parser reads one
choice's text as it streams and splits it into events, the same whether the text arrives whole
or a character at a time:

- ``reasoning``: ``ReasoningParser`` families, found by name in ``REASONING_PARSERS``;
- ``tool``: ``ToolParser`` families, found by name in ``TOOL_PARSERS``; ``forced`` parses the
  output of a forced tool call (``tool_choice`` required or named).

Each family is one module in its package, registered by name with the package registry's
``register`` decorator, so adding a parser touches one file (``dyn.core.parsers.registry``).
The frontend's output stage (``dyn.core.frontend.output``) runs them per choice; the mocker
uses a tool parser's ``render`` to write calls in the model's format.
"""
