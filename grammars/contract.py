"""The Matcher contract as a type: ``TokenMatcher``, and ``TokenCheck``, what one check proves.

Every matcher kind keeps it, and samplers, decoders and the test kit's ``MatcherLaws`` rely on
nothing else. ``StateHistory`` is the half of it every kind implements alike: the public methods,
which check their arguments here, once, and hand validated ints to each kind's private hooks, so
every kind raises the same ``TypeError``/``ValueError`` for the same misuse. ``token_id``,
``count`` and ``mask_row`` are those checks, for callers outside a matcher too. Numpy, typing and
``grammars.errors`` only, so every layer of ``grammars`` above the errors may import it.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Protocol, Sequence, runtime_checkable

import numpy as np

from grammars.errors import RollbackError, TokenRejected

__all__ = ["TokenMatcher", "TokenCheck", "StateHistory", "token_id", "token_ids", "count", "mask_row", "write_mask"]

#: dtypes ``fill_mask`` writes into: 32-bit words, the layout every mask kernel reads
_MASK_DTYPES = (np.dtype(np.int32), np.dtype(np.uint32))

_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1


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
        """A check that proves nothing beyond ``token`` itself.

        An id outside the int64 range (never a real token) cannot be listed in an id array, so
        its check comes back with empty sets rather than overflowing.
        """
        token = int(token)
        if not _INT64_MIN <= token <= _INT64_MAX:
            none = np.empty(0, dtype=np.int64)
            return cls(allowed, none, none)
        ids = np.array([token], dtype=np.int64)
        return cls(allowed, ids[:0], ids) if allowed else cls(allowed, ids, ids[:0])


# --- argument checks shared by every matcher kind ----------------------------------------------


def token_id(token: object, where: str) -> int:
    """``token`` as a Python int, or ``TypeError`` naming ``where``.

    Token ids are ints: Python ints and numpy integer scalars (what argmax and arrays hand out).
    ``bool`` is refused although it is an ``int`` subclass, and so are floats — ``2.9`` silently
    becoming token 2 would consume a token nobody chose. Any int value is accepted here; whether
    it is a token of the vocabulary is the matcher's answer ("not allowed"), not a type error.
    """
    if isinstance(token, (bool, np.bool_)) or not isinstance(token, (int, np.integer)):
        raise TypeError(f"{where}: a token id must be an int, got {type(token).__name__} {token!r}")
    return int(token)


def count(n: object, name: str, where: str) -> int:
    """A non-negative int argument (a number of tokens), else ``TypeError``/``ValueError``."""
    if isinstance(n, (bool, np.bool_)) or not isinstance(n, (int, np.integer)):
        raise TypeError(f"{where}: {name} must be an int, got {type(n).__name__} {n!r}")
    if n < 0:
        raise ValueError(f"{where}: {name} must be >= 0, got {int(n)}")
    return int(n)


def token_ids(tokens: object, where: str) -> list[int]:
    """Every id of an iterable of token ids, checked before any is used (``TypeError`` otherwise)."""
    if isinstance(tokens, (str, bytes)) or not isinstance(tokens, Iterable):
        raise TypeError(f"{where}: tokens must be a sequence of int token ids, got {type(tokens).__name__}")
    return [token_id(t, where) for t in tokens]


def mask_row(out: object, row: object, words: int, where: str) -> np.ndarray:
    """The row of ``out`` a mask of ``words`` 32-bit words goes into, checked.

    ``out`` is a writable numpy array of int32 or uint32 words, 1-D (the row itself) or 2-D
    (``row`` picks one; ``0 <= row < len(out)``). Other dtypes are refused with ``TypeError``:
    int16, uint8, bool or float buffers would silently truncate the words. The row may be wider
    than ``words`` — serving engines size masks by the model's logits width, which can exceed the
    vocabulary's — and the caller clears the extra words; narrower is a ``ValueError``.
    """
    if not isinstance(out, np.ndarray):
        raise TypeError(f"{where}: out must be a numpy int32 array (allocate_token_bitmask), got {type(out).__name__}")
    if out.dtype not in _MASK_DTYPES:
        raise TypeError(f"{where}: out must hold int32 or uint32 words, got dtype {out.dtype}; "
                        "allocate it with allocate_token_bitmask")
    if out.ndim not in (1, 2):
        raise ValueError(f"{where}: out must be 1-D (one row) or 2-D (rows of words), got {out.ndim} dimensions")
    if not out.flags.writeable:
        raise ValueError(f"{where}: out is read-only")
    if isinstance(row, (bool, np.bool_)) or not isinstance(row, (int, np.integer)):
        raise TypeError(f"{where}: row must be an int, got {type(row).__name__} {row!r}")
    if out.ndim == 1:
        target = out
    else:
        if not 0 <= row < out.shape[0]:
            raise ValueError(f"{where}: row {int(row)} is out of range for a bitmask of {out.shape[0]} rows")
        target = out[int(row)]
    if target.shape[0] < words:
        raise ValueError(f"{where}: the bitmask row has {target.shape[0]} words but this vocabulary needs "
                         f"{words}; allocate it with allocate_token_bitmask")
    return target


def write_mask(target: np.ndarray, words: np.ndarray | None) -> None:
    """Copy ``words`` (int32; ``None``: nothing allowed) into a row from ``mask_row``; zero the rest."""
    n = 0 if words is None else words.shape[0]
    if n:
        target[:n] = words.view(target.dtype)
    target[n:] = 0


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

    Raises, always with the matcher unchanged:

    * ``TokenRejected`` (a ``MatchError``): ``advance`` with a token outside the mask;
    * ``RollbackError`` (a ``MatchError``): ``rollback(n)`` past the start;
    * ``LimitExceeded``: ``fill_mask``, ``allows``, ``check`` and ``advance`` where a ``Limits``
      bound is hit; the matcher stays usable;
    * ``TypeError`` for an argument of the wrong type: a token id that is not an int (numpy
      integers are ints; ``bool`` and ``float`` are not), a count that is not an int, ``tokens``
      that are not an iterable of ints (checked before any is consumed), a mask buffer that is
      not a numpy array of int32/uint32 words;
    * ``ValueError`` for a wrong value: a negative count (``rollback``, ``forced_tokens``), a
      mask row narrower than the vocabulary needs, a row index out of range, a read-only buffer.

    An int id that is no token of this vocabulary (negative, padding, huge) is not an error:
    queries answer "not allowed" and ``advance`` raises ``TokenRejected``. A mask row *wider* than
    needed is fine: the extra words are cleared. A matcher is not thread-safe; forks may be used
    from different threads.
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
    """The half of the contract every kind implements alike, over a history of states.

    A kind supplies ``_history`` (a list, start state first; ``_history[-1]`` is the state) and
    the hooks below, which receive validated ints only; the public methods here check every
    argument (``token_id``, ``count``, ``mask_row``) and then delegate, so that argument errors
    are the same, and raised before anything changes, for every kind:

    * ``_next_state(token)``: the state after ``token``, ``None`` when it is not allowed;
    * ``_allows(token)`` (default: ``_next_state`` is not ``None``) and ``_check(token)``
      (default: ``TokenCheck.alone``);
    * ``_mask()``: the packed int32 words of the current state (``None``: nothing allowed), and
      ``_logits_width``, the number of ids a mask covers;
    * ``_forced(max_tokens)``: the forced run, at most ``max_tokens`` long.
    """

    __slots__ = ()
    _history: list

    # --- hooks --------------------------------------------------------------------------------

    def _next_state(self, token: int):  # pragma: no cover - every kind overrides it
        raise NotImplementedError

    def _mask(self) -> np.ndarray | None:  # pragma: no cover - every kind overrides it
        raise NotImplementedError

    @property
    def _logits_width(self) -> int:  # pragma: no cover - every kind overrides it
        raise NotImplementedError

    def _forced(self, max_tokens: int) -> list[int]:  # pragma: no cover - every kind overrides it
        raise NotImplementedError

    def _allows(self, token: int) -> bool:
        return self._next_state(token) is not None

    def _check(self, token: int) -> TokenCheck:
        return TokenCheck.alone(token, self._allows(token))

    def _where(self, method: str) -> str:
        return f"{type(self).__name__}.{method}"

    def _token(self, token: object, method: str) -> int:
        """``token_id`` with a fast path for plain ints (``allows`` is the samplers' hot path)."""
        return token if type(token) is int else token_id(token, self._where(method))

    # --- queries ------------------------------------------------------------------------------

    @property
    def num_consumed(self) -> int:
        """Tokens consumed so far (what ``rollback`` can undo)."""
        return len(self._history) - 1

    def freeze(self):
        """A hashable snapshot of the state, for memoisation in samplers."""
        return self._history[-1]

    def fill_mask(self, out: np.ndarray, row: int = 0) -> None:
        """Write the allowed-token bitmask into ``out[row]`` (or ``out`` when it is 1-D).

        ``out`` holds int32 (or uint32) words, at least ``ceil(logits_width / 32)`` per row
        (``allocate_token_bitmask``); words beyond those are cleared. Bit ``i`` set: token ``i``
        is allowed. EOS is allowed exactly when ``is_accepting()``. Does not change the state.
        """
        words = (self._logits_width + 31) // 32
        target = mask_row(out, row, words, self._where("fill_mask"))
        write_mask(target, self._mask())

    def allows(self, token: int) -> bool:
        """Whether ``token`` may come next (``False`` for ids outside the vocabulary)."""
        return self._allows(self._token(token, "allows"))

    def check(self, token: int) -> TokenCheck:
        """``allows(token)`` plus the tokens the same check proves rejected or allowed."""
        return self._check(self._token(token, "check"))

    def rejection(self, token: int) -> np.ndarray | None:
        """``None`` when ``token`` may come next; otherwise ``check(token).rejected``."""
        result = self._check(self._token(token, "rejection"))
        return None if result.allowed else result.rejected

    def forced_tokens(self, max_tokens: int = 64) -> list[int]:
        """Tokens the constraint forces from here (each the only allowed one), not consumed.

        Stops at the first state with a choice, with EOS allowed, or after ``max_tokens``.
        """
        return self._forced(count(max_tokens, "max_tokens", self._where("forced_tokens")))

    # --- moves --------------------------------------------------------------------------------

    def advance(self, token: int) -> None:
        """Consume ``token``. Raises ``TokenRejected`` (state unchanged) if it is not allowed."""
        token = self._token(token, "advance")
        nxt = self._next_state(token)
        if nxt is None:
            raise TokenRejected(token)
        self._history.append(nxt)

    def try_advance(self, tokens: Sequence[int]) -> int:
        """Consume the longest allowed prefix of ``tokens``; returns how many were consumed.

        Every id is checked first, so a malformed sequence raises ``TypeError`` with nothing consumed.
        """
        if type(tokens) not in (tuple, list) or any(type(t) is not int for t in tokens):  # plain ints: checked
            tokens = token_ids(tokens, self._where("try_advance"))
        consumed = 0
        for token in tokens:
            nxt = self._next_state(token)
            if nxt is None:
                break
            self._history.append(nxt)
            consumed += 1
        return consumed

    def rollback(self, n: int = 1) -> None:
        """Undo the last ``n`` consumed tokens in O(n). Raises ``RollbackError`` if n is too large."""
        n = count(n, "n", self._where("rollback"))
        if n > len(self._history) - 1:
            raise RollbackError(f"cannot roll back {n} tokens; {len(self._history) - 1} consumed")
        if n:
            del self._history[-n:]
