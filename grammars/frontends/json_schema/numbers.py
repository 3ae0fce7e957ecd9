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
``jsonschema`` alike. The price, documented where it is paid:

* bounded ``number`` schemas do not accept non-normalised exponent texts (``12e3``, ``0.5e1``);
* a bound is rounded *inward* to 25 significant digits (and a float-reading bound to magnitudes
  of at least 1e-40), so texts with more than 25 significant digits, or tiny magnitudes next to
  a bound of 0, may be rejected although valid;
* a finite bound beyond ``PLAIN_MAGNITUDE_CAP`` (1e40) in magnitude, like ``maximum: 1.8e308``,
  narrows integer and plain-decimal texts to magnitudes up to 1e40 (scientific texts keep the
  exact bound);
* ``type: integer`` accepts integer texts only (``1.0`` and ``1e2`` are integers from draft 6 on,
  but not in draft 4, and the compiler does not know the draft);
* ``multipleOf``: see ``multiple_of_dfa``.
"""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass
from fractions import Fraction
from typing import Callable

import numpy as np

from grammars.automata.byte_dfa import ByteDFA, compile_regular, minimize
from grammars.ir import EMPTY, NOTHING, Expr, Literal, alt, chars, repeat, seq

__all__ = [
    "DIGIT",
    "NONZERO_DIGIT",
    "INTEGER_TEXT",
    "NUMBER_TEXT",
    "Bound",
    "fixed_width_range",
    "natural_range",
    "integer_range",
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
    "clamp_integer_bounds",
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
    for b in (lo, hi):
        if b is not None and len(str(abs(b))) > MAX_BOUND_DIGITS:
            raise ValueError(f"integer bound with more than {MAX_BOUND_DIGITS} digits")
    if lo is not None and hi is not None and lo > hi:
        return NOTHING
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


def clamp_integer_bounds(lo: int | None, hi: int | None) -> tuple[int | None, int | None]:
    """Narrow finite integer bounds beyond ``PLAIN_MAGNITUDE_CAP`` to it (see the module docstring)."""
    cap = PLAIN_MAGNITUDE_CAP
    if (lo is not None and lo > cap) or (hi is not None and hi < -cap):
        return 1, 0  # every qualifying integer is beyond the cap: none is accepted
    if lo is not None:
        lo = lo if lo >= -cap else -cap
    if hi is not None:
        hi = hi if hi <= cap else cap
    return lo, hi


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

    @classmethod
    def of(cls, value: int | float, *, strict: bool, lower: bool) -> "Bound":
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise TypeError(f"bound must be a number, got {value!r}")
        if isinstance(value, float):
            if not math.isfinite(value):
                raise ValueError(f"bound must be finite, got {value!r}")
            return cls(Fraction(repr(value)), Fraction(value), strict, lower)
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
    # more significant digits than SIGNIFICANT_DIGITS (e.g. the exact value of 1.8e308): round
    # inward, so the range IR has few pieces; only integers of that many digits near the bound
    # are lost
    digits = len(str(abs(result)))
    if digits > SIGNIFICANT_DIGITS:
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
        mirrored = Bound(-bound.written, -bound.binary, bound.strict, True)
        value, strict = float_reading_bound(mirrored)
        return -value, strict
    # smallest float c with c >= binary (c > binary when strict)
    try:
        c = float(bound.binary)
    except OverflowError:
        raise ValueError("bound beyond the float range") from None
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
