"""DFA construction shortcuts must not change languages: products, shared sub-DFAs, byte classes,
cached IR hashes, and big pieces of a regular run lowered as terminals of their own."""

from __future__ import annotations

import pickle
import random
import re

import numpy as np
import pytest

from grammars import Compiler, LimitExceeded, Limits, TokenVocabulary
from grammars.automata import compile_regular
from grammars.automata.byte_dfa import ByteDFA, byte_classes, difference, from_transitions, intersect
from grammars.frontends import parse_regex
from grammars.frontends.json_schema.strings import json_string_value, string_not_in
from grammars.ir import Grammar, Literal, Ref, Repeat, Seq, alt, chars, literal, repeat, seq

PATTERNS = ["[ab]*a[ab]{2}", "(ab|ba)+", "a*b?a*", "[a-c]{1,4}", "(aa)*", "b[ab]*", ""]


def _strings(rnd: random.Random, n: int = 300) -> list[bytes]:
    return [bytes(rnd.choice(b"abc") for _ in range(rnd.randrange(7))) for _ in range(n)]


@pytest.mark.parametrize("p", PATTERNS)
@pytest.mark.parametrize("q", PATTERNS)
def test_products_agree_with_both_operands(p, q):
    a, b = compile_regular(parse_regex(p)), compile_regular(parse_regex(q))
    both, minus = intersect(a, b), difference(a, b)
    for s in _strings(random.Random(p + q)) + [b""]:
        assert both.matches(s) == (a.matches(s) and b.matches(s)), (p, q, s)
        assert minus.matches(s) == (a.matches(s) and not b.matches(s)), (p, q, s)


def _reachable_pairs(a: ByteDFA, b: ByteDFA) -> int:
    seen, todo = {(a.start, b.start)}, [(a.start, b.start)]
    while todo:
        x, y = todo.pop()
        for c in range(256):
            pair = (int(a.table[x, c]), int(b.table[y, c]))
            if min(pair) >= 0 and pair not in seen:
                seen.add(pair)
                todo.append(pair)
    return len(seen)


def test_products_past_their_first_capacity_are_run_again_with_more():
    # "a 7th from the end" (128 states) times "a length divisible by 5" (5): 640 reachable pairs,
    # past the kernel's first guess (about the operands' sizes), so the call is repeated with
    # room for more (the minimal result is small: the two conditions fix each other's phase)
    a, b = compile_regular(parse_regex("[ab]*a[ab]{6}")), compile_regular(parse_regex("([ab]{5})*"))
    assert _reachable_pairs(a, b) > 2 * (a.n_states + b.n_states) + 64
    both, minus = intersect(a, b), difference(a, b)
    rnd = random.Random(1)
    for s in [bytes(rnd.choice(b"ab") for _ in range(rnd.randrange(16))) for _ in range(3000)]:
        assert both.matches(s) == (a.matches(s) and b.matches(s)), s
        assert minus.matches(s) == (a.matches(s) and not b.matches(s)), s
    with pytest.raises(LimitExceeded):
        intersect(a, b, Limits(max_dfa_states=_reachable_pairs(a, b) - 1))


def test_subset_construction_past_its_first_capacity_is_run_again_with_more():
    # 2**12 states of one NFA of a few dozen: past the first guess of both the state arrays
    # (1,024) and the set members (four per NFA state)
    pattern = re.compile(rb"[ab]*a[ab]{11}")
    dfa = compile_regular(parse_regex("[ab]*a[ab]{11}"))
    assert dfa.n_states == 2 ** 12
    rnd = random.Random(2)
    for s in [bytes(rnd.choice(b"ab") for _ in range(rnd.randrange(20))) for _ in range(2000)]:
        assert dfa.matches(s) == bool(pattern.fullmatch(s)), s
    with pytest.raises(LimitExceeded):
        compile_regular(parse_regex("[ab]*a[ab]{11}"), Limits(max_dfa_states=3000))


def test_string_not_in_matches_the_complement_of_every_encoding():
    names = ["a", "ab", "name", "naïve", ""]
    d = string_not_in(names)
    assert isinstance(d, ByteDFA)
    excluded = compile_regular(alt(json_string_value(v) for v in names))
    token = compile_regular(string_not_in([]))
    rnd = random.Random(0)
    samples = [b'"a"', b'"\\u0061"', b'"\\u0061b"', b'"na\\u00efve"', b'""', b'"abc"', b'"nam"', b'"n\\u0061me"']
    samples += [b'"' + bytes(rnd.choice(b"abnme\\u0") for _ in range(rnd.randrange(8))) + b'"' for _ in range(300)]
    for s in samples:
        assert d.matches(s) == (token.matches(s) and not excluded.matches(s)), s
    assert d.n_states < 200  # a trie plus a string token, not their product


def test_shared_sub_dfas_give_the_same_language():
    ws = repeat(chars(" \t\n"), 0, 20)
    body = repeat(alt([chars(("a", "z")), seq([literal("\\"), chars("n\"")])]), 0, None)
    expr = seq([ws, literal(","), ws, literal('"'), body, literal('"'), ws, literal(":"), ws])
    memo: dict = {}

    def sub(e):
        if e not in memo:
            memo[e] = compile_regular(e, sub=sub)
        return memo[e]

    assert compile_regular(expr, sub=sub).key == compile_regular(expr).key
    assert memo  # the repetitions were compiled on their own


def test_embedded_dfas_survive_cloning_and_replay():
    """An embedded DFA's edges live in a block of the NFA, not in per-state lists: every copy of a
    fragment holding one (a counted repetition, a small sequence met again) must carry it along."""
    word_expr = parse_regex("[a-c]{1,3}x?|y")

    def expr(word):
        inner = seq([literal("<"), word, literal(">")])
        nested = repeat(seq([inner, repeat(inner, 0, 2)]), 1, 3)
        return alt([seq([repeat(inner, 2, 4), literal(";"), inner]), seq([inner, literal("!")]), nested])

    embedded, written = compile_regular(expr(compile_regular(word_expr))), compile_regular(expr(word_expr))
    assert embedded.key == written.key
    rnd = random.Random(7)
    for _ in range(300):
        s = "".join(rnd.choice(["<a>", "<abx>", "<y>", "<>", ";", "!", "<cc"]) for _ in range(rnd.randrange(7)))
        assert embedded.matches(s.encode()) == written.matches(s.encode()), s
    assert embedded.matches(b"<a><bx>;<y>") and embedded.matches(b"<y>!") and not embedded.matches(b"<a>;<y>")


def test_byte_classes_group_equal_columns():
    d = compile_regular(parse_regex("[a-f]x|[0-9]+|q"))
    cls, b2c = byte_classes(d.table)
    assert np.array_equal(cls[:, b2c], d.table)
    assert len({tuple(d.table[:, b]) for b in range(256)}) == cls.shape[1]


@pytest.mark.parametrize("seed", range(6))
def test_byte_classes_are_exact_on_random_tables(seed):
    """Equal columns share a class, unequal ones never do, classes are numbered by first byte."""
    rng = np.random.default_rng(seed)
    n, distinct = int(rng.integers(1, 300)), int(rng.integers(1, 40))
    table = rng.integers(-1, n, (n, distinct)).astype(np.int32)[:, rng.integers(0, distinct, 256)]
    cls, b2c = byte_classes(table)
    assert np.array_equal(cls[:, b2c], table)
    assert len({tuple(table[:, b]) for b in range(256)}) == cls.shape[1]
    assert list(dict.fromkeys(b2c.tolist())) == list(range(cls.shape[1]))


def test_ir_hash_is_cached_but_not_pickled():
    e = seq([literal("ab"), repeat(chars(("0", "9")), 1, 3), Ref("x")])
    h = hash(e)
    assert e.__dict__["_hash"] == h
    state = pickle.dumps(e)
    assert b"_hash" not in state
    back = pickle.loads(state)
    assert back == e and hash(back) == h and back is not e
    assert Literal("a") != Ref("a") and Repeat(Literal("a"), 0, 2) != Repeat(Literal("a"), 0, 3)


def test_big_pieces_of_a_run_become_their_own_terminal():
    pieces = [b"a", b"b", b"ab", b'"', b":", b'":', b'"a', b"{", b"}", b",", b"x", b"y"]
    vocab = TokenVocabulary.from_bytes(pieces + [b""], eos_token_ids=[len(pieces)], special_token_ids=[len(pieces)])

    def ids(text: str) -> list[int]:  # greedy longest match over the pieces
        out, data = [], text.encode()
        while data:
            best = max((p for p in pieces if data.startswith(p)), key=len)
            out.append(pieces.index(best))
            data = data[len(best):]
        return out

    counted = repeat(chars("ab"), 0, 300)  # a DFA of 301 states, shared by both members
    member = lambda key: seq([literal(f'"{key}"'), literal(":"), literal('"'), counted, literal('"')])  # noqa: E731
    rules = {
        "root": seq([literal("{"), Ref("m"), literal("}")]),
        "m": alt([member("x"), seq([member("y"), literal(","), Ref("m")])]),
    }
    g = Compiler(vocab).compile_grammar(Grammar.of(rules, "root"))
    sizes = sorted(t.n_states for t in g._cfg.terminals)
    assert sizes[-1] < 320 and sum(s > 256 for s in sizes) == 1
    m = g.matcher()
    good = ids('{"y":"ab","x":"' + "a" * 300 + '"}')
    assert m.try_advance(good) == len(good) and m.is_accepting()
    bad = ids('{"x":"' + "a" * 301 + '"}')
    assert g.matcher().try_advance(bad) < len(bad)


def test_a_big_piece_between_loose_pieces_takes_them_up_to_the_quotes():
    """An unanchored pattern's body (``"`` any* P any* ``"``) with a big P: P standing alone could
    end after any character of its loop, so every token would be a boundary and the next terminal
    walked from every trie node. It takes the unbounded repetitions around it and the literals
    beyond them: the string is one terminal, from quote to quote."""
    pieces = [b"a", b"b", b"x", b"y", b'"', b"{", b"}", b":", b"k", b"ax", b"yb"]
    vocab = TokenVocabulary.from_bytes(pieces + [b""], eos_token_ids=[len(pieces)], special_token_ids=[len(pieces)])
    big = compile_regular(repeat(chars("ab"), 1, 400))
    assert big.n_states > 256
    loose = repeat(chars("xy"), 0, None)
    rules = {"root": seq([literal('{"k":"'), loose, big, loose, literal('"}')])}
    g = Compiler(vocab).compile_grammar(Grammar.of(rules, "root"))
    assert len(g._cfg.terminals) == 1
    text = '{"k":"xyab' + "a" * 300 + 'yx"}'
    data = [pieces.index(bytes([c])) for c in text.encode()]
    m = g.matcher()
    assert m.try_advance(data) == len(data) and m.is_accepting()
    for bad in ('{"k":"xyyx"}', '{"k":"' + "a" * 401 + '"}', '{"k":"axa"}'):
        data = [pieces.index(bytes([c])) for c in bad.encode()]
        assert g.matcher().try_advance(data) < len(data)


def test_big_embedded_dfa_is_not_inlined_into_every_alternative():
    """A rule holding a pre-compiled DFA bigger than ``ALONE_STATES`` is one IR node but a big
    terminal: inlined into an alternative of members (an any-order object), it would be copied
    into one terminal per alternative. It stays a rule, and its DFA one shared terminal."""
    pieces = [b"a", b"b", b'"', b":", b"{", b"}", b",", b"x", b"y", b"z"]
    vocab = TokenVocabulary.from_bytes(pieces + [b""], eos_token_ids=[len(pieces)], special_token_ids=[len(pieces)])
    body = compile_regular(repeat(chars("ab"), 0, 400))  # 401 states, embedded as a ByteDFA
    assert body.n_states > 256
    value = seq([literal('"'), body, literal('"')])
    rules = {f"m{k}": seq([literal(f'"{k}":'), value]) for k in "xyz"}
    rules["next"] = alt([seq([Ref(f"m{k}"), literal(",")]) for k in "xyz"])  # regular: inlinable if small
    rules["root"] = seq([literal("{"), Ref("next"), Ref("next"), Ref("mx"), literal("}")])
    g = Compiler(vocab).compile_grammar(Grammar.of(rules, "root"))
    sizes = sorted(t.n_states for t in g._cfg.terminals)
    assert sum(s > 256 for s in sizes) == 1 and sizes[-1] < 420
    text = '{"y":"' + "ab" * 200 + '","z":"","x":"b"}'
    data = [pieces.index(bytes([c])) for c in text.encode()]
    m = g.matcher()
    assert m.try_advance(data) == len(data) and m.is_accepting()
    bad = '{"y":"' + "a" * 401 + '",'
    data = [pieces.index(bytes([c])) for c in bad.encode()]
    assert g.matcher().try_advance(data) < len(data)


def test_repetitions_and_alternatives_around_big_pieces_are_lowered_as_rules():
    """An optional list of long strings (``[]`` or up to 9 of them), and up to 50 copies of a
    sizeable item: one terminal of either would unroll the big piece or the item once per copy.
    Lowered as rules, each stays one terminal, and the counts stay exact."""
    pieces = [b"a", b"b", b'"', b"[", b"]", b","]
    vocab = TokenVocabulary.from_bytes(pieces + [b""], eos_token_ids=[len(pieces)], special_token_ids=[len(pieces)])

    def ids(text: str) -> list[int]:
        return [pieces.index(bytes([c])) for c in text.encode()]

    long_string = seq([literal('"'), compile_regular(repeat(chars("ab"), 0, 300)), literal('"')])
    items = alt([literal(""), seq([long_string, repeat(seq([literal(","), long_string]), 0, 8)])])
    fixed = seq([literal('"'), repeat(chars("ab"), 70, 70), literal('"')])  # a 72-state item
    rules = {"root": alt([seq([literal("["), items, literal("]")]),
                          seq([literal("["), literal("["), repeat(seq([fixed, literal(",")]), 0, 50), literal("]"), literal("]")])])}
    g = Compiler(vocab).compile_grammar(Grammar.of(rules, "root"))
    assert max(t.n_states for t in g._cfg.terminals) < 320

    def accepts(text: str) -> bool:
        m, data = g.matcher(), ids(text)
        return m.try_advance(data) == len(data) and m.is_accepting()

    s = '"' + "ab" * 150 + '"'
    assert accepts("[]") and accepts("[" + ",".join([s] * 9) + "]")
    assert not accepts("[" + ",".join([s] * 10) + "]")
    assert not accepts('["' + "a" * 301 + '"]')
    f = '"' + "b" * 70 + '",'
    assert accepts("[[]]") and accepts("[[" + f * 50 + "]]")
    assert not accepts("[[" + f * 51 + "]]")
    assert not accepts('[["' + "b" * 69 + '",]]')


KEY_PATTERNS = PATTERNS + ["[^x]{2,5}", ".", "[\\u0100-\\u2000]+z", "[a-c]|[b-d]x", "[\\x00-\\x7f]*", "\\d+(\\.\\d*)?"]


@pytest.mark.parametrize("p", KEY_PATTERNS)
def test_key_from_the_class_form_equals_the_key_of_the_full_table(p):
    """``compile_regular`` fills ``key`` from its class table; a ByteDFA rebuilt from the full
    table computes it from ``byte_classes``: equal languages must still give equal keys."""
    built = compile_regular(parse_regex(p))
    rebuilt = ByteDFA(np.array(built.table), np.array(built.accepting), built.start)
    assert "key" not in rebuilt.__dict__
    assert rebuilt.key == built.key


def test_keys_of_different_languages_differ():
    keys = {compile_regular(parse_regex(p)).key for p in KEY_PATTERNS}
    assert len(keys) == len(set(KEY_PATTERNS))


def test_from_transitions_minimises_a_trie():
    # trie of "ab", "ac", "b": states 0 -a-> 1 -b-> 2, 1 -c-> 3, 0 -b-> 4; 2, 3, 4 accept
    d = from_transitions(5, [0, 1, 1, 0], [0x61, 0x62, 0x63, 0x62], [1, 2, 3, 4], [2, 3, 4])
    expected = compile_regular(alt([literal("ab"), literal("ac"), literal("b")]))
    assert d.n_states == expected.n_states == 3
    assert d.key == expected.key
    assert [w for w in (b"ab", b"ac", b"b", b"a", b"bc", b"") if d.matches(w)] == [b"ab", b"ac", b"b"]


def test_known_sequences_are_embedded_as_their_dfas():
    """A member compiled as a terminal and met again behind a comma is embedded, not rebuilt:
    same language, and the lookup is asked for the inner sequence."""
    member = seq([literal('"k"'), literal(":"), alt([literal("1"), literal("22")])])
    inner = compile_regular(member)
    asked = []

    def known(expr):
        asked.append(expr)
        return inner if expr == member else None

    behind_comma = Seq((literal(","), member))  # nested, as lowering leaves a member rule's body
    with_known = compile_regular(behind_comma, known=known)
    assert member in asked
    assert with_known.key == compile_regular(behind_comma).key


def test_a_precompiled_dfa_at_the_root_is_minimised_not_rebuilt():
    """A table built directly may hold equivalent states; compiling it alone gives the minimal
    DFA of its language (what an NFA round trip gave), with the same key."""
    reference = compile_regular(parse_regex("(ab)*"))
    # (ab)* unrolled once: states 0 -a-> 1 -b-> 2 -a-> 3 -b-> 2, with 0 and 2 equivalent
    table = np.full((4, 256), -1, dtype=np.int32)
    table[0, ord("a")], table[1, ord("b")], table[2, ord("a")], table[3, ord("b")] = 1, 2, 3, 2
    redundant = ByteDFA(table, np.array([True, False, True, False]), 0)
    compiled = compile_regular(redundant)
    assert compiled.n_states == reference.n_states == 2
    assert compiled.key == reference.key


def test_rules_holding_small_dfas_are_not_copied_into_every_alternative(monkeypatch):
    """Keys, string bodies and formats arrive as small pre-compiled DFAs. Counted as one IR node
    each, every member rule of an any-order object was inlined into every alternative of every
    state, and the states became terminals of thousands of states; weighted per DFA state, the
    members stay rules, each one terminal."""
    import grammars.automata.cfg as cfg

    pieces = [b"a", b"b", b'"', b":", b"{", b"}", b",", b"x", b"y", b"z"]
    vocab = TokenVocabulary.from_bytes(pieces + [b""], eos_token_ids=[len(pieces)], special_token_ids=[len(pieces)])
    body = compile_regular(repeat(chars("ab"), 0, 40))  # a counted string: 41 states
    rules = {f"m{k}": seq([compile_regular(literal(f'"{k}"')), literal(":"), literal('"'), body, literal('"')])
             for k in "xyz"}
    rules["next"] = alt([seq([Ref(f"m{k}"), literal(",")]) for k in "xyz"])
    rules["root"] = seq([literal("{"), Ref("next"), Ref("next"), Ref("next"), Ref("mx"), literal("}")])

    def largest_terminal() -> int:
        g = Compiler(vocab).compile_grammar(Grammar.of(rules, "root"))
        text = '{"y":"ab","z":"","x":"' + "b" * 40 + '","x":"a"}'
        m, data = g.matcher(), [pieces.index(bytes([c])) for c in text.encode()]
        assert m.try_advance(data) == len(data) and m.is_accepting()
        return max(t.n_states for t in g._cfg.terminals)

    assert largest_terminal() < 60  # one member and its comma
    monkeypatch.setattr(cfg, "DFA_STATE_NODES", 1)
    assert largest_terminal() > 120  # members copied into the alternatives' terminals


def _naive_derivable(prods, through_terminals):
    """The textbook fixpoint: pass over every production until nothing changes."""
    out: set[int] = set()
    changed = True
    while changed:
        changed = False
        for p in prods:
            if p.lhs not in out and all((through_terminals if s < 0 else s in out) for s in p.rhs):
                out.add(p.lhs)
                changed = True
    return out


@pytest.mark.parametrize("seed", range(40))
def test_nullable_and_productive_match_the_fixpoint(seed):
    from grammars.automata.cfg import Production, _nullable, _productive

    rng = random.Random(seed)
    n = rng.randint(1, 12)
    prods = [
        Production(rng.randrange(n), tuple(rng.choice([rng.randrange(n), ~rng.randrange(3)]) for _ in range(rng.randint(0, 3))))
        for _ in range(rng.randint(1, 25))
    ]
    assert _nullable(prods) == _naive_derivable(prods, through_terminals=False)
    assert _productive(prods) == _naive_derivable(prods, through_terminals=True)
