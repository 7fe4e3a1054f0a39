"""One sample's position in its grammar: which tokens may come next, advanced token by token.

Lives on the host with the engine's sequence (`Sequence.grammar`); the step builder fills the
bitmask of every constrained row of a step (`fill_bitmask`) and the engine advances each
matcher by its sampled token once that token is on the host. The grammar's end allows only
the stop tokens (EOS); accepting one terminates the matcher and the sample stops.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch


class GrammarMatcher:
    __slots__ = ("_ban", "_matcher")

    def __init__(self, matcher: Any, ban: torch.Tensor | None = None) -> None:
        self._matcher = matcher  # xgrammar.GrammarMatcher
        self._ban = ban  # [words] int32: tokens this output never takes (bits cleared)

    def accept(self, token_id: int) -> bool:
        """Advance by the sampled token; False if the grammar does not allow it."""
        return bool(self._matcher.accept_token(token_id))

    @property
    def is_terminated(self) -> bool:
        """The grammar has ended (a stop token was accepted): nothing may follow."""
        return bool(self._matcher.is_terminated())

    def fill(self, bitmask: torch.Tensor, index: int) -> None:
        self._matcher.fill_next_token_bitmask(bitmask, index)
        if self._ban is not None:
            bitmask[index].bitwise_and_(self._ban)


def fill_bitmask(matchers: list[GrammarMatcher], bitmask: np.ndarray) -> None:
    """Row ``i`` of ``bitmask`` (``[k, words]`` int32) gets matcher ``i``'s allowed tokens.

    One after another in this thread: on a shared 2-core box xgrammar's thread pool was no
    faster at batch 16 (docs/benchmarks.md)."""
    tensor = torch.from_numpy(bitmask)
    for index, matcher in enumerate(matchers):
        matcher.fill(tensor, index)
