"""The Files API: files uploaded once and referenced by id in later requests (``file_id`` of a
Responses ``input_file`` part, an Anthropic document's ``file`` source)."""
