"""OpenAI's chat completions and (legacy) text completions: ``endpoints`` and the ``ChunkWire``
that writes both, as the OpenAI API and vLLM do."""
