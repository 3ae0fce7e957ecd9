"""``Matcher``, the cursor over a compiled grammar, and ``UnconstrainedMatcher``: both keep the
``TokenMatcher`` contract (``grammars.contract``; docs/ARCHITECTURE.md, "The Matcher contract").

One Matcher follows one generated sequence. It is cheap to create and to ``fork`` (states are
immutable and shared); the expensive data lives in the ``CompiledGrammar`` and is shared by all
its matchers. A Matcher is *not* thread-safe; distinct matchers of one grammar may be used from
different threads at once.

Errors: user-level misuse raises ``MatchError`` subclasses (``TokenRejected``, ``RollbackError``);
an argument of the wrong type or value raises ``TypeError``/``ValueError`` before anything changes
(the checks live in ``grammars.contract.StateHistory``, shared by every kind); methods that answer
questions (``allows``, ``check``, ``try_advance``) answer "not allowed" for an int id that is no
token rather than raise.

``shortest_completion`` answers "how do I finish from here, in as few bytes as possible" exactly,
from the grammar's structure rather than by searching texts; see ``CompletionTables``.
"""

from __future__ import annotations

import numpy as np

from grammars.bitmask import bit_is_set, pack_bool
from grammars.contract import StateHistory, TokenCheck, TokenMatcher
from grammars.masks.completion import CompletionTables
from grammars.masks.runtime import ACCEPT, GrammarRuntime, MatchState
from grammars.vocab.vocabulary import TokenVocabulary

__all__ = ["TokenMatcher", "Matcher", "UnconstrainedMatcher", "TokenCheck"]  # the contract re-exported

#: State after EOS: nothing more is allowed.
_TERMINATED: MatchState = frozenset()

_NO_TOKENS = np.empty(0, dtype=np.int64)
_NO_TOKENS.setflags(write=False)


class Matcher(StateHistory):
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

    @property
    def _logits_width(self) -> int:
        return self._rt.logits_width

    def _mask(self) -> np.ndarray:
        state = self._history[-1]
        return self._rt.mask(state) if state else self._rt.zero_mask

    def _allows(self, token: int) -> bool:
        """One token only, so it is cheap (the AWRS/ASAp hot path)."""
        state = self._history[-1]
        if token in self._eos:
            return ACCEPT in state
        if not (0 <= token < self._text_ok.shape[0]) or not self._text_ok[token] or not state:
            return False
        cached = self._rt.cached_mask(state)
        if cached is not None:
            return bit_is_set(cached, token)
        return bool(self._rt.consume(state, token))

    def _check(self, token: int) -> TokenCheck:
        """``allows(token)``, plus what the same walk proves about other tokens (``check``).

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
        if token in self._eos:
            return TokenCheck.alone(token, ACCEPT in state)
        if not (0 <= token < self._text_ok.shape[0]) or not self._text_ok[token] or not state:
            return TokenCheck.alone(token, False)
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

    def _forced(self, max_tokens: int) -> list[int]:
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


class UnconstrainedMatcher(StateHistory):
    """The matcher of unconstrained generation: every token of the vocabulary, EOS at any time.

    Keeps the ``TokenMatcher`` contract so that decoders and samplers run one code path with or
    without a constraint. Only padding ids (columns of the logits beyond the vocabulary) are
    never allowed; special tokens are, as in any unconstrained sampler. The state is whether EOS
    was consumed.
    """

    __slots__ = ("_vocab", "_history", "_words")

    def __init__(self, vocab: TokenVocabulary, _history: list[bool] | None = None):
        if not isinstance(vocab, TokenVocabulary):
            raise TypeError(f"UnconstrainedMatcher: vocab must be a TokenVocabulary, got {type(vocab).__name__}")
        self._vocab = vocab
        self._history: list[bool] = _history if _history is not None else [False]
        self._words = pack_bool(np.ones(len(vocab), dtype=bool), vocab.logits_width)

    @property
    def _logits_width(self) -> int:
        return self._vocab.logits_width

    def _mask(self) -> np.ndarray | None:
        return None if self.is_terminated() else self._words

    def is_accepting(self) -> bool:
        return not self._history[-1]

    def is_terminated(self) -> bool:
        return self._history[-1]

    def _forced(self, max_tokens: int) -> list[int]:
        return []

    def shortest_completion(self) -> tuple[int, ...] | None:
        """``()`` (EOS may come at once), ``None`` after EOS."""
        return None if self.is_terminated() else ()

    def fork(self) -> "UnconstrainedMatcher":
        return UnconstrainedMatcher(self._vocab, list(self._history))

    def _next_state(self, token: int) -> bool | None:
        if self._history[-1] or not 0 <= token < len(self._vocab):
            return None
        return token in self._vocab.eos_token_ids

    def __repr__(self) -> str:
        return f"UnconstrainedMatcher(consumed={self.num_consumed})"
