"""``python -m gateway.policy``: print the policy's JSON Schema, or check a policy file."""

from __future__ import annotations

import argparse
import json
import sys

from gateway.policy.base import PolicyError
from gateway.policy.parse import load_policy_file, policy_json_schema


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m gateway.policy")
    parser.add_argument("--schema", action="store_true", help="print the JSON Schema")
    parser.add_argument("--check", metavar="FILE", help="validate a policy file")
    args = parser.parse_args(argv)
    if args.schema:
        print(json.dumps(policy_json_schema(), indent=2))
        return 0
    if args.check:
        try:
            load_policy_file(args.check)
        except PolicyError as exc:
            print(f"invalid policy: {exc}", file=sys.stderr)
            return 1
        print("ok")
        return 0
    parser.print_help()
    return 2


if __name__ == "__main__":
    raise SystemExit(main())
