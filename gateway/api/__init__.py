"""The HTTP layer, and nothing else, one folder per part: ``v1/`` (the /v1 pipeline and its
front doors), ``admin/`` (the admin API and the probes), ``dashboard/`` (the ``/admin/ui``
pages and their templates), ``openapi/`` (the OpenAPI document). What they share sits here:
every route is ``Route(path, endpoint(handler, Guard))`` (``endpoint.py``); bodies are read and
answered by ``http.py``, ``strict_json.py``, ``multipart.py`` and ``payloads.py``; errors in the
client's envelope by ``envelopes.py``; ``request_headers.py`` guards the ``x-switchyard-*``
request headers."""
