"""Batch lines run by a provider's own batch API (``batch: native``, docs/batches.md).

- ``store``: the upstream batches and their lines in the SQL store (``NativeStore``);
- ``upstream``: what is asked of a provider's batch API (``BatchApi``), ``calls`` the calls
  both make through the provider the gateway already has; ``openai`` (Files and Batch API) and
  ``anthropic`` (Message Batches) implement it;
- ``lines``: the seam to the pipeline (``NativeLines``: route a line, record its result),
  bound by the app to ``gateway/api/v1/native_line.py``;
- ``runner``: sorting a batch's lines, submitting, polling, recording results
  (``NativeRunner``, driven by the batch runner each turn).
"""
