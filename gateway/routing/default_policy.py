"""The shipped default policy: ``routing_rules.yaml`` packaged beside this module (one copy;
the repository root's ``routing_rules.yaml`` is a link to it).

A gateway whose policy file was left at its default (``./routing_rules.yaml``, no
``SWITCHYARD_POLICY_FILE``) and is missing serves this one, so ``switchyard serve`` in an empty
directory after ``pip install`` answers at once; ``switchyard init`` writes an editable copy. A
policy file named explicitly must exist: a deployment that names a missing file is a mistake.
"""

from __future__ import annotations

from pathlib import Path

SHIPPED_POLICY = Path(__file__).with_name("routing_rules.yaml")


def shipped_policy_text() -> str:
    return SHIPPED_POLICY.read_text(encoding="utf-8")


def policy_fallback(policy_file: Path, *, explicit: bool) -> Path | None:
    """The shipped policy when ``policy_file`` is the unset default and does not exist."""
    if explicit or policy_file.exists():
        return None
    return SHIPPED_POLICY
