"""``Matcher``, the cursor over a compiled grammar, and ``UnconstrainedMatcher``: both keep the
``TokenMatcher`` contract (``grammars.contract``; docs/ARCHITECTURE.md, "The Matcher contract").

One Matcher follows one generated sequence. It is cheap to create and to ``fork`` (states are
immutable and shared); the expensive data lives in the ``CompiledGrammar`` and is shared by all
its matchers. A Matcher is *not* thread-safe; distinct matchers of one grammar may be used from
different threads at once.

Errors: user-level misuse raises ``MatchError`` subclasses (``TokenRejected``, ``RollbackError``);
methods that answer questions (``allows``, ``try_advance``) never raise for a bad token.

``shortest_completion`` answers "how do I finish from here, in as few bytes as possible" exactly,
from the grammar's structure rather than by searching texts; see ``CompletionTables``.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from grammars.bitmask import bit_is_set, pack_bool
from grammars.contract import TokenCheck, TokenMatcher
from grammars.errors import RollbackError, TokenRejected
from grammars.masks.completion import CompletionTables
from grammars.masks.runtime import ACCEPT, GrammarRuntime, MatchState

__all__ = ["TokenMatcher", "Matcher", "UnconstrainedMatcher", "TokenCheck"]  # the contract re-exported

#: State after EOS: nothing more is allowed.
_TERMINATED: MatchState = frozenset()

_NO_TOKENS = np.empty(0, dtype=np.int64)
_NO_TOKENS.setflags(write=False)


class Matcher:
    """Tracks which tokens may come next. Obtain one from ``CompiledGrammar.matcher()``."""

    __slots__ = ("_rt", "_history", "_text_ok", "_eos")

    def __init__(self, runtime: GrammarRuntime, text_token: np.ndarray, _history: list | None = None):
        self._rt = runtime
        self._text_ok = text_token
        self._eos = runtime.eos_token_ids
        self._history: list[MatchState] = _history if _history is not None else [runtime.initial]

    # --- queries (never mutate) --------------------------------------------------------------

    @property
    def state(self) -> MatchState:
        """The current state: hashable and immutable, equal for equal futures of this grammar."""
        return self._history[-1]

    def freeze(self) -> MatchState:
        """A hashable snapshot (same as ``state``) for memoisation in samplers."""
        return self._history[-1]

    @property
    def num_consumed(self) -> int:
        """Tokens consumed so far (what ``rollback`` can undo)."""
        return len(self._history) - 1

    def fill_mask(self, out: np.ndarray, row: int = 0) -> None:
        """Write the allowed-token bitmask into ``out[row]`` (or ``out`` when it is 1-D).

        ``out`` is int32 with ``ceil(logits_width / 32)`` words per row (see
        ``allocate_token_bitmask``); bit ``i`` set means token ``i`` is allowed. EOS is allowed
        exactly when ``is_accepting()``. This method does not change the matcher state.
        """
        mask = self._rt.mask(self._history[-1]) if self._history[-1] else self._rt.zero_mask
        target = out if out.ndim == 1 else out[row]
        if target.shape[0] != mask.shape[0]:
            raise ValueError(
                f"bitmask row has {target.shape[0]} words but this vocabulary needs {mask.shape[0]} "
                f"(logits_width={self._rt.logits_width}); allocate it with allocate_token_bitmask"
            )
        target[:] = mask

    def allows(self, token: int) -> bool:
        """Whether ``token`` may come next; one token only, so it is cheap (AWRS/ASAp hot path)."""
        state = self._history[-1]
        token = int(token)
        if token in self._eos:
            return ACCEPT in state
        if not (0 <= token < self._text_ok.shape[0]) or not self._text_ok[token] or not state:
            return False
        cached = self._rt.cached_mask(state)
        if cached is not None:
            return bit_is_set(cached, token)
        return bool(self._rt.consume(state, token))

    def rejection(self, token: int) -> np.ndarray | None:
        """``None`` when ``token`` may come next; otherwise the ids of tokens rejected with it
        (``check(token).rejected``)."""
        result = self.check(token)
        return None if result.allowed else result.rejected

    def check(self, token: int) -> TokenCheck:
        """``allows(token)``, plus what the same walk proves about other tokens.

        A text token is allowed iff the walk of its bytes stays alive. A rejected walk stops at
        the first byte that cannot follow, and each state it went through says which bytes could
        follow there: every text token spelled with the same first ``d`` bytes and then a byte
        that cannot follow after them is rejected too, for every ``d`` up to the failure point
        (``d = 0``: every token whose first byte cannot start here). Every token spelled as a
        prefix that the walk got through alive is allowed. AWRS removes the rejected set with
        one draw and answers the accepted set without asking again. Special tokens and ids
        outside the vocabulary come back alone.
        """
        state = self._history[-1]
        token = int(token)
        if token in self._eos:
            accepting = ACCEPT in state
            alone = np.array([token], dtype=np.int64)
            return TokenCheck(accepting, _NO_TOKENS if accepting else alone, alone if accepting else _NO_TOKENS)
        if not (0 <= token < self._text_ok.shape[0]) or not self._text_ok[token] or not state:
            return TokenCheck(False, np.array([token], dtype=np.int64), _NO_TOKENS)
        trie = self._rt.trie
        cached = self._rt.cached_mask(state)
        path = None if cached is not None and bit_is_set(cached, token) else self._rt.dead_end(state, token)
        if path is None:
            return TokenCheck(True, _NO_TOKENS, trie.tokens_on_path(token, len(self._rt.token_bytes[token])))
        next_bytes = self._rt.next_bytes
        deeper = [trie.tokens_continuing(token, d, ~next_bytes(s)) for d, s in enumerate(path) if d]
        rejected = np.concatenate([self._rt.dead_start(state), *deeper])
        return TokenCheck(False, rejected, trie.tokens_on_path(token, len(path) - 1))

    def is_accepting(self) -> bool:
        """The text so far is a complete sentence: EOS is allowed now."""
        return ACCEPT in self._history[-1]

    def is_terminated(self) -> bool:
        """EOS has been consumed: no token is allowed until ``rollback``."""
        return not self._history[-1]

    def forced_tokens(self, max_tokens: int = 64) -> list[int]:
        """Tokens the grammar forces from here (each the only allowed choice), without consuming them.

        Stops at the first state with a choice, with EOS allowed, or after ``max_tokens``.
        """
        probe = self.fork()
        forced: list[int] = []
        while len(forced) < max_tokens and probe._history[-1] and not probe.is_accepting():
            words = probe._rt.mask(probe._history[-1])
            nonzero = np.flatnonzero(words)
            if nonzero.shape[0] != 1:
                break
            word = int(words[nonzero[0]]) & 0xFFFFFFFF
            if word & (word - 1):
                break
            token = int(nonzero[0]) * 32 + word.bit_length() - 1
            forced.append(token)
            probe.advance(token)
        return forced

    def shortest_completion_text(self) -> bytes | None:
        """The shortest byte string after which the matcher accepts (``b""`` when it accepts now).

        Exact: no shorter text leads to an accepting state. ``None`` when no text does (EOS was
        consumed) or a parser limit was hit. Cached per state; does not change the matcher.
        Cheaper than ``shortest_completion`` (no tokenization): its length bounds the token count
        from above whenever the vocabulary spells every byte as a token.
        """
        state = self._history[-1]
        if ACCEPT in state:
            return b""
        if not state:
            return None
        return CompletionTables.of(self._rt).text(state)

    def shortest_completion(self) -> tuple[int, ...] | None:
        """Tokens that bring the matcher to an accepting state (EOS not included), or ``None``.

        They spell ``shortest_completion_text()`` — the fewest bytes that finish — in the fewest
        vocabulary tokens (special tokens never used), each allowed in turn. So the length is an
        achievable upper bound on the true token minimum, exact for a byte-level vocabulary: a
        longer text could in principle take fewer, longer tokens. ``None`` also when the
        vocabulary cannot spell the text. Cached per state.
        """
        state = self._history[-1]
        if ACCEPT in state:
            return ()
        if not state:
            return None
        return CompletionTables.of(self._rt).tokens(state, self._text_ok)

    # --- mutations ---------------------------------------------------------------------------

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

    def reset(self) -> None:
        """Back to the start state."""
        del self._history[1:]

    def fork(self) -> "Matcher":
        """An independent copy sharing all compiled data; advancing one never affects the other."""
        return Matcher(self._rt, self._text_ok, list(self._history))

    # --- internals ---------------------------------------------------------------------------

    def _next_state(self, token: int) -> MatchState | None:
        state = self._history[-1]
        if not state:
            return None
        if token in self._eos:
            return _TERMINATED if ACCEPT in state else None
        if not (0 <= token < self._text_ok.shape[0]) or not self._text_ok[token]:
            return None
        nxt = self._rt.consume(state, token)
        return nxt if nxt else None

    def __repr__(self) -> str:
        return f"Matcher(consumed={self.num_consumed}, configurations={len(self._history[-1])})"


class UnconstrainedMatcher:
    """The matcher of unconstrained generation: every token of the vocabulary, EOS at any time.

    Keeps the ``TokenMatcher`` contract so that decoders and samplers run one code path with or
    without a constraint. Only padding ids (columns of the logits beyond the vocabulary) are
    never allowed; special tokens are, as in any unconstrained sampler.
    """

    __slots__ = ("_vocab", "_consumed", "_words", "_text_ok")

    def __init__(self, vocab, _consumed: list[int] | None = None):
        self._vocab = vocab
        self._consumed: list[int] = _consumed if _consumed is not None else []
        self._text_ok = np.ones(len(vocab), dtype=bool)
        self._words = pack_bool(self._text_ok, vocab.logits_width)

    @property
    def num_consumed(self) -> int:
        return len(self._consumed)

    def freeze(self) -> tuple[str, bool]:
        return ("unconstrained", self.is_terminated())

    def fill_mask(self, out: np.ndarray, row: int = 0) -> None:
        target = out if out.ndim == 1 else out[row]
        if target.shape[0] != self._words.shape[0]:
            raise ValueError(
                f"bitmask row has {target.shape[0]} words but this vocabulary needs {self._words.shape[0]} "
                f"(logits_width={self._vocab.logits_width}); allocate it with allocate_token_bitmask"
            )
        target[:] = 0 if self.is_terminated() else self._words

    def allows(self, token: int) -> bool:
        token = int(token)
        return not self.is_terminated() and 0 <= token < self._text_ok.shape[0] and bool(self._text_ok[token])

    def check(self, token: int) -> TokenCheck:
        alone = np.array([int(token)], dtype=np.int64)
        if self.allows(token):
            return TokenCheck(True, _NO_TOKENS, alone)
        return TokenCheck(False, alone, _NO_TOKENS)

    def rejection(self, token: int) -> np.ndarray | None:
        result = self.check(token)
        return None if result.allowed else result.rejected

    def is_accepting(self) -> bool:
        return not self.is_terminated()

    def is_terminated(self) -> bool:
        return bool(self._consumed) and self._consumed[-1] in self._vocab.eos_token_ids

    def forced_tokens(self, max_tokens: int = 64) -> list[int]:
        return []

    def shortest_completion(self) -> tuple[int, ...] | None:
        return None if self.is_terminated() else ()

    def advance(self, token: int) -> None:
        if not self.allows(token):
            raise TokenRejected(int(token))
        self._consumed.append(int(token))

    def try_advance(self, tokens: Sequence[int]) -> int:
        count = 0
        for token in tokens:
            if not self.allows(token):
                break
            self._consumed.append(int(token))
            count += 1
        return count

    def rollback(self, n: int = 1) -> None:
        if n < 0 or n > len(self._consumed):
            raise RollbackError(f"cannot roll back {n} tokens; {len(self._consumed)} consumed")
        if n:
            del self._consumed[-n:]

    def fork(self) -> "UnconstrainedMatcher":
        return UnconstrainedMatcher(self._vocab, list(self._consumed))

    def __repr__(self) -> str:
        return f"UnconstrainedMatcher(consumed={self.num_consumed})"
