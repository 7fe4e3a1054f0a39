"""Batch work through one key: OpenAI's Batch API and Anthropic's Message Batches, run by the
gateway itself (docs/batches.md).

- ``records``: files, batches, lines; ``store`` (over ``sql``): them in the SQL store beside
  usage (schema in ``gateway/ledger/batch_tables.py``), leases included;
- ``jsonl``: the lines in (checked) and the answers out, in each API's JSONL;
- ``runner``: every replica's share of the work: validate, claim and run lines through the
  pipeline (``lines.LineRunner``, bound by the app to ``gateway/api/v1/batch_line.py``), close;
- ``headroom``: batch lines use only the limits interactive traffic leaves and back off on
  429s; ``local_admission``: they yield the local engine to interactive requests (admitted
  only into an idle engine, called back when one arrives); ``cancels``: a cancel's Redis marks;
- ``native``: the lines routed to a ``batch: native`` provider, sent to its own batch API,
  polled, and booked through the pipeline (``native/runner.py``, driven by the runner);
- ``service``: what the API handlers get (``Batches``) and ``build_runner``.
"""
