"""The OpenAI-compatible HTTP frontend: ASGI app, preprocessing (chat template, tokenizer,
incremental detokenizer), streaming, metrics."""
