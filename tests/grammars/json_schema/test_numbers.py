"""Number texts: integer ranges, decimal bounds under both readings, multipleOf, single values.

The oracles are Python's ``json`` + ``jsonschema`` (the "Python reading": ints exact, other texts
as correctly rounded floats) and exact decimal arithmetic on the text (the "math reading"). A
bounded number grammar must accept only texts valid under both; for the text families it
supports it must accept all of them (up to the documented precision limits).
"""

from __future__ import annotations

import json
import math
import re
from fractions import Fraction
from functools import lru_cache

import jsonschema
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from grammars.automata.byte_dfa import compile_regular
from grammars.errors import UnsupportedSchemaError
from grammars.frontends.json_schema import numbers, scalars
from grammars.ir import NOTHING

FAST = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])

_INT_TEXT = re.compile(r"-?(0|[1-9]\d*)")
_PLAIN = re.compile(r"-?(0|[1-9]\d*)\.\d+")
_SCI = re.compile(r"-?([1-9](\.\d+)?|0(\.0+)?)[eE][+-]?\d+")


def dfa(expr):
    return compile_regular(expr)


@lru_cache(maxsize=None)
def schema_dfa(items: tuple, integer: bool):
    return dfa(scalars.number_schema(dict(items), "#", None, integer=integer))


def math_value(text: str) -> Fraction:
    mantissa, _, exponent = text.lower().partition("e")
    return Fraction(mantissa) * Fraction(10) ** int(exponent or 0)


def python_valid(schema: dict, text: str) -> bool:
    try:
        return jsonschema.Draft202012Validator(schema).is_valid(json.loads(text))
    except OverflowError:  # jsonschema compares an int too large for float() with a float bound
        return False


def math_valid(schema: dict, text: str) -> bool:
    v = math_value(text)
    w = lambda b: Fraction(repr(b)) if isinstance(b, float) else Fraction(b)  # noqa: E731
    ok = True
    if "minimum" in schema:
        ok &= v >= w(schema["minimum"])
    if "maximum" in schema:
        ok &= v <= w(schema["maximum"])
    if "exclusiveMinimum" in schema:
        ok &= v > w(schema["exclusiveMinimum"])
    if "exclusiveMaximum" in schema:
        ok &= v < w(schema["exclusiveMaximum"])
    if schema.get("type") == "integer":
        ok &= v.denominator == 1
    return ok


def significant_digits(text: str) -> int:
    mantissa = text.lower().partition("e")[0].lstrip("-").replace(".", "").lstrip("0")
    return len(mantissa.rstrip("0")) or 1


# --- digit ranges ----------------------------------------------------------------------------


@pytest.mark.parametrize("width", [1, 2, 3, 4])
def test_fixed_width_range_exhaustive_on_samples(width):
    rng = __import__("random").Random(width)
    for _ in range(40):
        a, b = sorted(rng.randrange(10**width) for _ in range(2))
        d = dfa(numbers.fixed_width_range(a, b, width))
        for x in list(range(0, 10**width, max(1, 10**width // 150))) + [a, b, max(a - 1, 0), min(b + 1, 10**width - 1)]:
            assert d.matches(str(x).zfill(width).encode()) == (a <= x <= b), (a, b, x)


bound = st.one_of(st.none(), st.integers(-(10**30), 10**30), st.integers(-300, 300))


@FAST
@given(lo=bound, hi=bound, xs=st.lists(st.one_of(st.integers(-400, 400), st.integers(-(10**31), 10**31)), min_size=20, max_size=40))
@example(lo=123, hi=4567, xs=[122, 123, 124, 999, 1000, 4567, 4568, 0, -0])
def test_integer_range_matches_interval(lo, hi, xs):
    d = dfa(numbers.integer_range(lo, hi))
    for x in xs + ([lo, lo - 1] if lo is not None else []) + ([hi, hi + 1] if hi is not None else []):
        inside = (lo is None or x >= lo) and (hi is None or x <= hi)
        assert d.matches(str(x).encode()) == inside, (lo, hi, x)
    zero_in = (lo is None or lo <= 0) and (hi is None or hi >= 0)
    assert d.matches(b"-0") == zero_in
    for bad in (b"007", b"+1", b"1.0", b"", b"-", b"--1", b"1e2"):
        assert not d.matches(bad)


def test_natural_range_spans_widths_compactly():
    d = dfa(numbers.natural_range(7, 10**40))
    assert d.matches(b"7") and d.matches(b"1" + b"0" * 40) and not d.matches(b"1" + b"0" * 39 + b"1")
    assert not d.matches(b"6") and d.matches(b"5" * 20)


# --- integer schemas against jsonschema ------------------------------------------------------

int_bound = st.one_of(st.integers(-(10**6), 10**6), st.integers(-(10**22), 10**22), st.floats(-1e7, 1e7, allow_nan=False).map(lambda f: round(f, 3)))


@st.composite
def integer_schemas(draw):
    schema = {"type": "integer"}
    for key in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"):
        if draw(st.booleans()):
            schema[key] = draw(int_bound)
    return schema


@FAST
@given(schema=integer_schemas(), xs=st.lists(st.one_of(st.integers(-(10**7), 10**7), st.integers(-(10**23), 10**23)), min_size=10, max_size=30))
@example(schema={"type": "integer", "maximum": 1e23}, xs=[10**23, 10**23 - 1, 99999999999999991611392, 99999999999999991611393])
@example(schema={"type": "integer", "minimum": 0.5, "exclusiveMaximum": 3}, xs=[0, 1, 2, 3])
def test_integer_schema_equals_jsonschema(schema, xs):
    d = schema_dfa(tuple(schema.items()), True)
    extra = [math.floor(v) + dv for v in schema.values() if isinstance(v, (int, float)) for dv in (-1, 0, 1)]
    for x in xs + extra:
        text = str(x)
        # exact for integer texts: both readings agree on ints (up to 25 significant digits)
        expected = python_valid(schema, text) and math_valid(schema, text)
        assert d.matches(text.encode()) == expected, (schema, text)


def test_integer_schema_rejects_fraction_and_exponent_texts():
    d = schema_dfa((("minimum", 0),), True)
    for text in ("1.0", "1e2", "0.5", "-1", "01"):
        assert not d.matches(text.encode())
    assert d.matches(b"0") and d.matches(b"-0") and d.matches(b"12345678901234567890123")


# --- number schemas: both readings ------------------------------------------------------------

num_bound = st.one_of(
    st.integers(-1000, 1000),
    st.floats(-1e6, 1e6, allow_nan=False, allow_infinity=False),
    st.sampled_from([0, 0.0, 0.1, -0.1, 0.5, 1e-5, 1e16, 1e23, -2.5, 99.99, 5e-324, 1.7976931348623157e308]),
)


@st.composite
def number_schemas(draw):
    schema = {"type": "number"}
    for key in draw(st.lists(st.sampled_from(["minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"]), min_size=1, max_size=2, unique=True)):
        schema[key] = draw(num_bound)
    return schema


def near(value) -> list[str]:
    """Texts around a bound in every family (int, plain, scientific)."""
    out = []
    f = float(value)
    for g in (f, math.nextafter(f, math.inf), math.nextafter(f, -math.inf)):
        out += [repr(g), json.dumps(g), f"{g:.3e}", f"{g:.20f}" if abs(g) < 1e6 else repr(g)]
    if abs(f) < 1e20:
        i = math.floor(f)
        out += [str(i - 1), str(i), str(i + 1), f"{i}.0", f"{i}.5"]
    return [t for t in out if re.fullmatch(r"-?(0|[1-9]\d*)(\.\d+)?([eE][+-]?\d+)?", t)]


texts = st.one_of(
    st.integers(-(10**7), 10**7).map(str),
    st.floats(allow_nan=False, allow_infinity=False).map(json.dumps),
    st.decimals(allow_nan=False, allow_infinity=False, places=4).map(lambda d: f"{d:f}"),
    st.from_regex(r"-?[1-9](\.[0-9]{1,6})?[eE][+-]?0?[0-9]{1,2}", fullmatch=True),
    st.from_regex(r"-?(0|[1-9][0-9]{0,3})\.[0-9]{1,8}", fullmatch=True),
)


@FAST
@given(schema=number_schemas(), samples=st.lists(texts, min_size=15, max_size=30))
@example(schema={"type": "number", "exclusiveMinimum": 0}, samples=["0", "-0.0", "0.0", "1e-400", "5e-324", "1e-30", "0.1"])
@example(schema={"type": "number", "exclusiveMinimum": 0.1}, samples=["0.1", "0.10000000000000001", "0.10000000000000002", "1e-1"])
@example(schema={"type": "number", "maximum": 1e23}, samples=["1e23", "100000000000000000000000", "99999999999999991611392", "1.0e23"])
def test_number_schema_is_sound_and_complete_on_its_families(schema, samples):
    d = schema_dfa(tuple(schema.items()), False)
    for text in samples + [t for v in schema.values() if not isinstance(v, str) for t in near(v)]:
        if not re.fullmatch(r"-?(0|[1-9]\d*)(\.\d+)?([eE][+-]?\d+)?", text):
            continue
        valid = python_valid(schema, text) and math_valid(schema, text)
        accepted = d.matches(text.encode())
        if accepted:
            assert valid, (schema, text)
        in_family = _INT_TEXT.fullmatch(text) or _PLAIN.fullmatch(text) or _SCI.fullmatch(text)
        tiny = math_value(text) != 0 and abs(math_value(text)) < Fraction(1, 10**39)
        if valid and in_family and significant_digits(text) <= 17 and not tiny:
            assert accepted, (schema, text)


def test_unbounded_number_accepts_every_json_number():
    d = schema_dfa((), False)
    for text in ("0", "-0", "1.5", "1E400", "-0.0e-0", "12e3", "0.5e1"):
        assert d.matches(text.encode())
    for text in ("01", "1.", ".5", "+1", "1e", "NaN", "Infinity", "-"):
        assert not d.matches(text.encode())


def test_bounded_number_excludes_non_normalised_exponents():
    d = schema_dfa((("minimum", 0),), False)
    assert d.matches(b"1.2e3") and d.matches(b"1200") and d.matches(b"1200.00")
    assert not d.matches(b"12e2") and not d.matches(b"0.12e4")


def test_huge_bounds_stay_compact():
    d = schema_dfa((("maximum", 1.7976931348623157e308), ("minimum", -1.7976931348623157e308)), False)
    assert d.n_states < 1000
    # integer texts keep the bound (rounded inward to 25 significant digits, as a float bound's
    # exact value has 309); plain decimals are narrowed to magnitudes up to 1e40; scientific
    # texts keep the bound
    assert d.matches(b"1" + b"0" * 41) and d.matches(b"1" + b"0" * 307) and not d.matches(b"2" + b"0" * 308)
    assert d.matches(b"1" + b"0" * 39 + b".5") and not d.matches(b"1" + b"0" * 41 + b".5") and d.matches(b"1.5e308")
    assert not d.matches(b"1.8e308") and d.matches(b"-1.7976931348623157e308")
    assert schema_dfa((("minimum", 1e300),), False).n_states < 500
    with pytest.raises(UnsupportedSchemaError) as err:
        scalars.number_schema({"maximum": float("inf")}, "#/x", None, integer=False)
    assert err.value.keyword == "maximum" and err.value.pointer == "#/x"


def test_draft4_boolean_exclusive_modifies_the_bound():
    d = schema_dfa((("minimum", 5), ("exclusiveMinimum", True), ("maximum", 10), ("exclusiveMaximum", False)), True)
    assert [x for x in range(0, 15) if d.matches(str(x).encode())] == [6, 7, 8, 9, 10]


def test_contradictory_bounds_give_nothing():
    d = schema_dfa((("minimum", 5), ("maximum", 4.5)), False)
    assert d.is_empty_language


# --- multipleOf -----------------------------------------------------------------------------


@pytest.mark.parametrize("k", [1, 2, 3, 7, 10, 25, 64, 999])
def test_multiple_of_dfa_is_divisibility(k):
    d = numbers.multiple_of_dfa(k)
    for x in list(range(-300, 300)) + [10**20, 10**20 + 1, -(10**19) * 7]:
        assert d.matches(str(x).encode()) == (x % k == 0), (k, x)
    assert d.matches(b"-0") and not d.matches(b"00")


@pytest.mark.parametrize(
    "schema, integer",
    [
        ({"multipleOf": 5, "minimum": 0, "maximum": 1000}, True),
        ({"multipleOf": 5.0}, True),
        ({"multipleOf": 2.5, "maximum": 100}, True),
        ({"multipleOf": 0.5}, True),
        ({"multipleOf": 1}, False),
        ({"multipleOf": 1.0, "exclusiveMinimum": 0}, False),
        ({"multipleOf": 11, "minimum": -50}, False),
    ],
)
def test_multiple_of_against_jsonschema(schema, integer):
    d = dfa(scalars.number_schema(schema, "#", None, integer=integer))
    full = {"type": "integer" if integer else "number", **schema}
    for x in list(range(-120, 121)) + [2**53, 2**53 + 5, 10**30]:
        text = str(x)
        if d.matches(text.encode()):
            assert python_valid(full, text) and math_valid(full, text), (schema, text)
        elif abs(x) <= 2**50:
            assert not (python_valid(full, text) and math_valid(full, text)), (schema, text)
    for text in ("2.5", "5.0", "1e1"):
        assert not d.matches(text.encode()) or python_valid(full, text)


@pytest.mark.parametrize("schema, integer", [({"multipleOf": 0.01}, False), ({"multipleOf": 0.1}, True), ({"multipleOf": 2.5}, False), ({"multipleOf": 0}, True), ({"multipleOf": 10**9 + 7}, True)])
def test_multiple_of_unsupported_raises(schema, integer):
    with pytest.raises(UnsupportedSchemaError) as err:
        scalars.number_schema(schema, "#/n", None, integer=integer)
    assert err.value.keyword == "multipleOf" and err.value.pointer == "#/n"


# --- single values --------------------------------------------------------------------------


@FAST
@given(value=st.one_of(st.integers(-(10**20), 10**20), st.floats(allow_nan=False, allow_infinity=False)), others=st.lists(texts, max_size=15))
@example(value=0.1, others=["0.10000000000000001", "1e-1", "0.1000"])
@example(value=100, others=["1e2", "100.0", "10e1", "1.00E+02"])
@example(value=10**23, others=["1e23", "100000000000000000000000", "1.0e23"])
def test_json_number_value_equality(value, others):
    d = dfa(scalars.json_number_value(value))
    assert d.matches(json.dumps(value).encode())
    if isinstance(value, float):
        assert d.matches(repr(value).encode())
    for text in others + [json.dumps(value) + "0" if "." in json.dumps(value) else json.dumps(value) + ".0"]:
        if not re.fullmatch(r"-?(0|[1-9]\d*)(\.\d+)?([eE][+-]?\d+)?", text):
            continue
        target = Fraction(repr(value)) if isinstance(value, float) else Fraction(value)
        both = json.loads(text) == value and math_value(text) == target
        if d.matches(text.encode()):
            assert both, (value, text)


def test_json_number_value_spellings():
    d = dfa(scalars.json_number_value(0))
    assert all(d.matches(t.encode()) for t in ("0", "-0", "0.0", "-0.00", "0e5", "0.0E-01"))
    d = dfa(scalars.json_number_value(2**60 + 1))  # no float equals it: integer text only
    assert d.matches(str(2**60 + 1).encode()) and not d.matches(f"{2**60 + 1}.0".encode())
    assert scalars.json_number_value(float("nan")) == NOTHING and scalars.json_number_value(float("inf")) == NOTHING
    with pytest.raises(TypeError):
        scalars.json_number_value(True)
