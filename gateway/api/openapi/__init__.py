"""The OpenAPI document served at ``GET /openapi.json`` (``document.py``) and its parts."""
