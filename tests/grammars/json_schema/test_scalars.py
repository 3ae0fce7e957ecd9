"""String tokens: every encoding of a value, value exclusion, lengths, pattern, their products.

Oracle: ``json.loads`` of the token gives the value; lengths are ``len(value)``; patterns are
Python ``re.search`` on patterns where ECMA-262 and Python agree.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from functools import lru_cache

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from shared_data import vocab_file

from grammars.automata.byte_dfa import ByteDFA, compile_regular, intersect
from grammars.errors import GrammarError, UnsupportedSchemaError
from grammars.frontends.json_schema import scalars, strings
from grammars.frontends.regex import parse_regex
from grammars.ir import NOTHING, Literal, Repeat, alt

FAST = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])

SHORT = {'"': '\\"', "\\": "\\\\", "/": "\\/", "\b": "\\b", "\f": "\\f", "\n": "\\n", "\r": "\\r", "\t": "\\t"}

# scalar values (no lone surrogates), biased towards characters with several encodings
chars_st = st.one_of(
    st.characters(exclude_categories=("Cs",)),
    st.sampled_from(list('"\\/\b\f\n\r\t\x00\x1fa\u00e9\u2028\U0001f600\U0010fffd')),
)
values = st.text(alphabet=chars_st, max_size=12)


def encodings_of(c: str, draw) -> str:
    """One random valid JSON encoding of the character ``c``."""
    options = []
    cp = ord(c)
    if cp >= 0x20 and c not in '"\\':
        options.append(c)
    if c in SHORT:
        options.append(SHORT[c])
    if cp <= 0xFFFF:
        options.append("\\u" + format(cp, "04x"))
        options.append("\\u" + format(cp, "04X"))
    else:
        hi, lo = 0xD800 + ((cp - 0x10000) >> 10), 0xDC00 + ((cp - 0x10000) & 0x3FF)
        options.append(f"\\u{hi:04x}\\u{lo:04X}")
        options.append(f"\\u{hi:04X}\\u{lo:04x}")
    return draw(st.sampled_from(options))


@st.composite
def encoded(draw, value_strategy=values):
    value = draw(value_strategy)
    return value, '"' + "".join(encodings_of(c, draw) for c in value) + '"'


@lru_cache(maxsize=None)
def token_dfa(items: tuple) -> ByteDFA:
    return compile_regular(scalars.string_schema(dict(items), "#", None))


def test_keyword_sets():
    assert {"minLength", "maxLength", "pattern", "format"} <= scalars.STRING_KEYWORDS
    assert scalars.NUMBER_KEYWORDS == {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf"}


# --- one character, any string ---------------------------------------------------------------


@FAST
@given(pair=encoded())
def test_any_string_accepts_every_encoding(pair):
    value, text = pair
    assert json.loads(text) == value
    assert token_dfa(()).matches(text.encode())


@pytest.mark.parametrize(
    "text, ok",
    [
        ('"\\ud83d\\ude00"', True),
        ('"\\uD83D\\uDE00"', True),
        ('"\\ud83d"', False),  # lone high surrogate
        ('"\\ude00"', False),  # lone low surrogate
        ('"\\ud83d\\u0061"', False),
        ('"\\x41"', False),
        ('"\x01"', False),  # control characters must be escaped
        ('"a"b"', False),
        ('"\\u00e9"', True),
        ('"\\/"', True),
    ],
)
def test_string_char_edges(text, ok):
    assert token_dfa(()).matches(text.encode("utf-8", "surrogatepass")) == ok


# --- values and exclusion --------------------------------------------------------------------


@FAST
@given(pair=encoded(), other=values)
@example(pair=("a", '"\\u0061"'), other="b")
def test_json_string_value_accepts_exactly_the_value(pair, other):
    value, text = pair
    d = compile_regular(scalars.json_string_value(value))
    assert d.matches(text.encode())
    other_text = json.dumps(other, ensure_ascii=False)
    assert d.matches(other_text.encode()) == (other == value)


def test_json_string_value_with_lone_surrogate_is_nothing():
    assert scalars.json_string_value("a\ud800") == NOTHING


@FAST
@given(vals=st.lists(values, min_size=1, max_size=5))
@example(vals=["", "a", "ab", "\U0001f600", '"\\/'])
def test_json_string_values_trie_equals_the_encoded_expression(vals):
    """The directly built trie and the NFA of every encoding give one minimal DFA (equal keys)."""
    expected = compile_regular(alt(strings.string_token(strings.encode_value_language(Literal(v))) for v in vals))
    assert strings.json_string_values(vals).key == expected.key


def test_json_string_values_skips_values_without_an_encoding():
    assert strings.json_string_values(["a\ud800"]) == NOTHING
    d = strings.json_string_values(["a\ud800", "b"])
    assert [v for v in ["a", "b", "ab"] if d.matches(json.dumps(v).encode())] == ["b"]


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(excluded=st.lists(st.text(alphabet=chars_st, max_size=5), max_size=4), probes=st.lists(encoded(), min_size=1, max_size=8), data=st.data())
@example(excluded=["a"], probes=[("a", '"\\u0061"'), ("ab", '"ab"'), ("", '""')], data=None)
def test_string_not_in_excludes_every_encoding(excluded, probes, data):
    d = compile_regular(scalars.string_not_in(excluded))
    if data is not None:  # also probe encodings of the excluded values themselves
        probes = probes + [data.draw(encoded(st.just(v))) for v in excluded[:3]]
    for value, text in probes:
        assert d.matches(text.encode()) == (value not in excluded), (excluded, value, text)


def test_string_not_in_prefixes_and_empty():
    d = compile_regular(scalars.string_not_in(["", "ab", "abc"]))
    assert [s for s in ["", "a", "ab", "abc", "abcd", "b", "aab"] if d.matches(json.dumps(s).encode())] == ["a", "abcd", "b", "aab"]


# --- lengths ---------------------------------------------------------------------------------


def same_language(a: ByteDFA, b: ByteDFA) -> bool:
    """Product walk: every reachable pair agrees on acceptance (trimmed DFAs: dead iff -1)."""
    seen = {(a.start, b.start)}
    stack = [(a.start, b.start)]
    while stack:
        p, q = stack.pop()
        if a.is_accepting(p) != b.is_accepting(q):
            return False
        for byte in range(256):
            np_, nq = a.step(p, byte), b.step(q, byte)
            if (np_ < 0) != (nq < 0):
                return False
            if np_ >= 0 and (np_, nq) not in seen:
                seen.add((np_, nq))
                stack.append((np_, nq))
    return True


@pytest.mark.parametrize("bounds", [(0, 0), (1, 3), (2, 2), (0, 40), (5, None), (40, None), (33, 33)])
def test_length_automaton_is_the_minimal_repeat(bounds):
    lo, hi = bounds
    built = compile_regular(strings.length_bounded_body(lo, hi))
    reference = compile_regular(Repeat(strings.STRING_CHAR, lo, hi))
    assert same_language(built, reference)
    assert built.n_states == (hi if hi is not None else lo) * strings.STATES_PER_CHARACTER + 1  # minimal


@FAST
@given(pair=encoded(st.text(alphabet=chars_st, max_size=45)))
@example(pair=("\U0001f600", '"\\ud83d\\ude00"'))
def test_lengths_count_characters_not_bytes(pair):
    value, text = pair
    for lo, hi in [(0, 1), (1, 3), (2, 40), (3, None), (35, 45)]:
        items = (("minLength", lo),) + ((("maxLength", hi),) if hi is not None else ())
        assert token_dfa(items).matches(text.encode()) == (lo <= len(value) and (hi is None or len(value) <= hi))


def test_long_max_length_is_narrowed_soundly_and_reported():
    notes: list[str] = []
    d = compile_regular(scalars.string_schema({"maxLength": 32767}, "#/s", None, narrowed=notes.append))
    limit = strings.max_counted_length() - 1
    assert notes and "#/s" in notes[0]
    assert d.matches(json.dumps("x" * limit).encode()) and not d.matches(json.dumps("x" * (limit + 1)).encode())


def test_huge_min_length_raises():
    with pytest.raises(UnsupportedSchemaError) as err:
        scalars.string_schema({"minLength": 100_000}, "#/s", None)
    assert err.value.keyword == "minLength" and err.value.pointer == "#/s"


def test_contradictory_lengths_give_nothing():
    assert scalars.string_schema({"minLength": 3, "maxLength": 2}, "#", None) == NOTHING


# --- pattern ---------------------------------------------------------------------------------

PATTERNS = [r"^[a-z0-9-]+$", r"^\d{4}-\d{2}-\d{2}$", r"ab+c", r"^(foo|bar)?baz", r"[\"\\]", r"^[^/]*$", r"x{2,3}$", r"^.{2}$"]


@FAST
@given(pair=encoded(st.text(alphabet=st.sampled_from(list('abcxfoz019-/"\\\n\U0001f600')), max_size=10)))
@example(pair=("abc", '"\\u0061bc"'))
def test_pattern_is_search_over_the_value(pair):
    value, text = pair
    for pattern in PATTERNS:
        d = token_dfa((("pattern", pattern),))
        assert d.matches(text.encode()) == bool(re.search(pattern, value)) or (
            pattern.endswith("$") and value.endswith("\n")  # Python's $ also matches before a final \n
        ), (pattern, value, text)


@FAST
@given(pair=encoded(st.text(alphabet=st.sampled_from(list("abcx-9\U0001f600\"")), max_size=12)))
def test_pattern_with_lengths_is_exact(pair):
    value, text = pair
    for pattern, lo, hi in [(r"^[a-c]+$", 2, 5), (r"x", 0, 3), (r"^[^-]*$", 4, None), (r"b", 1, 1)]:
        items = (("pattern", pattern), ("minLength", lo)) + ((("maxLength", hi),) if hi is not None else ())
        expected = bool(re.search(pattern, value)) and lo <= len(value) and (hi is None or len(value) <= hi)
        assert token_dfa(items).matches(text.encode()) == expected, (pattern, lo, hi, value, text)


def test_pattern_that_bounds_length_ignores_a_huge_max_length():
    notes: list[str] = []
    e = scalars.string_schema({"pattern": "^[A-Z]{3}$", "maxLength": 32767}, "#", None, narrowed=notes.append)
    assert not notes and compile_regular(e).matches(b'"ABC"')


@pytest.mark.parametrize("pattern", ["[a-c]*x?", "é+x?", "(\\S+\\s){1,2}", "[\U0001f600-\U0001f602ab]*", ".*"])
def test_restrict_length_equals_intersection_with_repeat(pattern):
    body = compile_regular(strings.encode_value_language(parse_regex(pattern, search=False)))
    for lo, hi in [(0, 0), (0, 2), (1, 4), (3, None)]:
        expected = intersect(body, compile_regular(Repeat(strings.STRING_CHAR, lo, hi)))
        assert same_language(strings.restrict_length(body, lo, hi), expected), (pattern, lo, hi)


def test_length_budget_reports_the_largest_bound_that_fits():
    """``reached`` - 1 is exact: that bound fits the budget and one more does not, so a narrowed
    ``maxLength`` keeps every length it can."""
    body = compile_regular(strings.encode_value_language(parse_regex("(\\S+\\s){2,5}\\S+", search=False)))
    with pytest.raises(strings.LengthBudgetExceeded) as err:
        strings.restrict_length(body, 0, 255)
    fits = err.value.reached - 1
    assert fits > 0
    strings.restrict_length(body, 0, fits)
    with pytest.raises(strings.LengthBudgetExceeded):
        strings.restrict_length(body, 0, fits + 1)
    notes: list[str] = []
    narrowed = scalars.string_schema({"pattern": "^(\\S+\\s){2,5}\\S+$", "maxLength": 255}, "#", None, narrowed=notes.append)
    words = ("a " * 3 + "b" * fits)[:fits]
    assert notes and compile_regular(narrowed).matches(json.dumps(words).encode())
    assert not compile_regular(narrowed).matches(json.dumps(words + "c").encode())


@pytest.mark.parametrize("pattern, reason", [("(?=a)b", "lookahead"), ("(a)\\1", "backreference")])
def test_unsupported_patterns_raise(pattern, reason):
    with pytest.raises(UnsupportedSchemaError) as err:
        scalars.string_schema({"pattern": pattern}, "#/p", None)
    assert err.value.keyword == "pattern" and err.value.pointer == "#/p" and reason in str(err.value)


@pytest.mark.parametrize("pattern, reason", [("[", "unterminated"), ("a(", "missing"), (5, "must be a string")])
def test_malformed_patterns_are_malformed_schemas_at_the_pattern(pattern, reason):
    """Not a regular expression in our dialect nor in Python's ``re`` (what validators run): the
    schema is malformed, reported at the pattern's own pointer (never relaxed by ``lenient``)."""
    with pytest.raises(GrammarError) as err:
        scalars.string_schema({"pattern": pattern}, "#/p", None)
    assert not isinstance(err.value, UnsupportedSchemaError)
    assert "malformed schema at #/p/pattern" in str(err.value) and reason in str(err.value)


def test_encode_value_language_keeps_structure():
    body = strings.encode_value_language(parse_regex("a{2}"))
    d = compile_regular(body)
    assert d.matches(b"aa") and d.matches(b"\\u0061a") and not d.matches(b"a")
    minimal = compile_regular(strings.encode_value_language(parse_regex("[a\u00e9\"]"), "minimal"))
    assert minimal.matches(b"a") and not minimal.matches(b"\\u0061") and minimal.matches(b"\\u00e9")
    assert minimal.matches(b'\\"') and minimal.matches("\u00e9".encode())


def test_format_and_pattern_intersect():
    d = token_dfa((("format", "uuid"), ("pattern", "^0")))
    assert d.matches(b'"0e4567e8-e89b-12d3-a456-426614174000"')
    assert not d.matches(b'"1e4567e8-e89b-12d3-a456-426614174000"')


@pytest.mark.parametrize("escapes", ["all", "minimal"])
@pytest.mark.parametrize("pair", [(0x00, 0x01), (0x21, 0x22), (0x2E, 0x2F), (0x5B, 0x5C), (0x61, 0x62), (0x7E, 0x7F), (0xE9, 0xEA), (0xFFFF, 0x10000), (0x1F600, 0x1F601)])
def test_single_character_fast_path_matches_the_range_path(pair, escapes):
    from grammars.ir import Chars, alt

    a, b = pair
    both = compile_regular(strings.encode_chars(Chars(((a, b),)), escapes))  # range path
    singles = compile_regular(alt([strings.encode_chars(Chars(((a, a),)), escapes), strings.encode_chars(Chars(((b, b),)), escapes)]))
    assert both.key == singles.key


STRING_CONJUNCTIONS = [
    # several patterns with length bounds and excluded values: their automata meet smallest first
    {"type": "string", "minLength": 3, "maxLength": 6, "allOf": [{"pattern": "a"}, {"pattern": "b"}, {"pattern": "^[a-c]"}]},
    {"type": "string", "maxLength": 2, "allOf": [{"pattern": "a"}, {"pattern": ".*"}], "not": {"enum": ["a", "ab"]}},
    {"type": "string", "minLength": 4, "pattern": "x", "anyOf": [{"pattern": "^x"}, {"pattern": "y$"}]},
]


@pytest.mark.parametrize("schema", STRING_CONJUNCTIONS)
def test_conjunctions_of_patterns_lengths_and_excluded_values_match_the_oracle(byte_vocab, schema):
    from schema_check import Checker

    strings = ["", "a", "b", "ab", "ba", "abc", "cab", "aab", "abcabc", "abcabca", "bca", "x", "xy", "xxxx",
               "axxy", "xabc", "yyyx", "xaay", "é", "aé b", "a\u00e9"]
    assert not Checker(byte_vocab).disagreements(schema, strings)


def test_the_first_schema_compile_loads_the_length_kernels():
    # a kernel signature first met inside a compile is compiled (or loaded) there, seconds charged
    # to that schema: the first compile of any schema loads them before its own work
    script = (
        "from grammars import Compiler, TokenVocabulary\n"
        "from grammars.frontends.json_schema import strings\n"
        f"compiler = Compiler(TokenVocabulary.from_pretrained({str(vocab_file('gpt-2'))!r}))\n"
        "compiler.compile_json_schema({'type': 'integer'})\n"
        "before = len(strings._length_product.signatures), len(strings._bfs_order.signatures)\n"
        "compiler.compile_json_schema({'type': 'string', 'minLength': 2, 'maxLength': 7, 'pattern': '^[a-z]+$'})\n"
        "after = len(strings._length_product.signatures), len(strings._bfs_order.signatures)\n"
        "print(before == after, min(before) > 0)\n"
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["True", "True"]
