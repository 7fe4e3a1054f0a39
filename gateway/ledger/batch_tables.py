"""The tables of batch work, in the SQL store beside usage (schema versions 6 and 7).

``batch_files``: one row per uploaded or generated file (a batch's input, output and error
files), its bytes in ``batch_file_chunks`` (1 MiB each), so every replica that shares the store
reads every file. ``batches``: one row per batch (OpenAI's Batch API and Anthropic's Message
Batches alike), its status and the time of each step. ``batch_lines``: one row per request of a
batch: its body, who holds it (``owner`` and ``lease_until_ms``, the lease a replica renews while
it runs the line) and, once answered, the answer (``status_code``, ``response``). A line is
answered once: the update that records an answer only applies to a line not yet answered.

Version 7 adds the lines sent to a provider's own batch API (``batch: native``):
``batch_natives``, one row per upstream batch (a gateway batch's lines for one provider): the
provider's batch id once submitted (``upstream_id``), its state (``submitting``, ``submitted``,
``ended``), who works it (``owner``, ``lease_until_ms``), when it is next polled, and the budget
hold its lines took (``hold_json``); ``batch_lines.native_id`` and ``native_model`` say which
upstream batch a line went to and the model its route chose (state ``native``); and a batch's
lines are sorted into native and pipeline ones once (``batches.routed_ms``, under the lease
``router``, ``router_until_ms``) before any is claimed.

The runner and the store that use them are ``gateway.batches``.
"""

from __future__ import annotations


def _batch_sql(text: str, big: str, blob: str, options: str) -> str:
    return f"""
CREATE TABLE batch_files (
  file_id {text} NOT NULL PRIMARY KEY,
  key_id {text} NOT NULL,
  purpose {text} NOT NULL,
  filename {text} NOT NULL,
  bytes {big} NOT NULL,
  created_ms {big} NOT NULL
){options};
CREATE INDEX batch_files_key ON batch_files (key_id, created_ms, file_id);
CREATE TABLE batch_file_chunks (
  file_id {text} NOT NULL,
  seq {big} NOT NULL,
  data {blob} NOT NULL,
  PRIMARY KEY (file_id, seq)
){options};
CREATE TABLE batches (
  batch_id {text} NOT NULL PRIMARY KEY,
  key_id {text} NOT NULL,
  api {text} NOT NULL,
  endpoint {text} NOT NULL,
  input_file_id {text},
  completion_window {text} NOT NULL,
  metadata_json {text},
  status {text} NOT NULL,
  created_ms {big} NOT NULL,
  expires_ms {big} NOT NULL,
  in_progress_ms {big},
  finalizing_ms {big},
  completed_ms {big},
  failed_ms {big},
  expired_ms {big},
  cancelling_ms {big},
  cancelled_ms {big},
  output_file_id {text},
  error_file_id {text},
  errors_json {text},
  total {big} NOT NULL,
  completed {big} NOT NULL,
  failed {big} NOT NULL,
  closer {text},
  closer_until_ms {big}
){options};
CREATE INDEX batches_key ON batches (key_id, created_ms, batch_id);
CREATE INDEX batches_status ON batches (status, created_ms);
CREATE TABLE batch_lines (
  batch_id {text} NOT NULL,
  line_index {big} NOT NULL,
  custom_id {text} NOT NULL,
  body {text} NOT NULL,
  state {text} NOT NULL,
  owner {text},
  lease_until_ms {big},
  tries {big} NOT NULL,
  status_code {big},
  response {text},
  request_id {text},
  done_ms {big},
  PRIMARY KEY (batch_id, line_index)
){options};
CREATE INDEX batch_lines_state ON batch_lines (batch_id, state, line_index);
CREATE INDEX batch_lines_owner ON batch_lines (owner, state);
"""


# Schema version 6 of each backend; a shipped migration: the text never changes.
SQLITE_MIGRATION = _batch_sql("TEXT", "INTEGER", "BLOB", " STRICT")
POSTGRES_MIGRATION = _batch_sql("text", "bigint", "bytea", "")


def _native_sql(text: str, big: str, options: str) -> str:
    return f"""
ALTER TABLE batches ADD COLUMN routed_ms {big};
ALTER TABLE batches ADD COLUMN router {text};
ALTER TABLE batches ADD COLUMN router_until_ms {big};
ALTER TABLE batch_lines ADD COLUMN native_id {text};
ALTER TABLE batch_lines ADD COLUMN native_model {text};
CREATE INDEX batch_lines_native ON batch_lines (native_id, line_index);
CREATE TABLE batch_natives (
  native_id {text} NOT NULL PRIMARY KEY,
  batch_id {text} NOT NULL,
  provider {text} NOT NULL,
  state {text} NOT NULL,
  upstream_id {text},
  upstream_status {text},
  hold_json {text},
  lines {big} NOT NULL,
  tries {big} NOT NULL,
  owner {text},
  lease_until_ms {big},
  next_poll_ms {big} NOT NULL,
  cancel_sent_ms {big},
  created_ms {big} NOT NULL,
  submitted_ms {big},
  ended_ms {big}
){options};
CREATE INDEX batch_natives_batch ON batch_natives (batch_id, state);
"""


# Schema version 7: lines sent to a provider's own batch API.
SQLITE_NATIVE_MIGRATION = _native_sql("TEXT", "INTEGER", " STRICT")
POSTGRES_NATIVE_MIGRATION = _native_sql("text", "bigint", "")
