"""An explicit token-level DFA for regular constraints (what DINGO's dynamic program runs over).

States are the byte-DFA states of the single terminal; a token moves a state to the state its
bytes reach. Transitions are computed per state on first use with one trie walk (shared with
the matcher's inside-walk cache), so a huge DFA costs only what is visited.
"""

from __future__ import annotations

import numpy as np

from grammars.bitmask import pack_bool
from grammars.masks.runtime import BoundedCache
from grammars.masks.token_walk import WalkCache

__all__ = ["TokenDFA"]


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

    def is_accepting(self, state: int) -> bool:
        return bool(self.accepting[state])

    def transitions(self, state: int) -> tuple[np.ndarray, np.ndarray]:
        """(token ids, next states) of every text token allowed from ``state``, ascending by id."""
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
        tokens, states = self.transitions(state)
        i = int(np.searchsorted(tokens, token))
        if i < tokens.shape[0] and tokens[i] == token:
            return int(states[i])
        return -1

    def allowed_mask(self, state: int) -> np.ndarray:
        """Packed bitmask of tokens allowed from ``state`` (EOS when accepting)."""
        tokens, _ = self.transitions(state)
        allowed = np.zeros(self.logits_width, dtype=bool)
        allowed[tokens] = True
        if self.accepting[state]:
            allowed[[t for t in self.eos_token_ids if t < self.logits_width]] = True
        return pack_bool(allowed, self.logits_width)
