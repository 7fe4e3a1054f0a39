"""Providers: the ``Provider`` protocol (``base.py``), the OpenAI-compatible upstreams, the
in-process engine (its host and its adapter) and the registry that builds one of each per
policy provider."""
