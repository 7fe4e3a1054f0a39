"""Metering: the per-key limits (reserve before the upstream call, settle after), the usage
ledger and its spool, the settle batch that writes both in one round trip, and the reports."""
