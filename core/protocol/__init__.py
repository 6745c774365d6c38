"""The HTTP API's types: OpenAI requests and responses (with vLLM's extra parameters), nvext,
and OpenAI error bodies."""
