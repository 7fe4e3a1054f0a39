"""The /v1 API: one pipeline (``pipeline.py``) behind every front door (``doors.py``: OpenAI's
chat completions, completions, embeddings, images, moderations, speech and uploads, Anthropic's
messages, OpenAI's Responses), the model list, and the end of each request
(``request_end.py``)."""
