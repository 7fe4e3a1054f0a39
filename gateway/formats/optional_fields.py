"""Optional fields of a rendered body: a field whose value is None is left out, not sent null.

Every format renders the same way: modelled settings a client left unset are absent from the
body an upstream gets, so the upstream applies its own default.
"""

from __future__ import annotations

from typing import Any


def present(fields: dict[str, Any]) -> dict[str, Any]:
    """The fields that are set, in their order."""
    return {key: value for key, value in fields.items() if value is not None}
