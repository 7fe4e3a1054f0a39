"""The HTTP layer, and nothing else: every route is ``Route(path, endpoint(handler, Guard))``
(``endpoint.py``) and each module holds the handlers of one concern."""
