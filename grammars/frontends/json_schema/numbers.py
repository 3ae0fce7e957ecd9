"""JSON number texts as IR: exact integer ranges, decimal bounds and ``multipleOf``.

Everything here works on the *text* of a JSON number, ``-?(0|[1-9][0-9]*)(\\.[0-9]+)?([eE][+-]?[0-9]+)?``.
Three families of texts are told apart, because a validator reads them differently:

* integer texts ``-?(0|[1-9][0-9]*)``: Python's ``json`` parses them to ``int``, which compares
  *exactly* with a bound (``int`` vs ``float`` comparison is exact in Python);
* plain decimals ``-?(0|[1-9][0-9]*)\\.[0-9]+`` and
* normalised scientific texts ``-?[1-9](\\.[0-9]+)?[eE][+-]?[0-9]+`` (what ``json.dumps`` writes for
  large and small floats; the exponent may have leading zeros) plus zero written with an exponent
  (``0e5``, ``-0.0E-1``): Python parses both to ``float`` (correctly rounded).

A bound constrains the text only if the instance satisfies it under *both* readings: the
mathematical value of the text against the decimal the schema wrote (``repr`` of a float bound),
and the Python reading (``int`` exact, or ``float(text)`` rounded) against the bound's float. So
whatever a bounded number grammar accepts is valid for a decimal-exact validator and for
``jsonschema`` alike. Integer bounds written as ints are exact at any size (Fractions and ints
throughout, never floats; bounds of more than 25 significant digits get their automaton built
directly, ``integer_range_dfa``). The price, documented where it is paid and reported by the
compiler in ``SchemaReport.narrowed``:

* bounded ``number`` schemas do not accept non-normalised exponent texts (``12e3``, ``0.5e1``);
* a float bound is rounded *inward* to 25 significant digits (and a float-reading bound to
  magnitudes of at least 1e-40), so texts with more than 25 significant digits next to such a
  bound, or tiny magnitudes next to a bound of 0, may be rejected although valid;
* a finite bound beyond ``PLAIN_MAGNITUDE_CAP`` (1e40) in magnitude, like ``maximum: 1.8e308``,
  narrows plain-decimal texts to magnitudes up to 1e40 (integer and scientific texts keep the
  bound);
* integers in other spellings (``1.0``, ``1e2``: integers from draft 6 on, and multiples under
  ``multipleOf`` in every draft) are accepted up to 15 digits in zero-fraction and normalised
  scientific form (``integral_spellings``), where every reading agrees;
* ``multipleOf``: see ``multiple_of_dfa``.
"""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass
from fractions import Fraction
from typing import Callable

import numpy as np

from grammars.automata.byte_dfa import (
    ByteDFA,
    compile_regular,
    from_transitions,
    intersect,
    minimize,
    union,
)
from grammars.ir import EMPTY, NOTHING, Expr, Literal, alt, chars, repeat, seq
from grammars.memo import shared_automata

__all__ = [
    "DIGIT",
    "NONZERO_DIGIT",
    "INTEGER_TEXT",
    "NUMBER_TEXT",
    "Bound",
    "fixed_width_range",
    "natural_range",
    "integer_range",
    "integer_range_dfa",
    "integral_spellings",
    "integer_texts",
    "EXACT_INTEGERS",
    "decimal_ge",
    "decimal_le",
    "float_reading_bound",
    "integer_reading_bound",
    "multiple_of_dfa",
    "number_equal",
    "non_integer_text",
    "MAX_BOUND_DIGITS",
    "SIGNIFICANT_DIGITS",
    "MIN_MAGNITUDE_EXPONENT",
    "MAX_MODULUS",
    "PLAIN_MAGNITUDE_CAP",
]

DIGIT = chars(("0", "9"))
NONZERO_DIGIT = chars(("1", "9"))
_DIGITS = repeat(DIGIT, 0, None)
_SIGN = Literal("-")

#: ``-?(0|[1-9][0-9]*)``
INTEGER_TEXT: Expr = seq([repeat(_SIGN, 0, 1), alt([Literal("0"), seq([NONZERO_DIGIT, _DIGITS])])])
#: every JSON number text
NUMBER_TEXT: Expr = seq(
    [
        INTEGER_TEXT,
        repeat(seq([Literal("."), repeat(DIGIT, 1, None)]), 0, 1),
        repeat(seq([chars("eE"), repeat(chars("+-"), 0, 1), repeat(DIGIT, 1, None)]), 0, 1),
    ]
)

#: integer bounds with more decimal digits than this raise (their range IR grows with the digits)
MAX_BOUND_DIGITS = 400
#: float-reading bounds are rounded inward to this many significant digits
SIGNIFICANT_DIGITS = 25
#: float-reading bounds of smaller magnitude than 10**this are moved inward to it (or to 0)
MIN_MAGNITUDE_EXPONENT = -40
#: a finite bound beyond this magnitude is narrowed to it for integer and plain-decimal texts
#: (their range automata grow with the digits of the bound, and are not minimised when large)
PLAIN_MAGNITUDE_CAP = 10**40
#: largest modulus for which ``multiple_of_dfa`` builds the residue automaton
MAX_MODULUS = 10_000


# ------------------------------------------------------------------------------------------
# digit-string ranges


def _decimal_digit(lo: int, hi: int) -> Expr:
    if lo == hi:
        return Literal(str(lo))
    return chars((str(lo), str(hi)))


def fixed_width_range(
    lo: int, hi: int, width: int, *, base: int = 10, digit: Callable[[int, int], Expr] = _decimal_digit
) -> Expr:
    """Strings of exactly ``width`` base-``base`` digits whose value lies in ``[lo, hi]``.

    ``digit(a, b)`` is the IR of one digit with value in ``[a, b]`` (so hex digits can allow
    both letter cases). The expression follows the two bounds digit by digit and branches off
    into "any digits" as soon as it is strictly inside, so it determinises into about two states
    per position (no subset blow-up, which matters since large DFAs are not minimised). A bound
    suffix of all zeros (all top digits) is one literal run, so the nesting depth grows with the
    significant digits of the bounds only.
    """
    if lo > hi or lo < 0 or hi >= base**width:
        return NOTHING
    lo_d = _digits_of(lo, width, base)
    hi_d = _digits_of(hi, width, base)
    top = base - 1

    def any_digits(n: int) -> Expr:
        return repeat(digit(0, top), n, n)

    def run(d: int, n: int) -> Expr:
        return seq([digit(d, d)] * n)

    # below[p]: suffixes (positions p..) >= lo_d[p:]; above[p]: suffixes <= hi_d[p:]
    below: list[Expr] = [EMPTY] * (width + 1)
    above: list[Expr] = [EMPTY] * (width + 1)
    for p in range(width - 1, -1, -1):
        rest = width - p - 1
        if all(d == 0 for d in lo_d[p:]):
            below[p] = any_digits(width - p)
        elif all(d == top for d in lo_d[p:]):
            below[p] = run(top, width - p)
        else:
            d = lo_d[p]
            below[p] = alt(([seq([digit(d + 1, top), any_digits(rest)])] if d < top else []) + [seq([digit(d, d), below[p + 1]])])
        if all(d == top for d in hi_d[p:]):
            above[p] = any_digits(width - p)
        elif all(d == 0 for d in hi_d[p:]):
            above[p] = run(0, width - p)
        else:
            d = hi_d[p]
            above[p] = alt(([seq([digit(0, d - 1), any_digits(rest)])] if d > 0 else []) + [seq([digit(d, d), above[p + 1]])])
    # common prefix, then the first differing position splits into lower / middle / upper
    p = 0
    while p < width and lo_d[p] == hi_d[p]:
        p += 1
    prefix = [digit(d, d) for d in lo_d[:p]]
    if p == width:
        return seq(prefix)
    a, b = lo_d[p], hi_d[p]
    parts = [seq([digit(a, a), below[p + 1]]), seq([digit(b, b), above[p + 1]])]
    if b - a > 1:
        parts.append(seq([digit(a + 1, b - 1), any_digits(width - p - 1)]))
    return seq(prefix + [alt(parts)])


def _digits_of(value: int, width: int, base: int) -> list[int]:
    out = [0] * width
    for i in range(width - 1, -1, -1):
        value, out[i] = divmod(value, base)
    return out


def natural_range(lo: int, hi: int | None) -> Expr:
    """Canonical decimal texts (``0`` or no leading zero) of the naturals in ``[lo, hi]``.

    ``hi=None`` means unbounded. ``lo`` is clamped to 0.
    """
    lo = max(lo, 0)
    if hi is not None and hi < lo:
        return NOTHING
    parts: list[Expr] = []
    if lo == 0:
        parts.append(Literal("0"))
        lo = 1
        if hi is not None and hi < 1:
            return alt(parts)
    lo_w = len(str(lo))
    if hi is None:
        parts.append(fixed_width_range(lo, 10**lo_w - 1, lo_w))
        parts.append(seq([NONZERO_DIGIT, repeat(DIGIT, lo_w, None)]))
        return alt(parts)
    hi_w = len(str(hi))
    if lo_w == hi_w:
        parts.append(fixed_width_range(lo, hi, lo_w))
        return alt(parts)
    parts.append(fixed_width_range(lo, 10**lo_w - 1, lo_w))
    if hi_w - lo_w >= 2:  # every number of the widths in between: one bounded repetition
        parts.append(seq([NONZERO_DIGIT, repeat(DIGIT, lo_w, hi_w - 2)]))
    parts.append(fixed_width_range(10 ** (hi_w - 1), hi, hi_w))
    return alt(parts)


def integer_range(lo: int | None, hi: int | None) -> Expr:
    """Integer texts ``-?(0|[1-9][0-9]*)`` whose value lies in ``[lo, hi]`` (``None``: unbounded).

    ``-0`` (value 0) is included exactly when 0 is in the range.
    """
    key = ("integer_range", lo, hi)  # ranges recur across schemas; the result is immutable
    known = shared_automata().get(key)
    if known is None:
        known = _integer_range(lo, hi)
        shared_automata().put(key, known)
    return known


def _integer_range(lo: int | None, hi: int | None) -> Expr:
    for b in (lo, hi):
        if b is not None and len(str(abs(b))) > MAX_BOUND_DIGITS:
            raise ValueError(f"integer bound with more than {MAX_BOUND_DIGITS} digits")
    if lo is not None and hi is not None and lo > hi:
        return NOTHING
    if any(b is not None and _significant_digits(b) > SIGNIFICANT_DIGITS for b in (lo, hi)):
        return integer_range_dfa(lo, hi)  # type: ignore[return-value]  # a ByteDFA inside the IR
    parts: list[Expr] = []
    if hi is None or hi >= 0:
        parts.append(natural_range(0 if lo is None else max(lo, 0), hi))
    if lo is None or lo < 0:
        mag_lo = 1 if hi is None or hi >= 0 else -hi
        mag_hi = None if lo is None else -lo
        parts.append(seq([_SIGN, natural_range(mag_lo, mag_hi)]))
    if (lo is None or lo <= 0) and (hi is None or hi >= 0):
        parts.append(Literal("-0"))
    return alt(parts)


def _significant_digits(value: int) -> int:
    """Digits of ``value`` up to its last nonzero one (0 has none)."""
    return len(str(abs(value)).rstrip("0"))


def integer_range_dfa(lo: int | None, hi: int | None) -> ByteDFA:
    """``integer_range`` built directly as a DFA, for bounds of any number of significant digits.

    The expression ``integer_range`` writes nests one level per significant digit of a bound,
    which the automaton builders walk recursively; this builds the automaton instead, one
    comparison state per digit position: ``(digits read, prefix vs the lower bound's, prefix vs
    the upper bound's)``, so its size is linear in the digits and no recursion is involved."""
    rows: list[dict[int, int]] = [{}]
    accepting: list[int] = []
    neg_lo = None if hi is None else max(-hi, 0)
    if hi is None or hi >= 0:
        _magnitude_states(rows, accepting, 0, 0 if lo is None else max(lo, 0), hi)
    if lo is None or lo <= 0:
        minus = len(rows)
        rows.append({})
        rows[0][ord("-")] = minus
        _magnitude_states(rows, accepting, minus, 0 if neg_lo is None else neg_lo, None if lo is None else -lo)
    src = [q for q, row in enumerate(rows) for _ in row]
    byte = [b for row in rows for b in row]
    dst = [t for row in rows for t in row.values()]
    if not accepting:
        return ByteDFA(np.zeros((0, 256), dtype=np.int32), np.zeros(0, dtype=bool), -1)
    return from_transitions(len(rows), src, byte, dst, accepting)


def _magnitude_states(rows: list[dict[int, int]], accepting: list[int], start: int, a: int, b: int | None) -> None:
    """Add, below ``start``, the canonical texts (``0`` or no leading zero) of the naturals in
    ``[a, b]`` (``b=None``: unbounded). States are ``(digits read, sign of prefix - a's prefix,
    sign of prefix - b's prefix)``; a prefix longer than ``a`` is greater, so past ``len(a)``
    digits an unbounded range saturates."""
    if b is not None and b < a:
        return
    low, high = str(a), None if b is None else str(b)
    ids: dict[tuple[int, int, int], int] = {}
    todo: list[tuple[int, int, int]] = []

    def state(key: tuple[int, int, int]) -> int:
        if key not in ids:
            ids[key] = len(rows)
            rows.append({})
            k, ca, cb = key
            fits_low = k > len(low) or (k == len(low) and ca >= 0)
            fits_high = high is None or k < len(high) or (k == len(high) and cb <= 0)
            if fits_low and fits_high:
                accepting.append(ids[key])
            todo.append(key)
        return ids[key]

    def step(key: tuple[int, int, int], d: int) -> tuple[int, int, int] | None:
        k, ca, cb = key
        if high is not None and k + 1 > len(high):
            return None  # longer than the upper bound
        nk = k + 1 if high is not None else min(k + 1, len(low) + 1)
        nca = 1 if k + 1 > len(low) else ca or (d > int(low[k])) - (d < int(low[k]))
        ncb = 0 if high is None else cb or (d > int(high[k])) - (d < int(high[k]))
        return nk, nca, ncb

    if a == 0:
        zero = len(rows)
        rows.append({})
        accepting.append(zero)
        rows[start][ord("0")] = zero
    for d in range(1, 10):
        first = step((0, 0, 0), d)
        if first is not None:
            rows[start][ord("0") + d] = state(first)
    while todo:
        key = todo.pop()
        here = ids[key]
        for d in range(10):
            nxt = step(key, d)
            if nxt is not None:
                rows[here][ord("0") + d] = state(nxt)


# ------------------------------------------------------------------------------------------
# decimal fractions: sets of digit strings after the point ("" = no fraction part)


@dataclass(frozen=True)
class _Frac:
    """A set of fraction digit strings: ``empty`` says whether "" (no ``.part``) is in it."""

    empty: bool
    nonempty: Expr

    def text(self, *, required: bool) -> Expr:
        parts = [] if required or not self.empty else [EMPTY]
        parts.append(seq([Literal("."), self.nonempty]))
        return alt(parts)


_ANY_FRAC = _Frac(True, repeat(DIGIT, 1, None))


def _frac_gt(f: str) -> _Frac:
    """Fractions ``s`` with ``0.s > 0.f`` (``f`` without trailing zeros)."""
    g = seq([_DIGITS, NONZERO_DIGIT, _DIGITS])
    for ch in reversed(f):
        d = int(ch)
        g = alt(([seq([_decimal_digit(d + 1, 9), _DIGITS])] if d < 9 else []) + [seq([Literal(ch), g])])
    return _Frac(False, g)


def _frac_eq(f: str) -> _Frac:
    zeros = repeat(Literal("0"), 0, None)
    if not f:
        return _Frac(True, repeat(Literal("0"), 1, None))
    return _Frac(False, seq([Literal(f), zeros]))


def _frac_lt(f: str) -> _Frac:
    """Fractions ``s`` with ``0.s < 0.f`` (``f`` without trailing zeros)."""
    if not f:
        return _Frac(False, NOTHING)
    full: Expr = NOTHING  # strings (maybe empty) below 0.f[i:]
    top: Expr = NOTHING
    for i in range(len(f) - 1, -1, -1):
        d = int(f[i])
        nonempty = alt(([seq([_decimal_digit(0, d - 1), _DIGITS])] if d > 0 else []) + [seq([Literal(f[i]), full])])
        full = alt([EMPTY, nonempty])
        top = nonempty
    return _Frac(True, top)


def _frac_union(a: _Frac, b: _Frac) -> _Frac:
    return _Frac(a.empty or b.empty, alt([a.nonempty, b.nonempty]))


def _split(b: Fraction) -> tuple[int, str]:
    """``b >= 0`` with a finite decimal expansion -> (integer part, fraction digits without trailing zeros)."""
    whole = b.numerator // b.denominator
    rest = b - whole
    digits: list[str] = []
    while rest:
        rest *= 10
        d = rest.numerator // rest.denominator
        digits.append(str(d))
        rest -= d
        if len(digits) > 2000:
            raise ValueError(f"bound {b} has no short decimal expansion")
    return whole, "".join(digits)


def _magnitude(b: Fraction, strict: bool, *, ge: bool, int_lo: int, int_hi: int | None, frac_required: bool) -> Expr:
    """Unsigned texts ``I(.F)?`` with ``I`` in ``[int_lo, int_hi]`` and value ``>= b`` (``ge``) or ``<= b``."""
    whole, f = _split(b)
    parts: list[Expr] = []
    any_frac = _ANY_FRAC.text(required=frac_required)
    if ge:
        others = natural_range(max(whole + 1, int_lo), int_hi)
        frac = _frac_gt(f) if strict else _frac_union(_frac_gt(f), _frac_eq(f))
    else:
        others = natural_range(int_lo, whole - 1 if int_hi is None else min(whole - 1, int_hi))
        frac = _frac_lt(f) if strict else _frac_union(_frac_lt(f), _frac_eq(f))
    parts.append(seq([others, any_frac]))
    if int_lo <= whole and (int_hi is None or whole <= int_hi):
        parts.append(seq([Literal(str(whole)), frac.text(required=frac_required)]))
    return alt(parts)


# -- the two float-read families -----------------------------------------------------------


class _PlainFamily:
    """Plain decimals with a fraction part: ``(0|[1-9][0-9]*)\\.[0-9]+`` (unsigned)."""

    any = seq([alt([Literal("0"), seq([NONZERO_DIGIT, _DIGITS])]), Literal("."), repeat(DIGIT, 1, None)])

    @staticmethod
    def ge(b: Fraction, strict: bool) -> Expr:
        return _magnitude(b, strict, ge=True, int_lo=0, int_hi=None, frac_required=True)

    @staticmethod
    def le(b: Fraction, strict: bool) -> Expr:
        return _magnitude(b, strict, ge=False, int_lo=0, int_hi=None, frac_required=True)


def _exponent_range(lo: int | None, hi: int | None) -> Expr:
    """``[eE][+-]?[0-9]+`` (leading zeros allowed) with exponent value in ``[lo, hi]``."""
    zeros = repeat(Literal("0"), 0, None)
    parts: list[Expr] = []
    if hi is None or hi >= 0:
        parts.append(seq([repeat(Literal("+"), 0, 1), zeros, natural_range(0 if lo is None else max(lo, 0), hi)]))
    if lo is None or lo < 0:
        mag_lo = 1 if hi is None or hi >= 0 else -hi
        parts.append(seq([_SIGN, zeros, natural_range(mag_lo, None if lo is None else -lo)]))
    if (lo is None or lo <= 0) and (hi is None or hi >= 0):
        parts.append(seq([_SIGN, repeat(Literal("0"), 1, None)]))
    body = alt(parts)
    return NOTHING if body == NOTHING else seq([chars("eE"), body])


class _ScientificFamily:
    """``[1-9](\\.[0-9]+)?[eE][+-]?[0-9]+`` (value m * 10**e, 1 <= m < 10) and zero as ``0(\\.0+)?[eE]...``."""

    _mantissa = seq([NONZERO_DIGIT, repeat(seq([Literal("."), repeat(DIGIT, 1, None)]), 0, 1)])
    zero = seq([Literal("0"), repeat(seq([Literal("."), repeat(Literal("0"), 1, None)]), 0, 1), _exponent_range(None, None)])
    nonzero = seq([_mantissa, _exponent_range(None, None)])
    any = alt([zero, nonzero])

    @classmethod
    def ge(cls, b: Fraction, strict: bool) -> Expr:
        if b == 0:
            return cls.nonzero if strict else cls.any
        m, e = _normalise(b)
        return alt(
            [
                seq([cls._mantissa, _exponent_range(e + 1, None)]),
                seq([_magnitude(m, strict, ge=True, int_lo=1, int_hi=9, frac_required=False), _exponent_range(e, e)]),
            ]
        )

    @classmethod
    def le(cls, b: Fraction, strict: bool) -> Expr:
        if b == 0:
            return NOTHING if strict else cls.zero
        m, e = _normalise(b)
        return alt(
            [
                cls.zero,
                seq([cls._mantissa, _exponent_range(None, e - 1)]),
                seq([_magnitude(m, strict, ge=False, int_lo=1, int_hi=9, frac_required=False), _exponent_range(e, e)]),
            ]
        )


def _normalise(b: Fraction) -> tuple[Fraction, int]:
    """``b > 0`` -> (m, e) with ``b == m * 10**e`` and ``1 <= m < 10``."""
    e = len(str(b.numerator)) - len(str(b.denominator))
    m = b / Fraction(10) ** e
    while m >= 10:
        m /= 10
        e += 1
    while m < 1:
        m *= 10
        e -= 1
    return m, e


def _signed(family, bound: Fraction, strict: bool, *, lower: bool) -> Expr:
    """Signed texts of a family with value ``>= bound`` (``lower``) or ``<= bound`` (``>``/``<`` if strict)."""
    if lower:
        if bound > 0 or (bound == 0 and strict):
            return family.ge(bound, strict)
        if bound == 0:  # every non-negative text, and zero written with a minus sign
            return alt([family.any, seq([_SIGN, family.le(Fraction(0), False)])])
        return alt([family.any, seq([_SIGN, family.le(-bound, strict)])])
    if bound < 0 or (bound == 0 and strict):
        return seq([_SIGN, family.ge(-bound, strict)])
    if bound == 0:
        return alt([seq([_SIGN, family.any]), family.le(Fraction(0), False)])
    return alt([seq([_SIGN, family.any]), family.le(bound, strict)])


def _plain_clamped(bound: Fraction, strict: bool, lower: bool) -> Expr:
    """The plain family under a bound, narrowed to magnitudes up to ``PLAIN_MAGNITUDE_CAP``."""
    cap = Fraction(PLAIN_MAGNITUDE_CAP)
    if lower and bound > cap or not lower and bound < -cap:
        return NOTHING  # every qualifying plain text is beyond the cap
    if lower and bound < -cap:
        bound, strict = -cap, False
    elif not lower and bound > cap:
        bound, strict = cap, False
    return _signed(_PlainFamily, bound, strict, lower=lower)


def decimal_ge(bound: Fraction, strict: bool) -> Expr:
    """Float-read texts (plain decimals with a fraction, normalised scientific) with value >= bound."""
    return alt([_plain_clamped(bound, strict, True), _signed(_ScientificFamily, bound, strict, lower=True)])


def decimal_le(bound: Fraction, strict: bool) -> Expr:
    """Float-read texts with value <= bound (< if strict)."""
    return alt([_plain_clamped(bound, strict, False), _signed(_ScientificFamily, bound, strict, lower=False)])


# ------------------------------------------------------------------------------------------
# bounds under both readings


@dataclass(frozen=True)
class Bound:
    """One bound from a schema: ``written`` is the decimal the schema wrote (``repr`` of a float),
    ``binary`` the exact value of the float Python holds (equal to ``written`` for ints)."""

    written: Fraction
    binary: Fraction
    strict: bool
    lower: bool
    #: written as a float: its exact binary value may need rounding (``integer_reading_bound``);
    #: an int bound is exact at any size
    from_float: bool = False

    @classmethod
    def of(cls, value: int | float, *, strict: bool, lower: bool) -> "Bound":
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise TypeError(f"bound must be a number, got {value!r}")
        if isinstance(value, float):
            if not math.isfinite(value):
                raise ValueError(f"bound must be finite, got {value!r}")
            return cls(Fraction(repr(value)), Fraction(value), strict, lower, True)
        return cls(Fraction(value), Fraction(value), strict, lower)


def _tighter(a: tuple[Fraction, bool], b: tuple[Fraction, bool], lower: bool) -> tuple[Fraction, bool]:
    if a[0] == b[0]:
        return (a[0], a[1] or b[1])
    if (a[0] > b[0]) == lower:
        return a
    return b


def integer_reading_bound(bound: Bound) -> int:
    """The integer bound for integer texts (exact ``int`` reading): both readings must hold."""
    value, strict = _tighter((bound.written, bound.strict), (bound.binary, bound.strict), bound.lower)
    if bound.lower:
        result = math.floor(value) + 1 if strict else math.ceil(value)
    else:
        result = math.ceil(value) - 1 if strict else math.floor(value)
    # a float bound's exact binary value may have hundreds of significant digits (that of 1.8e308
    # has 309): round inward to SIGNIFICANT_DIGITS, so the range IR has few pieces; only integers
    # of that many digits next to the bound are lost (a narrowing). An int bound stays exact.
    digits = len(str(abs(result)))
    if bound.from_float and digits > SIGNIFICANT_DIGITS:
        scale = 10 ** (digits - SIGNIFICANT_DIGITS)
        result = -((-result) // scale) * scale if bound.lower else (result // scale) * scale
    return result


def float_reading_bound(bound: Bound) -> tuple[Fraction, bool]:
    """The bound for float-read texts: ``x (>=|>) written`` and ``float(x) (>=|>) binary`` both hold.

    ``float(x) >= c`` for a float ``c`` holds whenever ``x`` exceeds the midpoint between ``c`` and
    its predecessor (or equals it, when that tie rounds to ``c``). The result is then rounded inward
    (``SIGNIFICANT_DIGITS``, ``MIN_MAGNITUDE_EXPONENT``) so the grammar stays small.
    """
    if not bound.lower:
        mirrored = Bound(-bound.written, -bound.binary, bound.strict, True, bound.from_float)
        value, strict = float_reading_bound(mirrored)
        return -value, strict
    top = Fraction(sys.float_info.max)
    overflow = (top + Fraction(2**1024)) / 2  # texts from here on read as inf (the tie rounds to even)
    if bound.binary > top:
        # an int bound beyond every float: only inf satisfies it, i.e. texts from ``overflow`` on
        chosen = _tighter((bound.written, bound.strict), (overflow, False), True)
        return _round_inward(chosen[0], chosen[1], lower=True)
    if bound.binary < -top:
        # below every float: each finite float and inf satisfy it, -inf (texts up to -overflow) not
        chosen = _tighter((bound.written, bound.strict), (-overflow, True), True)
        return _round_inward(chosen[0], chosen[1], lower=True)
    # smallest float c with c >= binary (c > binary when strict)
    c = float(bound.binary)
    if Fraction(c) < bound.binary or (bound.strict and Fraction(c) == bound.binary):
        c = math.nextafter(c, math.inf)
    if not math.isfinite(c):
        # no finite float qualifies: float(x) must overflow to inf, i.e. x reaches the midpoint
        # between the largest float and 2**1024 (that tie rounds to even, which overflows)
        top = Fraction(sys.float_info.max)
        chosen = _tighter((bound.written, bound.strict), ((top + Fraction(2**1024)) / 2, False), True)
        return _round_inward(chosen[0], chosen[1], lower=True)
    below = math.nextafter(c, -math.inf)
    if not math.isfinite(below):
        # c is the most negative float: every float >= c; only the written bound matters
        chosen = (bound.written, bound.strict)
    else:
        midpoint = (Fraction(below) + Fraction(c)) / 2
        # a text exactly at the midpoint rounds half-to-even: to c (allowed) or to ``below``
        chosen = _tighter((bound.written, bound.strict), (midpoint, float(midpoint) != c), True)
    return _round_inward(chosen[0], chosen[1], lower=True)


def _round_inward(value: Fraction, strict: bool, *, lower: bool) -> tuple[Fraction, bool]:
    if value == 0:
        return value, strict
    tiny = Fraction(10) ** MIN_MAGNITUDE_EXPONENT
    if abs(value) < tiny:
        if (value > 0) == lower:
            return (tiny if lower else -tiny), False
        return Fraction(0), False
    m, e = _normalise(abs(value))
    scale = Fraction(10) ** (e - SIGNIFICANT_DIGITS + 1)
    q = value / scale
    rounded = (math.ceil(q) if lower else math.floor(q)) * scale
    if rounded == value:
        return value, strict
    return rounded, False


# ------------------------------------------------------------------------------------------
# multipleOf over integer texts


def multiple_of_dfa(modulus: int) -> ByteDFA:
    """Integer texts ``-?(0|[1-9][0-9]*)`` whose value is a multiple of ``modulus`` (>= 1).

    Divisibility is regular over decimal digits: the automaton tracks the value modulo
    ``modulus`` (state ``r`` reading digit ``d`` goes to ``(10 r + d) % modulus``).
    Raises ``ValueError`` for a modulus above ``MAX_MODULUS``.
    """
    if modulus < 1:
        raise ValueError("modulus must be >= 1")
    if modulus > MAX_MODULUS:
        raise ValueError(f"modulus {modulus} above MAX_MODULUS={MAX_MODULUS}")
    if modulus == 1:
        return compile_regular(INTEGER_TEXT)
    start, minus, zero, base = 0, 1, 2, 3
    n = base + modulus
    table = np.full((n, 256), -1, dtype=np.int32)
    digits = np.arange(10)
    table[start, ord("-")] = minus
    for s in (start, minus):
        table[s, ord("0")] = zero
        table[s, ord("1") : ord("9") + 1] = base + (digits[1:] % modulus)
    r = np.arange(modulus)[:, None]
    table[base:, ord("0") : ord("9") + 1] = base + (10 * r + digits[None, :]) % modulus
    accepting = np.zeros(n, dtype=bool)
    accepting[zero] = True
    accepting[base] = True
    return minimize(ByteDFA(table, accepting, start))


# ------------------------------------------------------------------------------------------
# one value


def number_equal(value: Fraction, *, integer_texts: bool, float_texts: bool) -> Expr:
    """Number texts whose mathematical value is exactly ``value`` (a finite decimal).

    ``integer_texts``: the integer spelling (``-0`` too for zero). ``float_texts``: plain decimals
    with any number of trailing zeros (``1.50``) and normalised scientific spellings with any
    exponent spelling (``1.5e0``, ``15E-1`` is *not* normalised and is not included), and zero as
    ``0.0``, ``0e0``, ``-0.0E+00`` and so on.
    """
    negative = value < 0
    mag = -value if negative else value
    whole, f = _split(mag)
    parts: list[Expr] = []
    if integer_texts and not f:
        parts.append(Literal(str(whole)))
    if float_texts:
        parts.append(seq([Literal(str(whole)), _frac_eq(f).text(required=True)]))
        if mag == 0:
            parts.append(_ScientificFamily.zero)
        else:
            m, e = _normalise(mag)
            m_whole, m_frac = _split(m)
            parts.append(seq([Literal(str(m_whole)), _frac_eq(m_frac).text(required=False), _exponent_range(e, e)]))
    body = alt(parts)
    if mag == 0:
        return alt([body, seq([_SIGN, body])])
    return seq([_SIGN, body]) if negative else body


#: significant digits a decimal text keeps through a round trip to a double (``DBL_DIG``)
ROUND_TRIP_DIGITS = 15


def non_integer_text() -> Expr:
    """Plain decimal texts whose value is not an integer under any reading (exact value and
    Python's ``float``): a nonzero fractional digit and at most ``ROUND_TRIP_DIGITS`` digits up
    to the last nonzero one, so the double nearest the text is not an integer either (a double
    that was would print back, with 15 digits, as that integer). A narrowing: longer texts and
    exponent texts (``1.5e0``) with non-integer values are not accepted."""
    out = []
    frac = lambda n: seq([repeat(DIGIT, 0, n - 1), NONZERO_DIGIT, repeat(Literal("0"), 0, None)])  # noqa: E731
    out.append(seq([Literal("0."), frac(ROUND_TRIP_DIGITS)]))
    for width in range(1, ROUND_TRIP_DIGITS):
        out.append(seq([NONZERO_DIGIT, repeat(DIGIT, width - 1, width - 1), Literal("."), frac(ROUND_TRIP_DIGITS - width)]))
    return seq([repeat(Literal("-"), 0, 1), alt(out)])


# ------------------------------------------------------------------------------------------
# integers in other spellings

#: integers whose other spellings are accepted: a double holds every integer up to 2**53
#: exactly, so up to there ``float(text)`` of any spelling of an integer is that integer and
#: Python's reading and the mathematical one agree on every keyword (type, bounds,
#: ``multipleOf``, ``enum``); the 15-digit integers keep the automata small (a bound of 2**53
#: itself costs a comparison state per digit)
EXACT_INTEGERS = 10**15 - 1
#: largest exponent of the scientific spellings ``integral_spellings`` accepts (every integer up
#: to ``EXACT_INTEGERS`` has at most 15 digits)
MAX_SPELLING_EXPONENT = 14
#: character-level states (integer automaton states times significant digits) past which
#: ``integral_spellings`` leaves out the scientific spellings (a ``multipleOf`` of 10,000 has
#: 10,000 residues, each needing its own exponent automaton)
MAX_SPELLING_STATES = 40_000


def integral_spellings(ints: ByteDFA) -> ByteDFA:
    """Texts other than integer texts that spell, exactly, an integer whose integer text is in
    ``ints`` (a DFA over ``-?(0|[1-9][0-9]*)``, ``-0`` for a zero written with a minus sign), for
    integers up to ``EXACT_INTEGERS`` in magnitude:

    * zero fractions: ``1.0``, ``-12.000``, ``0.0``;
    * normalised scientific texts: one nonzero digit, an optional fraction, an exponent of at
      most ``MAX_SPELLING_EXPONENT`` written with any leading zeros and an optional ``+``
      (``1e2``, ``1.5E+03``, ``2.50e001``; ``e-0`` for exponent 0), when the value is an
      integer: ``1.5e1`` yes, ``1.55e1`` no;
    * zero with any exponent: ``0e5``, ``-0.0E-3``.

    Not included (a narrowing the callers report): larger magnitudes, non-normalised exponent
    texts (``15e1``, ``0.15e3``, ``150e-1``), and the scientific spellings when the integer
    automaton is too large (``MAX_SPELLING_STATES``). The result may be empty.
    """
    bounded = intersect(ints, integer_range_dfa(-EXACT_INTEGERS, EXACT_INTEGERS))
    if bounded.is_empty_language:
        return bounded
    parts = [compile_regular(seq([bounded, Literal("."), repeat(Literal("0"), 1, None)]))]
    exponent = seq([chars("eE"), repeat(chars("+-"), 0, 1), repeat(DIGIT, 1, None)])
    for sign in ("", "-"):
        if bounded.matches(f"{sign}0".encode()):
            parts.append(compile_regular(seq([Literal(sign + "0"), repeat(seq([Literal("."), repeat(Literal("0"), 1, None)]), 0, 1), exponent])))
    if bounded.n_states * (MAX_SPELLING_EXPONENT + 1) <= MAX_SPELLING_STATES:
        scientific = _scientific_spellings(bounded)
        if not scientific.is_empty_language:
            parts.append(scientific)
    return union(parts)


def _scientific_spellings(ints: ByteDFA) -> ByteDFA:
    """Normalised scientific texts of nonzero integers with integer texts in ``ints`` (see
    ``integral_spellings``), built state by state: ``(ints state after the significant digits,
    how many there are, zeros read since, phase)`` while the mantissa is read, then an exponent
    automaton per set of exponents that complete the integer text inside ``ints``."""
    rows: list[dict[int, int]] = [{}]
    accepting: list[int] = []
    ids: dict[tuple, int] = {}
    todo: list[tuple] = []
    cap = MAX_SPELLING_EXPONENT + 1  # significant digits of an integer below 10**cap

    def state(key: tuple) -> int:
        if key not in ids:
            ids[key] = len(rows)
            rows.append({})
            todo.append(key)
            if key[0] == "exp" and key[3] and key[2] in key[1]:
                accepting.append(ids[key])
        return ids[key]

    for sign, at in ((b"", ints.start), (b"-", ints.step(ints.start, ord("-")))):
        if at < 0:
            continue
        origin = 0 if not sign else state(("sign",))
        if sign:
            rows[0][ord("-")] = origin
        for d in range(1, 10):
            q = ints.step(at, ord("0") + d)
            if q >= 0:
                rows[origin][ord("0") + d] = state(("mant", q, 1, 0, "first"))
    while todo:
        key = todo.pop()
        here = ids[key]
        if key[0] == "sign":
            continue  # its row was filled where it was made
        if key[0] == "mant":
            _, q, n, z, phase = key
            if phase == "first":
                rows[here][ord(".")] = state(("mant", q, n, z, "dot"))
            if phase in ("dot", "frac"):
                rows[here][ord("0")] = state(("mant", q, n, min(z + 1, cap), "frac"))
                for d in range(1, 10):
                    if n + z + 1 <= cap:
                        q2 = ints.run(b"0" * z + bytes([ord("0") + d]), q)
                        if q2 >= 0:
                            rows[here][ord("0") + d] = state(("mant", q2, n + z + 1, 0, "frac"))
            if phase in ("first", "frac"):
                allowed = frozenset(x for x in range(n - 1, MAX_SPELLING_EXPONENT + 1)
                                    if ints.is_accepting(ints.run(b"0" * (x + 1 - n), q)))
                if allowed:
                    exp = state(("exp", allowed, 0, False, "start"))
                    rows[here][ord("e")] = rows[here][ord("E")] = exp
            continue
        _, allowed, value, _seen, phase = key  # the exponent: value so far (cap: too large)
        if phase == "start":
            rows[here][ord("+")] = state(("exp", allowed, 0, False, "signed"))
            if 0 in allowed:
                rows[here][ord("-")] = state(("exp", allowed, 0, False, "minus"))
        for d in range(10):
            if phase in ("minus", "minus digits") and d != 0:
                continue  # "e-0": only a zero exponent may carry a minus sign
            after = "minus digits" if phase in ("minus", "minus digits") else "digits"
            rows[here][ord("0") + d] = state(("exp", allowed, min(value * 10 + d, cap), True, after))
    src = [q for q, row in enumerate(rows) for _ in row]
    byte = [b for row in rows for b in row]
    dst = [t for row in rows for t in row.values()]
    if not accepting:
        return ByteDFA(np.zeros((0, 256), dtype=np.int32), np.zeros(0, dtype=bool), -1)
    return from_transitions(len(rows), src, byte, dst, accepting)


def integer_texts(values, limits_states: int = 200_000) -> ByteDFA:
    """The integer texts of ``values`` (ints; ``-0`` added with 0), as the minimal DFA of the
    words (``CodePointDFA.of_words``, linear in their total length): an enum of ten thousand
    integers is one small automaton, not ten thousand alternatives."""
    from grammars.automata.codepoint import CodePointDFA

    texts = {str(v) for v in values}
    if "0" in texts:
        texts.add("-0")
    words = CodePointDFA.of_words(texts, limits_states)
    src = [q for q, row in enumerate(words.trans) for _ in row]
    byte = [cp for row in words.trans for cp, _, _ in row]
    dst = [t for row in words.trans for _, _, t in row]
    return from_transitions(len(words.trans), src, byte, dst, [q for q, ok in enumerate(words.accept) if ok])
