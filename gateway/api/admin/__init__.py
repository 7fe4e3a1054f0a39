"""The admin API (``/admin/*``: keys, teams, tokens, policy, usage, audit, cache, dead
letters), ``GET /v1/usage``, and the operations endpoints (probes, metrics, the OpenAPI
document): a module a concern, each route behind its ``Guard``."""
