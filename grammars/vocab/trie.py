"""The vocabulary as a byte trie in flat numpy arrays, the structure every mask walk runs over.

Nodes are numbered breadth-first with each node's children contiguous and sorted by byte; each
node also knows its parent, depth, subtree size, preorder position and the tokens that end at it,
and non-root nodes are indexed by their entering byte. The walks themselves are numba kernels in
``grammars.masks.token_walk`` (depth-first, preorder with jumps over dead subtrees, or one linear
pass in node order); ``bfs_states`` here is the linear pass, shared with ``token_slices``. Built
once per vocabulary and cached on disk (docs/ARCHITECTURE.md, "The mask engine").
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass, fields
from functools import cached_property
from pathlib import Path
from typing import Sequence

import numpy as np
from numba import njit

__all__ = ["TokenTrie", "bfs_states"]


@dataclass(frozen=True, eq=False)
class TokenTrie:
    """Byte trie over the text tokens of a vocabulary.

    ``token_node[t]`` is the node where token ``t``'s bytes end; tokens that never match text
    (special tokens, empty byte strings) map to ``n_nodes`` — a sentinel slot that walks never
    mark — so ``alive_nodes[token_node]`` is the validity of every token at once.
    """

    node_byte: np.ndarray  # uint8[n_nodes] byte on the edge into the node (root: 0)
    child_start: np.ndarray  # int64[n_nodes]
    child_count: np.ndarray  # int64[n_nodes]
    node_depth: np.ndarray  # int32[n_nodes]
    node_parent: np.ndarray  # int64[n_nodes] (root: 0); parents precede children
    token_node: np.ndarray  # int64[n_tokens]
    node_tok_start: np.ndarray  # int64[n_nodes]: tokens ending at a node are
    node_tok_count: np.ndarray  # int64[n_nodes]:   node_tokens[start : start + count]
    node_tokens: np.ndarray  # int64[n_text_tokens], grouped by node
    edges_by_byte: np.ndarray  # int64[n_nodes - 1]: every non-root node, sorted by (byte, id) ...
    edge_byte_start: np.ndarray  # int64[257]: ... nodes entered by byte b are edges_by_byte[start[b]:start[b+1]]
    subtree_size: np.ndarray  # int64[n_nodes]: nodes in the subtree rooted at each node (itself included)

    #: bump when the layout changes, so stale cache files are rebuilt instead of misread
    FORMAT = 2

    @classmethod
    def cached(cls, token_bytes: Sequence[bytes], text_token: np.ndarray, path: Path | None) -> "TokenTrie":
        """``build``, reusing an ``.npz`` at ``path`` (written atomically) when given.

        The caller keys ``path`` by the vocabulary fingerprint; a damaged or stale file is rebuilt.
        """
        if path is not None and path.exists():
            try:
                with np.load(path) as data:
                    if int(data["format"]) == cls.FORMAT:
                        arrays = {f.name: data[f.name] for f in fields(cls)}
                        for arr in arrays.values():
                            arr.setflags(write=False)
                        return cls(**arrays)
            except (OSError, KeyError, ValueError):
                pass
        trie = cls.build(token_bytes, text_token)
        if path is not None:
            trie._save(path)
        return trie

    def _save(self, path: Path) -> None:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp.npz")
            with os.fdopen(fd, "wb") as f:
                np.savez(f, format=np.int64(self.FORMAT), **{fl.name: getattr(self, fl.name) for fl in fields(self)})
            os.replace(tmp, path)
        except OSError:  # a read-only cache location only costs the rebuild next time
            pass

    @cached_property
    def preorder(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(node, parent position, byte, subtree end) per depth-first preorder position, and each
        token's position (``n_nodes`` for the sentinel): a subtree is a contiguous range, so a
        walk can jump over a dead one."""
        node, parent, byte, end = _preorder(self.child_start, self.child_count, self.node_byte, self.subtree_size)
        position = np.empty(self.n_nodes + 1, dtype=np.int64)
        position[node] = np.arange(self.n_nodes)
        position[self.n_nodes] = self.n_nodes
        token_position = position[self.token_node]
        for arr in (node, parent, byte, end, token_position):
            arr.setflags(write=False)
        return node, parent, byte, end, token_position

    @cached_property
    def _tokens_in_preorder(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Text tokens sorted by preorder position, those positions, each node's position and the
        end of its subtree: the tokens of a subtree are one slice (``tokens_continuing``)."""
        pre_node, _, _, pre_end, token_position = self.preorder
        node_position = np.empty(self.n_nodes, dtype=np.int64)
        node_position[pre_node] = np.arange(self.n_nodes)
        ids = np.flatnonzero(self.token_node < self.n_nodes)
        ids = ids[np.argsort(token_position[ids], kind="stable")]
        positions = token_position[ids]
        for arr in (ids, positions, node_position):
            arr.setflags(write=False)
        return ids, positions, node_position, pre_end

    def tokens_continuing(self, token: int, length: int, next_bytes: np.ndarray) -> np.ndarray:
        """Ids of the text tokens whose bytes start with the first ``length`` bytes of ``token``'s
        and go on with a byte ``b`` where ``next_bytes[b]`` (bool[256]): the subtrees of those
        children of that trie node. ``length`` must be shorter than the token."""
        node = self._prefix_node(token, length)
        if length == int(self.node_depth[int(self.token_node[token])]):
            raise ValueError(f"token {token} has no byte after a prefix of {length} bytes")
        return self._subtrees_below(node, next_bytes)

    def _prefix_node(self, token: int, length: int) -> int:
        """The trie node of the first ``length`` bytes of text token ``token``."""
        node = int(self.token_node[token])
        if node >= self.n_nodes or not 0 <= length <= int(self.node_depth[node]):
            raise ValueError(f"token {token} has no prefix of {length} bytes")
        for _ in range(int(self.node_depth[node]) - length):
            node = int(self.node_parent[node])
        return node

    def tokens_continuing_root(self, next_bytes: np.ndarray) -> np.ndarray:
        """Ids of the text tokens whose first byte ``b`` has ``next_bytes[b]``."""
        return self._subtrees_below(0, next_bytes)

    def _subtrees_below(self, node: int, next_bytes: np.ndarray) -> np.ndarray:
        first = int(self.child_start[node])
        children = np.arange(first, first + int(self.child_count[node]))
        children = children[next_bytes[self.node_byte[children]]]
        ids, positions, node_position, pre_end = self._tokens_in_preorder
        starts = node_position[children]
        lo = np.searchsorted(positions, starts)
        hi = np.searchsorted(positions, pre_end[starts])
        return np.concatenate([ids[a:b] for a, b in zip(lo.tolist(), hi.tolist())] or [ids[:0]])

    def tokens_on_path(self, token: int, length: int) -> np.ndarray:
        """Ids of the text tokens spelled exactly as the first ``d`` bytes of ``token``'s, for
        ``1 <= d <= length`` (``token`` itself when ``length`` is its whole length)."""
        node = self._prefix_node(token, length)
        chunks = []
        while node:
            start = int(self.node_tok_start[node])
            chunks.append(self.node_tokens[start : start + int(self.node_tok_count[node])])
            node = int(self.node_parent[node])
        return np.concatenate(chunks) if chunks else np.empty(0, dtype=np.int64)

    @property
    def n_nodes(self) -> int:
        return int(self.node_byte.shape[0])

    @property
    def n_tokens(self) -> int:
        return int(self.token_node.shape[0])

    @classmethod
    def build(cls, token_bytes: Sequence[bytes], text_token: np.ndarray) -> "TokenTrie":
        """Build from each token's bytes; ``text_token[t]`` False excludes token ``t``."""
        order = sorted((bytes(token_bytes[t]), t) for t in range(len(token_bytes)) if text_token[t])
        # Children dictionaries level by level; tokens are sorted so siblings come out sorted.
        node_byte = [0]
        node_depth = [0]
        children: list[dict[int, int]] = [{}]
        token_node = np.full(len(token_bytes), -1, dtype=np.int64)
        # First build a pointer trie, then renumber breadth-first.
        for data, tok in order:
            node = 0
            for depth, b in enumerate(data, 1):
                nxt = children[node].get(b)
                if nxt is None:
                    nxt = len(node_byte)
                    children[node][b] = nxt
                    children.append({})
                    node_byte.append(b)
                    node_depth.append(depth)
                node = nxt
            token_node[tok] = node
        n = len(node_byte)
        bfs = [0]
        new_id = np.empty(n, dtype=np.int64)
        child_start = np.zeros(n, dtype=np.int64)
        child_count = np.zeros(n, dtype=np.int64)
        head = 0
        while head < len(bfs):
            old = bfs[head]
            new_id[old] = head
            kids = children[old]
            child_start[head] = len(bfs)
            child_count[head] = len(kids)
            for b in sorted(kids):
                bfs.append(kids[b])
            head += 1
        perm = np.asarray(bfs, dtype=np.int64)  # new index -> old index
        nb = np.asarray(node_byte, dtype=np.uint8)[perm]
        nd = np.asarray(node_depth, dtype=np.int32)[perm]
        tn = np.where(token_node >= 0, new_id[np.maximum(token_node, 0)], n)
        parent = np.zeros(n, dtype=np.int64)
        parent[1:] = np.repeat(np.arange(n, dtype=np.int64), child_count)  # BFS: children follow parents in order
        text_ids = np.flatnonzero(tn < n)
        by_node = text_ids[np.argsort(tn[text_ids], kind="stable")]
        tok_count = np.bincount(tn[text_ids], minlength=n).astype(np.int64)
        tok_start = np.cumsum(tok_count) - tok_count
        non_root = np.arange(1, n, dtype=np.int64)
        edges = non_root[np.lexsort((non_root, nb[1:]))]
        edge_start = np.zeros(257, dtype=np.int64)
        edge_start[1:] = np.cumsum(np.bincount(nb[1:], minlength=256))
        subtree = np.ones(n, dtype=np.int64)
        level_start = np.searchsorted(nd, np.arange(int(nd.max()) + 2))  # BFS: depths are contiguous
        for depth in range(int(nd.max()), 0, -1):
            level = slice(level_start[depth], level_start[depth + 1])
            np.add.at(subtree, parent[level], subtree[level])
        arrays = (nb, child_start, child_count, nd, parent, tn, tok_start, tok_count, by_node, edges, edge_start, subtree)
        for arr in arrays:
            arr.setflags(write=False)
        return cls(*arrays)


@njit(cache=True, nogil=True)
def _preorder(child_start, child_count, node_byte, subtree_size):  # pragma: no cover - jitted
    """The trie in depth-first preorder: (node, parent position, byte, subtree end) per position.

    A subtree is a contiguous range of positions, so a walk skips a dead subtree in one jump.
    """
    n = child_start.shape[0]
    pre_node = np.empty(n, np.int32)
    pre_parent = np.zeros(n, np.int32)
    pre_byte = np.empty(n, np.uint8)
    pre_end = np.empty(n, np.int32)
    stack_node = np.empty(n, np.int64)
    stack_parent = np.empty(n, np.int64)
    stack_node[0] = 0
    stack_parent[0] = 0
    top = 1
    pos = 0
    while top > 0:
        top -= 1
        node = stack_node[top]
        pre_node[pos] = node
        pre_parent[pos] = stack_parent[top]
        pre_byte[pos] = node_byte[node]
        pre_end[pos] = pos + subtree_size[node]
        c0 = child_start[node]
        for c in range(c0 + child_count[node] - 1, c0 - 1, -1):  # first child on top
            stack_node[top] = c
            stack_parent[top] = pos
            top += 1
        pos += 1
    return pre_node, pre_parent, pre_byte, pre_end


@njit(cache=True, nogil=True)
def bfs_states(parent, node_byte, flat, accepting, state, extra):  # pragma: no cover - jitted
    """A byte DFA run from ``state`` down a breadth-first trie (parents before children; node 0
    the root): the state at every node (-1: dead), followed by ``extra`` slots of -1 (sentinels
    for tokens without a node), and the nodes where the DFA accepts, in increasing order.

    ``flat`` is the transition table reshaped to one row (``state * 256 + byte``). Every whole-
    trie walk shares this pass; the callers differ only in what they read off the states.
    """
    n = parent.shape[0]
    states = np.empty(n + extra, np.int32)
    states[0] = state
    n_acc = 0
    for node in range(1, n):
        ps = states[parent[node]]
        if ps < 0:
            states[node] = -1
        else:
            nxt = flat[ps * 256 + node_byte[node]]
            states[node] = nxt
            if nxt >= 0 and accepting[nxt]:
                n_acc += 1
    for i in range(n, n + extra):
        states[i] = -1
    accept = np.empty(n_acc, np.int64)
    k = 0
    for node in range(1, n):
        st = states[node]
        if st >= 0 and accepting[st]:
            accept[k] = node
            k += 1
    return states, accept
