"""The flat trie's layout invariants (which the walk kernels rely on) and its disk cache."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from grammars.vocab.trie import TokenTrie


def _path_bytes(trie: TokenTrie, node: int) -> bytes:
    out = []
    while node:
        out.append(int(trie.node_byte[node]))
        node = int(trie.node_parent[node])
    return bytes(reversed(out))


@settings(max_examples=60, deadline=None)
@given(pieces=st.lists(st.binary(min_size=0, max_size=6), min_size=1, max_size=40))
def test_layout_invariants(pieces):
    text = np.array([bool(p) for p in pieces])
    trie = TokenTrie.build(pieces, text)
    n = trie.n_nodes
    # breadth-first: parents precede children, depths never decrease, children are contiguous
    assert all(trie.node_parent[i] < i for i in range(1, n))
    assert np.all(np.diff(trie.node_depth) >= 0)
    for node in range(n):
        kids = range(trie.child_start[node], trie.child_start[node] + trie.child_count[node])
        assert all(trie.node_parent[k] == node for k in kids)
        assert list(trie.node_byte[list(kids)]) == sorted(trie.node_byte[list(kids)])
    # every text token ends at the node spelling its bytes; others at the sentinel
    for tok, data in enumerate(pieces):
        node = trie.token_node[tok]
        if data:
            assert _path_bytes(trie, int(node)) == data
            start = trie.node_tok_start[node]
            assert tok in trie.node_tokens[start : start + trie.node_tok_count[node]]
        else:
            assert node == n
    # subtree sizes add up; edges grouped by byte cover every non-root node once
    assert trie.subtree_size[0] == n
    assert sorted(trie.edges_by_byte.tolist()) == list(range(1, n))
    for b in range(256):
        group = trie.edges_by_byte[trie.edge_byte_start[b] : trie.edge_byte_start[b + 1]]
        assert np.all(trie.node_byte[group] == b)


def test_cache_round_trip_and_damaged_file(tmp_path):
    pieces = [b"a", b"ab", b"abc", b"b", b"", b"\xff"]
    text = np.array([bool(p) for p in pieces])
    path = tmp_path / "trie.npz"
    built = TokenTrie.cached(pieces, text, path)
    assert path.exists()
    loaded = TokenTrie.cached(pieces, text, path)
    for name in ("node_byte", "child_start", "node_parent", "token_node", "node_tokens", "subtree_size"):
        assert np.array_equal(getattr(built, name), getattr(loaded, name))
    assert not loaded.node_byte.flags.writeable
    path.write_bytes(b"not an npz file")
    rebuilt = TokenTrie.cached(pieces, text, path)
    assert np.array_equal(rebuilt.token_node, built.token_node)


def test_unwritable_cache_location_still_builds(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    trie = TokenTrie.cached([b"a"], np.array([True]), blocker / "sub" / "trie.npz")
    assert trie.n_nodes == 2


@settings(max_examples=60, deadline=None)
@given(
    pieces=st.lists(st.binary(min_size=1, max_size=5), min_size=1, max_size=40),
    pick=st.integers(0, 10**6),
    length=st.integers(0, 6),
    allowed=st.sets(st.integers(0, 255)),
)
def test_tokens_continuing_are_the_children_subtrees(pieces, pick, length, allowed):
    """The tokens under some children of a trie node, by slices, are exactly the tokens spelled
    with that prefix and then one of those bytes."""
    trie = TokenTrie.build(pieces, np.ones(len(pieces), dtype=bool))
    token = pick % len(pieces)
    length = min(length, len(pieces[token]) - 1)
    next_bytes = np.zeros(256, dtype=bool)
    next_bytes[sorted(allowed)] = True
    got = sorted(trie.tokens_continuing(token, length, next_bytes).tolist())
    prefix = pieces[token][:length]
    want = [t for t, data in enumerate(pieces) if data.startswith(prefix) and len(data) > length and data[length] in allowed]
    assert got == want
