"""String and number schemas, and single JSON string/number values, as IR.

The structure compiler (``compiler``, ``objects``, ``combinators``, ``values``) calls these
functions with the string or number keywords of one conjunction. Each returns the IR of whole
JSON tokens (a string token includes its quotes) or raises ``UnsupportedSchemaError`` for what it
cannot enforce exactly; nothing is relaxed silently.

Strings (``string_schema``):

* ``minLength``/``maxLength`` count value characters (a surrogate-pair escape is one). The
  automaton needs about 20 states per counted character, bounded by ``strings.MAX_LENGTH_STATES``
  (10,000): a larger ``maxLength`` is *narrowed* to the largest bound that fits (499 characters
  for unrestricted strings, fewer under a format or pattern) and reported through the
  ``narrowed`` callback; a ``minLength`` that large raises;
* ``pattern`` is an ECMA-262 regex with search semantics over the value; every encoding of a
  matching value is accepted (``strings.encode_value_language``);
* ``format``: see ``formats``; format strings accept the encodings ``json.dumps`` writes
  (``escapes="minimal"``: printable ASCII literally, ``\\u`` escapes for the rest);
* two or more of {pattern, format, length} are intersected exactly on byte DFAs
  (``byte_dfa.intersect``, ``strings.restrict_length``), and the result is embedded in the IR as
  a pre-compiled ``ByteDFA`` (which compares by language);
* ``contentEncoding``/``contentMediaType``/``contentSchema`` are annotations (draft 2019-09 on;
  draft 7 lets validators skip them and ``jsonschema`` does): consumed, no constraint.

Numbers (``number_schema``): see ``numbers`` for the exact semantics of bounds. ``integer=True``
accepts integer texts only (the compiler adds their other spellings where the draft makes them
integers, ``numbers.integral_spellings``). Bounds are exact for ints of any size; a bound of more
than ``numbers.MAX_BOUND_DIGITS`` digits raises. ``multipleOf``:

* an integer ``k`` (or a float with an integer value) up to ``numbers.MAX_MODULUS`` (larger raise):
  integer texts that are multiples of ``k`` (for a float ``k > 1``, only ``|x| <= 2**53``, where
  float division is exact); a ``number`` schema gets integer texts too (the compiler adds their
  other spellings);
* ``k = p / 2**j`` (0.5, 0.25, 2.5, ...) on an ``integer`` schema: the integers divisible by
  ``p`` (``|x| <= 2**(53 - j)`` unless ``p == 1``);
* anything else (``0.01`` on numbers, ``0.1`` anywhere) raises: ``jsonschema`` decides it with
  float division (``0.07 / 0.01 != 7``), which is not a regular language of texts.
"""

from __future__ import annotations

import math
from fractions import Fraction
from functools import lru_cache
from typing import Any, Callable, Mapping

from grammars.automata.byte_dfa import (
    ByteDFA,
    compile_regular,
    intersect,
    shared_regular,
)
from grammars.errors import (
    GrammarError,
    GrammarSyntaxError,
    LimitExceeded,
    UnsupportedGrammarError,
    UnsupportedSchemaError,
)
from grammars.frontends.json_schema.document import count_keyword
from grammars.frontends.regex import parse_regex
from grammars.ir import NOTHING, Expr, alt
from grammars.limits import Limits

from . import formats as _formats
from . import numbers as _numbers
from . import strings as _strings

__all__ = [
    "STRING_KEYWORDS",
    "NUMBER_KEYWORDS",
    "NUMBER_BOUNDS",
    "normalized_number_keywords",
    "string_schema",
    "number_schema",
    "json_string_value",
    "json_string_values",
    "json_number_value",
    "string_not_in",
    "encode_value_language",
    "parse_pattern",
    "pattern_site",
]

#: keywords ``string_schema`` consumes
STRING_KEYWORDS: frozenset[str] = frozenset(
    {"minLength", "maxLength", "pattern", "format", "contentEncoding", "contentMediaType", "contentSchema"}
)
#: keywords ``number_schema`` consumes
NUMBER_KEYWORDS: frozenset[str] = frozenset(
    {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf"}
)
#: the bound keywords, in 2020-12 form (``normalized_number_keywords``)
NUMBER_BOUNDS = ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum")

encode_value_language = _strings.encode_value_language
json_string_value = _strings.json_string_value
json_string_values = _strings.json_string_values
string_not_in = _strings.string_not_in


# ------------------------------------------------------------------------------------------
# strings


def _length(schema: Mapping, key: str, pointer: str) -> int | None:
    return count_keyword(schema[key], key, pointer) if key in schema else None


def string_schema(
    schema: Mapping, pointer: str, options: Any = None, *, narrowed: Callable[[str], None] | None = None,
    pattern_at: str | None = None, limits: Limits | None = None,
) -> Expr:
    """A whole JSON string token (quotes included) satisfying the string keywords of ``schema``.

    Keywords outside ``STRING_KEYWORDS`` are ignored here (the caller owns them). ``pattern_at``:
    the pointer of the ``pattern`` value when it is not ``<pointer>/pattern`` (a merged
    conjunction's, a ``patternProperties`` key), for messages. Of ``options``
    only an optional ``string_escapes`` attribute is read (default ``"all"``): the encodings a
    ``pattern`` accepts. ``"minimal"`` (what ``json.dumps`` writes) can make pattern automata
    several times smaller and faster to build, e.g. for long counted hex-digit runs.

    A ``maxLength`` whose exact automaton would exceed ``strings.MAX_LENGTH_STATES`` states is
    *narrowed*: the grammar accepts strings up to the largest length that fits (never more than
    the schema allows), and ``narrowed`` (when given) is called with a note saying so. A
    ``minLength`` that large cannot be narrowed and raises ``UnsupportedSchemaError``.
    Automata are built under ``limits`` (the compiler's; the defaults when None).
    A ``pattern`` may also be given already encoded: a ``ByteDFA`` of string bodies (a language
    met on code points, ``strings.encode_value_automaton``), kept as it is.
    """
    limits = limits or Limits()
    min_length = _length(schema, "minLength", pointer) or 0
    max_length = _length(schema, "maxLength", pointer)
    if max_length is not None and max_length < min_length:
        return NOTHING
    bodies: list[tuple[str, Expr]] = []  # (keyword, body IR)
    if "pattern" in schema:
        escapes = getattr(options, "string_escapes", "all")  # an optional knob; see below
        site = pattern_at or f"{pointer}/pattern"
        pattern = schema["pattern"]
        bodies.append(("pattern", pattern if isinstance(pattern, ByteDFA)
                       else _strings.encode_value_language(parse_pattern(pattern, site), escapes)))
    if "format" in schema:
        language = _format(schema["format"], pointer)
        if language is not None:
            bodies.append(("format", _format_body(schema["format"])))

    def note(fitted: int) -> None:
        if narrowed is not None:
            narrowed(f"{pointer}: maxLength {max_length} accepted only up to {fitted} characters (DFA size)")

    if not bodies:
        limit = _strings.max_counted_length()
        if min_length >= limit:
            raise UnsupportedSchemaError(
                "minLength", pointer, f"minLength {min_length} needs more than {_strings.MAX_LENGTH_STATES} DFA states"
            )
        if max_length is not None and max_length >= limit:
            note(limit - 1)
            max_length = limit - 1
        return _strings.string_token(_strings.length_bounded_body(min_length, max_length))
    if len(bodies) == 1 and min_length == 0 and max_length is None:
        return _strings.string_token(bodies[0][1])
    body: ByteDFA | None = None
    try:
        for keyword, expr in bodies:
            dfa = expr if isinstance(expr, ByteDFA) else shared_regular(expr, limits)
            body = dfa if body is None else intersect(body, dfa, limits)
    except LimitExceeded as exc:
        raise UnsupportedSchemaError(keyword, pointer, str(exc)) from None
    assert body is not None
    if min_length >= _strings.MAX_LENGTH_STATES:
        raise UnsupportedSchemaError("minLength", pointer, f"minLength {_short_number(min_length)} needs more than "
                                     f"{_strings.MAX_LENGTH_STATES} DFA states")
    if min_length > 0 or max_length is not None:
        # A product that fits the state budget never counts past it (a longer string needs more
        # states), so a maxLength beyond the budget can be handed to the counter as the budget
        # plus one, exactly; a product that does not fit is narrowed and reported.
        counted = None if max_length is None else min(max_length, _strings.MAX_LENGTH_STATES + 1)
        body = _restrict_length(body, min_length, counted, pointer, note, limits)
    if body.is_empty_language:
        return NOTHING
    return _strings.string_token(body)  # type: ignore[arg-type]  # a ByteDFA inside the IR


def _restrict_length(
    body: ByteDFA, min_length: int, max_length: int | None, pointer: str, note: Callable[[int], None], limits: Limits
) -> ByteDFA:
    """``restrict_length``, narrowing ``max_length`` to the largest bound that fits when too big.

    The product is built one character count at a time, so the count it was building when it ran
    out of states is one past the largest bound that fits (``LengthBudgetExceeded.reached``).
    """
    try:
        return _strings.restrict_length(body, min_length, max_length, limits)
    except _strings.LengthBudgetExceeded as exc:
        if max_length is None or exc.reached - 1 < min_length:
            keyword = "minLength" if max_length is None or min_length else "maxLength"
            raise UnsupportedSchemaError(keyword, pointer, str(exc)) from None
        fitted = min(max_length - 1, exc.reached - 1)
    try:
        out = _strings.restrict_length(body, min_length, fitted, limits)
    except LimitExceeded as exc:
        raise UnsupportedSchemaError("minLength" if min_length else "maxLength", pointer, str(exc)) from None
    note(fitted)
    return out


def pattern_site(site: str) -> tuple[str, str]:
    """(keyword, schema pointer) to name in an ``UnsupportedSchemaError`` about the pattern at
    ``site``, the pointer of the pattern itself: ``#/a/pattern`` is keyword ``pattern`` of
    ``#/a``; ``#/patternProperties/x`` names ``patternProperties`` at the pattern's own pointer,
    since the keyword alone would not say which of its patterns it is."""
    head, _, last = site.rpartition("/")
    if head.rpartition("/")[2] == "patternProperties":
        return "patternProperties", site
    if last == "pattern":
        return "pattern", head
    return "pattern", site


def parse_pattern(pattern: Any, site: str) -> Expr:
    """The search language of the ``pattern`` found at ``site`` (the pattern's own pointer).

    A pattern that is not a regular expression at all — our parser rejects its syntax and so does
    Python's ``re``, the dialect validators run — makes the schema malformed: ``GrammarError``
    naming ``site``. A pattern one of them accepts that corral cannot enforce exactly raises
    ``UnsupportedSchemaError`` (see ``pattern_site`` for the keyword and pointer)."""
    keyword, where = pattern_site(site)
    if not isinstance(pattern, str):
        raise GrammarError(f"malformed schema at {site}: a pattern must be a string, got {pattern!r}")
    try:
        return parse_regex(pattern, search=True, source=site)
    except GrammarSyntaxError as exc:
        if _python_compiles(pattern):
            raise UnsupportedSchemaError(keyword, where, f"regular expression {pattern!r}: {exc.message}") from None
        raise GrammarError(f"malformed schema at {site}: invalid regular expression {pattern!r}: {exc.message}") from None
    except UnsupportedGrammarError as exc:
        raise UnsupportedSchemaError(keyword, where, str(exc)) from None


def _python_compiles(pattern: str) -> bool:
    import re

    try:
        re.compile(pattern)
    except (re.error, OverflowError, RecursionError):
        return False
    return True


@lru_cache(maxsize=64)
def _format_body(name: str) -> Expr:
    """The string bodies of a supported, enforced ``format``, compiled once per process: a format
    is a constant of the dialect (as the string token is), met in schema after schema, and its
    DFA is then embedded in each terminal instead of rebuilt from a large expression. The
    expression itself when its DFA exceeds the default limits (then it is compiled as part of
    its terminal, under the compiler's limits)."""
    language = _formats.format_language(name)
    expr = _strings.encode_value_language(language, "minimal")
    try:
        return compile_regular(expr)
    except LimitExceeded:
        return expr


def _format(name: Any, pointer: str) -> Expr | None:
    if not isinstance(name, str):
        raise UnsupportedSchemaError("format", pointer, f"format must be a string, got {name!r}")
    try:
        return _formats.format_language(name)
    except KeyError:
        raise UnsupportedSchemaError("format", pointer, _formats.UNSUPPORTED_FORMATS[name]) from None


# ------------------------------------------------------------------------------------------
# numbers


def _bound_value(schema: Mapping, key: str, pointer: str) -> int | float:
    """A bound's value: an int of any size (exact), or a finite float."""
    value = schema[key]
    if isinstance(value, bool) or not isinstance(value, (int, float)) or (isinstance(value, float) and not math.isfinite(value)):
        raise UnsupportedSchemaError(key, pointer, f"{key} must be a finite number, got {value!r}")
    return value


def _bounds(schema: Mapping, pointer: str) -> tuple[list[_numbers.Bound], list[_numbers.Bound]]:
    """Lower and upper bounds; draft 4's boolean ``exclusiveMinimum`` modifies ``minimum``."""
    lowers: list[_numbers.Bound] = []
    uppers: list[_numbers.Bound] = []
    for key, exclusive, out, lower in (
        ("minimum", "exclusiveMinimum", lowers, True),
        ("maximum", "exclusiveMaximum", uppers, False),
    ):
        flag = schema.get(exclusive)
        if key in schema:
            out.append(_numbers.Bound.of(_bound_value(schema, key, pointer), strict=flag is True, lower=lower))
        if exclusive in schema and not isinstance(flag, bool):
            out.append(_numbers.Bound.of(_bound_value(schema, exclusive, pointer), strict=True, lower=lower))
    return lowers, uppers


def _modulus(k: Any, pointer: str, integer: bool) -> tuple[int, int | None]:
    """(integer modulus, magnitude cap or None) for ``multipleOf: k`` over integer texts."""
    if isinstance(k, bool) or not isinstance(k, (int, float)) or (isinstance(k, float) and not math.isfinite(k)) or k <= 0:
        raise UnsupportedSchemaError("multipleOf", pointer, f"multipleOf must be a positive number, got {k!r}")
    if isinstance(k, int):
        if k > _numbers.MAX_MODULUS:
            raise UnsupportedSchemaError("multipleOf", pointer, f"multipleOf {_short_number(k)}: moduli above "
                                         f"{_numbers.MAX_MODULUS} are not supported (the automaton has a state per residue)")
        return k, None
    exact = Fraction(k)
    if exact.denominator == 1:
        if exact > _numbers.MAX_MODULUS:
            raise UnsupportedSchemaError("multipleOf", pointer, f"multipleOf {k!r}: moduli above {_numbers.MAX_MODULUS} "
                                         "are not supported (the automaton has a state per residue)")
        return int(exact), (None if exact == 1 else 2**53)
    written = Fraction(repr(k))
    j = exact.denominator.bit_length() - 1  # denominator is 2**j
    if not integer or written != exact:
        raise UnsupportedSchemaError(
            "multipleOf",
            pointer,
            f"multipleOf {k!r} on {'integers' if integer else 'numbers'}: the validator divides floats "
            "(e.g. 0.07 / 0.01 != 7), which is not a regular language",
        )
    p = exact.numerator
    return p, (None if p == 1 else 2 ** max(0, 53 - j))


def number_schema(schema: Mapping, pointer: str, options: Any = None, *, integer: bool) -> Expr:
    """JSON number texts (``integer``: integer texts only) satisfying the number keywords.

    Keywords outside ``NUMBER_KEYWORDS`` are ignored here. ``options`` is not consulted.
    """
    lowers, uppers = _bounds(schema, pointer)
    modulus, cap = (None, None)
    if "multipleOf" in schema:
        modulus, cap = _modulus(schema["multipleOf"], pointer, integer)
    int_lo = max((_numbers.integer_reading_bound(b) for b in lowers), default=None)
    int_hi = min((_numbers.integer_reading_bound(b) for b in uppers), default=None)
    if cap is not None:
        int_lo = -cap if int_lo is None else max(int_lo, -cap)
        int_hi = cap if int_hi is None else min(int_hi, cap)
    keyword = "minimum" if lowers else "maximum"
    for bound, keyword_of in ((int_lo, "minimum"), (int_hi, "maximum")):
        if bound is not None and len(str(abs(bound))) > _numbers.MAX_BOUND_DIGITS:
            raise UnsupportedSchemaError(keyword_of, pointer, f"an integer bound of {len(str(abs(bound)))} digits "
                                         f"(more than {_numbers.MAX_BOUND_DIGITS}) is not supported")
    try:
        ints: Expr = _numbers.integer_range(int_lo, int_hi)
    except ValueError as exc:
        raise UnsupportedSchemaError(keyword, pointer, str(exc)) from None
    if modulus is not None and ints != NOTHING:
        try:
            ints = intersect(compile_regular(ints), _numbers.multiple_of_dfa(modulus))  # type: ignore[assignment]
        except ValueError as exc:
            raise UnsupportedSchemaError("multipleOf", pointer, str(exc)) from None
        if ints.is_empty_language:  # type: ignore[union-attr]
            ints = NOTHING
    if integer or modulus is not None:
        return ints
    if not lowers and not uppers:
        return _numbers.NUMBER_TEXT
    try:
        floats = _float_texts(lowers, uppers)
    except ValueError as exc:
        raise UnsupportedSchemaError(keyword, pointer, str(exc)) from None
    return alt([ints, floats])


def _short_number(value: int) -> str:
    """An int for a message: ``10**309`` is 310 digits, shown as its first digits and length."""
    text = str(value)
    return text if len(text) <= 24 else f"{text[:12]}...({len(text)} digits)"


def _float_texts(lowers: list[_numbers.Bound], uppers: list[_numbers.Bound]) -> Expr:
    lo = _tightest([_numbers.float_reading_bound(b) for b in lowers], lower=True)
    hi = _tightest([_numbers.float_reading_bound(b) for b in uppers], lower=False)
    if lo is None:
        assert hi is not None
        return _numbers.decimal_le(*hi)
    if hi is None:
        return _numbers.decimal_ge(*lo)
    if lo[0] > hi[0] or (lo[0] == hi[0] and (lo[1] or hi[1])):
        return NOTHING
    dfa = intersect(compile_regular(_numbers.decimal_ge(*lo)), compile_regular(_numbers.decimal_le(*hi)))
    return NOTHING if dfa.is_empty_language else dfa  # type: ignore[return-value]


def _tightest(bounds: list[tuple[Fraction, bool]], *, lower: bool) -> tuple[Fraction, bool] | None:
    best: tuple[Fraction, bool] | None = None
    for value, strict in bounds:
        if best is None or (value > best[0] if lower else value < best[0]) or (value == best[0] and strict):
            best = (value, strict)
    return best


def json_number_value(value: int | float, same_type: bool = False) -> Expr:
    """JSON number texts equal to ``value`` under both readings (mathematical and Python's).

    Accepted spellings: the integer text (when the value is an integer and Python's reading of it
    is exact), plain decimals with trailing zeros (``1.0``, ``1.50``), and normalised scientific
    texts with any exponent spelling (``1e0``, ``1.5E+00``); zero in every signed form. Not
    accepted: non-normalised exponents (``10e-1``, ``0.15e1``). A float ``value`` matches the
    decimal ``repr`` writes (``0.1`` is ``0.1``, not its binary expansion); an integer beyond
    2**53 that no float represents has its integer text only. NaN and infinities: ``NOTHING``.
    ``same_type``: only the texts Python reads as the value's own type (an int: its integer text;
    a float: the others), for draft 4, where ``1.0`` is not an integer: an enum value checked as
    ``1`` must not admit ``1.0``.
    """
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"json_number_value takes an int or float, got {value!r}")
    if isinstance(value, float):
        if not math.isfinite(value):
            return NOTHING
        written = Fraction(repr(value))
        integer_texts = written == Fraction(value) and not same_type
        return _numbers.number_equal(written, integer_texts=integer_texts, float_texts=True)
    exact_float = abs(value) < 2**1024 and float(value) == value and not same_type
    return _numbers.number_equal(Fraction(value), integer_texts=True, float_texts=exact_float)


def _number_value(value: Any, keyword: str, where: str) -> int | float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise GrammarError(f"malformed schema at {where}: {keyword!r} must be a number, got {value!r}")
    return value


def normalized_number_keywords(node: dict, where: str) -> dict:
    """Number keywords in 2020-12 form (draft 4's boolean ``exclusiveMinimum`` rewritten)."""
    out: dict = {}
    for key in ("minimum", "maximum"):
        if key in node:
            bound = _number_value(node[key], key, where)
            flag = node.get("exclusive" + key[0].upper() + key[1:])
            if flag is True:
                out["exclusive" + key[0].upper() + key[1:]] = bound
            else:
                out[key] = bound
    for key in ("exclusiveMinimum", "exclusiveMaximum"):
        if key in node and not isinstance(node[key], bool):
            bound = _number_value(node[key], key, where)
            out[key] = bound if key not in out else (max if key == "exclusiveMinimum" else min)(out[key], bound)
    if "multipleOf" in node:
        m = _number_value(node["multipleOf"], "multipleOf", where)
        if m <= 0:
            raise GrammarError(f"malformed schema at {where}: 'multipleOf' must be > 0, got {m!r}")
        out["multipleOf"] = m
    for key in NUMBER_KEYWORDS - set(NUMBER_BOUNDS) - {"multipleOf"}:
        if key in node:
            out[key] = node[key]
    return out
