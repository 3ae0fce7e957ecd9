"""Trie walks (numba kernels, path cache, walk classes) against brute force over every token."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from grammars.automata.byte_dfa import compile_regular
from grammars.bitmask import unpack_bits
from grammars.frontends import parse_regex
from grammars.masks.token_walk import (
    LANGUAGE_KEY_MAX_DFA,
    WALK_CLASS_AFTER,
    WALK_CLASS_STATES_PER_WALK,
    WalkCache,
    bounded_equivalence,
)
from grammars.vocab.trie import TokenTrie

PATTERNS = [r"[a-c]{0,9}d", r"(ab|a)*c?", r"[^d]*d[a-d]{2}", r"a{3,7}b*", r"(ac|b)+d?(c|dd)*"]
ALPHABET = b"abcd"


@pytest.fixture(scope="module")
def pieces() -> list[bytes]:
    """Every string over a,b,c,d of length 1..3 plus a few longer ones, and one special token."""
    out = [bytes(p) for n in (1, 2, 3) for p in itertools.product(ALPHABET, repeat=n)]
    out += [b"abcdab", b"aaaaaa", b"dddddd", b"abab"]
    return out + [b""]


@pytest.fixture(scope="module")
def walks(pieces):
    text = np.array([bool(p) for p in pieces])
    return WalkCache(TokenTrie.build(pieces, text), len(pieces) + 7)


def _alive(dfa, data: bytes, state: int) -> bool:
    return dfa.run(data, state) >= 0


@pytest.mark.parametrize("pattern", PATTERNS)
def test_root_walk_matches_brute_force(walks, pieces, pattern):
    dfa = compile_regular(parse_regex(pattern))
    for state in range(dfa.n_states):
        walk = walks.root(dfa, state)
        allowed = unpack_bits(walk.mask, walks.logits_width)
        expected = [bool(p) and _alive(dfa, p, state) for p in pieces]
        assert allowed[: len(pieces)].tolist() == expected
        assert not allowed[len(pieces) :].any()
        accept_prefixes = {_node_bytes(walks.trie, n) for n in walk.accept_nodes.tolist()}
        for p in pieces:
            for k in range(1, len(p) + 1):
                run = dfa.run(p[:k], state)
                assert (run >= 0 and dfa.is_accepting(run)) == (p[:k] in accept_prefixes)


@pytest.mark.parametrize("first,second", [(r"a+", r"b[a-d]?"), (r"(ab)+", r"c*d"), (r"[a-d]", r"[a-d]{2}")])
def test_sub_walk_matches_brute_force(walks, pieces, first, second):
    dfa1 = compile_regular(parse_regex(first))
    dfa2 = compile_regular(parse_regex(second))
    root = walks.root(dfa1, dfa1.start)
    child = walks.extend(root, dfa2, dfa2.start)
    got = set(child.tokens.tolist())
    expected = set()
    for tok, p in enumerate(pieces):
        for k in range(1, len(p)):  # the first lexeme ends inside the token, the second continues it
            run = dfa1.run(p[:k], dfa1.start)
            if run >= 0 and dfa1.is_accepting(run) and _alive(dfa2, p[k:], dfa2.start):
                expected.add(tok)
    assert got == expected


@pytest.mark.parametrize("first,second", [(r"a+", r"b[a-d]?"), (r"[a-d]+", r"[a-d]*"), (r"(ab)+", r"[a-d]*c")])
def test_deduplicated_sub_walk_finds_the_same_tokens_and_nodes(walks, first, second):
    """Nested parents (every prefix of ``aaa`` ends ``a+``) make a plain walk visit subtrees once
    per ancestor; the deduplicated walk skips repeats and must still find exactly the same sets."""
    dfa1 = compile_regular(parse_regex(first))
    dfa2 = compile_regular(parse_regex(second))
    parents = walks.root(dfa1, dfa1.start).accept_nodes
    flat, bits, size = dfa2.table.reshape(-1), np.zeros(1, np.uint64), walks.trie.n_nodes + 1
    plain = walks._kernel_sub_walk(flat, dfa2.accepting, dfa2.start, parents, bits, False, 64 * size, False)
    dedup = walks._kernel_sub_walk(flat, dfa2.accepting, dfa2.start, parents, bits, False, size, True)
    assert plain[2] and dedup[2]
    assert set(plain[0].tolist()) == set(dedup[0].tolist()) and len(set(dedup[0].tolist())) == len(dedup[0])
    assert dedup[1].tolist() == sorted(set(plain[1].tolist()))  # sorted, each node once


def _node_bytes(trie, node: int) -> bytes:
    out = []
    while node:
        out.append(int(trie.node_byte[node]))
        node = int(trie.node_parent[node])
    return bytes(reversed(out))


def _signature(dfa, state: int, length: int) -> tuple:
    """(alive, accepting) of ``state`` after every string over the alphabet up to ``length``."""
    out = []
    for n in range(length + 1):
        for w in itertools.product(ALPHABET, repeat=n):
            run = dfa.run(bytes(w), state)
            out.append((run >= 0, run >= 0 and dfa.is_accepting(run)))
    return tuple(out)


@settings(max_examples=25, deadline=None)
@given(pattern=st.sampled_from(PATTERNS + [r"[a-d]{0,12}c", r"(a|b){2,6}d"]), rounds=st.integers(0, 3))
def test_bounded_equivalence_is_exact(pattern, rounds):
    dfa = compile_regular(parse_regex(pattern))
    classes = bounded_equivalence(dfa.table, dfa.accepting, rounds)
    signatures = [_signature(dfa, s, rounds) for s in range(dfa.n_states)]
    # the brute force enumerates strings over a..d only; it sees everything when no other byte lives
    complete = not np.any(np.delete(dfa.table, list(ALPHABET), axis=1) >= 0)
    for a in range(dfa.n_states):
        for b in range(dfa.n_states):
            if classes[a] == classes[b]:
                assert signatures[a] == signatures[b], "one class, different behaviour: walks would be wrong"
            elif complete:
                assert signatures[a] != signatures[b], "needlessly split class"


def test_counter_states_share_walks(walks):
    dfa = compile_regular(parse_regex(r"[a-c]{0,60}d"))
    # each state is its own class until the DFA has been walked from a few states ...
    assert len(set(walks.walk_class(dfa).tolist())) == dfa.n_states
    for state in range(20, 20 + WALK_CLASS_AFTER):
        walks.root(dfa, state)
    # ... then bounded equivalence merges the counter states
    classes = walks.walk_class(dfa)
    # tokens are at most 6 bytes: states with more than 6 counts left behave alike
    assert len(set(classes.tolist())) <= 8
    first = walks.root(dfa, 0)
    assert walks.root(dfa, 10) is first
    assert np.array_equal(walks.root(dfa, 58).mask, walks.root(dfa, 58).mask)
    assert not np.array_equal(walks.root(dfa, 58).mask, first.mask)


def test_narrow_walks_do_not_lead_to_walk_classes():
    """Walks from a few subtrees (here the one token led by 'd') are cheap: however many there are,
    no classes are computed for them; broad walks of the same shape of DFA lead to classes."""
    pieces = [bytes(p) for n in (1, 2, 3, 4) for p in itertools.product(b"abc", repeat=n)] + [b"d", b"dd"]
    walks = WalkCache(TokenTrie.build(pieces, np.ones(len(pieces), dtype=bool)), len(pieces))
    narrow = compile_regular(parse_regex(r"d{0,300}x"))
    broad = compile_regular(parse_regex(r"[a-d]{0,300}x"))
    for state in range(2 * WALK_CLASS_AFTER):
        walks.root(narrow, state)
        walks.root(broad, state)
    assert min(walks.walk_class(narrow).tolist()) < 0
    assert min(walks.walk_class(broad).tolist()) >= 0
    for dfa in (narrow, broad):  # exact either way
        for state in (0, 150, 299):
            allowed = unpack_bits(walks.root(dfa, state).mask, len(pieces))
            assert allowed.tolist() == [dfa.run(p, state) >= 0 for p in pieces]


@pytest.mark.parametrize("pattern, limit, longer", [
    ("abc", 2, True), ("abc", 3, False),
    (r"x[0-9]+y", 3, False),  # the digit loop closes a cycle: not a run
    (r"[a-c]{0,60}d", 60, True), (r"[a-c]{0,60}d", 61, False),  # a counter is a run of 61 bytes
])
def test_walk_classes_are_looked_for_along_long_runs_only(pattern, limit, longer):
    from grammars.masks.token_walk import _flat, _runs_longer_than

    dfa = compile_regular(parse_regex(pattern))
    assert _runs_longer_than(_flat(dfa), dfa.start, limit) is longer


def test_walks_made_before_the_classes_are_not_repeated(walks):
    """The walks that lead to the walk classes are filed under them too: a long string's first
    positions are not walked again once the classes exist."""
    # more states than language keys look at (LANGUAGE_KEY_MAX_DFA): walks are found by class only
    bound = LANGUAGE_KEY_MAX_DFA + 100
    dfa = compile_regular(parse_regex(rf"[a-c]{{0,{bound}}}d"))
    # a big DFA waits for more walks than a small one: one per WALK_CLASS_STATES_PER_WALK states
    after = dfa.n_states // WALK_CLASS_STATES_PER_WALK
    assert after > WALK_CLASS_AFTER
    near_end = [int(dfa.run(b"a" * k)) for k in range(bound - after, bound)]  # few counts left
    early = [walks.root(dfa, state) for state in near_end[:WALK_CLASS_AFTER]]
    assert min(walks.walk_class(dfa).tolist()) < 0, "not computed after WALK_CLASS_AFTER walks"
    early += [walks.root(dfa, state) for state in near_end[WALK_CLASS_AFTER:]]
    classes = walks.walk_class(dfa)
    assert min(classes.tolist()) >= 0, "the classes were computed"
    horizon = int(walks.trie.node_depth.max())  # positions closer to the end than a token differ
    assert len({int(classes[state]) for state in near_end[-horizon:]}) == horizon
    made = {id(walk) for walk in early}
    for state, walk in zip(near_end, early):
        again = walks.root(dfa, state)
        assert id(again) in made, "walked again"
        assert np.array_equal(again.mask, walk.mask)


@pytest.mark.parametrize("pattern", PATTERNS + [r"[^a]*", r"d[a-d]*", r"[bc]{2,}a"])
def test_root_walk_kernels_agree(walks, pattern):
    """The preorder walk (jumps over dead subtrees) and the linear walk give the same result."""
    from grammars.masks.token_walk import _flat, _linear_walk

    trie = walks.trie
    dfa = compile_regular(parse_regex(pattern))
    for state in range(dfa.n_states):
        words, accept = walks._walk_root(_flat(dfa), dfa.accepting, state)
        words2, accept2 = _linear_walk(trie.node_parent, trie.node_byte, trie.token_node, _flat(dfa), dfa.accepting,
                                       state, walks._words)
        assert np.array_equal(words, words2) and np.array_equal(accept, accept2)


def _synchronous_moore(table: np.ndarray, accepting: np.ndarray, rounds: int) -> list[int]:
    """The definition, round by round: a state's class is (its class, its successors' classes)."""
    classes = [int(a) for a in accepting]
    for _ in range(rounds):
        signatures: dict = {}
        new = [signatures.setdefault((classes[q], *(classes[t] if t >= 0 else -1 for t in table[q])), len(signatures))
               for q in range(table.shape[0])]
        stable = len(set(new)) == len(set(classes))
        classes = new
        if stable:
            break
    return classes


def _partition(classes) -> list[int]:
    first: dict = {}
    return [first.setdefault(c, len(first)) for c in classes]


@settings(max_examples=200, deadline=None)
@given(data=st.data(), n=st.integers(1, 30), k=st.integers(1, 4), chain=st.booleans(), rounds=st.integers(0, 40))
def test_bounded_equivalence_matches_synchronous_rounds(data, n, k, chain, rounds):
    """The worklist kernel (re-signs only predecessors of moved states) partitions like Moore's
    synchronous rounds, on random DFAs and on counter-like chains (one state moves per round)."""
    table = np.full((n, 256), -1, dtype=np.int32)
    if chain:
        for q in range(n - 1):
            table[q, data.draw(st.integers(0, k - 1))] = q + 1
    for _ in range(data.draw(st.integers(0, 2 * n))):
        table[data.draw(st.integers(0, n - 1)), data.draw(st.integers(0, k - 1))] = data.draw(st.integers(0, n - 1))
    accepting = np.array(data.draw(st.lists(st.booleans(), min_size=n, max_size=n)))
    got = bounded_equivalence(table, accepting, rounds)
    assert _partition(got.tolist()) == _partition(_synchronous_moore(table, accepting, rounds))


def _node_children_bytes(trie, nodes) -> tuple[int, int]:
    """Brute force of a walk's (child_byte_set, children_total): the bytes and the number of
    trie edges leaving its accept nodes."""
    byte_set, total = 0, 0
    for node in nodes:
        start, count = int(trie.child_start[node]), int(trie.child_count[node])
        for child in range(start, start + count):
            byte_set |= 1 << int(trie.node_byte[child])
            total += 1
    return byte_set, total


@pytest.mark.parametrize("first,second", [(r"a+", r"b[a-d]?"), (r"(ab)+", r"c*d"), (r"[a-d]", r"[a-d]{2}")])
def test_walk_child_bytes_match_the_trie(walks, first, second):
    """The "can anything follow" byte set and the edge count that sizes the next scan."""
    dfa1 = compile_regular(parse_regex(first))
    dfa2 = compile_regular(parse_regex(second))
    root = walks.root(dfa1, dfa1.start)
    child = walks.extend(root, dfa2, dfa2.start)
    for walk in (root, child):
        assert (walk.child_byte_set, walk.children_total) == _node_children_bytes(walks.trie, walk.accept_nodes.tolist())
    assert root.children_total > 0  # the cases end lexemes inside tokens


def test_language_key_is_the_language_from_the_state(walks):
    """Equal remaining languages in different DFAs share a key; different ones do not."""
    inner = compile_regular(parse_regex(r"[a-c]*d"))
    prefixed = compile_regular(parse_regex(r"x[a-c]*d"))
    other = compile_regular(parse_regex(r"x[a-c]*dd?"))
    after_x = prefixed.run(b"x")
    key = walks.language_key(inner, inner.start)
    assert key is not None
    assert walks.language_key(prefixed, after_x) == key
    assert walks.language_key(prefixed, prefixed.start) != key
    assert walks.language_key(other, other.run(b"x")) not in (None, key)
    # walks from the two states are the same object: shared through the key
    assert walks.root(prefixed, after_x) is walks.root(inner, inner.start)


def test_language_key_gives_up_past_the_reach_limit(walks):
    from grammars.masks.token_walk import LANGUAGE_KEY_MAX_REACH

    counted = compile_regular(parse_regex(f"a{{{LANGUAGE_KEY_MAX_REACH + 5}}}"))
    assert walks.language_key(counted, counted.start) is None
    near_end = counted.run(b"a" * 10)
    assert walks.language_key(counted, near_end) is not None


def test_walk_child_bytes_cover_all_four_words_of_the_byte_set():
    """Children on bytes from every 64-byte quarter (0x01, 'b', 0xc3, 0xe9) after the lexeme ``a``."""
    pieces = [b"a", b"a\x01", b"ab", b"a\xc3", b"a\xe9x", b"z"]
    trie = TokenTrie.build(pieces, np.ones(len(pieces), dtype=bool))
    walks = WalkCache(trie, len(pieces))
    dfa = compile_regular(parse_regex("a"))
    root = walks.root(dfa, dfa.start)
    assert (root.child_byte_set, root.children_total) == _node_children_bytes(trie, root.accept_nodes.tolist())
    assert root.child_byte_set == (1 << 0x01) | (1 << ord("b")) | (1 << 0xC3) | (1 << 0xE9)
