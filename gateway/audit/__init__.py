"""The admin audit log: who did what to which key, team, token or policy, when and from where.

``AuditTrail.record`` writes one entry per admin action (the API, the dashboard, the CLI) to
the SQL store's ``admin_audit`` table (``gateway/ledger/audit.py``) before the action's answer
goes out, falling back to a local spool when the store cannot take it; ``AuditTrail.query``
reads it back for ``/admin/audit`` and the dashboard. Values are scrubbed of secrets first
(``scrub.py``).
"""
