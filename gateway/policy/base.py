"""What every section of the policy shares: its error and its strict base model.

Every invalid policy is refused with a ``PolicyError`` naming the dotted field path
(``models.gpt-4.1.price.input``), so an operator can find the line to fix.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class PolicyError(ValueError):
    """An invalid policy; ``path`` is the dotted field path (``models.gpt-4.1.price.input``)."""

    def __init__(self, path: str, message: str) -> None:
        super().__init__(f"{path}: {message}" if path else message)
        self.path = path
        self.message = message


class StrictModel(BaseModel):
    """A section of the policy: unknown fields refused, values frozen once loaded."""

    # Every number in a policy is finite: .inf or .nan anywhere is refused, naming the field.
    model_config = ConfigDict(
        extra="forbid", frozen=True, populate_by_name=True, allow_inf_nan=False
    )
