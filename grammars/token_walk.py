"""Walking the vocabulary trie through byte DFAs: the only code that touches every token.

Two kernels, compiled with numba (cached on disk) because a profile showed numpy's per-level
overhead dominating: the Llama-3 trie is 128 levels deep with ~2,400 nodes in long unary chains
below depth 24, so a level-by-level numpy walk costs ~11 ms while these cost ~0.25 ms (root)
and a few µs (small sub-walks).

- ``root walk``: the DFA from one state over the whole trie, as one linear pass in breadth-first
  node order (a node's state is its parent's state stepped by the node's byte).
- ``sub walk``: the DFA from one state over the subtries below a set of nodes (the places where
  a previous lexeme may end), depth-first, emitting token ids directly.

``PathWalk`` caches these by *lexical path* — the sequence of (terminal DFA, state) pairs a token
passes through — which does not depend on the parser. Parser-dependent work (which paths are
allowed) then costs dictionary lookups and ORs, not walks.
"""

from __future__ import annotations

from threading import Lock

import numpy as np
from numba import njit

from grammars.bitmask import mask_words
from grammars.trie import TokenTrie

__all__ = ["PathWalk", "WalkCache", "tokens_to_words"]


@njit(cache=True, nogil=True)
def _grow(arr):  # pragma: no cover - jitted
    out = np.empty(arr.shape[0] * 2, arr.dtype)
    out[: arr.shape[0]] = arr
    return out


@njit(cache=True, nogil=True)
def _next_bytes(child_start, child_count, node_byte, nodes):  # pragma: no cover - jitted
    """Bitset (4 x uint64) of the bytes on edges leaving ``nodes``."""
    bits = np.zeros(4, np.uint64)
    for i in range(nodes.shape[0]):
        c0 = child_start[nodes[i]]
        for c in range(c0, c0 + child_count[nodes[i]]):
            b = node_byte[c]
            bits[b >> 6] |= np.uint64(1) << np.uint64(b & 63)
    return bits


@njit(cache=True, nogil=True)
def _root_states(parent, node_byte, flat, state):  # pragma: no cover - jitted
    """DFA state at every node when the DFA starts at the root in ``state`` (-1: dead)."""
    states = np.empty(parent.shape[0] + 1, np.int32)
    states[0] = state
    for node in range(1, parent.shape[0]):
        ps = states[parent[node]]
        states[node] = -1 if ps < 0 else flat[ps * 256 + node_byte[node]]
    states[parent.shape[0]] = -1  # sentinel slot of non-text tokens
    return states


@njit(cache=True, nogil=True)
def _root_walk(parent, node_byte, token_node, flat, accepting, state, n_words):  # pragma: no cover - jitted
    """Packed mask of tokens alive from the root in ``state``, and the nodes where the DFA accepts."""
    states = _root_states(parent, node_byte, flat, state)
    out_accept = np.empty(64, np.int64)
    n_acc = 0
    for node in range(1, parent.shape[0]):
        st = states[node]
        if st >= 0 and accepting[st]:
            if n_acc == out_accept.shape[0]:
                out_accept = _grow(out_accept)
            out_accept[n_acc] = node
            n_acc += 1
    words = np.zeros(n_words, np.uint32)
    for tok in range(token_node.shape[0]):
        if states[token_node[tok]] >= 0:
            words[tok >> 5] |= np.uint32(1) << np.uint32(tok & 31)
    return words.view(np.int32), out_accept[:n_acc].copy()


@njit(cache=True, nogil=True)
def _token_next_states(parent, node_byte, token_node, flat, state):  # pragma: no cover - jitted
    """For every token, the DFA state its bytes reach from ``state`` (-1: dead)."""
    states = _root_states(parent, node_byte, flat, state)
    out = np.empty(token_node.shape[0], np.int32)
    for tok in range(token_node.shape[0]):
        out[tok] = states[token_node[tok]]
    return out


@njit(cache=True, nogil=True)
def _sub_walk(child_start, child_count, node_byte, node_parent, edges_by_byte, edge_byte_start, tok_start, tok_count,
              node_tokens, flat, accepting, state, parents):  # pragma: no cover - jitted
    """Tokens kept alive below ``parents`` (sorted) from ``state``, and nodes where the DFA accepts.

    The first byte is matched either by scanning the parents' children or, when the parents are
    many and the terminal's first bytes few (an identifier followed by ``(``), by scanning the
    trie edges of those bytes and binary-searching their parent: whichever touches fewer nodes.
    Parents may be nested (one below another); their subtrees are then walked once per parent,
    from different DFA states, so buffers grow on demand.
    """
    out_tokens = np.empty(64, np.int64)
    out_accept = np.empty(64, np.int64)
    stack_node = np.empty(256, np.int64)
    stack_state = np.empty(256, np.int32)
    n_tok = 0
    n_acc = 0
    top = 0
    n_parents = parents.shape[0]
    edge_cost = 0
    for b in range(256):
        if flat[state * 256 + b] >= 0:
            edge_cost += edge_byte_start[b + 1] - edge_byte_start[b]
    if edge_cost * 4 < n_parents:
        for b in range(256):
            if flat[state * 256 + b] < 0:
                continue
            for e in range(edge_byte_start[b], edge_byte_start[b + 1]):
                child = edges_by_byte[e]
                p = node_parent[child]
                i = np.searchsorted(parents, p)
                if i < n_parents and parents[i] == p:
                    if top == stack_node.shape[0]:
                        stack_node = _grow(stack_node)
                        stack_state = _grow(stack_state)
                    stack_node[top] = child
                    stack_state[top] = state
                    top += 1
    else:
        for i in range(n_parents):
            p = parents[i]
            c0 = child_start[p]
            for c in range(c0, c0 + child_count[p]):
                if top == stack_node.shape[0]:
                    stack_node = _grow(stack_node)
                    stack_state = _grow(stack_state)
                stack_node[top] = c
                stack_state[top] = state
                top += 1
    while top > 0:
        top -= 1
        node = stack_node[top]
        nxt = flat[stack_state[top] * 256 + node_byte[node]]
        if nxt < 0:
            continue
        t0 = tok_start[node]
        for k in range(t0, t0 + tok_count[node]):
            if n_tok == out_tokens.shape[0]:
                out_tokens = _grow(out_tokens)
            out_tokens[n_tok] = node_tokens[k]
            n_tok += 1
        if accepting[nxt]:
            if n_acc == out_accept.shape[0]:
                out_accept = _grow(out_accept)
            out_accept[n_acc] = node
            n_acc += 1
        c0 = child_start[node]
        for c in range(c0, c0 + child_count[node]):
            if top == stack_node.shape[0]:
                stack_node = _grow(stack_node)
                stack_state = _grow(stack_state)
            stack_node[top] = c
            stack_state[top] = nxt
            top += 1
    return out_tokens[:n_tok].copy(), np.unique(out_accept[:n_acc])


@njit(cache=True, nogil=True)
def tokens_to_words(tokens, n_words):  # pragma: no cover - jitted
    """Packed int32 mask with the bits of ``tokens`` set."""
    words = np.zeros(n_words, np.uint32)
    for i in range(tokens.shape[0]):
        tok = tokens[i]
        words[tok >> 5] |= np.uint32(1) << np.uint32(tok & 31)
    return words.view(np.int32)


class PathWalk:
    """The result of walking one lexical path: tokens reachable and where the last lexeme may end.

    ``mask`` (packed) is set for root walks, ``tokens`` (ids) for sub-walks, which are small.
    """

    __slots__ = ("mask", "tokens", "accept_nodes", "next_bytes", "_children", "_lock")

    def __init__(self, mask, tokens, accept_nodes, next_bytes: int):
        self.mask = mask
        self.tokens = tokens
        self.accept_nodes = accept_nodes
        #: bytes that can follow an accept node inside some token (256-bit int): a lexeme starting
        #: with none of them cannot continue this path, so its walk is skipped
        self.next_bytes = next_bytes
        self._children: dict = {}
        self._lock = Lock()


class WalkCache:
    """Root walks per (DFA, state), bounded LRU; each root owns the cache of its sub-walks.

    Shared by every grammar one ``Compiler`` builds for a vocabulary; thread-safe.
    """

    def __init__(self, trie: TokenTrie, logits_width: int, capacity: int = 2048):
        self.trie = trie
        self.logits_width = logits_width
        self.capacity = capacity
        self._roots: dict = {}
        self._lock = Lock()
        self._words = mask_words(logits_width)
        self._first: dict = {}

    def root(self, dfa, state: int) -> PathWalk:
        key = (dfa.key, state)
        hit = self._roots.get(key)
        if hit is not None:
            return hit
        trie = self.trie
        flat = _flat(dfa)
        live_first = dfa.table[state][trie.node_byte[1 : 1 + trie.child_count[0]]] >= 0
        reach = int(trie.subtree_size[1 : 1 + trie.child_count[0]][live_first].sum())
        if reach * 8 < trie.n_nodes:
            # few subtrees start with an allowed byte (keywords, punctuation): walk only those
            tokens, accept = _sub_walk(trie.child_start, trie.child_count, trie.node_byte, trie.node_parent,
                                       trie.edges_by_byte, trie.edge_byte_start, trie.node_tok_start,
                                       trie.node_tok_count, trie.node_tokens, flat, dfa.accepting, state, _ROOT)
            words = tokens_to_words(tokens, self._words)
        else:
            words, accept = _root_walk(trie.node_parent, trie.node_byte, trie.token_node, flat, dfa.accepting, state,
                                       self._words)
        words.setflags(write=False)
        walk = PathWalk(words, None, accept, self._next_bytes(accept))
        with self._lock:
            if len(self._roots) >= self.capacity:
                self._roots.clear()
            self._roots[key] = walk
        return walk

    def extend(self, walk: PathWalk, dfa, state: int) -> PathWalk:
        """Walk ``dfa`` from ``state`` below the places where ``walk``'s last lexeme may end."""
        key = (dfa.key, state)
        hit = walk._children.get(key)
        if hit is not None:
            return hit
        if not walk.next_bytes & self._first_bytes(dfa, state):
            with walk._lock:
                walk._children[key] = _EMPTY_WALK
            return _EMPTY_WALK
        trie = self.trie
        tokens, accept = _sub_walk(trie.child_start, trie.child_count, trie.node_byte, trie.node_parent,
                                   trie.edges_by_byte, trie.edge_byte_start, trie.node_tok_start, trie.node_tok_count,
                                   trie.node_tokens, _flat(dfa), dfa.accepting, state, walk.accept_nodes)
        child = PathWalk(None, tokens, accept, self._next_bytes(accept))
        with walk._lock:
            walk._children[key] = child
        return child


    def _next_bytes(self, nodes: np.ndarray) -> int:
        if not nodes.shape[0]:
            return 0
        trie = self.trie
        words = _next_bytes(trie.child_start, trie.child_count, trie.node_byte, nodes)
        return int(words[0]) | int(words[1]) << 64 | int(words[2]) << 128 | int(words[3]) << 192

    def _first_bytes(self, dfa, state: int) -> int:
        key = (dfa.key, state)
        bits = self._first.get(key)
        if bits is None:
            live = np.flatnonzero(dfa.table[state] >= 0)
            bits = sum(1 << int(b) for b in live)
            self._first[key] = bits
        return bits

    def token_next_states(self, dfa, state: int) -> np.ndarray:
        """Per token, the state its bytes reach from ``state`` (-1: not allowed). Not cached here."""
        trie = self.trie
        return _token_next_states(trie.node_parent, trie.node_byte, trie.token_node, _flat(dfa), state)


_ROOT = np.zeros(1, dtype=np.int64)
_EMPTY_WALK = PathWalk(None, np.empty(0, np.int64), np.empty(0, np.int64), 0)


def _flat(dfa) -> np.ndarray:
    return dfa.table.reshape(-1)
