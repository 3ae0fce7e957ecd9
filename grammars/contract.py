"""The Matcher contract as a type: ``TokenMatcher``, and ``TokenCheck``, what one check proves.

Every matcher kind keeps it, and samplers, decoders and the test kit's ``MatcherLaws`` rely on
nothing else. ``StateHistory`` is the half of it every kind implements alike. Numpy, typing and
``grammars.errors`` only, so every layer of ``grammars`` above the errors may import it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, Sequence, runtime_checkable

import numpy as np

from grammars.errors import RollbackError, TokenRejected

__all__ = ["TokenMatcher", "TokenCheck", "StateHistory"]


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

    @classmethod
    def alone(cls, token: int, allowed: bool) -> "TokenCheck":
        """A check that proves nothing beyond ``token`` itself."""
        ids = np.array([int(token)], dtype=np.int64)
        return cls(allowed, ids[:0], ids) if allowed else cls(allowed, ids, ids[:0])


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


class StateHistory:
    """The moving half of the contract, over a history of states (``_history[-1]`` is the state).

    A matcher kind supplies ``_history`` (a list, start state first) and ``_next_state(token)``
    (the state after ``token``, ``None`` when it is not allowed); advancing, rolling back and
    freezing are then the same for every kind, and so are their errors.
    """

    __slots__ = ()
    _history: list

    def _next_state(self, token: int):  # pragma: no cover - every kind overrides it
        raise NotImplementedError

    @property
    def num_consumed(self) -> int:
        """Tokens consumed so far (what ``rollback`` can undo)."""
        return len(self._history) - 1

    def freeze(self):
        """A hashable snapshot of the state, for memoisation in samplers."""
        return self._history[-1]

    def rejection(self, token: int) -> np.ndarray | None:
        """``None`` when ``token`` may come next; otherwise ``check(token).rejected``."""
        result = self.check(token)  # type: ignore[attr-defined]
        return None if result.allowed else result.rejected

    def advance(self, token: int) -> None:
        """Consume ``token``. Raises ``TokenRejected`` (state unchanged) if it is not allowed."""
        nxt = self._next_state(int(token))
        if nxt is None:
            raise TokenRejected(int(token))
        self._history.append(nxt)

    def try_advance(self, tokens: Sequence[int]) -> int:
        """Consume the longest allowed prefix of ``tokens``; returns how many were consumed."""
        count = 0
        for token in tokens:
            nxt = self._next_state(int(token))
            if nxt is None:
                break
            self._history.append(nxt)
            count += 1
        return count

    def rollback(self, n: int = 1) -> None:
        """Undo the last ``n`` consumed tokens in O(n). Raises ``RollbackError`` if n is too large."""
        if n < 0 or n > len(self._history) - 1:
            raise RollbackError(f"cannot roll back {n} tokens; {len(self._history) - 1} consumed")
        if n:
            del self._history[-n:]
