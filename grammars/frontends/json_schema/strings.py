"""JSON string tokens as IR: escapes, values, value exclusion, character-counted lengths.

Two alphabets meet here. A *value* is a sequence of Unicode scalar values (what ``json.loads``
returns and what ``minLength``, ``pattern`` and ``enum`` talk about); a *body* is the text
between the quotes of a JSON string token, where every value character is written either
literally or as an escape. ``encode_value_language`` maps an IR over value characters to the IR
of every body that decodes to a value of that language, so constraints stated on values
(``pattern``, ``const``, ``enum``, key exclusion) accept every encoding of their values.

Encodings of one value character ``c`` (RFC 8259 section 7):

* ``c`` itself, unless it is ``"``, ``\\`` or a control character U+0000-U+001F;
* a two-character escape: ``\\"`` ``\\\\`` ``\\/`` ``\\b`` ``\\f`` ``\\n`` ``\\r`` ``\\t``;
* ``\\u`` and four hex digits in either case, for ``c`` in the BMP;
* ``\\uD8xx\\uDCxx``, a surrogate pair (either case), for ``c`` above U+FFFF: one character.

Exception, to bound automaton size: a character class with more than ``MAX_ESCAPED_RANGES``
ranges beyond ASCII (say a Unicode letter class spelled out in a pattern) accepts its non-ASCII
characters literally only, not as ``\\u`` escapes — a subset, and exactly what
``json.dumps(..., ensure_ascii=False)`` writes.

Lone surrogates are never produced nor accepted: ``\\uD800`` not followed by a low-surrogate
escape, or a low surrogate on its own. Python's ``json`` would decode them to a one-character
string, but they are not Unicode scalar values (RFC 8259 calls the result unpredictable, I-JSON
forbids them), the IR cannot represent them, and rejecting them only narrows what is accepted.
Lengths therefore count scalar values, with a surrogate-pair escape as one character, as
``len(json.loads(token))`` does.

Length bounds count characters: the minimal DFA of ``Repeat(STRING_CHAR, min, max)``, built
directly and embedded (``length_bounded_body``). Its byte DFA needs ``STATES_PER_CHARACTER`` (20) states per counted character, so bounds are limited
to ``MAX_LENGTH_STATES`` states (``max_counted_length()`` = 500 characters for unrestricted
strings). ``restrict_length`` intersects any body automaton with a length bound through an
implicit character counter and only pays for the states that are reachable.
"""

from __future__ import annotations

import hashlib
import typing
from dataclasses import dataclass
from functools import lru_cache
from typing import TYPE_CHECKING, Collection, Iterable

import numpy as np
from numba import njit

from grammars.automata.byte_dfa import (
    DEAD,
    ByteDFA,
    compile_graph,
    compile_regular,
    shared_regular,
    difference,
    from_transitions,
    minimize,
)
from grammars.automata.frames import Frame, run_frames
from grammars.errors import LimitExceeded, UnsupportedGrammarError
from grammars.ir import (
    EMPTY,
    MAX_CODE_POINT,
    NOTHING,
    Alt,
    Chars,
    Expr,
    Literal,
    Ref,
    Repeat,
    Seq,
    alt,
    chars,
    repeat,
    seq,
)
from grammars.limits import Limits
from grammars.memo import shared_automata

from .numbers import fixed_width_range

if TYPE_CHECKING:
    from grammars.automata.codepoint import CodePointDFA

__all__ = [
    "Escapes",
    "QUOTE",
    "ANY_CHAR",
    "UNESCAPED",
    "STRING_CHAR",
    "STRING_BODY",
    "STRING_TOKEN",
    "MAX_LENGTH_STATES",
    "MAX_ESCAPED_RANGES",
    "STATES_PER_CHARACTER",
    "hex4_range",
    "encode_chars",
    "encode_value_language",
    "json_string_value",
    "json_string_values",
    "string_not_in",
    "value_not_in",
    "length_bounded_body",
    "max_counted_length",
    "restrict_length",
    "LengthBudgetExceeded",
    "string_token",
]

#: which encodings of a character ``encode_chars`` produces
Escapes = typing.Literal["all", "minimal"]

QUOTE = Literal('"')
_BACKSLASH = Literal("\\")
#: every Unicode scalar value (``Chars`` drops the surrogate block)
ANY_CHAR = Chars(((0, MAX_CODE_POINT),))
#: characters a JSON string may contain literally
UNESCAPED = Chars(((0x20, 0x21), (0x23, 0x5B), (0x5D, MAX_CODE_POINT)))
#: value character -> letter of its two-character escape
_SHORT_ESCAPES = {'"': '"', "\\": "\\", "/": "/", "\b": "b", "\f": "f", "\n": "n", "\r": "r", "\t": "t"}

#: byte-DFA states per character position of a string value (``json_string_values``' estimate)
STATES_PER_VALUE_CHARACTER = 5
#: a bound on the byte-DFA states one length-bounded string may need
MAX_LENGTH_STATES = 10_000
#: byte-DFA states per counted character of an unrestricted string (measured: UTF-8 lead and
#: continuation states, ``\\`` / ``\\u`` / hex-digit states, and the surrogate-pair tail)
STATES_PER_CHARACTER = 20


def _hex_digit(lo: int, hi: int) -> Expr:
    """One hex digit with value in ``[lo, hi]``; letters in either case."""
    ranges: list[tuple[int, int]] = []
    if lo <= 9:
        ranges.append((ord("0") + lo, ord("0") + min(hi, 9)))
    if hi >= 10:
        a, b = max(lo, 10) - 10, hi - 10
        ranges.append((ord("a") + a, ord("a") + b))
        ranges.append((ord("A") + a, ord("A") + b))
    return Chars(tuple(ranges))


def hex4_range(lo: int, hi: int) -> Expr:
    """Four hex digits (either case) whose value lies in ``[lo, hi]``."""
    return fixed_width_range(lo, hi, 4, base=16, digit=_hex_digit)


def _u_escape(lo: int, hi: int) -> Expr:
    return seq([Literal("\\u"), hex4_range(lo, hi)])


@lru_cache(maxsize=4096)
def encode_chars(cs: Chars, escapes: Escapes = "all") -> Expr:
    """Every encoding, inside a JSON string body, of one character from ``cs``.

    Memoised (a pure function of a character class; ``\\d``, ``[a-z]`` and ``.`` recur in
    every format and pattern): a class's ``\\u`` forms are a hex-digit trie per range.

    ``escapes="all"``: every encoding RFC 8259 allows. ``escapes="minimal"``: printable ASCII
    only as itself (``"`` and ``\\`` only as ``\\"`` and ``\\\\``), control characters only
    escaped, other characters as themselves or ``\\u`` escapes — every text ``json.dumps``
    writes, with ``ensure_ascii`` on or off, and far fewer DFA states for ASCII languages.
    """
    if escapes not in ("all", "minimal"):
        raise ValueError(f"escapes must be 'all' or 'minimal', got {escapes!r}")
    if len(cs.ranges) == 1 and cs.ranges[0][0] == cs.ranges[0][1]:
        return _encode_one(cs.ranges[0][0], escapes)
    parts: list[Expr] = []
    literal = cs.intersection(UNESCAPED)
    if not literal.is_empty:
        parts.append(literal)
    short = "".join(
        esc for ch, esc in _SHORT_ESCAPES.items() if cs.contains(ord(ch)) and (escapes == "all" or ch != "/")
    )
    if short:
        parts.append(seq([_BACKSLASH, chars(short)]))
    u_ranges = cs if escapes == "all" else cs.intersection(_NEEDS_U_IN_MINIMAL)
    if sum(1 for lo, hi in u_ranges.ranges if hi > 0x7F) > MAX_ESCAPED_RANGES:
        # a large Unicode class: its ``\\u`` forms would need a hex-digit trie per range
        # (tens of thousands of DFA states under a repetition); keep them for ASCII only
        u_ranges = u_ranges.intersection(_ASCII)
    bmp = [(lo, min(hi, 0xFFFF)) for lo, hi in u_ranges.ranges if lo <= 0xFFFF]
    if bmp:
        parts.append(seq([Literal("\\u"), alt(hex4_range(lo, hi) for lo, hi in bmp)]))
    for lo, hi in u_ranges.ranges:
        if hi < 0x10000:
            continue
        a, b = max(lo, 0x10000) - 0x10000, hi - 0x10000
        (ha, la), (hb, lb) = divmod(a, 0x400), divmod(b, 0x400)
        spans = [(ha, ha, la, lb)] if ha == hb else [(ha, ha, la, 0x3FF), (ha + 1, hb - 1, 0, 0x3FF), (hb, hb, 0, lb)]
        for h1, h2, l1, l2 in spans:
            if h1 <= h2:
                parts.append(seq([_u_escape(0xD800 + h1, 0xD800 + h2), _u_escape(0xDC00 + l1, 0xDC00 + l2)]))
    return alt(parts)


_ASCII = Chars(((0, 0x7F),))
#: a class with more ranges than this beyond ASCII accepts its non-ASCII characters literally only
MAX_ESCAPED_RANGES = 32
#: with ``escapes="minimal"``, the characters that keep their ``\\u`` forms: controls without a
#: short escape, and everything beyond ASCII
_NEEDS_U_IN_MINIMAL = Chars(((0x00, 0x07), (0x0B, 0x0B), (0x0E, 0x1F), (0x7F, MAX_CODE_POINT)))


def _hex_exact(value: int) -> list[Expr]:
    """Four hex digits spelling ``value``, letters in either case."""
    out: list[Expr] = []
    for shift in (12, 8, 4, 0):
        d = (value >> shift) & 0xF
        out.append(Literal(str(d)) if d < 10 else chars("abcdef"[d - 10] + "ABCDEF"[d - 10]))
    return out


@lru_cache(maxsize=4096)
def _encode_one(cp: int, escapes: Escapes) -> Expr:
    """``encode_chars`` for a single code point (the hot path of keys and ``const``).

    Memoised (a pure function of two small values): every occurrence of a character is then
    one object, which hashing, equality and the automaton builder's snapshots meet by identity.
    """
    if 0xD800 <= cp <= 0xDFFF:
        return NOTHING
    c = chr(cp)
    parts: list[Expr] = []
    if UNESCAPED.contains(cp):
        parts.append(Literal(c))
    short = _SHORT_ESCAPES.get(c)
    if short is not None and (escapes == "all" or c != "/"):
        parts.append(Literal("\\" + short))
    if escapes == "all" or _NEEDS_U_IN_MINIMAL.contains(cp):
        if cp <= 0xFFFF:
            parts.append(seq([Literal("\\u")] + _hex_exact(cp)))
        else:
            hi, lo = 0xD800 + ((cp - 0x10000) >> 10), 0xDC00 + ((cp - 0x10000) & 0x3FF)
            parts.append(seq([Literal("\\u")] + _hex_exact(hi) + [Literal("\\u")] + _hex_exact(lo)))
    return alt(parts)


#: one value character in any encoding
STRING_CHAR: Expr = encode_chars(ANY_CHAR)
#: any string body
STRING_BODY: Expr = repeat(STRING_CHAR, 0, None)
#: any JSON string token, quotes included
STRING_TOKEN: Expr = seq([QUOTE, STRING_BODY, QUOTE])
_STRING_TOKEN_DFA = compile_regular(STRING_TOKEN)


def encode_value_language(expr: Expr, escapes: Escapes = "all") -> Expr:
    """Map an IR over value characters to the IR of the JSON string bodies encoding its values.

    Each ``Chars`` set (and each character of a ``Literal``) becomes ``encode_chars``; the
    structure is kept, so repetition bounds still count characters. Raises
    ``UnsupportedGrammarError`` for ``Ref`` (value languages are regular) and ``TypeError`` for a
    pre-compiled ``ByteDFA`` (its bytes cannot be read back as characters). ``escapes`` is
    passed to ``encode_chars``.
    """
    memo: dict[Expr, Expr] = {}

    def char(cs: Chars) -> Expr:
        out = memo.get(cs)
        if out is None:
            out = memo[cs] = encode_chars(cs, escapes)
        return out

    def go(e: Expr) -> Frame:  # -> Expr; a frame (``run_frames``): patterns may nest deeply
        if isinstance(e, Chars):
            return char(e)
        if isinstance(e, Literal):
            return seq(char(Chars(((ord(c), ord(c)),))) for c in e.text)
        if isinstance(e, Seq):
            parts: list[Expr] = []
            for item in e.items:
                part = yield go(item)
                if isinstance(part, Chars) and part.is_empty:
                    return NOTHING  # as ``seq`` would, without encoding the rest
                parts.append(part)
            return seq(parts)
        if isinstance(e, Alt):
            options: list[Expr] = []
            for item in e.items:
                options.append((yield go(item)))
            return alt(options)
        if isinstance(e, Repeat):
            return repeat((yield go(e.item)), e.min, e.max)
        if isinstance(e, Ref):
            raise UnsupportedGrammarError(f"rule reference {e.name!r} in a string value language")
        raise TypeError(f"cannot encode {type(e).__name__} as a JSON string body")

    return run_frames(go(expr))


def encode_value_automaton(language: CodePointDFA, escapes: Escapes = "all", limits: Limits | None = None) -> ByteDFA:
    """The byte DFA of the JSON string bodies encoding the values a code-point automaton accepts
    (``language``, a ``CodePointDFA``: interval rows, start state 0).

    ``encode_value_language`` for a language held as an automaton (a union of patterns with
    negations, met on code points) rather than as an expression: every range's encodings
    (``encode_chars``) on its arc, the graph compiled at once. Surrogate code points have no
    encoding here, as in ``Chars``.
    """
    limits = limits or Limits()
    arcs = []
    for state, row in enumerate(language.trans):
        by_target: dict[int, list[tuple[int, int]]] = {}
        for lo, hi, target in row:
            by_target.setdefault(target, []).append((lo, hi))
        for target, ranges in by_target.items():
            chars = Chars(tuple(ranges))
            if not chars.is_empty:  # one class per target, its encodings a small DFA built once per process
                arcs.append((state, shared_regular(encode_chars(chars, escapes), limits), target))
    return compile_graph(len(language.trans), arcs, [q for q, yes in enumerate(language.accept) if yes], limits)


def string_token(body: Expr) -> Expr:
    """The JSON string token around a body expression (or body ``ByteDFA``)."""
    return seq([QUOTE, body, QUOTE])


def json_string_value(value: str) -> Expr:
    """Every JSON string token (quotes included) whose value is exactly ``value``.

    A value holding a lone surrogate has no encoding here (see the module docstring): the
    result is ``NOTHING``.
    """
    return json_string_values((value,))


def json_string_values(values: Iterable[str], limits: Limits | None = None) -> Expr:
    """Every JSON string token (quotes included) whose value is one of ``values``, in every
    encoding, as one ``ByteDFA`` (``NOTHING`` when no value has an encoding).

    The language equals ``string_token(encode_value_language(Literal(v)))`` over the values, but
    it is built directly instead of through an NFA: keys and string enums are in nearly every
    schema, and enums may hold tens of thousands of values. First the minimal automaton over
    value characters (``CodePointDFA.of_words``: linear in the total length, prefixes and
    suffixes shared), then each of its character edges spelled out in bytes. The encodings of
    distinct characters are distinct and none is a prefix of another (UTF-8 is prefix-free,
    escapes start with a backslash that no literal character is), so the result is
    deterministic as built and only minimisation remains.

    Work is bounded before it is done: a character position that some value continues from
    costs about ``STATES_PER_VALUE_CHARACTER`` byte states (itself, after ``\\``, after ``\\u``
    and after each of three hex digits; measured 5.2 to 6 on real and random sets), so a value,
    or a character automaton, whose estimate exceeds ``limits.max_dfa_states`` raises
    ``LimitExceeded`` at once, before a byte automaton is allocated; so does a byte automaton of
    more than twice ``max_dfa_states`` states before it is minimised, or more after.
    """
    budget = (limits or Limits()).max_dfa_states
    values = tuple(values)
    # keys and enums recur across schemas; a digest keeps a large enum's key small
    digest = hashlib.sha256("".join(f"{len(v)}:{v}" for v in values).encode("utf-8", "surrogatepass")).digest()
    key = ("json_string_values", digest, budget)
    known = shared_automata().get(key)
    if known is None:
        known = _json_string_values(values, budget)
        shared_automata().put(key, known)
    return known


def _json_string_values(values: tuple[str, ...], budget: int) -> Expr:
    from grammars.automata.codepoint import CodePointDFA

    words = [v for v in values if not any(0xD800 <= ord(ch) <= 0xDFFF for ch in v)]
    if not words:
        return NOTHING
    longest = max(len(w) for w in words)
    if STATES_PER_VALUE_CHARACTER * longest > budget:
        raise LimitExceeded("max_dfa_states", budget, f"a string value of {longest} characters needs about "
                            f"{STATES_PER_VALUE_CHARACTER * longest} DFA states, more than max_dfa_states={budget}")
    chars = CodePointDFA.of_words(words, budget)
    need = sum(STATES_PER_VALUE_CHARACTER if row else 1 for row in chars.trans)
    if need > budget:
        raise LimitExceeded("max_dfa_states", budget, f"these {len(words)} string values need about {need} DFA "
                            f"states, more than max_dfa_states={budget}")
    out = _spelled(chars, 2 * budget)
    if out.n_states > budget:
        raise LimitExceeded("max_dfa_states", budget, f"these {len(words)} string values need {out.n_states} DFA "
                            f"states, more than max_dfa_states={budget}")
    return out  # type: ignore[return-value]  # a ByteDFA inside the IR


def _spelled(chars, max_rows: int) -> ByteDFA:
    """The byte DFA of the string tokens whose values ``chars`` (a ``CodePointDFA`` over value
    characters, acyclic) accepts: an opening quote, each character edge in every encoding (the
    escape paths of one state share their ``\\``, ``\\u`` and hex-digit prefixes), a closing quote."""
    OPEN, CLOSED = 0, 1  # before the opening quote; after the closing one
    first = 2  # state of character state q is first + q
    src: list[int] = [OPEN]
    byte: list[int] = [0x22]
    dst: list[int] = [first]
    count = first + len(chars.trans)
    for q, row in enumerate(chars.trans):
        here = first + q
        if len(row) == 1 and row[0][0] == row[0][1]:  # one character on (every state of a lone key)
            rel_src, rel_byte, rel_dst, fresh = _edge_template(row[0][0])
            ends = (here, first + row[0][2])  # relative states -1 and -2: the edge's source and target
            src += [count + r if r >= 0 else ends[-1 - r] for r in rel_src]
            byte += rel_byte
            dst += [count + r if r >= 0 else ends[-1 - r] for r in rel_dst]
            count += fresh
        else:
            count = _lay_out_row([(cp, first + target) for cp, _, target in row], here, count, src, byte, dst)
        if count > max_rows:
            raise LimitExceeded("max_dfa_states", max_rows // 2, f"the string values need more than {max_rows} "
                                "DFA states before minimisation")
        if chars.accept[q]:
            src.append(here)
            byte.append(0x22)
            dst.append(CLOSED)
    return from_transitions(count, src, byte, dst, [CLOSED])


def _lay_out_row(edges: list[tuple[int, int]], here: int, count: int, src: list[int], byte: list[int],
                 dst: list[int]) -> int:
    """Append the transitions of one state's character edges ``(code point, target)`` in every
    encoding, the escape paths sharing their prefixes (new states numbered from ``count``);
    returns the next free state number."""
    local: dict[tuple[int, bytes], int] = {}  # (state, step) -> the state it leads to, within the escapes
    for cp, target in edges:
        for path in _spellings(cp):
            at = here
            for step in path[:-1]:
                nxt = local.get((at, step))
                if nxt is None:
                    nxt = local[(at, step)] = count
                    count += 1
                    src += [at] * len(step)
                    byte += step
                    dst += [nxt] * len(step)
                at = nxt
            src += [at] * len(path[-1])
            byte += path[-1]
            dst += [target] * len(path[-1])
    return count


@lru_cache(maxsize=4096)
def _edge_template(cp: int) -> tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...], int]:
    """``_lay_out_row`` of one character edge, once per character: (sources, bytes, targets, new
    states), a state written -1 for the edge's source, -2 for its target and 0.. for the escape
    paths' own states."""
    src: list[int] = []
    byte: list[int] = []
    dst: list[int] = []
    fresh = _lay_out_row([(cp, -2)], -1, 0, src, byte, dst)
    return tuple(src), tuple(byte), tuple(dst), fresh


@lru_cache(maxsize=4096)
def _spellings(cp: int) -> tuple[tuple[bytes, ...], ...]:
    """``_encode_one(cp, "all")`` as byte paths for ``json_string_values``' trie: one path per
    encoding, each step the interchangeable bytes at that position (``b"aA"`` for a hex letter)."""
    encoded = _encode_one(cp, "all")
    paths: list[tuple[bytes, ...]] = []
    for spelling in encoded.items if isinstance(encoded, Alt) else (encoded,):
        steps: list[bytes] = []
        for item in spelling.items if isinstance(spelling, Seq) else (spelling,):
            if isinstance(item, Literal):
                steps.extend(bytes((b,)) for b in item.text.encode("utf-8"))
            else:  # a Chars of ASCII hex letters in either case
                steps.append(bytes(c for lo, hi in item.ranges for c in range(lo, hi + 1)))  # type: ignore[union-attr]
        paths.append(tuple(steps))
    return tuple(paths)


def value_not_in(values: Iterable[str]) -> Expr:
    """IR over value characters: every string except those in ``values``.

    Trie complement: at each trie node the value may stop (unless the node ends an excluded
    value), continue along a child, or leave the trie with any other character and then
    continue freely. Children whose sub-languages are equal are merged into one ``Chars``.
    Values holding lone surrogates are skipped: no accepted string can equal them anyway.
    """
    root: dict = {}
    END = ""  # key of the end marker (no character is the empty string)
    for v in set(values):
        if any(0xD800 <= ord(c) <= 0xDFFF for c in v):
            continue
        node = root
        for c in v:
            node = node.setdefault(c, {})
        node[END] = True
    rest = repeat(ANY_CHAR, 0, None)
    # post-order without recursion (values may be long)
    built: dict[int, Expr] = {}
    stack: list[tuple[dict, bool]] = [(root, False)]
    while stack:
        node, ready = stack.pop()
        kids = [(c, n) for c, n in node.items() if c != END]
        if not ready:
            stack.append((node, True))
            stack.extend((n, False) for _, n in kids)
            continue
        groups: dict[Expr, list[int]] = {}
        for c, n in kids:
            groups.setdefault(built.pop(id(n)), []).append(ord(c))
        parts: list[Expr] = [] if END in node else [EMPTY]
        for sub, cps in groups.items():
            parts.append(seq([Chars(tuple((cp, cp) for cp in cps)), sub]))
        others = Chars(tuple((ord(c), ord(c)) for c, _ in kids)).complement()
        parts.append(seq([others, rest]))
        built[id(node)] = alt(parts)
    return built[id(root)]


def string_not_in(values: Collection[str]) -> Expr:
    """Every JSON string token whose *value* is not in ``values``, in every encoding.

    ``"\\u0061"`` decodes to ``"a"``, so it is excluded together with ``"a"``. Built as the
    DFA difference "any string token minus the tokens of ``values``" and embedded in the IR as a
    ``ByteDFA``: its size is the encodings' trie plus a string token, where the complement
    written as an expression (``value_not_in``) determinises to their product.
    """
    names = sorted({v for v in values if not any(0xD800 <= ord(c) <= 0xDFFF for c in v)})
    if not names:
        return _STRING_TOKEN_DFA  # type: ignore[return-value]  # a ByteDFA inside the IR
    # an object's names recur across the schemas a server or benchmark compiles (shared
    # definitions, API families); the difference is a product and a minimisation, ~1 ms
    digest = hashlib.sha256("".join(f"{len(v)}:{v}" for v in names).encode("utf-8")).digest()
    key = ("string_not_in", digest)
    out = shared_automata().get(key)
    if out is None:
        out = difference(_STRING_TOKEN_DFA, json_string_values(names))  # type: ignore[arg-type]
        shared_automata().put(key, out)
    return NOTHING if out.is_empty_language else out  # type: ignore[return-value]  # a ByteDFA inside the IR


# ------------------------------------------------------------------------------------------
# lengths


def _char_steps() -> tuple[np.ndarray, np.ndarray]:
    """(next state, completes-a-character) tables of the DFA of ``STRING_CHAR*``.

    ``STRING_CHAR`` is prefix-free (no encoding of a character extends another), so its minimal
    DFA has one final state without exits; folding that state into the start gives the
    character-boundary automaton.
    """
    one = compile_regular(STRING_CHAR)
    finals = np.nonzero(one.accepting)[0]
    if len(finals) != 1 or (one.table[finals[0]] >= 0).any():
        raise AssertionError("STRING_CHAR must be prefix-free with one final state")
    step = one.table.astype(np.int64)
    done = step == int(finals[0])
    step[done] = one.start
    step.setflags(write=False)
    done.setflags(write=False)
    return step, done


_CHAR_STEP, _CHAR_DONE = _char_steps()
_CHAR_DONE_INT = _CHAR_DONE.astype(np.int64)  # the count's increment, for ``_length_product``


def max_counted_length(states_per_character: int = STATES_PER_CHARACTER) -> int:
    """The largest length bound whose automaton stays within ``MAX_LENGTH_STATES``."""
    return MAX_LENGTH_STATES // max(1, states_per_character)


def length_bounded_body(min_length: int, max_length: int | None) -> Expr:
    """Bodies of ``min_length..max_length`` characters (``None``: unbounded), any characters.

    The minimal DFA is built directly (layers of the character automaton, no subset
    construction or minimisation), once per bound and process, and embedded as a ``ByteDFA``:
    the compiler lowers it several times faster than the repetition, which every schema with a
    string field would otherwise compile again. Raises ``LimitExceeded`` when the automaton
    would exceed ``MAX_LENGTH_STATES`` states.
    """
    if max_length is not None and max_length < min_length:
        return NOTHING
    counted = max_length if max_length is not None else min_length
    need = (counted + 1) * STATES_PER_CHARACTER
    if need > MAX_LENGTH_STATES:
        raise LimitExceeded(
            "max_length_states",
            MAX_LENGTH_STATES,
            f"a string length bound of {counted} characters needs about {need} byte-DFA states "
            f"(more than MAX_LENGTH_STATES={MAX_LENGTH_STATES})",
        )
    return _length_dfa(min_length, max_length)  # type: ignore[return-value]  # a ByteDFA inside the IR


@lru_cache(maxsize=64)
def _length_dfa(min_length: int, max_length: int | None) -> ByteDFA:
    """The minimal DFA of ``STRING_CHAR{min,max}``, built layer by layer and numbered canonically.

    Memoised per process: every string field with these bounds embeds this one automaton.

    State ``(k, t)``: ``k`` characters complete (saturating at ``min_length`` when unbounded),
    phase ``t`` inside the current character. Layers are distinguished by how many more
    characters may or must follow and phases by how the current character can end, so the
    construction is already minimal; the last layer of a bounded length keeps only phase 0.
    """
    step, done = _CHAR_STEP, _CHAR_DONE
    phases = [t for t in range(step.shape[0]) if (step[t] >= 0).any()]
    n_p = len(phases)
    local = np.full(step.shape[0] + 1, -1, dtype=np.int64)  # local[-1] == -1 for dead targets
    local[phases] = np.arange(n_p)
    pstep = local[step[phases]]  # [n_p, 256] next phase or -1
    pdone = done[phases].astype(np.int64)
    cap = max_length if max_length is not None else min_length
    layers = cap + 1
    k = np.repeat(np.arange(layers, dtype=np.int64), n_p)[:, None]
    nk = k + np.tile(pdone, (layers, 1))
    nxt = np.tile(pstep, (layers, 1))
    if max_length is None:
        # saturate at ``cap``; a character begun at the top layer is the same state as one
        # begun a layer lower (both end at the top), so it lives there
        nk = np.minimum(nk, cap)
        if cap > 0:
            nk = np.where((nk == cap) & (nxt > 0), cap - 1, nk)
    raw = np.where((nxt < 0) | (nk > cap), -1, nk * n_p + nxt)
    # the last layer of a bounded length: only phase 0 can still complete
    if max_length is not None:
        last = cap * n_p
        raw[last + 1 :] = -1
        raw[raw > last] = -1
    accepting = (np.arange(layers * n_p) % n_p == 0) & (np.arange(layers * n_p) // n_p >= min_length)
    return _canonical(raw, accepting, 0)


def _canonical(raw: np.ndarray, accepting: np.ndarray, start: int) -> ByteDFA:
    """Renumber a trimmed, minimal table in BFS order over bytes 0..255 (``ByteDFA``'s canon)."""
    idx, new = _bfs_order(np.ascontiguousarray(raw, dtype=np.int64), int(start))
    table = new[raw[idx]].astype(np.int32)
    return ByteDFA(table, accepting[idx], 0)


@njit(cache=True, nogil=True)
def _bfs_order(raw: np.ndarray, start: int) -> tuple[np.ndarray, np.ndarray]:  # pragma: no cover - jitted
    """States in BFS order from ``start`` (targets of a state in order of their first byte), and
    each state's new number (``new[-1] == -1`` for dead targets)."""
    n = raw.shape[0]
    new = np.full(n + 1, -1, dtype=np.int64)
    order = np.empty(n, dtype=np.int64)
    order[0] = start
    new[start] = 0
    size = 1
    i = 0
    while i < size:
        q = order[i]
        i += 1
        for b in range(raw.shape[1]):
            t = raw[q, b]
            if t >= 0 and new[t] < 0:
                new[t] = size
                order[size] = t
                size += 1
    return order[:size].copy(), new


class LengthBudgetExceeded(LimitExceeded):
    """``restrict_length`` ran out of states; ``reached`` is the character count it was building,
    so every length bound below ``reached`` fits."""

    def __init__(self, budget: int, reached: int, message: str):
        self.reached = reached
        super().__init__("max_length_states", budget, message)


def load_kernels() -> None:
    """Call this module's compiled kernels once, with the argument types compiles pass them
    (numba loads their machine code on a first call, ~0.1 s each, or compiles it where the
    kernel cache is empty or stale, seconds): setup time, not the first schema's that bounds a
    string's length. ``Compiler.compile_json_schema`` calls it once per process."""
    body = length_bounded_body(0, None)  # read-only int32 table, as every ByteDFA's
    _restrict_length(body, 0, 1, MAX_LENGTH_STATES)  # _length_product
    _canonical(np.full((1, 256), -1, dtype=np.int64), np.ones(1, dtype=bool), 0)  # _bfs_order


def restrict_length(body: ByteDFA, min_length: int, max_length: int | None, limits: Limits = Limits()) -> ByteDFA:
    """The bodies of ``body`` that have ``min_length..max_length`` characters (``None``: unbounded).

    ``body`` must be a language of string bodies (as ``encode_value_language`` builds). The
    product runs ``body`` alongside a character-boundary automaton and a counter that saturates
    at ``min_length`` when there is no maximum; only reachable triples are built, so a pattern
    that already bounds its length costs nothing extra. Raises ``LimitExceeded`` beyond
    ``min(limits.max_dfa_states, MAX_LENGTH_STATES)`` states.
    """
    if body.is_empty_language:
        return body
    if max_length is not None and max_length < min_length:
        return minimize(ByteDFA(np.zeros((0, 256), dtype=np.int32), np.zeros(0, dtype=bool), DEAD))
    budget = min(limits.max_dfa_states, MAX_LENGTH_STATES)
    key = ("restrict_length", body.key, min_length, max_length, budget)
    known = shared_automata().get(key)
    if known is None:
        try:
            known = _restrict_length(body, min_length, max_length, budget)
        except LengthBudgetExceeded as exc:  # callers retry with other bounds: remember the miss too
            known = _Overflow(exc.reached, str(exc))  # not the exception: its traceback holds frames
        shared_automata().put(key, known)
    if isinstance(known, _Overflow):
        raise LengthBudgetExceeded(budget, known.reached, known.message)
    return known


@dataclass(frozen=True)
class _Overflow:
    """A remembered ``LengthBudgetExceeded``: the layer it reached and its message."""

    reached: int
    message: str


def _restrict_length(body: ByteDFA, min_length: int, max_length: int | None, budget: int) -> ByteDFA:
    cap = max_length if max_length is not None else min_length
    table, q, t, k, reached = _length_product(
        np.ascontiguousarray(body.table, dtype=np.int32), int(body.start), _CHAR_STEP, _CHAR_DONE_INT,
        cap, max_length is not None, budget)
    if reached >= 0:
        raise LengthBudgetExceeded(
            budget,
            reached,
            f"restricting a string language to {min_length}..{max_length} characters "
            f"needs more than {budget} DFA states",
        )
    accepting = body.accepting[q] & (t == 0) & (k >= min_length)
    return minimize(ByteDFA(table, accepting, 0))


@njit(cache=True, nogil=True)
def _length_product(
    body: np.ndarray, start: int, step: np.ndarray, done: np.ndarray, cap: int, bounded: bool, budget: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, int]:
    """The reachable part of body x character phase x count, as (table, q, t, k, -1).

    Built count layer by count layer: a byte keeps the count or adds one, so two dense
    (body state, phase) -> id maps, the current layer's and the next's, index every triple
    without a hash table. Out of budget, returns ``reached`` >= 0 instead of -1: the layer being
    built, so every length below it fits.
    """
    n_t = step.shape[0]
    width = body.shape[0] * n_t
    here = np.full(width, -1, dtype=np.int32)
    above = np.full(width, -1, dtype=np.int32)
    qs = [start]
    ts = [0]
    ks = [0]
    rows = np.empty((64, 256), dtype=np.int32)
    here[start * n_t] = 0
    layer = [0]
    k = 0
    while len(layer) > 0:
        upper = [0]
        upper.pop()
        i = 0
        while i < len(layer):
            s = layer[i]
            i += 1
            if s >= rows.shape[0]:
                grown = np.empty((2 * rows.shape[0], 256), dtype=np.int32)
                grown[: rows.shape[0]] = rows
                rows = grown
            q = qs[s]
            t = ts[s]
            for b in range(256):
                nq = body[q, b]
                nt = step[t, b]
                if nq < 0 or nt < 0:
                    rows[s, b] = -1
                    continue
                nk = k + done[t, b]
                if nk > cap:
                    if bounded:
                        rows[s, b] = -1
                        continue
                    nk = cap
                slot = nq * n_t + nt
                index = here if nk == k else above
                d = index[slot]
                if d < 0:
                    d = len(qs)
                    if d >= budget:
                        return rows[:0], np.empty(0, np.int64), np.empty(0, np.int64), np.empty(0, np.int64), k
                    index[slot] = d
                    qs.append(nq)
                    ts.append(nt)
                    ks.append(nk)
                    if nk == k:
                        layer.append(d)
                    else:
                        upper.append(d)
                rows[s, b] = d
        for s in layer:
            here[qs[s] * n_t + ts[s]] = -1
        here, above = above, here
        layer = upper
        k += 1
    n = len(qs)
    return rows[:n].copy(), np.asarray(qs, dtype=np.int64), np.asarray(ts, dtype=np.int64), np.asarray(ks, dtype=np.int64), -1
