"""``format`` languages against the checker that labels MaskBench (Python ``jsonschema``'s
draft 2020-12 ``FORMAT_CHECKER`` with the optional format packages) and the RFCs.

Every format must accept only strings the checker accepts (soundness). Dates and times, ipv4,
uuid and JSON pointers are exact, so there acceptance must equal the checker's. Checkers whose
package is missing (``fqdn``, ``rfc3987``, ``isoduration``) are skipped, not faked.
"""

from __future__ import annotations

import ipaddress
import json
from functools import lru_cache

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from jsonschema import Draft202012Validator

from grammars.automata.byte_dfa import ByteDFA, compile_regular
from grammars.errors import UnsupportedSchemaError
from grammars.frontends.json_schema import formats, scalars

FAST = settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
CHECKER = Draft202012Validator.FORMAT_CHECKER


@lru_cache(maxsize=None)
def fmt(name: str) -> ByteDFA:
    return compile_regular(scalars.string_schema({"format": name}, "#", None))


def accepts(name: str, value: str) -> bool:
    return fmt(name).matches(json.dumps(value).encode())


def has_checker(name: str) -> bool:
    return name in CHECKER.checkers


VALID = {
    "date": ["2020-01-31", "2024-02-29", "2000-02-29", "0001-01-01", "1999-12-31"],
    "time": ["12:00:00Z", "23:59:59.999+05:30", "00:00:00-23:59", "08:30:06z"],
    "date-time": ["2022-01-01T12:00:00Z", "1985-04-12T23:20:50.52Z", "1996-12-19T16:39:57-08:00", "2020-02-29t01:02:03.5+00:00"],
    "duration": ["P1Y2M3DT4H5M6S", "PT1H", "P2W", "P1D", "PT36H", "P0D", "PT1M30S"],
    "email": ["john.doe@example.com", "a+b@c.io", '"j d"@example.org', "x@[127.0.0.1]", "user@localhost"],
    "idn-email": ["jöhn@example.com", "a@b.c"],
    "hostname": ["localhost", "example.com", "a-b.c-d.example", "xn--4gbwdl.xn--wgbh1c", "1host"],
    "ipv4": ["0.0.0.0", "192.168.1.1", "255.255.255.255"],
    "ipv6": ["::", "::1", "2001:db8::8a2e:370:7334", "1:2:3:4:5:6:7:8", "::ffff:192.0.2.1", "FE80::0202:B3FF:FE1E:8329"],
    "uuid": ["123e4567-e89b-12d3-a456-426614174000", "123E4567-E89B-12D3-A456-426614174000"],
    "uri": ["https://example.com/path?q=1#frag", "urn:isbn:0451450523", "mailto:a@b.c", "localhost:8080", "http://[::1]:80/", "ftp://u:p@h/%20x"],
    "uri-reference": ["/relative/path", "../up", "#frag", "", "https://x.y/"],
    "iri": ["https://例え.jp/パス", "http://example.com/ümlaut"],
    "iri-reference": ["/ä", "https://x.y/é"],
    "json-pointer": ["", "/", "/a/b", "/a~0b/c~1d", "/ü"],
    "relative-json-pointer": ["0", "1/a", "10#", "0#", "2/x/y"],
}
INVALID = {
    "date": ["2020-01-32", "2020-02-30", "2023-02-29", "1900-02-29", "0000-01-01", "2020-13-01", "20200101", "2020-1-01"],
    "time": ["12:00:00", "24:00:00Z", "12:60:00Z", "12:00:60Z", "12:00:00+24:00", "1:00:00Z"],
    "date-time": ["2022-01-01T12:00:00", "2022-01-01 12:00:00Z", "not a date", "2021-02-29T00:00:00Z"],
    "duration": ["P", "PT", "P1H", "1D", "P1DT", "P1.5D", "P1W2D"],
    "email": ["not an email", "invalid-email", "a@b@c", "@x.com", "a@", "a..b@c.com", "a@-x.com"],
    "idn-email": ["no at sign", "a b@c.com"],
    "hostname": ["localhost:8080", "-a.com", "a-.com", "a..b", "a_b.com", "", "a." , "x" * 64],
    "ipv4": ["256.1.1.1", "01.2.3.4", "1.2.3", "1.2.3.4.5", "1.2.3.-1"],
    "ipv6": ["1:2:3:4:5:6:7:8:9", ":::", "1::2::3", "12345::", "::ffff:256.0.0.1", "fe80::1%eth0", "1:2:3:4:5:6:7::8"],
    "uuid": ["123e4567-e89b-12d3-a456-42665544000", "{123e4567-e89b-12d3-a456-426614174000}", "123e4567e89b12d3a456426614174000"],
    "uri": ["not a uri", "invalid_uri", "/relative", "http://exa mple.com", "1http://x", "http://x/%zz"],
    "uri-reference": ["not a uri", "http://x/%g0", "a b"],
    "iri": ["not an iri", "/relative"],
    "iri-reference": ["a b"],
    "json-pointer": ["a", "/~2", "/~", "#/a"],
    "relative-json-pointer": ["", "-1", "01", "100", "a", "0a", "/a"],
}


@pytest.mark.parametrize("name", sorted(formats.KNOWN_FORMATS))
def test_examples(name):
    for value in VALID[name]:
        assert accepts(name, value), (name, value)
        if has_checker(name):
            assert CHECKER.conforms(value, name), (name, value)
    for value in INVALID[name]:
        assert not accepts(name, value), (name, value)


@pytest.mark.parametrize("name", sorted(formats.KNOWN_FORMATS))
def test_sound_against_the_checker_on_examples(name):
    if not has_checker(name):
        pytest.skip(f"jsonschema has no {name!r} checker here (optional package missing)")
    for value in VALID[name] + INVALID[name]:
        if accepts(name, value):
            assert CHECKER.conforms(value, name), (name, value)


# --- exact formats: equality with the checker on generated near-misses -----------------------

two = st.integers(0, 99).map(lambda n: f"{n:02d}")


@st.composite
def date_strings(draw):
    year = draw(st.one_of(st.integers(0, 9999), st.sampled_from([1900, 2000, 2024, 2023, 0, 400, 100, 4])))
    month = draw(st.integers(0, 13))
    day = draw(st.integers(0, 32))
    return f"{year:04d}-{month:02d}-{day:02d}"


@st.composite
def time_strings(draw):
    hms = f"{draw(st.integers(0, 25)):02d}:{draw(st.integers(0, 61)):02d}:{draw(st.integers(0, 61)):02d}"
    frac = draw(st.sampled_from(["", ".5", ".123456789", "."]))
    offset = draw(st.sampled_from(["Z", "z", "", "+00:00", "-23:59", "+24:00", "+05:60", "+5:00"]))
    return hms + frac + offset


@FAST
@given(value=date_strings())
@example(value="2000-02-29")
@example(value="1900-02-29")
def test_date_equals_checker(value):
    assert accepts("date", value) == CHECKER.conforms(value, "date"), value


@FAST
@given(date=date_strings(), time=time_strings(), sep=st.sampled_from(["T", "t", " "]))
def test_date_time_and_time_equal_checker(date, time, sep):
    if not has_checker("date-time"):
        pytest.skip("rfc3339-validator missing")
    value = date + sep + time
    assert accepts("date-time", value) == CHECKER.conforms(value, "date-time"), value
    assert accepts("time", time) == CHECKER.conforms(time, "time"), time


@FAST
@given(parts=st.lists(st.one_of(st.integers(0, 300).map(str), st.sampled_from(["00", "01", "-1", "", "a"])), min_size=3, max_size=5))
def test_ipv4_equals_checker(parts):
    value = ".".join(parts)
    assert accepts("ipv4", value) == CHECKER.conforms(value, "ipv4"), value


@FAST
@given(address=st.ip_addresses(v=6), form=st.sampled_from(["compressed", "exploded", "upper", "v4tail"]))
def test_ipv6_accepts_python_spellings(address, form):
    text = {"compressed": address.compressed, "exploded": address.exploded, "upper": address.compressed.upper()}.get(form)
    if text is None:
        packed = address.packed
        text = address.exploded.rsplit(":", 2)[0] + ":" + str(ipaddress.IPv4Address(packed[-4:]))
    assert accepts("ipv6", text) and CHECKER.conforms(text, "ipv6"), text


@FAST
@given(value=st.text(alphabet=st.sampled_from(list("0123456789abcdefABCDEF:.g%")), max_size=42))
def test_ipv6_sound_on_noise(value):
    if accepts("ipv6", value):
        assert CHECKER.conforms(value, "ipv6"), value


@FAST
@given(value=st.one_of(st.uuids().map(str), st.text(alphabet=st.sampled_from(list("0123456789abcdefABCDEF-{}")), min_size=30, max_size=38)))
def test_uuid_equals_checker(value):
    assert accepts("uuid", value) == CHECKER.conforms(value, "uuid"), value


pointer_text = st.text(alphabet=st.sampled_from(list("/~01a#")), max_size=8)


@FAST
@given(value=pointer_text, prefix=st.sampled_from(["", "0", "1", "10", "100", "05"]))
def test_json_pointers_equal_checker(value, prefix):
    assert accepts("json-pointer", value) == CHECKER.conforms(value, "json-pointer"), value
    rel = prefix + value
    assert accepts("relative-json-pointer", rel) == CHECKER.conforms(rel, "relative-json-pointer"), rel


# --- sound formats: accepted noise must satisfy the checker ---------------------------------

noise_alphabet = list("abz09-._~:/?#[]@!$&'()*+,;=%AF ")


@FAST
@given(value=st.text(alphabet=st.sampled_from(noise_alphabet), max_size=20), scheme=st.sampled_from(["", "http://", "a:", "//"]))
def test_uri_family_sound(value, scheme):
    text = scheme + value
    for name in ("uri", "uri-reference", "iri", "iri-reference"):
        if has_checker(name) and accepts(name, text):
            assert CHECKER.conforms(text, name), (name, text)


@FAST
@given(value=st.text(alphabet=st.sampled_from(list("ab0-.@_\"[]:")), max_size=16))
def test_hostname_and_email_sound(value):
    if has_checker("hostname") and accepts("hostname", value):
        assert CHECKER.conforms(value, "hostname"), value
    if accepts("email", value):
        assert CHECKER.conforms(value, "email"), value


@FAST
@given(value=st.from_regex(r"P([0-9]{1,2}[YMWD]){0,3}(T([0-9]{1,2}[HMS]){0,3})?", fullmatch=True))
def test_duration_sound(value):
    if has_checker("duration") and accepts("duration", value):
        assert CHECKER.conforms(value, "duration"), value


# --- encodings and policy --------------------------------------------------------------------


def test_format_tokens_accept_json_dumps_spellings_only():
    assert fmt("date").matches(b'"2020-01-01"')
    assert not fmt("date").matches(b'"\\u0032020-01-01"')  # ASCII escapes: not what json.dumps writes
    iri = "https://例え.jp/"
    assert fmt("iri").matches(json.dumps(iri).encode()) and fmt("iri").matches(json.dumps(iri, ensure_ascii=False).encode())
    assert fmt("email").matches(json.dumps('"a b"@c.com').encode())


@pytest.mark.parametrize("name", ["int32", "int64", "byte", "binary", "double", "color", "host-name", "whatever"])
def test_unknown_formats_constrain_nothing(name):
    assert fmt(name).key == compile_regular(scalars.string_schema({}, "#", None)).key


@pytest.mark.parametrize("name", sorted(formats.UNSUPPORTED_FORMATS))
def test_unsupported_formats_raise(name):
    with pytest.raises(UnsupportedSchemaError) as err:
        scalars.string_schema({"format": name}, "#/f", None)
    assert err.value.keyword == "format" and err.value.pointer == "#/f"


def test_format_with_length():
    notes: list[str] = []
    d = compile_regular(scalars.string_schema({"format": "date-time", "maxLength": 23}, "#", None, narrowed=notes.append))
    assert d.matches(b'"2020-01-01T00:00:00.12Z"') and not d.matches(b'"2020-01-01T00:00:00.123Z"')
    assert not notes
