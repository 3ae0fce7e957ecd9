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
The test is exact, so a slice is only ever an accelerator: where it does not apply (patterns,
accepting loops) the walk is the ordinary one.

Counted lengths (``maxLength``) get a *bounded* slice (``TokenSlice.reach``): from a state d
characters before the end of a counted body, every C string of at most d characters keeps the
DFA alive and non-accepting and every one of d + 1 characters kills it. Then the slice tokens
of at most d characters are allowed and the longer ones are not, so the walk is their mask OR
the residual walk. Each position of such a body is a walk of its own (the remaining count
differs), so without it every position of a ``maxLength`` string cost a whole-trie walk.
"""

from __future__ import annotations

from dataclasses import dataclass, field

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
#: (DFA state, loop state) pairs one character of ``TokenSlice.reach`` may meet before it gives
#: up (the answer is then None, which only costs the ordinary walk); a counted body meets ~5.
REACH_WIDTH = 64


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
    token_chars: np.ndarray  # int32[logits_width]: characters of each slice token; -1 for others
    max_chars: int  # the most characters a slice token has
    loop_bytes: np.ndarray  # int64: the bytes with a transition from each loop state, state after state ...
    loop_byte_start: np.ndarray  # int64[loop states + 1]: ... from this offset
    _bounded: dict = field(default_factory=dict, repr=False)  # d -> mask of tokens of <= d characters

    @property
    def n_slice_tokens(self) -> int:
        return int(np.unpackbits(self.mask.view(np.uint8)).sum())

    def applies(self, dfa: ByteDFA, state: int) -> bool:
        """Every nonempty prefix of C* keeps ``dfa`` alive and non-accepting from ``state``."""
        if dfa.n_states > APPLY_MAX_DFA:
            return False
        return bool(_applies(dfa.table.reshape(-1), dfa.accepting, int(state), self.loop.table.reshape(-1),
                             self.loop.start, self.loop.n_states, APPLY_LIMIT))

    def reach(self, dfa: ByteDFA, state: int) -> int | None:
        """How many characters of C the walk from ``state`` may take: ``max_chars`` where the slice
        ``applies``, d where it applies to strings of at most d characters and every string of d + 1
        kills the DFA (a counted body; see the module docstring), None where neither holds."""
        if self.applies(dfa, state):
            return self.max_chars
        if dfa.n_states > APPLY_MAX_DFA:
            return None
        loop = self.loop
        d = int(_reach(dfa.table.reshape(-1), dfa.accepting, int(state), loop.table.reshape(-1), loop.accepting,
                       loop.start, self.loop_bytes, self.loop_byte_start, self.max_chars, REACH_WIDTH))
        return d if d >= 0 else None

    def walk(self, dfa: ByteDFA, state: int, chars: int | None = None) -> tuple[np.ndarray, np.ndarray]:
        """(packed mask, accept nodes) of the root walk from ``state``; only where ``applies``, or
        with ``chars`` = ``reach(dfa, state)``."""
        base = self.mask if chars is None or chars >= self.max_chars else self._at_most(chars)
        words, accept = _residual_walk(self.parent, self.node_byte, dfa.table.reshape(-1), dfa.accepting, state,
                                       self.token_position, self.token_id, base)
        return words, self.node[accept]

    def _at_most(self, chars: int) -> np.ndarray:
        """Packed mask of the slice tokens of at most ``chars`` characters (memoised: one per count)."""
        words = self._bounded.get(chars)
        if words is None:
            kept = (self.token_chars >= 0) & (self.token_chars <= chars)
            words = self._bounded[chars] = pack_bool(kept, self.token_chars.shape[0])
        return words


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
    # characters per node (UTF-8 bytes that are not continuation bytes), parents before children
    node_chars = np.zeros(trie.n_nodes, dtype=np.int32)
    leads = ((trie.node_byte & 0xC0) != 0x80).astype(np.int32)
    for depth in range(1, int(trie.node_depth.max()) + 1):
        level = np.arange(level_start[depth], level_start[depth + 1])
        node_chars[level] = node_chars[trie.node_parent[level]] + leads[level]
    token_chars = np.full(logits_width, -1, dtype=np.int32)
    sliced_ids = np.flatnonzero(in_slice)
    token_chars[sliced_ids] = node_chars[trie.token_node[sliced_ids]]
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
        token_chars=token_chars,
        loop_bytes=np.flatnonzero(loop.table.reshape(-1) >= 0) % 256,
        loop_byte_start=np.concatenate(([0], np.cumsum((loop.table >= 0).sum(axis=1)))).astype(np.int64),
    )
    for arr in arrays.values():
        arr.setflags(write=False)
    max_chars = int(token_chars.max()) if sliced_ids.shape[0] else 0
    return TokenSlice(chars=char_class, loop=loop, max_chars=max_chars, **arrays)


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
def _reach(flat, accepting, state, loop_flat, loop_accepting, loop_start, loop_bytes, loop_byte_start, max_chars,
           width):  # pragma: no cover - jitted
    """``TokenSlice.reach`` below ``applies``: -1, or d <= ``max_chars`` such that every byte prefix of
    a C string of at most d characters leaves the DFA alive and non-accepting from ``state``, and
    every C string of d + 1 characters kills it.

    Character by character: the pairs (DFA state, loop state) met while reading one more
    character, at most ``width`` of them (-1 beyond), over the bytes the loop allows from each
    (``loop_bytes[loop_byte_start[l]:loop_byte_start[l + 1]]``). A character boundary is an
    accepting loop state. A level of boundaries equal to the one before repeats forever: nothing dies."""
    front_q = np.empty(width, np.int64)  # boundary pairs before the next character
    front_l = np.empty(width, np.int64)
    seen_q = np.empty(width, np.int64)  # every pair met inside the next character
    seen_l = np.empty(width, np.int64)
    next_q = np.empty(width, np.int64)
    next_l = np.empty(width, np.int64)
    front_q[0] = state
    front_l[0] = loop_start
    n_front = 1
    for level in range(max_chars):
        n_seen = 0
        for i in range(n_front):
            seen_q[n_seen] = front_q[i]
            seen_l[n_seen] = front_l[i]
            n_seen += 1
        n_next = 0
        died = False
        head = 0
        while head < n_seen:
            q = seen_q[head]
            lp = seen_l[head]
            head += 1
            last_q = -1
            last_l = -1
            for k in range(loop_byte_start[lp], loop_byte_start[lp + 1]):
                b = loop_bytes[k]
                nl = loop_flat[lp * 256 + b]
                nq = flat[q * 256 + b]
                if nq < 0:
                    died = True
                    continue
                if nq == last_q and nl == last_l:  # most bytes lead where the one before led
                    continue
                last_q = nq
                last_l = nl
                if accepting[nq]:
                    return -1
                if loop_accepting[nl]:  # a whole character: a pair of the next level
                    if _pair_index(next_q, next_l, n_next, nq, nl) < 0:
                        if n_next == width:
                            return -1
                        next_q[n_next] = nq
                        next_l[n_next] = nl
                        n_next += 1
                elif _pair_index(seen_q, seen_l, n_seen, nq, nl) < 0:
                    if n_seen == width:
                        return -1
                    seen_q[n_seen] = nq
                    seen_l[n_seen] = nl
                    n_seen += 1
        if died:  # every string of level + 1 characters must die, or the bound is not sharp
            return level if n_next == 0 else -1
        same = n_next == n_front
        for j in range(n_next):
            if _pair_index(front_q, front_l, n_front, next_q[j], next_l[j]) < 0:
                same = False
                break
        if same:
            return max_chars
        for j in range(n_next):
            front_q[j] = next_q[j]
            front_l[j] = next_l[j]
        n_front = n_next
    return max_chars


@njit(cache=True, nogil=True)
def _pair_index(qs, ls, n, q, lp):  # pragma: no cover - jitted
    """Where the pair (``q``, ``lp``) is among the first ``n`` of ``qs``/``ls``; -1 if absent
    (``_reach``'s sets hold a few pairs: a scan is cheaper than hashing)."""
    for j in range(n):
        if qs[j] == q and ls[j] == lp:
            return j
    return -1


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
