"""Text with holes: ``CompiledGrammar.completable`` / ``complete`` against brute force.

Brute force enumerates every fill of bounded holes over the grammar's own alphabet (a byte no
string of the language contains can never help), so on small grammars the answer is known
exactly. Membership is the matcher's, fed byte by byte through a vocabulary of single bytes.
"""

from __future__ import annotations

import itertools
import json
import random

import jsonschema
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from grammars import Compiler, Limits, TokenVocabulary, compile_gbnf, compile_json_schema, compile_lark, compile_regex
from grammars.errors import LimitExceeded
from shared_data import shared_path

BYTES = [bytes([b]) for b in range(256)]


@pytest.fixture(scope="module")
def vocab():
    """One token per byte (id = byte value) and an EOS, so a matcher reads text byte by byte."""
    return TokenVocabulary.from_bytes(BYTES + [b""], eos_token_ids=[256], special_token_ids=[256])


def walked(grammar, text: bytes):
    """The matcher after ``text`` (one token per byte), or None where a byte is refused."""
    matcher = grammar.matcher()
    for byte in text:
        if not matcher.allows(byte):
            return None
        matcher.advance(byte)
    return matcher


def member(grammar, text: bytes) -> bool:
    matcher = walked(grammar, text)
    return matcher is not None and matcher.is_accepting()


def live_prefix(grammar, text: bytes) -> bool:
    return walked(grammar, text) is not None


def fills_up_to(alphabet: bytes, low: int, high: int):
    for n in range(low, high + 1):
        for combo in itertools.product(alphabet, repeat=n):
            yield bytes(combo)


def brute_force(grammar, parts: list[bytes], bounds: list[tuple[int, int]], alphabet: bytes) -> bool:
    for fills in itertools.product(*(list(fills_up_to(alphabet, lo, hi)) for lo, hi in bounds)):
        text = parts[0] + b"".join(f + p for f, p in zip(fills, parts[1:]))
        if member(grammar, text):
            return True
    return False


def joined(parts, fills):
    return parts[0] + type(parts[0])().join(f + p for f, p in zip(fills, parts[1:]))


# name -> (GBNF, alphabet): nested, ambiguous, multi-byte terminals, keywords that prefix others
SMALL_GRAMMARS = {
    "nested": ('root ::= "(" root ")" | "x"', b"()x"),
    "ambiguous": ('root ::= a\na ::= a a | "x" | "(" a ")"', b"()x"),
    "arithmetic": ('root ::= e\ne ::= t ("+" t)*\nt ::= [0-9]+ | "(" e ")"', b"0+()"),
    "keywords": ('root ::= "[" (v ("," v)*)? "]"\nv ::= "ab" | "abc" | "\\"" [ab]* "\\""', b'[],"ab'),
}


@pytest.fixture(scope="module", params=sorted(SMALL_GRAMMARS))
def small(request, vocab):
    source, alphabet = SMALL_GRAMMARS[request.param]
    return compile_gbnf(source, vocab), alphabet


def random_parts(rng: random.Random, alphabet: bytes, n_parts: int) -> list[bytes]:
    return [bytes(rng.choice(alphabet) for _ in range(rng.randint(0, 4))) for _ in range(n_parts)]


def test_bounded_holes_agree_with_brute_force(small):
    grammar, alphabet = small
    rng = random.Random(7)
    agreed = {True: 0, False: 0}
    for _ in range(60):
        n_parts = rng.choice([2, 2, 3])
        parts = random_parts(rng, alphabet, n_parts)
        high = 4 if n_parts == 2 else 2
        bounds = []
        for _ in range(n_parts - 1):
            lo = rng.randint(0, 1)
            bounds.append((lo, rng.randint(lo, high)))
        expected = brute_force(grammar, parts, bounds, alphabet)
        assert grammar.completable(parts, hole_bytes=bounds) == expected, (parts, bounds)
        fills = grammar.complete(parts, hole_bytes=bounds)
        assert (fills is not None) == expected
        if fills is not None:
            assert all(lo <= len(f) <= hi for f, (lo, hi) in zip(fills, bounds))
            assert member(grammar, joined(parts, fills)), (parts, fills)
            # the fewest fill bytes: no completion with fewer bytes in all exists
            shorter = [(lo, min(hi, len(f))) for f, (lo, hi) in zip(fills, bounds)]
            total = sum(len(f) for f in fills)
            for candidate in itertools.product(*(list(fills_up_to(alphabet, lo, hi)) for lo, hi in shorter)):
                if sum(map(len, candidate)) < total:
                    assert not member(grammar, joined(parts, list(candidate))), (parts, candidate, fills)
        agreed[expected] += 1
    assert agreed[True] and agreed[False], agreed  # both answers were exercised


def test_unbounded_holes_are_decided_and_witnessed(small):
    grammar, alphabet = small
    rng = random.Random(11)
    for _ in range(40):
        parts = random_parts(rng, alphabet, rng.choice([2, 3]))
        fills = grammar.complete(parts)
        assert (fills is not None) == grammar.completable(parts)
        if fills is None:
            # nothing up to 3 bytes per hole either (a sound, partial confirmation)
            assert not brute_force(grammar, parts, [(0, 3)] * (len(parts) - 1), alphabet), parts
        else:
            assert member(grammar, joined(parts, fills)), (parts, fills)


def test_the_prefix_question_agrees_with_the_matcher(small):
    grammar, alphabet = small
    rng = random.Random(3)
    for _ in range(80):
        prefix = bytes(rng.choice(alphabet) for _ in range(rng.randint(0, 8)))
        assert grammar.completable([prefix, b""]) == live_prefix(grammar, prefix), prefix
        assert grammar.completable([prefix]) == member(grammar, prefix), prefix


def language_strings(grammar, alphabet: bytes, max_len: int) -> list[bytes]:
    return [t for t in fills_up_to(alphabet, 1, max_len) if member(grammar, t)]


@pytest.fixture(scope="module")
def nested_members(vocab):
    grammar = compile_gbnf(SMALL_GRAMMARS["arithmetic"][0], vocab)
    return grammar, language_strings(grammar, b"0+()", 7)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_holes_cut_from_strings_of_the_language_are_completable_and_corruption_matches_brute_force(data, nested_members):
    grammar, members = nested_members
    text = data.draw(st.sampled_from(members))
    cuts = sorted(data.draw(st.lists(st.integers(0, len(text)), min_size=2, max_size=4)))
    # fixed, hole, fixed, hole, ...: cut pairs (a, b) remove text[a:b]
    pairs = list(zip(cuts[::2], cuts[1::2]))
    parts, at = [], 0
    for a, b in pairs:
        parts.append(text[at:a])
        at = b
    parts.append(text[at:])
    assert grammar.completable(parts), (text, parts)
    fills = grammar.complete(parts)
    assert fills is not None and member(grammar, joined(parts, fills))
    # corrupt one fixed part: the answer (holes bounded) matches brute force
    index = data.draw(st.integers(0, len(parts) - 1))
    corrupt = bytearray(parts[index])
    position = data.draw(st.integers(0, len(corrupt)))
    corrupt[position:position] = bytes([data.draw(st.sampled_from(b"0+()"))])
    parts[index] = bytes(corrupt)
    bounds = [(0, 2)] * (len(parts) - 1)
    assert grammar.completable(parts, hole_bytes=bounds) == brute_force(grammar, parts, bounds, b"0+()"), parts


def test_fragments_that_cut_terminals(vocab):
    strings = compile_regex(r'"([a-z]|\\n)*"( [0-9]+(\.[0-9]+)?)?', vocab)
    assert strings.complete(['"ab', "c"]) is None  # the string never ends before "c"
    assert strings.complete(['"ab', '" 1']) == ["", ]  # half a string literal, then the rest
    assert strings.complete(['"a\\', '"']) == ["n"]  # half an escape
    assert strings.complete(['"a" 1.', ""]) == ["0"]  # half a number
    assert strings.complete(['"', "\\", ""]) == ["", "n\""]  # a terminal spanning two holes
    accented = compile_regex("é+", vocab)
    e_acute = "é".encode()
    assert accented.completable([e_acute[:1], b""])  # half a UTF-8 character
    assert accented.complete([e_acute[:1], e_acute[1:]]) == [b""]
    assert not accented.completable([e_acute[1:], b""])  # a character cannot start mid-sequence
    assert accented.complete([b"", e_acute[1:]]) == [e_acute[:1]]


def test_ambiguous_grammars_stay_fast_and_exact(vocab):
    grammar = compile_gbnf('root ::= a\na ::= a a | "x"', vocab)
    assert grammar.completable(["x" * 60, "x" * 60])
    assert grammar.complete(["x" * 30, "y"]) is None
    assert grammar.complete(["", "x"]) == [""]


def test_nullable_languages_and_empty_texts(vocab):
    optional = compile_regex("(ab)?", vocab)
    assert optional.complete(["", ""]) == [""]
    assert optional.complete(["", "", ""]) == ["", ""]
    assert optional.complete(["", ""], hole_bytes=[(1, None)]) == ["ab"]
    assert optional.complete(["a", "", ""]) == ["b", ""]
    assert optional.complete(["", "", ""], hole_bytes=[(1, 1), (1, 1)]) == ["a", "b"]


def test_arguments_are_checked(vocab):
    grammar = compile_regex("a+", vocab)
    with pytest.raises(TypeError):
        grammar.completable("aaa")
    with pytest.raises(TypeError):
        grammar.completable(["a", 3])
    with pytest.raises(ValueError):
        grammar.completable([])
    with pytest.raises(ValueError):
        grammar.completable(["a", "a"], hole_bytes=[(2, 1)])
    with pytest.raises(ValueError):
        grammar.completable(["a", "a"], hole_bytes=[(0, 1), (0, 1)])


def test_work_is_bounded_by_limits(vocab):
    compiler = Compiler(vocab, limits=Limits(max_infill_items=500))
    grammar = compiler.compile_gbnf('root ::= a\na ::= a a | "x" | "(" a ")"')
    with pytest.raises(LimitExceeded) as caught:
        grammar.completable(["(" * 40, "x" * 40, ")" * 40])
    assert caught.value.limit == "max_infill_items"
    assert grammar.completable(["(x", ")"])  # still usable


def test_lark_grammars_answer_too(vocab):
    grammar = compile_lark('start: "let " NAME " = " NAME ";"\nNAME: /[a-z]+/', vocab)
    assert grammar.complete(["let a", "b;"]) == [" = "]
    assert grammar.complete(["let ", "= x;"]) == ["a "]
    assert not grammar.completable(["let 1", ""])


MASKBENCH_FILES = 25


@pytest.fixture(scope="module")
def maskbench_cases(vocab):
    folder = shared_path("jsonschemabench", "maskbench")
    files = sorted(folder.glob("*.json"))
    rng = random.Random(5)
    rng.shuffle(files)
    compiler = Compiler(vocab)
    cases = []
    for path in files:
        case = json.loads(path.read_text(encoding="utf-8"))
        try:
            grammar = compiler.compile_json_schema(case["schema"], whitespace="flexible")
        except Exception:
            continue
        cases.append((case, grammar))
        if len(cases) == MASKBENCH_FILES:
            break
    return cases


def test_json_schema_holes_complete_to_valid_instances(maskbench_cases):
    rng = random.Random(1)
    checked = 0
    for case, grammar in maskbench_cases:
        validator = jsonschema.Draft202012Validator(case["schema"])
        for test in case["tests"]:
            text = json.dumps(test["data"], ensure_ascii=False, separators=(", ", ": "))
            if not member(grammar, text.encode()):
                continue  # outside what the compiled schema admits (narrowed or invalid)
            cuts = sorted(rng.sample(range(len(text) + 1), k=min(len(text) + 1, 2 * rng.randint(1, 3))))
            parts, at = [], 0
            for a, b in zip(cuts[::2], cuts[1::2]):
                parts.append(text[at:a])
                at = b
            parts.append(text[at:])
            fills = grammar.complete(parts)
            assert fills is not None, (case["description"], parts)
            completed = joined(parts, fills)
            validator.validate(json.loads(completed))
            assert member(grammar, completed.encode())
            # prefixes agree with the matcher
            cut = rng.randint(0, len(text))
            corrupted = text[:cut] + rng.choice(['"', "}", "]", ",", "x", "1"]) + text[cut:]
            for prefix in (text[:cut], corrupted[: cut + 1]):
                assert grammar.completable([prefix, ""]) == live_prefix(grammar, prefix.encode()), prefix
            checked += 1
    assert checked >= 20


def test_a_prefix_chart_answers_as_the_one_shot_question(small):
    """A run of questions whose first texts grow, change and shrink (as a diffusion canvas's do):
    the kept chart answers each exactly as ``completable`` does."""
    from grammars.automata.holes import PrefixChart

    grammar, alphabet = small
    rng = random.Random(17)
    chart = PrefixChart(grammar.hole_grammar)
    first = b""
    answers = set()
    for _ in range(80):
        move = rng.random()
        if move < 0.5:
            first += bytes([rng.choice(alphabet)])
        elif move < 0.8 and first:
            first = first[:rng.randrange(len(first))] + bytes([rng.choice(alphabet)])
        else:
            first = first[:rng.randint(0, len(first))]
        parts = [first] + random_parts(rng, alphabet, rng.choice([1, 2]))
        bounds = [(lo, rng.choice([None, lo + 2])) for lo in (rng.randint(0, 1) for _ in parts[1:])]
        expected = grammar.completable(parts, hole_bytes=bounds)
        assert chart.completable(parts, bounds) == expected, (parts, bounds)
        answers.add(expected)
    assert answers == {True, False}


def test_a_prefix_chart_recovers_after_a_limit(vocab):
    """A limit hit while the chart reads a first text leaves it part-read: the next question cuts
    it back to what it holds for sure and answers exactly."""
    from grammars.automata.holes import PrefixChart

    grammar = compile_gbnf(SMALL_GRAMMARS["ambiguous"][0], vocab)
    chart = PrefixChart(grammar.hole_grammar, Limits(max_infill_items=300))
    with pytest.raises(LimitExceeded):
        chart.completable([b"(" * 400 + b"x", b")" * 400])
    assert chart.text == b"" and chart.chart.length > 0  # read part of it, holds none of it for sure
    for parts, expected in (([b"(x", b")"], True), ([b"(x))", b""], False), ([b"((", b"x))"], True)):
        assert chart.completable(parts) is expected, parts
