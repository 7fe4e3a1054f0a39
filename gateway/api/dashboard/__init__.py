"""The ``/admin/ui`` dashboard: server-rendered pages (``templates/``, drawn by ``view.py``),
the usage page and login (``home.py``), keys, teams and the audit log (``manage.py``)."""
