"""Numbers from schemas, exactly: bounds of any size, typed errors past what is supported, and
every spelling of an integer that the schema's draft calls valid, judged against ``jsonschema``.

* Integer bounds are ints throughout (never floats): ``10**25 + 7`` is a bound to the unit, and
  ``10**309`` (beyond every float) is a bound like any other.
* Numbers past what can be enforced raise ``UnsupportedSchemaError`` naming keyword and pointer,
  or are narrowed and reported; never ``OverflowError``, never "nested too deeply".
* Integers spelled ``1.0``, ``1e2``, ``1.5E+1``: integers from draft 6 on, multiples under
  ``multipleOf`` in every draft. Accepted up to 15 digits in zero-fraction and normalised
  scientific form (where every reading agrees); other spellings are a narrowing reported in
  ``SchemaReport.narrowed`` — an accepted text is never invalid.
"""

from __future__ import annotations

import json
from decimal import Decimal
from fractions import Fraction

import jsonschema
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from schema_check import Checker

from grammars import UnsupportedSchemaError
from grammars.frontends.json_schema import (
    JsonSchemaOptions,
    analyze_json_schema,
    load_schema,
)
from grammars.frontends.json_schema.compiler import NUMBER_SPELLINGS

DRAFT4 = "http://json-schema.org/draft-04/schema#"
DRAFT2020 = "https://json-schema.org/draft/2020-12/schema"
FAST = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                        HealthCheck.function_scoped_fixture])


@pytest.fixture(scope="module")
def checker(byte_vocab):
    return Checker(byte_vocab)


def valid(schema, text: str) -> bool:
    instance = json.loads(text)
    return jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)(schema).is_valid(instance)


def exact_value(text: str) -> Fraction:
    return Fraction(Decimal(text))


# --- exact integer bounds -----------------------------------------------------------------------


def test_bounds_beyond_float_precision_are_exact(checker):
    big = 10**25
    schema = {"type": "integer", "minimum": big, "maximum": big + 7}
    for k in range(-2, 10):
        text = str(big + k)
        assert checker.accepts(schema, text) == (0 <= k <= 7) == valid(schema, text), text


def test_exclusive_bounds_beyond_float_precision_are_exact(checker):
    big = 10**25
    schema = {"type": "integer", "exclusiveMinimum": big, "exclusiveMaximum": big + 3}
    assert [k for k in range(-2, 6) if checker.accepts(schema, str(big + k))] == [1, 2]


@pytest.mark.parametrize("exponent", [60, 309, 350])
def test_integer_bounds_beyond_the_float_range(checker, exponent):
    big = 10**exponent
    schema = {"type": "integer", "minimum": big}
    for text in (str(big), str(big + 1), str(big - 1), "1", "0"):
        assert checker.accepts(schema, text) == valid(schema, text), text
    upper = {"type": "number", "maximum": -big}
    for text in (str(-big), str(-big + 1), "-1e400", "-1.5e" + str(exponent), "0"):
        accepted = checker.accepts(upper, text)
        assert not accepted or valid(upper, text), text
    assert checker.accepts(upper, str(-big)) and not checker.accepts(upper, "0")


def test_number_bound_beyond_the_float_range_reads_floats_as_python_does(checker):
    """``minimum: 10**309``: a float text reads as ``inf`` only from about 1.8e308 on (and
    ``inf`` satisfies the bound), but its value must reach the bound as well."""
    schema = {"minimum": 10**309}
    for text in ("1e309", "1.5e309", "2e308", "1e308", str(10**309)):
        accepted = checker.accepts(schema, text)
        assert not accepted or (valid(schema, text) and exact_value(text) >= 10**309), text
    assert checker.accepts(schema, "1e309") and checker.accepts(schema, str(10**309))


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(low=st.integers(-10**30, 10**30), width=st.integers(0, 50), probe=st.integers(-60, 60))
def test_random_large_integer_ranges_match_the_oracle(checker, low, width, probe):
    schema = {"type": "integer", "minimum": low, "maximum": low + width}
    text = str(low + probe)
    assert checker.accepts(schema, text) == valid(schema, text)


# --- typed errors from numbers -------------------------------------------------------------------


@pytest.mark.parametrize(
    "schema, keyword, pointer",
    [
        ({"properties": {"n": {"multipleOf": 10**309}}}, "multipleOf", "#/properties/n"),
        ({"multipleOf": 10**20}, "multipleOf", "#"),
        ({"multipleOf": 1e300}, "multipleOf", "#"),
        ({"type": "integer", "minimum": 10**500}, "minimum", "#"),
        ({"type": "array", "minItems": 10**20}, "minItems", "#"),
        ({"items": {"type": "array", "minItems": 100_000}}, "minItems", "#/items"),
        ({"type": "array", "contains": {"type": "integer"}, "minContains": 100_000}, "minContains", "#"),
        ({"type": "object", "minProperties": 10**20}, "minProperties", "#"),
        ({"type": "string", "minLength": 10**30}, "minLength", "#"),
        ({"type": "string", "minLength": 10**30, "pattern": "a"}, "minLength", "#"),
    ],
)
def test_numbers_past_what_is_supported_are_typed_errors(schema, keyword, pointer):
    with pytest.raises(UnsupportedSchemaError) as info:
        analyze_json_schema(load_schema(schema))
    assert (info.value.keyword, info.value.pointer) == (keyword, pointer)
    assert "nested too deeply" not in str(info.value)


@pytest.mark.parametrize(
    "schema, note",
    [
        ({"type": "array", "maxItems": 10**20}, "maxItems"),
        ({"type": "array", "contains": {}, "maxContains": 100_000}, "maxContains"),
        ({"type": "object", "maxProperties": 10**20}, "maxProperties"),
        ({"type": "string", "maxLength": 10**30}, "maxLength"),
        ({"type": "string", "maxLength": 10**30, "pattern": "^a+$"}, "maxLength"),
    ],
)
def test_upper_counts_past_what_is_counted_are_narrowed_and_reported(checker, schema, note):
    report = analyze_json_schema(load_schema(schema))
    assert any(note in n for n in report.narrowed_values)
    assert checker.compile(schema) is not None


def test_narrowed_upper_counts_stay_sound(checker):
    schema = {"type": "array", "items": {"type": "integer"}, "maxItems": 10**20}
    assert checker.accepts(schema, "[" + ",".join(["1"] * 1024) + "]")
    assert not checker.accepts(schema, "[" + ",".join(["1"] * 1025) + "]")  # narrowed, never wider


# --- integers in every spelling -----------------------------------------------------------------

INTEGER_SCHEMAS = [
    {"type": "integer"},
    {"type": "integer", "minimum": -5, "maximum": 1000},
    {"type": "integer", "minimum": 10**14 + 1},
    {"type": "integer", "multipleOf": 3},
    {"multipleOf": 3},
    {"multipleOf": 2, "minimum": 10},
    {"type": "integer", "multipleOf": 0.5},
    {"type": ["integer", "string"], "maximum": 12},
]

spellings = st.one_of(
    st.builds(lambda m, f, e, z, plus, sign, upper: f"{sign}{m}{'.' + f if f else ''}{'E' if upper else 'e'}{'+' if plus else ''}{'0' * z}{e}",
              st.integers(1, 9), st.text("0123456789", max_size=4), st.integers(0, 18), st.integers(0, 2),
              st.booleans(), st.sampled_from(["", "-"]), st.booleans()),
    st.builds(lambda i, z, sign: f"{sign}{i}.{'0' * z}", st.integers(0, 10**16), st.integers(1, 3), st.sampled_from(["", "-"])),
    st.builds(lambda i, f, sign: f"{sign}{i}.{f}", st.integers(0, 10**6), st.text("0123456789", min_size=1, max_size=3),
              st.sampled_from(["", "-"])),
    st.builds(lambda i, sign: f"{sign}{i}", st.integers(0, 10**20), st.sampled_from(["", "-"])),
    st.sampled_from(["0e0", "-0.0", "0.0E-5", "1e-0", "15e1", "0.15e3", "150e-1", "1e+20", "1e400", "9.0", "1.0"]),
)


@pytest.mark.parametrize("draft", [DRAFT4, DRAFT2020])
@pytest.mark.parametrize("base", INTEGER_SCHEMAS, ids=[json.dumps(s) for s in INTEGER_SCHEMAS])
@FAST
@given(text=spellings)
def test_integer_spellings_match_the_oracle(checker, draft, base, text):
    """Never accept an invalid text; accept a valid one in the documented spellings (integer
    texts; up to 15 digits, zero fractions and normalised exponents up to 14)."""
    schema = {"$schema": draft, **base}
    expected = valid(schema, text)
    accepted = checker.accepts(schema, text)
    assert not accepted or expected, text
    value = exact_value(text)
    integer_text = text.lstrip("-").isdigit()
    mantissa = text.lstrip("-").split("e")[0].split("E")[0]
    normalised = "e" not in text.lower() or (mantissa[0] != "0" and "." not in mantissa[1:2] and
                                               (len(mantissa) == 1 or mantissa[1] == ".") and int(text.lower().split("e")[1]) <= 14)
    small = value.denominator == 1 and abs(value) < 10**15
    if expected and (integer_text or (small and normalised)):
        assert accepted, text


@pytest.mark.parametrize("schema, texts", [
    ({"type": "integer"}, ["1e2", "1E2", "9.0", "1.0", "10.0", "1.5e1", "-2.50E+001", "0e0", "-0.0"]),
    ({"multipleOf": 3}, ["9.0", "9e0", "1.2e1", "3.000"]),
    ({"type": "integer", "minimum": 10**25, "maximum": 10**25 + 7}, [str(10**25 + 3)]),
])
def test_reported_reproducers_are_accepted(checker, schema, texts):
    for text in texts:
        assert valid(schema, text) and checker.accepts(schema, text), text


def test_draft4_integers_are_integer_texts_only(checker):
    schema = {"$schema": DRAFT4, "type": "integer"}
    assert checker.accepts(schema, "12") and not checker.accepts(schema, "12.0") and not checker.accepts(schema, "1e2")
    assert not analyze_json_schema(load_schema(schema)).narrowed  # exact: nothing to report
    multiple = {"$schema": DRAFT4, "multipleOf": 3}
    assert checker.accepts(multiple, "9.0") and valid(multiple, "9.0")


def test_spelling_narrowing_is_reported_not_silent():
    for schema in ({"type": "integer"}, {"multipleOf": 2}, {"type": "number", "minimum": 1}):
        report = analyze_json_schema(load_schema(schema), JsonSchemaOptions())
        notes = [n for n in report.narrowed if NUMBER_SPELLINGS in n]
        assert notes and not report.narrowed_values, schema
    assert not analyze_json_schema(load_schema({"type": "number"})).narrowed  # every spelling accepted


def test_lenient_drops_only_the_count_it_cannot_enforce(checker):
    schema = {"type": "array", "items": {"type": "integer"}, "minItems": 10**20}
    report = analyze_json_schema(load_schema(schema), JsonSchemaOptions(lenient=True))
    assert [(r.keyword, r.pointer) for r in report.relaxed] == [("minItems", "#")]
    assert checker.accepts(schema, "[1,2]", lenient=True)
    assert not checker.accepts(schema, '["a"]', lenient=True)  # items still enforced
    objects = {"type": "object", "additionalProperties": {"type": "string"}, "minProperties": 10**6}
    report = analyze_json_schema(load_schema(objects), JsonSchemaOptions(lenient=True))
    assert [(r.keyword, r.pointer) for r in report.relaxed] == [("minProperties", "#")]
    assert not checker.accepts(objects, '{"a":1}', lenient=True)
