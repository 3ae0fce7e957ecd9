"""Soundness of the regex front end between its two dialects: whatever we accept, Python's ``re``
(what validators run) AND ECMA-262 (what JSON Schema specifies) must both accept.

The oracles are independent of the front end: Python's dialect is ``re`` itself; ECMA-262 is
emulated by rewriting the pattern for ``re`` (``re.ASCII`` gives ECMA's ``\\d``/``\\w``; ``\\s``,
``.`` and ``$`` are spelled out) and, for the ``i`` flag, by ECMA-262's ``Canonicalize`` written
out from the spec. This module imports nothing but ``parse_regex`` and ``compile_regular`` from
the library, so it also runs (and fails) against a front end that gets the dialects wrong.
"""

from __future__ import annotations

import functools
import random
import re
import sys
from array import array

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from grammars.automata.byte_dfa import compile_regular
from grammars.frontends import parse_regex
from grammars.ir import Alt, Chars, Expr, Literal, Repeat, Seq

# --- oracles --------------------------------------------------------------------------------

#: ECMA-262 WhiteSpace + LineTerminator, as the contents of a Python class
ECMA_SPACE = "\\t\\n\\x0b\\x0c\\r \\xa0\\u1680\\u2000-\\u200a\\u2028\\u2029\\u202f\\u205f\\u3000\\ufeff"
#: ECMA-262's ``.`` without the ``s`` flag
ECMA_DOT = "[^\\n\\r\\u2028\\u2029]"


def _ecma_class(pattern: str, start: int) -> tuple[str, int]:
    """The class at ``pattern[start] == '['`` rewritten for ``re.ASCII``; returns (text, end)."""
    i = start + 1
    negated = pattern.startswith("^", i)
    i += negated
    rest: list[str] = []
    has_big_s = False
    while pattern[i] != "]":
        if pattern[i] == "\\":
            esc = pattern[i : i + 2]
            i += 2
            if esc == "\\s":
                rest.append(ECMA_SPACE)
            elif esc == "\\S":
                has_big_s = True
            else:
                rest.append(esc)
        else:
            rest.append(pattern[i])
            i += 1
    body = "".join(rest)
    if body.startswith("^"):
        body = "\\" + body
    if not has_big_s:
        text = f"[^{body}]" if negated else f"[{body}]"
    elif negated:  # not (non-space or body): a space that is not in body
        text = f"(?:(?![{body}])[{ECMA_SPACE}])" if body else f"[{ECMA_SPACE}]"
    else:
        text = f"(?:[^{ECMA_SPACE}]|[{body}])" if body else f"[^{ECMA_SPACE}]"
    return text, i + 1


@functools.lru_cache(maxsize=None)
def ecma_regex(pattern: str) -> re.Pattern[str]:
    """``pattern`` (our subset; ``(?i:...)`` only in ASCII patterns) with ECMA-262's meaning, compiled
    for Python's ``re``: ASCII ``\\d``/``\\w`` (``re.ASCII``), ECMA's ``\\s``, ``.`` excluding every
    line terminator unless ``s`` is on, and ``$`` only at the very end (``\\Z``)."""
    out: list[str] = []
    dotall = [False]
    i = 0
    while i < len(pattern):
        ch = pattern[i]
        if ch == "\\":
            esc = pattern[i : i + 2]
            i += 2
            out.append({"\\s": f"[{ECMA_SPACE}]", "\\S": f"[^{ECMA_SPACE}]"}.get(esc, esc))
            continue
        if ch == "[":
            text, i = _ecma_class(pattern, i)
            out.append(text)
            continue
        if ch == "(":
            flags = re.match(r"\(\?([a-z]*)(?:-([a-z]*))?:", pattern[i:])
            if flags:
                on, off = flags.group(1), flags.group(2) or ""
                # re.ASCII folds exactly the ASCII letters, as ECMA's Canonicalize does for them
                assert "i" not in on or pattern.isascii(), "case folding is emulated for ASCII only"
                dotall.append(("s" in on or dotall[-1]) and "s" not in off)
                out.append(flags.group(0))
                i += len(flags.group(0))
                continue
            dotall.append(dotall[-1])
        elif ch == ")":
            dotall.pop()
        out.append({".": "(?s:.)" if dotall[-1] else ECMA_DOT, "$": "\\Z"}.get(ch, ch))
        i += 1
    return re.compile("".join(out), re.ASCII)


def both_accept(pattern: str, text: str, *, search: bool = False) -> tuple[bool, bool]:
    """(Python's ``re`` accepts, ECMA-262 accepts) for ``text``, full match or search."""
    python, ecma = re.compile(pattern), ecma_regex(pattern)
    if search:
        return python.search(text) is not None, ecma.search(text) is not None
    return python.fullmatch(text) is not None, ecma.fullmatch(text) is not None


def ecma_canonicalize(cp: int) -> int:
    """ECMA-262 Canonicalize(rer, ch) with IgnoreCase and neither ``u`` nor ``v``: on UTF-16 code
    units (a supplementary character is a surrogate pair, which has no case); toUppercase must give
    one code unit, and a non-ASCII character never canonicalizes to an ASCII one."""
    if cp > 0xFFFF:
        return cp
    upper = chr(cp).upper()
    if len(upper.encode("utf-16-le")) != 2:
        return cp
    if cp >= 128 and ord(upper) < 128:
        return cp
    return ord(upper)


@functools.lru_cache(maxsize=1)
def everything() -> str:
    codes = array("I", range(0xD800))
    codes.extend(range(0xE000, 0x110000))
    assert codes.itemsize == 4
    return codes.tobytes().decode("utf-32-le" if sys.byteorder == "little" else "utf-32-be")


def to_chars(text: str) -> Chars:
    return Chars(tuple((ord(c), ord(c)) for c in text))


def _code_point(index: int) -> int:
    """The code point at ``index`` of ``everything()`` (which skips the surrogates)."""
    return index if index < 0xD800 else index + 0x800


def accepted_by(regex: re.Pattern[str]) -> Chars:
    """Every single character the one-character ``regex`` fully matches, over all of Unicode."""
    runs = re.compile(f"(?:{regex.pattern})+", regex.flags)
    spans = ((m.start(), m.end() - 1) for m in runs.finditer(everything()))
    return Chars(tuple((_code_point(lo), _code_point(hi)) for lo, hi in spans))


def accepted_by_both(pattern: str) -> Chars:
    """The characters a one-character pattern (no ``i``) matches in both dialects."""
    rejected = accepted_by(re.compile(pattern)).complement().union(accepted_by(ecma_regex(pattern)).complement())
    return rejected.complement()


def overlap(a: Chars, b: Chars) -> list[int]:
    """A few code points in both ``a`` and ``b`` (empty when disjoint)."""
    out: list[int] = []
    j = 0
    for lo, hi in a.ranges:
        while j < len(b.ranges) and b.ranges[j][1] < lo:
            j += 1
        k = j
        while k < len(b.ranges) and b.ranges[k][0] <= hi:
            out.append(max(lo, b.ranges[k][0]))
            if len(out) >= 5:
                return out
            k += 1
    return out


def as_chars(expr: Expr) -> Chars:
    """A one-character IR expression as a set."""
    if isinstance(expr, Literal) and len(expr.text) == 1:
        return to_chars(expr.text)
    assert isinstance(expr, Chars), expr
    return expr


# --- the characters that tell the dialects apart ---------------------------------------------

NASTY = (
    "aZ09_- .é"
    "\u0660\u0663\u0669"  # ARABIC-INDIC DIGITS (Nd: Python \d, not ECMA)
    "\uff10\uff13"  # FULLWIDTH DIGITS (Nd)
    "\U0001d7d8"  # MATHEMATICAL DOUBLE-STRUCK DIGIT ZERO (Nd, beyond the BMP)
    "αΩжЖǅ"  # letters: Python \w, not ECMA
    "\u0301\u0345"  # combining marks (Mn: neither dialect's \w)
    "\u00b2\u2160"  # SUPERSCRIPT TWO, ROMAN NUMERAL ONE: Python \w (numeric), not \d
    "\u00a0\u2028\u2029"  # both dialects' \s
    "\ufeff"  # ECMA \s only
    "\u0085\u001c\u001f"  # Python \s only
    "\n\r\t\x0b"
    "\u212a\u017f"  # KELVIN SIGN, LONG S
)


def sample_member(expr: Expr, rng: random.Random) -> str:
    """A random member of ``expr``'s language, picking dialect-sensitive characters where allowed."""
    if isinstance(expr, Literal):
        return expr.text
    if isinstance(expr, Chars):
        nasty = [c for c in NASTY if expr.contains(ord(c))]
        if nasty and rng.random() < 0.8:
            return rng.choice(nasty)
        lo, hi = rng.choice(expr.ranges)
        return chr(rng.randint(lo, min(hi, lo + 300)))
    if isinstance(expr, Seq):
        return "".join(sample_member(item, rng) for item in expr.items)
    if isinstance(expr, Alt):
        return sample_member(rng.choice(expr.items), rng)
    if isinstance(expr, Repeat):
        top = expr.min + 3 if expr.max is None else min(expr.max, expr.min + 3)
        return "".join(sample_member(expr.item, rng) for _ in range(rng.randint(expr.min, top)))
    raise TypeError(f"unexpected node {expr!r}")


ATOMS = [
    r"\d", r"\D", r"\w", r"\W", r"\s", r"\S", ".",
    r"[^\d]", r"[^\W_]", r"[\s\S]", r"[\d\D]", r"[^\s]", r"[^\S]", r"[a\d]", r"[^a\s]",
    r"[\w-]", r"[^\n]", r"[\S\d]", r"[^\w\s]", r"[\W\d]", r"[^\D]", r"[^\d\s]",
    "a", "é", "\u0663", r"\u0663", "[é٣]", "[^a-z]", r"(?s:.)", r"[0-9]",
]  # fmt: skip
QUANTIFIERS = ["", "", "*", "+", "?", "{1,2}"]


@st.composite
def patterns(draw: st.DrawFn) -> str:
    def branch() -> str:
        items = draw(st.lists(st.tuples(st.sampled_from(ATOMS), st.sampled_from(QUANTIFIERS)), min_size=1, max_size=4))
        return "".join(atom + quantifier for atom, quantifier in items)

    body = "|".join(branch() for _ in range(draw(st.integers(1, 2))))
    return f"(?:{body})" + draw(st.sampled_from(["", "+", "{2}"])) if draw(st.booleans()) else body


# --- soundness: random patterns, members of our language drawn at the dialects' seams ---------


def ir_matches(expr: Expr, text: str) -> bool:
    """Whether the IR accepts ``text`` as a whole (a position-set simulation; no automaton)."""

    def ends(e: Expr, starts: frozenset[int]) -> frozenset[int]:
        if not starts:
            return starts
        if isinstance(e, Literal):
            return frozenset(p + len(e.text) for p in starts if text.startswith(e.text, p))
        if isinstance(e, Chars):
            return frozenset(p + 1 for p in starts if p < len(text) and e.contains(ord(text[p])))
        if isinstance(e, Seq):
            for item in e.items:
                starts = ends(item, starts)
            return starts
        if isinstance(e, Alt):
            return frozenset().union(*(ends(item, starts) for item in e.items))
        assert isinstance(e, Repeat), e
        current = starts
        for _ in range(e.min):
            current = ends(e.item, current)
        reached, frontier, extra = set(current), current, 0
        while frontier and (e.max is None or extra < e.max - e.min):
            frontier = frozenset(ends(e.item, frontier) - reached)
            reached |= frontier
            extra += 1
        return frozenset(reached)

    return len(text) in ends(expr, frozenset({0}))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(pattern=patterns(), seed=st.integers(0, 2**32 - 1), search=st.booleans())
def test_every_accepted_string_is_accepted_by_both_dialects(pattern: str, seed: int, search: bool) -> None:
    expr = parse_regex(pattern, search=search)
    rng = random.Random(seed)
    for _ in range(12):
        text = sample_member(expr, rng)
        assert both_accept(pattern, text, search=search) == (True, True), (pattern, text, search)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(pattern=patterns(), text=st.text(alphabet=NASTY, max_size=6), search=st.booleans())
def test_random_strings_accepted_only_if_both_dialects_accept(pattern: str, text: str, search: bool) -> None:
    ours = ir_matches(parse_regex(pattern, search=search), text)
    python, ecma = both_accept(pattern, text, search=search)
    assert not ours or (python and ecma), (pattern, text, search, python, ecma)


# The byte automaton the engine runs, on a fixed set of patterns (compiling is the slow part).
COMPILED = [
    r"^\D+$", r"\w+@\w+", r"^[^\d\s]*\d{2}$", r"^\S+\s\S+$", r"^.{1,3}$", r"[\s\S]", r"^[^\W_]+$", r"^(\d|\D)$",
]  # fmt: skip


@functools.lru_cache(maxsize=None)
def _compiled(pattern: str):  # type: ignore[no-untyped-def]
    return compile_regular(parse_regex(pattern, search=True))


@pytest.mark.parametrize("pattern", COMPILED)
@settings(max_examples=60, deadline=None)
@given(text=st.text(alphabet=NASTY, max_size=6), seed=st.integers(0, 2**32 - 1))
def test_compiled_automaton_accepts_only_what_both_dialects_accept(pattern: str, text: str, seed: int) -> None:
    dfa = _compiled(pattern)
    member = sample_member(parse_regex(pattern, search=True), random.Random(seed))
    for candidate in (text, member):
        if dfa.matches(candidate.encode()):
            assert both_accept(pattern, candidate, search=True) == (True, True), (pattern, candidate)
    assert dfa.matches(member.encode()), (pattern, member)


# --- one character class at a time, over all of Unicode: exactly what both accept -------------

SINGLE_CLASSES = [
    r"\d", r"\D", r"\w", r"\W", r"\s", r"\S", ".", r"(?s:.)",
    r"[\d]", r"[\D]", r"[^\d]", r"[^\D]", r"[^\W_]", r"[^\W\d]", r"[\s\S]", r"[\d\D]", r"[^\s\S]",
    r"[\w-]", r"[^\w\s]", r"[\W\d]", r"[\S\d]", r"[^\S]", r"[^a\s]", r"[^\d\s]", r"[a-z\s]", r"[^\n]",
]  # fmt: skip


@pytest.mark.parametrize("pattern", SINGLE_CLASSES)
def test_class_is_what_both_dialects_accept(pattern: str) -> None:
    ours = as_chars(parse_regex(pattern))
    assert ours == accepted_by_both(pattern), pattern


def test_ecma_space_list_is_current() -> None:
    """Our ECMA \\s lists Zs as of Unicode 6.3+; the interpreter's Zs must not have grown."""
    import unicodedata

    listed = re.compile(f"[{ECMA_SPACE}]")
    assert all(listed.fullmatch(c) for c in everything() if unicodedata.category(c) == "Zs")


# --- regressions: strings one dialect rejects --------------------------------------------------

REJECTED = [
    (r"^\D+$", "\u0663"),  # Python's \d has ARABIC-INDIC DIGIT THREE, so its \D does not
    (r"^\D+$", "\uff13"),
    (r"^[^\d]+$", "\u0663"),
    (r"^[^\d]+$", "\U0001d7d8"),
    (r"^\w+$", "é"),  # ECMA's \w is ASCII: a deliberate narrowing on the validation side
    (r"^\w+$", "ж"),
    (r"^\d+$", "\u0663"),  # ECMA's \d is ASCII
    (r"^.$", "\r"),  # ECMA's . excludes every line terminator
    (r"^.$", "\u2028"),
    (r"^\s$", "\ufeff"),  # ECMA-only whitespace
    (r"^\s$", "\u0085"),  # Python-only whitespace
    (r"^\S$", "\ufeff"),
    (r"^\S$", "\u001c"),
    (r"^\W$", "\u00b2"),  # numeric, so a Python word character
    (r"^[^\w]$", "ǅ"),
    ("a$", "a\n"),  # Python's $ also matches before a final newline; ECMA's does not
]


@pytest.mark.parametrize(("pattern", "text"), REJECTED)
def test_strings_one_dialect_rejects(pattern: str, text: str) -> None:
    for search in (False, True):
        dfa = compile_regular(parse_regex(pattern, search=search))
        assert not dfa.matches(text.encode()), (pattern, text, search)
    assert False in both_accept(pattern, text, search=True)  # the oracle agrees it is contested


@pytest.mark.parametrize(
    ("pattern", "text"),
    [(r"^\D+$", "abc"), (r"^[\s\S]+$", "\ufeff\u0085\u001c\u0663"), (r"^\S+$", "é٣"), (r"^\W+$", "\u0301-")],
)
def test_strings_both_dialects_accept(pattern: str, text: str) -> None:
    assert both_accept(pattern, text, search=True) == (True, True)
    assert compile_regular(parse_regex(pattern, search=True)).matches(text.encode())


# --- case-insensitive matching ----------------------------------------------------------------


@functools.lru_cache(maxsize=1)
def bmp_canon() -> dict[int, int]:
    return {cp: ecma_canonicalize(cp) for cp in range(0x10000) if not 0xD800 <= cp <= 0xDFFF}


def ecma_folded(members: Chars) -> Chars:
    """What an ECMA-262 ``i`` class with these members matches (no ``u``): same Canonicalize."""
    canon = bmp_canon()
    targets = {canon[cp] for lo, hi in members.ranges for cp in range(lo, min(hi, 0xFFFF) + 1)}
    bmp = Chars(tuple((cp, cp) for cp, c in canon.items() if c in targets))
    return bmp.union(Chars(tuple((max(lo, 0x10000), hi) for lo, hi in members.ranges if hi > 0xFFFF)))


def cased_characters() -> list[str]:
    return [c for c in everything() if c.lower() != c or c.upper() != c or c.casefold() != c]


def test_case_insensitive_literals_are_within_both_dialects() -> None:
    """Every cased character, exhaustively: ``(?i:c)`` matches only what Python and ECMA-262 (with
    or without ``u``) both do."""
    canon = bmp_canon()
    for ch in cased_characters():
        ours = as_chars(parse_regex(f"(?i:{re.escape(ch)})"))
        assert ours.contains(ord(ch))
        python = re.compile(re.escape(ch), re.IGNORECASE)
        for lo, hi in ours.ranges:
            for cp in range(lo, hi + 1):
                assert python.fullmatch(chr(cp)), (ch, chr(cp), "Python")
                same = canon.get(cp, cp) == canon.get(ord(ch), ord(ch))
                assert same, (ch, chr(cp), "ECMA-262")
                # and ECMA-262 with ``u`` (simple case folding: one-character casefold() equal)
                assert cp == ord(ch) or chr(cp).casefold() == ch.casefold() == ch.casefold()[:1], (ch, chr(cp), "u")


def test_case_insensitive_narrowings() -> None:
    assert as_chars(parse_regex("(?i:k)")) == to_chars("kK")  # not KELVIN SIGN (ECMA-262)
    assert as_chars(parse_regex("(?i:s)")) == to_chars("sS")  # not LONG S
    assert as_chars(parse_regex("(?i:i)")) == to_chars("iI")  # not U+0130 / U+0131
    assert as_chars(parse_regex("(?i:σ)")) == to_chars("σςΣ")  # both dialects fold final sigma
    assert parse_regex("(?i:\U00010400)") == Literal("\U00010400")  # ECMA-262 without u: no folding


I_CLASSES = [
    "k", "K", "s", "i", "I", "ı", "İ", "µ", "σ", "ß", "ẞ", "ΐ", "ǅ", "Ω", "Å", "ﬅ", "\u0345", "θ",
    "\U00010400", "\U0001e922", "Ⓐ", "ǰ",
    r"\W", r"k\W", r"a-z\d", r"a-z\d_", r"\w", r"k\d", r"\s", r"\S", r"a-zA-Z", r"\D",
]  # fmt: skip


@pytest.mark.parametrize("negated", [False, True])
@pytest.mark.parametrize("members", I_CLASSES)
def test_case_insensitive_classes_are_within_both_dialects(members: str, negated: bool) -> None:
    """``(?i:[...])`` and ``(?i:[^...])`` over all of Unicode: within Python's set and ECMA-262's."""
    pattern = f"[{'^' if negated else ''}{members}]"
    ours = as_chars(parse_regex(f"(?i:{pattern})"))
    python_rejects = accepted_by(re.compile(pattern, re.IGNORECASE)).complement()
    assert not overlap(ours, python_rejects), (pattern, [hex(c) for c in overlap(ours, python_rejects)])
    # ECMA-262: the class matches c when some member (read the ECMA way) has c's Canonicalize
    ecma_matches = ecma_folded(accepted_by(ecma_regex(f"[{members}]")))
    ecma_rejects = ecma_matches if negated else ecma_matches.complement()
    assert not overlap(ours, ecma_rejects), (pattern, [hex(c) for c in overlap(ours, ecma_rejects)])


def test_case_insensitive_sampled_cased_letters() -> None:
    """A seeded sample of further cased characters, negated (the direction that needs widening)."""
    for ch in random.Random(7).sample(cased_characters(), 25):
        pattern = f"[^{re.escape(ch)}]"
        ours = as_chars(parse_regex(f"(?i:{pattern})"))
        assert not overlap(ours, accepted_by(re.compile(pattern, re.IGNORECASE)).complement()), ch
        assert not overlap(ours, ecma_folded(to_chars(ch))), ch
