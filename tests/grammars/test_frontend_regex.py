"""The regex front end against its oracles: on a corpus, the same language as Python's ``re`` and
ECMA-262 (emulated, see ``test_regex_dialects``) both accept; exact errors otherwise."""

from __future__ import annotations

import random
import re

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

# Test modules in this folder are importable by name (pytest puts the folder on sys.path).
from test_regex_dialects import ecma_regex

from grammars.errors import GrammarSyntaxError, UnsupportedGrammarError
from grammars.frontends import parse_regex
from grammars.frontends.regex import DOT, SPACE
from grammars.ir import Alt, Chars, Expr, Literal, Ref, Repeat, Seq, chars

# --- a test-local reference matcher over the IR ----------------------------------------------


def _ends(expr: Expr, text: str, starts: frozenset[int]) -> frozenset[int]:
    """Every position where a match of ``expr`` starting at one of ``starts`` can end."""
    if not starts:
        return starts
    if isinstance(expr, Literal):
        return frozenset(p + len(expr.text) for p in starts if text.startswith(expr.text, p))
    if isinstance(expr, Chars):
        return frozenset(p + 1 for p in starts if p < len(text) and expr.contains(ord(text[p])))
    if isinstance(expr, Seq):
        for item in expr.items:
            starts = _ends(item, text, starts)
        return starts
    if isinstance(expr, Alt):
        return frozenset().union(*(_ends(item, text, starts) for item in expr.items))
    if isinstance(expr, Repeat):
        return _repeat_ends(expr, text, starts)
    raise TypeError(f"unexpected node {expr!r}")


def _repeat_ends(expr: Repeat, text: str, starts: frozenset[int]) -> frozenset[int]:
    current = starts
    for _ in range(expr.min):
        current = _ends(expr.item, text, current)
    reached, frontier, extra = set(current), current, 0
    # Breadth-first: a position first reached after k extra copies keeps the most budget.
    while frontier and (expr.max is None or extra < expr.max - expr.min):
        frontier = frozenset(_ends(expr.item, text, frontier) - reached)
        reached |= frontier
        extra += 1
    return frozenset(reached)


def matches(expr: Expr, text: str) -> bool:
    return len(text) in _ends(expr, text, frozenset({0}))


def sample(expr: Expr, rng: random.Random) -> str:
    """A random member of ``expr``'s language (small repetition counts, mostly ASCII)."""
    if isinstance(expr, Literal):
        return expr.text
    if isinstance(expr, Chars):
        lo, hi = rng.choice(expr.ranges)
        return chr(rng.randint(lo, min(hi, lo + 200)))
    if isinstance(expr, Seq):
        return "".join(sample(item, rng) for item in expr.items)
    if isinstance(expr, Alt):
        return sample(rng.choice(expr.items), rng)
    if isinstance(expr, Repeat):
        top = expr.min + 3 if expr.max is None else min(expr.max, expr.min + 3)
        return "".join(sample(expr.item, rng) for _ in range(rng.randint(expr.min, top)))
    raise TypeError(f"unexpected node {expr!r}")


# --- the corpus: the language is exactly what both dialects accept ---------------------------

CORPUS = [
    "abc",
    "a|b|c",
    "a*",
    "a+b?",
    "(ab)*c",
    "(?:ab|a)*b",
    "[a-c]+",
    "[^a]*",
    "a{2}",
    "a{1,3}b",
    "a{2,}",
    "a{0,1000}",
    "(a|b){2,3}?",
    "a*?b+?c??",
    r"\d+",
    r"\D+",
    r"\w*",
    r"\s",
    r"\S+",
    r"[\d\s]+",
    r"[\D]",
    r"\W+",
    r"\S\s\S",
    ".",
    "a.*b",
    "^a$",
    "^(a|b)+$",
    "^a|b$",
    "a{",
    "a{x}",
    "a{1,2",
    "x}]",
    r"\.\*\+\?\(\)\[\]\{\}\|\^\$\\",
    r"\x41\u0042\U00000043",
    r"[\-a][a-][-a]",
    "(?P<n>a)(?:(?P<m>b)c)?",
    "(a(b(c)?)?)?",
    "[a-cx-z]{2}",
    r"\t\n\r\f\v\0",
    r"[\b]",
    "(?i:ab)c",
    "(?i:[a-z]+)",
    "(?i:[^k])s",
    "(|a)+",
    "((a*)*b)*",
    "[.]",
    r"[\w-]+",
    r"[^\n]*",
    "a||b",
    "()",
    r"[\]]",
    r"(?s:.)",
    r"(?s:a.(?-s:.))",
    r"[^\W\d]+",
    r"[^\d]+",
    r"[\s\S]*",
    r"[^\s]",
    r"\u0663|\d",
]


# ASCII, plus characters on which the dialects disagree (so the oracle's intersection matters)
_BASE_ALPHABET = (
    "abcABC01xyz_- \t\n.\r\x0b\x0c\x00\x08{}]"
    "\u0663\uff13é\u0301\u00a0\u0085\x1c\u2028\ufeff\u212a\u017f"
)


def _alphabet(pattern: str) -> str:
    return "".join(sorted(set(_BASE_ALPHABET) | (set(pattern) - {"\\"})))


def both_fullmatch(pattern: str, text: str) -> bool:
    """Python's ``re`` and ECMA-262 both match the whole of ``text``."""
    return re.fullmatch(pattern, text) is not None and ecma_regex(pattern).fullmatch(text) is not None


@pytest.mark.parametrize("pattern", CORPUS)
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_same_language_as_both_dialects(pattern: str, data: st.DataObject) -> None:
    expr = parse_regex(pattern)
    text = data.draw(st.text(alphabet=_alphabet(pattern), max_size=8))
    assert matches(expr, text) == both_fullmatch(pattern, text), (pattern, text, expr)


@pytest.mark.parametrize("pattern", CORPUS)
def test_sampled_members_match_both_dialects(pattern: str) -> None:
    expr = parse_regex(pattern)
    rng = random.Random(pattern)
    for _ in range(50):
        text = sample(expr, rng)
        assert both_fullmatch(pattern, text), (pattern, text)
        assert matches(expr, text)


# search=True (JSON Schema ``pattern``): Python's ``re.search`` and ECMA-262's (whose ``$`` is only
# the end of the text, never before a final newline) must both find a match.
SEARCH_CORPUS = ["a", "^a", "a$", "^ab$", "^a|b$", "^(ab)+$", r"\d{2}", "a.b", "", r"^\D$", r"\s"]


@pytest.mark.parametrize("pattern", SEARCH_CORPUS)
@settings(max_examples=150, deadline=None)
@given(text=st.text(alphabet="ab01\n.\r \u0663\u0085", max_size=7))
def test_search_semantics(pattern: str, text: str) -> None:
    expr = parse_regex(pattern, search=True)
    expected = re.search(pattern, text) is not None and ecma_regex(pattern).search(text) is not None
    assert matches(expr, text) == expected, (pattern, text)


# --- IR shape ---------------------------------------------------------------------------------


def test_literal_runs_merge() -> None:
    assert parse_regex("abc") == Literal("abc")
    assert parse_regex(r"a\.b") == Literal("a.b")


def test_counted_repetition_is_not_unrolled() -> None:
    assert parse_regex("x{0,1000}") == Repeat(Literal("x"), 0, 1000)
    assert parse_regex("[0-9]{3,}") == Repeat(chars(("0", "9")), 3, None)


def test_anchors_are_no_ops_under_full_match() -> None:
    assert parse_regex("^abc$") == Literal("abc")
    assert parse_regex("^a|b$") == Alt((Literal("a"), Literal("b")))


def test_search_pads_unanchored_ends_with_any_character() -> None:
    anything = Repeat(Chars(((0, 0x10FFFF),)), 0, None)
    assert parse_regex("a", search=True) == Seq((anything, Literal("a"), anything))
    assert parse_regex("^a", search=True) == Seq((Literal("a"), anything))
    assert parse_regex("^a$", search=True) == Literal("a")


def test_dot_and_space_sets() -> None:
    assert parse_regex(".") == DOT
    assert not DOT.contains(ord("\n")) and DOT.contains(0x10FFFF)
    assert not DOT.contains(ord("\r")) and not DOT.contains(0x2028)  # ECMA-262's line terminators
    assert parse_regex(".", flags="s") == Chars(((0, 0x10FFFF),))
    assert parse_regex(r"\s") == SPACE
    assert SPACE.contains(0x2028) and SPACE.contains(0xA0)
    assert not SPACE.contains(0xFEFF) and not SPACE.contains(0x85)  # ECMA-only, Python-only


def test_class_escapes_fail_closed_between_dialects() -> None:
    assert parse_regex(r"\d") == chars(("0", "9"))
    assert not parse_regex(r"\w").contains(ord("é"))  # Python's \w has it, ECMA's does not
    assert not parse_regex(r"\D").contains(ord("٣"))  # ARABIC-INDIC DIGIT THREE is Python's \d
    assert not parse_regex(r"[^\d]").contains(ord("٣"))
    assert parse_regex(r"[\s\S]") == Chars(((0, 0x10FFFF),))  # every character in both


def test_unicode_escapes() -> None:
    assert parse_regex(r"\u{1F600}") == Literal("\U0001F600")
    assert parse_regex(r"\ud83d\ude00") == Literal("\U0001F600")
    assert parse_regex(r"[\ud83d\ude00-\ud83d\ude4f]") == Chars(((0x1F600, 0x1F64F),))
    assert parse_regex("é+") == Repeat(Literal("é"), 1, None)


def test_case_insensitive_flag_folds_characters() -> None:
    # KELVIN SIGN folds to 'k' in Python's re, not in ECMA-262 (no u flag): both must match
    assert parse_regex("(?i:k)") == chars("kK")
    assert parse_regex("[^a]", flags="i").contains(ord("A")) is False
    assert parse_regex("[^k]", flags="i").contains(0x212A) is False  # Python excludes it
    assert parse_regex(r"(?i:\W)").contains(ord("k")) is False  # class escapes are not folded
    assert parse_regex("(?i:a(?-i:b))") == Seq((chars("aA"), Literal("b")))


def test_ecma_named_groups_are_plain_groups() -> None:
    assert parse_regex("(?<year>[0-9]{4})-(?P<mm>..)") == parse_regex("([0-9]{4})-(..)")


def test_refs_never_appear() -> None:
    def walk(e: Expr) -> None:
        assert not isinstance(e, Ref)
        for child in getattr(e, "items", ()):
            walk(child)

    walk(parse_regex("(a|b(c)*)+", search=True))


# --- errors -----------------------------------------------------------------------------------

SYNTAX_ERRORS = [
    ("a)", 1, "unbalanced"),
    ("(ab", 0, "unterminated group"),
    ("[ab", 0, "unterminated character class"),
    ("a**", 2, "multiple repeat"),
    ("a{2}{3}", 4, "multiple repeat"),
    ("*a", 0, "nothing to repeat"),
    ("a|+", 2, "nothing to repeat"),
    ("{2}", 0, "nothing to repeat"),
    ("^*", 1, "nothing to repeat"),
    ("a{3,2}", 1, "min repeat greater than max"),
    (r"\x4", 0, "hex digits"),
    (r"\u12", 0, "hex digits"),
    (r"\u{110000}", 0, "beyond"),
    ("ab\\", 2, "backslash"),
    ("[z-a]", 1, "bad character range"),
    ("(?P<1>a)", 4, "bad group name"),
    ("(?P<n>a)(?P<n>b)", 12, "redefinition"),
    ("(?)", 0, "unknown group extension"),
    (r"\ud800", 0, "surrogate"),
]


@pytest.mark.parametrize(("pattern", "offset", "message"), SYNTAX_ERRORS)
def test_syntax_errors_point_at_the_offset(pattern: str, offset: int, message: str) -> None:
    with pytest.raises(GrammarSyntaxError) as info:
        parse_regex(pattern)
    err = info.value
    assert err.position.offset == offset
    assert err.line == 1 and err.column == offset + 1
    assert message in err.message


def test_syntax_error_context_has_a_caret() -> None:
    with pytest.raises(GrammarSyntaxError) as info:
        parse_regex("abc(de")
    assert info.value.context() == "abc(de\n   ^"
    assert "<regex>:1:4" in str(info.value)


UNSUPPORTED = [
    (r"(a)\1", 3, "backreference"),
    (r"(?P<x>a)(?P=x)", 8, "backreference"),
    (r"\k<x>", 0, "backreference"),
    ("a(?=b)", 1, "lookahead"),
    ("a(?!b)", 1, "negative lookahead"),
    ("(?<=a)b", 0, "lookbehind"),
    ("(?<!a)b", 0, "negative lookbehind"),
    (r"\bfoo", 0, "word boundary"),
    (r"a\B", 1, "word boundary"),
    (r"\Aa", 0, "anchor"),
    ("a^b", 1, "anchor '^' in the middle"),
    ("a$b", 1, "anchor '$' in the middle"),
    ("(^a)", 1, "anchor '^' inside a group"),
    ("(?i)abc", 0, "global inline flags"),
    ("(?m:a)", 0, "inline flag 'm'"),
    ("a*+", 2, "possessive"),
    ("a{1,2}+", 6, "possessive"),
    ("(?>a)", 0, "atomic"),
    ("(?#c)", 0, "comment"),
    ("(?(1)a|b)", 0, "conditional"),
    ("[]a]", 0, "']' first"),
    ("[^]a]", 0, "']' first"),
    ("a{,3}", 1, "{,n}"),
    (r"\e", 0, "escape \\e"),
    (r"[\d-z]", 1, "range endpoint"),
    (r"\p{L}", 0, "property"),
    (r"\01", 0, "octal"),
    (r"[\1]", 1, "octal"),
    (r"\cA", 0, "control"),
]


@pytest.mark.parametrize(("pattern", "offset", "construct"), UNSUPPORTED)
def test_unsupported_constructs_fail_closed(pattern: str, offset: int, construct: str) -> None:
    with pytest.raises(UnsupportedGrammarError) as info:
        parse_regex(pattern)
    err = info.value
    assert not isinstance(err, GrammarSyntaxError)
    assert construct in str(err)
    assert err.offset == offset  # type: ignore[attr-defined]
    assert f"(offset {offset})" in str(err)


def test_unsupported_flag_argument() -> None:
    with pytest.raises(UnsupportedGrammarError, match="'m'"):
        parse_regex("a", flags="m")


_RANGES = st.lists(st.tuples(st.integers(0, 300), st.integers(0, 40)).map(lambda p: (p[0], p[0] + p[1])), max_size=8)


@settings(max_examples=200, deadline=None)
@given(a=_RANGES, b=_RANGES)
def test_class_intersection_is_the_set_intersection(a, b):
    def members(ranges):
        return {c for lo, hi in ranges for c in range(lo, hi + 1)}

    x, y = Chars(tuple(a)), Chars(tuple(b))
    got = x.intersection(y)
    assert members(got.ranges) == members(x.ranges) & members(y.ranges)
