"""An explicit token-level DFA for regular constraints (what DINGO's dynamic program runs over).

States are the byte-DFA states of the single terminal; a token moves a state to the state its
bytes reach. Transitions are computed per state on first use with one trie walk (shared with
the matcher's inside-walk cache), so a huge DFA costs only what is visited.
"""

from __future__ import annotations

from collections import deque

import numpy as np

from grammars.bitmask import pack_bool
from grammars.contract import StateHistory, token_id
from grammars.memo import BoundedCache
from grammars.masks.token_walk import WalkCache

__all__ = ["TokenDFA", "DFAMatcher"]

#: ``DFAMatcher``'s state after EOS: nothing more is allowed.
TERMINATED = -2


class TokenDFA:
    """``next_state(state, token)``; state ``-1`` is dead. EOS is allowed in accepting states.

    Do not construct directly: use ``CompiledGrammar.as_dfa()``. Thread-safe.
    """

    def __init__(self, dfa, start_accepting: bool, walks: WalkCache,
                 eos_token_ids: frozenset[int], logits_width: int):
        self._dfa = dfa
        self._walks = walks
        self.start = int(dfa.start)
        self.n_states = int(dfa.n_states)
        accepting = np.array(dfa.accepting, dtype=bool, copy=True)
        accepting[self.start] = start_accepting
        accepting.setflags(write=False)
        self.accepting = accepting
        self.eos_token_ids = eos_token_ids
        self.logits_width = logits_width
        self._rows = BoundedCache(65536)
        self._masks = BoundedCache(4096)

    def _state(self, state: object, where: str) -> int:
        """``state`` checked: an int naming one of this DFA's states (``TypeError``/``ValueError``)."""
        if isinstance(state, (bool, np.bool_)) or not isinstance(state, (int, np.integer)):
            raise TypeError(f"TokenDFA.{where}: state must be an int, got {type(state).__name__} {state!r}")
        if not 0 <= state < self.n_states:
            raise ValueError(f"TokenDFA.{where}: state {int(state)} is not a state of this DFA "
                             f"(0..{self.n_states - 1}; -1 is dead, not a state to ask about)")
        return int(state)

    def is_accepting(self, state: int) -> bool:
        """Whether ``state`` accepts (EOS is allowed there)."""
        return bool(self.accepting[self._state(state, "is_accepting")])

    def transitions(self, state: int) -> tuple[np.ndarray, np.ndarray]:
        """(token ids, next states) of every text token allowed from ``state``, ascending by id."""
        state = self._state(state, "transitions")
        row = self._rows.get(state)
        if row is None:
            nxt = self._walks.token_next_states(self._dfa, state)
            tokens = np.flatnonzero(nxt >= 0)
            row = (tokens, nxt[tokens])
            for arr in row:
                arr.setflags(write=False)
            self._rows.put(state, row)
        return row

    def next_state(self, state: int, token: int) -> int:
        """The state after ``token`` (a text token; EOS is the matcher's business), ``-1`` if dead."""
        token = token_id(token, "TokenDFA.next_state")
        tokens, states = self.transitions(state)
        if not 0 <= token < self.logits_width:
            return -1
        i = int(np.searchsorted(tokens, token))
        if i < tokens.shape[0] and tokens[i] == token:
            return int(states[i])
        return -1

    def matcher(self) -> "DFAMatcher":
        """A cursor over this DFA at its start state, keeping the ``TokenMatcher`` contract."""
        return DFAMatcher(self, [self.start])

    def allowed_mask(self, state: int) -> np.ndarray:
        """Packed bitmask of tokens allowed from ``state`` (EOS when accepting); read-only, cached."""
        state = self._state(state, "allowed_mask")
        cached = self._masks.get(state)
        if cached is None:
            tokens, _ = self.transitions(state)
            allowed = np.zeros(self.logits_width, dtype=bool)
            allowed[tokens] = True
            if self.accepting[state]:
                allowed[[t for t in self.eos_token_ids if t < self.logits_width]] = True
            cached = pack_bool(allowed, self.logits_width)
            cached.setflags(write=False)
            self._masks.put(state, cached)
        return cached

    def shortest_completion(self, state: int) -> tuple[int, ...] | None:
        """Fewest tokens from ``state`` to an accepting state (breadth-first over DFA states,
        each visited once); ``None`` when no accepting state can be reached."""
        state = self._state(state, "shortest_completion")
        if self.accepting[state]:
            return ()
        parent: dict[int, tuple[int, int]] = {state: (-1, -1)}
        queue = deque([state])
        while queue:
            here = queue.popleft()
            tokens, states = self.transitions(here)
            for token, nxt in zip(tokens.tolist(), states.tolist()):
                if nxt in parent:
                    continue
                parent[nxt] = (here, token)
                if self.accepting[nxt]:
                    path = []
                    while nxt != state:
                        nxt, token = parent[nxt]
                        path.append(token)
                    return tuple(reversed(path))
                queue.append(nxt)
        return None


class DFAMatcher(StateHistory):
    """One sequence's position in a ``TokenDFA``: the ``TokenMatcher`` contract over DFA states.

    What a regular constraint's decoder holds when it also runs DFA-level algorithms (DINGO's
    dynamic program) over the same ``TokenDFA``: the state is a plain int, shared with them.
    """

    __slots__ = ("dfa", "_history")

    def __init__(self, dfa: TokenDFA, history: list[int]):
        self.dfa = dfa
        self._history = history

    @property
    def state(self) -> int:
        """The DFA state (``TERMINATED`` after EOS)."""
        return self._history[-1]

    @property
    def _logits_width(self) -> int:
        return self.dfa.logits_width

    def _mask(self) -> np.ndarray | None:
        state = self._history[-1]
        return None if state == TERMINATED else self.dfa.allowed_mask(state)

    def is_accepting(self) -> bool:
        """The text so far is complete: EOS is allowed now."""
        state = self._history[-1]
        return state != TERMINATED and bool(self.dfa.accepting[state])

    def is_terminated(self) -> bool:
        """EOS has been consumed: no token is allowed until ``rollback``."""
        return self._history[-1] == TERMINATED

    def _forced(self, max_tokens: int) -> list[int]:
        forced: list[int] = []
        state = self._history[-1]
        while len(forced) < max_tokens and state != TERMINATED and not self.dfa.accepting[state]:
            tokens, states = self.dfa.transitions(state)
            if tokens.shape[0] != 1:
                break
            forced.append(int(tokens[0]))
            state = int(states[0])
        return forced

    def shortest_completion(self) -> tuple[int, ...] | None:
        """Fewest tokens to an accepting state (``TokenDFA.shortest_completion``); ``None`` after EOS."""
        state = self._history[-1]
        return None if state == TERMINATED else self.dfa.shortest_completion(state)

    def fork(self) -> "DFAMatcher":
        """An independent copy at the same state."""
        return DFAMatcher(self.dfa, list(self._history))

    def _next_state(self, token: int) -> int | None:
        state = self._history[-1]
        if state == TERMINATED:
            return None
        if token in self.dfa.eos_token_ids:
            return TERMINATED if self.dfa.accepting[state] else None
        nxt = self.dfa.next_state(state, token)
        return None if nxt < 0 else nxt

    def __repr__(self) -> str:
        return f"DFAMatcher(state={self.state}, consumed={self.num_consumed})"
