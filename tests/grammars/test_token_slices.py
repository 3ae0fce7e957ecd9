"""Token slices: a sliced root walk is the ordinary walk, and a slice applies exactly when it may."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from grammars.automata.byte_dfa import compile_regular
from grammars.bitmask import unpack_bits
from grammars.frontends import parse_regex
from grammars.masks.token_slices import build_slice
from grammars.masks.token_walk import WalkCache, _flat, _linear_walk
from grammars.vocab.trie import TokenTrie

#: Bytes of a small vocabulary with quotes, escapes, controls, multi-byte and partial UTF-8.
PIECES = [b"a", b"b", b"ab", b"abc", b" x", b'"', b'a"', b'"a', b'",', b"\\", b"\\n", b"\n", b"\x7f",
          "é".encode(), "éa".encode(), "€".encode(), "€"[0].encode()[:2], "€".encode()[:2], b"\xe2",
          "😀".encode(), "😀".encode()[:3], b"\x80", b"xyz\"}", b"", b"a\nb"]
CLASS_PATTERN = r'[^"\\\x00-\x1f\x7f]'
CLASS = parse_regex(CLASS_PATTERN)

#: (pattern, whether the slice applies right after the opening quote)
BODIES = [
    (r'"([^"\\\x00-\x1f]|\\["\\/bfnrtu])*"', True),
    (r'"[^"]*",?', True),
    (r'"([^"\\]|\\.)*"\}?', True),
    (r'"[a-z]*"', False),  # narrower than the class
    (r'"[^"]{0,3}"', False),  # counted: long tokens die
    (r'"[^"]*', False),  # the body itself may end (accepting)
    (r'"(.|\n)*"', False),  # '.' excludes U+2028/U+2029, which the class has
]


@pytest.fixture(scope="module")
def trie() -> TokenTrie:
    return TokenTrie.build(PIECES, np.array([bool(p) for p in PIECES]))


@pytest.fixture(scope="module")
def token_slice(trie):
    return build_slice(trie, CLASS, len(PIECES) + 5)


def _in_class(data: bytes) -> bool:
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return bool(text) and all(c not in '"\\' and ord(c) >= 0x20 and ord(c) != 0x7F for c in text)


def test_slice_holds_exactly_the_tokens_of_whole_class_characters(trie, token_slice):
    sliced = unpack_bits(token_slice.mask, len(PIECES) + 5)[: len(PIECES)]
    assert sliced.tolist() == [_in_class(p) for p in PIECES]
    # the residual trie reaches every other text token, each at its own node
    residual = {int(t) for t in token_slice.token_id}
    assert residual == {t for t, p in enumerate(PIECES) if p and not _in_class(p)}
    for position, tok in zip(token_slice.token_position.tolist(), token_slice.token_id.tolist()):
        assert int(token_slice.node[position]) == int(trie.token_node[tok])


@pytest.mark.parametrize("pattern,expected", BODIES)
def test_sliced_walk_equals_linear_walk(trie, token_slice, pattern, expected):
    dfa = compile_regular(parse_regex(pattern))
    words = (len(PIECES) + 5 + 31) // 32
    body = int(dfa.table[dfa.start, ord('"')])
    assert token_slice.applies(dfa, body) is expected
    for state in range(dfa.n_states):
        if not token_slice.applies(dfa, state):
            continue
        got = token_slice.walk(dfa, state)
        want = _linear_walk(trie.node_parent, trie.node_byte, trie.token_node, _flat(dfa), dfa.accepting, state, words)
        assert np.array_equal(got[0], want[0]) and np.array_equal(got[1], want[1])


def test_walk_cache_uses_slices_and_stays_exact(trie):
    """Through ``WalkCache.root``: the mask of a string body matches brute force per token."""
    walks = WalkCache(trie, len(PIECES) + 5)
    dfa = compile_regular(parse_regex(r'"([^"\\\x00-\x1f]|\\["\\/bfnrtu])*"'))
    body = int(dfa.table[dfa.start, ord('"')])
    allowed = unpack_bits(walks.root(dfa, body).mask, len(PIECES) + 5)[: len(PIECES)]
    assert allowed.tolist() == [bool(p) and dfa.run(p, body) >= 0 for p in PIECES]


def test_real_vocabulary_slice_is_most_of_it():
    from shared_data import vocab_file

    from grammars.compile import _vocab_index
    from grammars.vocab.vocabulary import TokenVocabulary

    vocab = TokenVocabulary.from_gguf(vocab_file("llama-bpe"))
    index = _vocab_index(vocab)
    token_slice = build_slice(index.trie, CLASS, vocab.logits_width)
    assert token_slice.n_slice_tokens > 0.9 * len(vocab)
    assert token_slice.parent.shape[0] < 0.1 * index.trie.n_nodes
    dfa = compile_regular(parse_regex(r'"([^"\\\x00-\x1f]|\\["\\/bfnrtu])*"'))
    body = int(dfa.table[dfa.start, ord('"')])
    trie = index.trie
    want = _linear_walk(trie.node_parent, trie.node_byte, trie.token_node, _flat(dfa), dfa.accepting, body,
                        (vocab.logits_width + 31) // 32)
    got = token_slice.walk(dfa, body)
    assert np.array_equal(got[0], want[0]) and np.array_equal(got[1], want[1])


def test_bits_at_reads_a_subset_of_a_packed_mask():
    import numpy as np

    from grammars.bitmask import bits_at, pack_bool

    rng = np.random.default_rng(3)
    allowed = rng.random(1000) < 0.3
    allowed[[31, 63, 999]] = True  # the sign bit of a word
    words = pack_bool(allowed, 1000)
    tokens = np.array(sorted(rng.choice(1000, 200, replace=False).tolist() + [31, 63, 999]))
    assert (bits_at(words, tokens) == allowed[tokens]).all()


#: (pattern, the bounded slice's reach right after the opening quote: None where it does not apply)
COUNTED_BODIES = [
    (r'"[^"]{0,2}"', 2),
    (r'"[^"\\]{1,2}"\}?', 2),
    (r'"([^"\\\x00-\x1f]|\\["\\/bfnrtu]){0,1}",', 1),  # an escape is a character, not a slice one
    (r'"[^"]{0,40}"', "max"),  # longer than any token: the whole slice
    (r'"[a-z]{0,2}"', None),  # narrower than the class
    (r'"([^"a][^"]?|a)"', None),  # of two characters, some die ("a" ends) and some live: no sharp bound
    (r'"[^"]{0,2}', None),  # accepting inside the body
]


@pytest.mark.parametrize("pattern,expected", COUNTED_BODIES)
def test_bounded_slice_walk_equals_linear_walk(trie, token_slice, pattern, expected):
    """``reach`` is the sharp bound where there is one, and the walk with it is the ordinary walk
    from every state (the later positions of a counted body have smaller bounds)."""
    dfa = compile_regular(parse_regex(pattern))
    body = int(dfa.table[dfa.start, ord('"')])
    want_reach = token_slice.max_chars if expected == "max" else expected
    assert token_slice.reach(dfa, body) == want_reach
    assert _reach_walks_are_linear(trie, token_slice, dfa) >= (1 if expected is not None else 0)


def _reach_walks_are_linear(trie, token_slice, dfa) -> int:
    """Assert the sliced walk is the whole-trie walk from every state where ``reach`` answers;
    how many states that was."""
    words = (len(PIECES) + 5 + 31) // 32
    checked = 0
    for state in range(dfa.n_states):
        chars = token_slice.reach(dfa, state)
        if chars is None:
            continue
        got = token_slice.walk(dfa, state, chars)
        want = _linear_walk(trie.node_parent, trie.node_byte, trie.token_node, _flat(dfa), dfa.accepting, state, words)
        assert np.array_equal(got[0], want[0]) and np.array_equal(got[1], want[1]), (state, chars)
        checked += 1
    return checked


def test_token_chars_count_characters_not_bytes(token_slice):
    chars = token_slice.token_chars[: len(PIECES)].tolist()
    assert chars == [len(p.decode()) if _in_class(p) else -1 for p in PIECES]
    assert token_slice.max_chars == max(c for c in chars)


def test_walk_cache_counted_body_matches_brute_force(trie):
    """Through ``WalkCache.root`` at every position of a counted body: each token's own run."""
    walks = WalkCache(trie, len(PIECES) + 5)
    dfa = compile_regular(parse_regex(r'"([^"\\\x00-\x1f]|\\["\\/bfnrtu]){0,3}"'))
    for state in range(dfa.n_states):
        allowed = unpack_bits(walks.root(dfa, state).mask, len(PIECES) + 5)[: len(PIECES)]
        assert allowed.tolist() == [bool(p) and dfa.run(p, state) >= 0 for p in PIECES]


def test_real_vocabulary_counted_string_is_sliced_at_every_position():
    """A ``maxLength`` string body on Llama 3's vocabulary: the bound is the remaining count at
    each position (the longest slice token has 128 characters) and each walk is the linear one."""
    from shared_data import vocab_file

    from grammars.compile import _vocab_index
    from grammars.vocab.vocabulary import TokenVocabulary

    vocab = TokenVocabulary.from_gguf(vocab_file("llama-bpe"))
    trie = _vocab_index(vocab).trie
    token_slice = build_slice(trie, CLASS, vocab.logits_width)
    assert token_slice.max_chars > 20
    dfa = compile_regular(parse_regex(r'"([^"\\\x00-\x1f]|\\["\\/bfnrtu]){0,20}"'))
    state = int(dfa.table[dfa.start, ord('"')])
    words = (vocab.logits_width + 31) // 32
    for remaining in range(20, -1, -1):
        assert token_slice.reach(dfa, state) == remaining
        if remaining in (20, 7, 1, 0):
            got = token_slice.walk(dfa, state, remaining)
            want = _linear_walk(trie.node_parent, trie.node_byte, trie.token_node, _flat(dfa), dfa.accepting, state,
                                words)
            assert np.array_equal(got[0], want[0]) and np.array_equal(got[1], want[1])
        state = int(dfa.table[state, ord("a")])


@settings(max_examples=60, deadline=None)
@given(body=st.sampled_from([r'[^"]', r'[^"\\]', r'([^"\\]|\\.)', r"[a-z]", r'[^"a]', r"(.|\n)", r'[^"\x00-\x1f]']),
       low=st.integers(0, 3), extra=st.integers(0, 5),
       suffix=st.sampled_from(['"', r'"\}?', '",?', "", r'"[^"]{0,2}"']))
def test_every_reach_gives_the_linear_walk(trie, token_slice, body, low, extra, suffix):
    """Counted bodies of assorted classes, bounds and endings: wherever ``reach`` answers, the
    sliced walk is the whole-trie walk, from every state of the DFA."""
    _reach_walks_are_linear(trie, token_slice, compile_regular(parse_regex(rf'"{body}{{{low},{low + extra}}}{suffix}')))
