"""Budget alerts: thresholds a settle crossed go to a Redis-stream outbox (``outbox.py``) and a
background deliverer POSTs them as HMAC-signed webhooks, at least once, with retries and
backoff, idempotent by alert id (``deliverer.py``). Nothing here runs on a request's path."""
