"""The Matcher contract as a type: ``TokenMatcher``, and ``TokenCheck``, what one check proves.

Every matcher kind keeps it, and samplers, decoders and the test kit's ``MatcherLaws`` rely on
nothing else. Numpy and typing only, so every layer of ``grammars`` may import it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, Sequence, runtime_checkable

import numpy as np

__all__ = ["TokenMatcher", "TokenCheck"]


@dataclass(frozen=True)
class TokenCheck:
    """What one check of a token proves (``Matcher.check``).

    ``allowed``: the token may come next (``Matcher.allows``). ``rejected``: ids proven not
    allowed by the same walk (the token among them when it is not allowed; empty when it is).
    ``accepted``: ids proven allowed — tokens spelled as a prefix of the token's bytes that its
    walk got through alive (the token itself when allowed).
    """

    allowed: bool
    rejected: np.ndarray
    accepted: np.ndarray


@runtime_checkable
class TokenMatcher(Protocol):
    """The contract of a matcher: one sequence's position in a constraint, over token ids.

    Every matcher kind keeps it — ``Matcher`` (any compiled grammar), ``DFAMatcher``
    (``TokenDFA.matcher()``, a regular constraint as an explicit token DFA) and
    ``UnconstrainedMatcher`` (no constraint) — and samplers, decoders and the test kit's
    ``MatcherLaws`` rely on nothing else.

    Queries never change the state: ``fill_mask``, ``allows``, ``check``, ``rejection``, ``is_accepting``,
    ``is_terminated``, ``forced_tokens``, ``shortest_completion``, ``freeze``, ``num_consumed``.
    Only ``advance``, ``try_advance`` and ``rollback`` move it; ``fork`` returns an independent
    copy. The mask, ``allows``, ``check`` and ``try_advance`` agree on every token id of the
    logits width; EOS is allowed exactly when ``is_accepting()``; ids beyond the vocabulary
    (padding columns of the logits) are never allowed.

    Raises: ``advance`` a ``TokenRejected`` for a token outside the mask, ``rollback`` a
    ``RollbackError`` past the start, both leaving the state unchanged. ``fill_mask``, ``allows``,
    ``check`` and ``advance`` may raise ``LimitExceeded`` where a ``Limits`` bound is hit; the
    matcher is then unchanged and stays usable. Queries for a bad token answer "not allowed"
    rather than raise. A matcher is not thread-safe; forks may be used from different threads.
    """

    @property
    def num_consumed(self) -> int:
        """Tokens consumed so far: how far ``rollback`` can go."""
        ...

    def freeze(self) -> object:
        """A hashable snapshot of the state, equal for equal states (memo keys in samplers)."""
        ...

    def fill_mask(self, out: np.ndarray, row: int = 0) -> None:
        """Write the allowed-token bitmask into ``out[row]`` (``out`` 1-D: into ``out``)."""
        ...

    def allows(self, token: int) -> bool:
        """Whether ``token`` may come next."""
        ...

    def check(self, token: int) -> TokenCheck:
        """``allows(token)`` plus the tokens the same check proves rejected or allowed."""
        ...

    def rejection(self, token: int) -> np.ndarray | None:
        """``None`` when ``token`` is allowed, else ``check(token).rejected``."""
        ...

    def is_accepting(self) -> bool:
        """The text so far is complete: EOS is allowed."""
        ...

    def is_terminated(self) -> bool:
        """EOS was consumed: nothing is allowed until ``rollback``."""
        ...

    def forced_tokens(self, max_tokens: int = 64) -> list[int]:
        """The run of tokens that are each the only allowed one from here, not consumed."""
        ...

    def shortest_completion(self) -> tuple[int, ...] | None:
        """Tokens, each allowed in turn, after which the matcher accepts; ``None`` if none do."""
        ...

    def advance(self, token: int) -> None:
        """Consume ``token`` or raise ``TokenRejected`` with the state unchanged."""
        ...

    def try_advance(self, tokens: Sequence[int]) -> int:
        """Consume the longest allowed prefix of ``tokens``; how many were consumed."""
        ...

    def rollback(self, n: int = 1) -> None:
        """Undo the last ``n`` tokens or raise ``RollbackError`` with the state unchanged."""
        ...

    def fork(self) -> "TokenMatcher":
        """An independent copy at the same state."""
        ...


