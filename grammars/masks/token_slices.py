"""Token slices: the vocabulary split once into "plain text" tokens and the rest.

Inside a quoted string almost every token is allowed, so a root walk from a string-body state
visits the whole trie (~275K nodes for Llama 3, ~0.5 ms) on the first mask of each such state.
A *slice* is a character class C fixed per vocabulary (by default JSON's unescaped string
characters). Its tokens — those whose bytes are whole characters of C — are found once, with
the *residual trie*: the trie of every other token (~12K nodes for Llama 3).

For a DFA state s, the slice *applies* when every nonempty prefix of a string in C* keeps the
DFA alive and non-accepting from s (checked on the product of C*'s DFA with the DFA from s).
Then every slice token is allowed from s, none of the slice's trie nodes is a place where the
lexeme may end, and the walk from s is: the slice's tokens, OR a walk over the residual trie.
The test is exact, so a slice is only ever an accelerator: where it does not apply (counted
lengths, patterns, accepting loops) the walk is the ordinary one.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numba import njit

from grammars.automata.byte_dfa import ByteDFA, compile_regular
from grammars.bitmask import pack_bool
from grammars.ir import Chars, chars, repeat
from grammars.vocab.trie import TokenTrie, bfs_states

__all__ = ["TokenSlice", "build_slice", "default_slices", "DEFAULT_SLICE_CLASSES"]

#: Character classes sliced by default: JSON's unescaped string characters (every code point but
#: ``"``, ``\\``, the C0 controls and DEL), which every quoted-string body of JSON, GBNF and
#: C-like grammars allows, also when it allows more.
DEFAULT_SLICE_CLASSES: tuple[Chars, ...] = (chars('"', "\\", (0x00, 0x1F), (0x7F, 0x7F)).complement(),)

#: Product states explored by ``TokenSlice.applies`` before giving up (the answer is then "no",
#: which only costs the ordinary walk); a string body needs fewer than ten.
APPLY_LIMIT = 64
#: ... and only on DFAs of at most this many states (its visited set is states x loop states).
APPLY_MAX_DFA = 1 << 16


@dataclass(frozen=True, eq=False)
class TokenSlice:
    """One character class's tokens, and the trie of every other token (see module docstring)."""

    chars: Chars  # the class C
    loop: ByteDFA  # C*: whole characters of the class; the start state accepts
    mask: np.ndarray  # packed int32 words: the slice's tokens
    parent: np.ndarray  # int64[n]: residual trie, parent position (breadth-first, root first)
    node_byte: np.ndarray  # uint8[n]
    node: np.ndarray  # int64[n]: the main trie node at each residual position (ascending)
    token_position: np.ndarray  # int64[k]: residual position of each residual token ...
    token_id: np.ndarray  # int64[k]: ... and its id

    @property
    def n_slice_tokens(self) -> int:
        return int(np.unpackbits(self.mask.view(np.uint8)).sum())

    def applies(self, dfa: ByteDFA, state: int) -> bool:
        """Every nonempty prefix of C* keeps ``dfa`` alive and non-accepting from ``state``."""
        if dfa.n_states > APPLY_MAX_DFA:
            return False
        return bool(_applies(dfa.table.reshape(-1), dfa.accepting, int(state), self.loop.table.reshape(-1),
                             self.loop.start, self.loop.n_states, APPLY_LIMIT))

    def walk(self, dfa: ByteDFA, state: int) -> tuple[np.ndarray, np.ndarray]:
        """(packed mask, accept nodes) of the root walk from ``state``; only where ``applies``."""
        words, accept = _residual_walk(self.parent, self.node_byte, dfa.table.reshape(-1), dfa.accepting, state,
                                       self.token_position, self.token_id, self.mask)
        return words, self.node[accept]


def build_slice(trie: TokenTrie, char_class: Chars, logits_width: int) -> TokenSlice:
    """Split ``trie``'s tokens by the character class ``char_class``."""
    loop = compile_regular(repeat(char_class, 0, None))
    states, _ = bfs_states(trie.node_parent, trie.node_byte, loop.table.reshape(-1), loop.accepting, loop.start, 1)
    ends = states[trie.token_node]  # the sentinel slot n: tokens without a node
    text = trie.token_node < trie.n_nodes
    in_slice = text & (ends >= 0) & loop.accepting[np.maximum(ends, 0)]
    mask = pack_bool(in_slice, logits_width)
    # the residual trie: every node on the path to a token outside the slice
    rest = np.flatnonzero(text & ~in_slice)
    keep = np.zeros(trie.n_nodes, dtype=bool)
    keep[0] = True
    keep[trie.token_node[rest]] = True
    level_start = np.searchsorted(trie.node_depth, np.arange(int(trie.node_depth.max()) + 2))
    for depth in range(int(trie.node_depth.max()), 0, -1):  # breadth-first: levels are contiguous
        level = np.arange(level_start[depth], level_start[depth + 1])
        keep[trie.node_parent[level[keep[level]]]] = True
    node = np.flatnonzero(keep)
    position = np.full(trie.n_nodes, -1, dtype=np.int64)
    position[node] = np.arange(node.shape[0])
    arrays = dict(
        mask=mask,
        parent=position[trie.node_parent[node]],
        node_byte=np.ascontiguousarray(trie.node_byte[node]),
        node=node,
        token_position=position[trie.token_node[rest]],
        token_id=rest.astype(np.int64),
    )
    for arr in arrays.values():
        arr.setflags(write=False)
    return TokenSlice(chars=char_class, loop=loop, **arrays)


def default_slices(trie: TokenTrie, logits_width: int) -> tuple[TokenSlice, ...]:
    """``DEFAULT_SLICE_CLASSES`` for ``trie``, built once per trie (a few ms) and kept on it."""
    key = f"_corral_slices_{logits_width}"
    cached = trie.__dict__.get(key)
    if cached is None:
        cached = tuple(build_slice(trie, char_class, logits_width) for char_class in DEFAULT_SLICE_CLASSES)
        trie.__dict__[key] = cached  # derived data of an immutable object
    return cached


@njit(cache=True, nogil=True)
def _applies(flat, accepting, state, loop_flat, loop_start, n_loop, limit):  # pragma: no cover - jitted
    """``TokenSlice.applies`` on the product of the loop DFA and the DFA from ``state``."""
    seen = np.zeros(accepting.shape[0] * n_loop, np.bool_)
    stack_loop = np.empty(limit, np.int64)
    stack_state = np.empty(limit, np.int64)
    seen[state * n_loop + loop_start] = True
    stack_loop[0] = loop_start
    stack_state[0] = state
    top = 1
    count = 1
    while top > 0:
        top -= 1
        lp = stack_loop[top]
        q = stack_state[top]
        for b in range(256):
            nl = loop_flat[lp * 256 + b]
            if nl < 0:
                continue
            nq = flat[q * 256 + b]
            if nq < 0 or accepting[nq]:
                return False
            k = nq * n_loop + nl
            if not seen[k]:
                if count == limit:
                    return False
                seen[k] = True
                count += 1
                stack_loop[top] = nl
                stack_state[top] = nq
                top += 1
    return True


@njit(cache=True, nogil=True)
def _residual_walk(parent, node_byte, flat, accepting, state, token_position, token_id,
                   base):  # pragma: no cover - jitted
    """The slice's mask plus the residual tokens alive from ``state``; residual accept positions."""
    states, accept = bfs_states(parent, node_byte, flat, accepting, state, 0)
    words = base.copy()
    bits = words.view(np.uint32)
    for k in range(token_id.shape[0]):
        if states[token_position[k]] >= 0:
            t = token_id[k]
            bits[t >> 5] |= np.uint32(1) << np.uint32(t & 31)
    return words, accept
