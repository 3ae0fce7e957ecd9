"""``format`` values as IR over value characters (``strings.encode_value_language`` adds escapes).

What "valid" means. JSON Schema makes ``format`` an annotation unless a validator opts in; the
validator that labels MaskBench opts in, and its labels agree with Python ``jsonschema`` run with
each draft's ``FORMAT_CHECKER`` and the optional format packages installed (``rfc3339-validator``,
``fqdn``, ``rfc3987``, ``isoduration``, ``jsonpointer``). So every format below accepts a subset of
what the specification allows *and* of what that checker accepts, and rejects the rest:

=======================  ==========================================================================
format                   language (all exact w.r.t. the RFC unless a restriction is listed)
=======================  ==========================================================================
date                     RFC 3339 full-date, years 0001-9999, real month lengths, Feb 29 in leap
                         years only (Gregorian rule on the 4-digit year; year 0000 is refused
                         like Python's ``date``)
time                     RFC 3339 full-time: ``HH:MM:SS[.frac](Z|z|+HH:MM|-HH:MM)``; no leap
                         second ``:60`` (the Python checker refuses it)
date-time                full-date ``T``/``t`` full-time
duration                 RFC 3339 Appendix A ``duration`` ABNF (``P1Y2M``, ``PT1H30M``, ``P2W``)
email                    RFC 5321 Mailbox: dot-atom or quoted-string local part ``@`` domain
                         (LDH labels of 1-63 characters) or ``[IPv4]`` / ``[IPv6:...]`` literal;
                         no length limits on local part / whole domain
idn-email                as email, plus non-ASCII characters in the local part (RFC 6531);
                         the domain stays ASCII (a subset)
hostname                 RFC 1123 labels (LDH, no edge hyphen), dot-separated; a subset of the
                         63-per-label / 253-in-all limits: at most 6 labels of at most 41
                         characters (the exact product needs ~24k DFA states); no trailing dot
ipv4                     dotted quad, 0-255, no leading zeros
ipv6                     RFC 4291 text form (RFC 3986 ``IPv6address``), embedded IPv4 allowed,
                         no zone id
uuid                     ``8-4-4-4-12`` hex digits, either case
uri / uri-reference      RFC 3986 ``URI`` / ``URI-reference``
iri / iri-reference      RFC 3987 ``IRI`` / ``IRI-reference``
json-pointer             RFC 6901
relative-json-pointer    non-negative integer then ``#`` or a JSON pointer; integers containing
                         ``0`` followed by a digit are refused (``10`` yes, ``100`` no: the Python
                         checker's reading); no ``+N``/``-N`` index offsets
=======================  ==========================================================================

``regex`` (ECMA-262 syntax is not regular), ``idn-hostname`` (IDNA 2008 tables) and
``uri-template`` raise ``UnsupportedSchemaError``. Every other name — OpenAPI's ``int32``,
``byte``, ``binary``, draft-03 names such as ``color`` — is unknown to draft 4 and later, which
ignore unknown formats, so ``format_language`` returns ``None`` (no constraint).
"""

from __future__ import annotations

from grammars.ir import EMPTY, Chars, Expr, Literal, alt, chars, repeat, seq

from .numbers import DIGIT, fixed_width_range, natural_range

__all__ = ["KNOWN_FORMATS", "UNSUPPORTED_FORMATS", "format_language"]


def _n(item: Expr, lo: int, hi: int | None = None) -> Expr:
    return repeat(item, lo, lo if hi is None else hi)


def _opt(item: Expr) -> Expr:
    return repeat(item, 0, 1)


def _star(item: Expr) -> Expr:
    return repeat(item, 0, None)


def _plus(item: Expr) -> Expr:
    return repeat(item, 1, None)


_L = Literal
ALPHA = chars(("a", "z"), ("A", "Z"))
HEXDIG = chars(("0", "9"), ("a", "f"), ("A", "F"))
_LDH = chars(("a", "z"), ("A", "Z"), ("0", "9"), "-")
_LET_DIG = chars(("a", "z"), ("A", "Z"), ("0", "9"))


def _two(lo: int, hi: int) -> Expr:
    return fixed_width_range(lo, hi, 2)


# ------------------------------------------------------------------------------------------
# dates and times (RFC 3339)

_YEAR = fixed_width_range(1, 9999, 4)
# two-digit multiples of 4 other than 00
_MULT4 = alt([seq([_L("0"), chars("48")]), seq([chars("2468"), chars("048")]), seq([chars("13579"), chars("26")])])
_LEAP_YEAR = alt([seq([DIGIT, DIGIT, _MULT4]), seq([_MULT4, _L("00")])])
_FULL_DATE = alt(
    [
        seq([_YEAR, _L("-"), alt(_L(m) for m in ("01", "03", "05", "07", "08", "10", "12")), _L("-"), _two(1, 31)]),
        seq([_YEAR, _L("-"), alt(_L(m) for m in ("04", "06", "09", "11")), _L("-"), _two(1, 30)]),
        seq([_YEAR, _L("-02-"), _two(1, 28)]),
        seq([_LEAP_YEAR, _L("-02-29")]),
    ]
)
_PARTIAL_TIME = seq([_two(0, 23), _L(":"), _two(0, 59), _L(":"), _two(0, 59), _opt(seq([_L("."), _plus(DIGIT)]))])
_OFFSET = alt([chars("Zz"), seq([chars("+-"), _two(0, 23), _L(":"), _two(0, 59)])])
_FULL_TIME = seq([_PARTIAL_TIME, _OFFSET])
_DATE_TIME = seq([_FULL_DATE, chars("Tt"), _FULL_TIME])


def _duration() -> Expr:
    num = _plus(DIGIT)

    def unit(u: str, tail: Expr | None = None) -> Expr:
        return seq([num, _L(u)] + ([_opt(tail)] if tail is not None else []))

    second = unit("S")
    minute = unit("M", second)
    hour = unit("H", minute)
    time = seq([_L("T"), alt([hour, minute, second])])
    day = unit("D")
    week = unit("W")
    month = unit("M", day)
    year = unit("Y", month)
    date = seq([alt([day, month, year]), _opt(time)])
    return seq([_L("P"), alt([date, time, week])])


# ------------------------------------------------------------------------------------------
# addresses

_DEC_OCTET = natural_range(0, 255)
IPV4 = seq([_DEC_OCTET, _L("."), _DEC_OCTET, _L("."), _DEC_OCTET, _L("."), _DEC_OCTET])


def _ipv6() -> Expr:
    h16 = _n(HEXDIG, 1, 4)
    h16c = seq([h16, _L(":")])
    ls32 = alt([seq([h16, _L(":"), h16]), IPV4])

    def head(k: int) -> Expr:  # [ *k( h16 ":" ) h16 ]
        return _opt(seq([_n(h16c, 0, k), h16])) if k >= 0 else EMPTY

    forms = [
        seq([_n(h16c, 6), ls32]),
        seq([_L("::"), _n(h16c, 5), ls32]),
        seq([_opt(h16), _L("::"), _n(h16c, 4), ls32]),
        seq([head(1), _L("::"), _n(h16c, 3), ls32]),
        seq([head(2), _L("::"), _n(h16c, 2), ls32]),
        seq([head(3), _L("::"), h16c, ls32]),
        seq([head(4), _L("::"), ls32]),
        seq([head(5), _L("::"), h16]),
        seq([head(6), _L("::")]),
    ]
    return alt(forms)


IPV6 = _ipv6()

_LABEL = seq([_LET_DIG, _opt(seq([_n(_LDH, 0, 61), _LET_DIG]))])
_DOMAIN = seq([_LABEL, _star(seq([_L("."), _LABEL]))])
# RFC 1123 allows 63-character labels and 253 characters in all, but that product needs ~24k DFA
# states; at most 6 labels of at most 41 characters (<= 251 in all) is a subset of ~500 states.
_SHORT_LABEL = seq([_LET_DIG, _opt(seq([_n(_LDH, 0, 39), _LET_DIG]))])
_HOSTNAME = seq([_SHORT_LABEL, _n(seq([_L("."), _SHORT_LABEL]), 0, 5)])


_UUID = seq(
    [_n(HEXDIG, 8), _L("-"), _n(HEXDIG, 4), _L("-"), _n(HEXDIG, 4), _L("-"), _n(HEXDIG, 4), _L("-"), _n(HEXDIG, 12)]
)


def _email(*, international: bool) -> Expr:
    atext = chars(("a", "z"), ("A", "Z"), ("0", "9"), "!#$%&'*+-/=?^_`{|}~")
    qtext = chars((32, 33), (35, 91), (93, 126))
    if international:
        atext = atext.union(Chars(((0x80, 0x10FFFF),)))
        qtext = qtext.union(Chars(((0x80, 0x10FFFF),)))
    dot_string = seq([_plus(atext), _star(seq([_L("."), _plus(atext)]))])
    quoted = seq([_L('"'), _star(alt([qtext, seq([_L("\\"), chars((32, 126))])])), _L('"')])
    local = alt([dot_string, quoted])
    domain = _DOMAIN
    literal = seq([_L("["), alt([IPV4, seq([_L("IPv6:"), IPV6])]), _L("]")])
    return seq([local, _L("@"), alt([domain, literal])])


# ------------------------------------------------------------------------------------------
# URIs (RFC 3986) and IRIs (RFC 3987)

_UCSCHAR = Chars(
    ((0xA0, 0xD7FF), (0xF900, 0xFDCF), (0xFDF0, 0xFFEF))
    + tuple((p * 0x10000, p * 0x10000 + 0xFFFD) for p in range(1, 14))
    + ((0xE1000, 0xEFFFD),)
)
_IPRIVATE = Chars(((0xE000, 0xF8FF), (0xF0000, 0xFFFFD), (0x100000, 0x10FFFD)))


def _uri(*, iri: bool, reference: bool) -> Expr:
    unreserved = chars(("a", "z"), ("A", "Z"), ("0", "9"), "-._~")
    if iri:
        unreserved = unreserved.union(_UCSCHAR)
    sub_delims = chars("!$&'()*+,;=")
    pct = seq([_L("%"), HEXDIG, HEXDIG])
    plain = unreserved.union(sub_delims)
    pchar = alt([plain.union(chars(":@")), pct])
    scheme = seq([ALPHA, _star(chars(("a", "z"), ("A", "Z"), ("0", "9"), "+-."))])
    userinfo = _star(alt([plain.union(chars(":")), pct]))
    ip_future = seq([_L("v"), _plus(HEXDIG), _L("."), _plus(plain.union(chars(":")))])
    ip_literal = seq([_L("["), alt([IPV6, ip_future]), _L("]")])
    reg_name = _star(alt([plain, pct]))
    host = alt([ip_literal, IPV4, reg_name])
    authority = seq([_opt(seq([userinfo, _L("@")])), host, _opt(seq([_L(":"), _star(DIGIT)]))])
    segment = _star(pchar)
    segment_nz = _plus(pchar)
    segment_nz_nc = _plus(alt([plain.union(chars("@")), pct]))
    path_abempty = _star(seq([_L("/"), segment]))
    path_absolute = seq([_L("/"), _opt(seq([segment_nz, path_abempty]))])
    path_rootless = seq([segment_nz, path_abempty])
    path_noscheme = seq([segment_nz_nc, path_abempty])
    query_char = alt([pchar, chars("/?")] + ([_IPRIVATE] if iri else []))
    query = _opt(seq([_L("?"), _star(query_char)]))
    fragment = _opt(seq([_L("#"), _star(alt([pchar, chars("/?")]))]))
    net_path = seq([_L("//"), authority, path_abempty])
    hier = alt([net_path, path_absolute, path_rootless, EMPTY])
    absolute = seq([scheme, _L(":"), hier, query, fragment])
    if not reference:
        return absolute
    relative = seq([alt([net_path, path_absolute, path_noscheme, EMPTY]), query, fragment])
    return alt([absolute, relative])


# ------------------------------------------------------------------------------------------
# JSON pointers

_POINTER_CHAR = alt([chars("/~").complement(), seq([_L("~"), chars("01")])])
JSON_POINTER = _star(seq([_L("/"), _star(_POINTER_CHAR)]))
# Python's checker refuses any digit after a "0": so "0", or [1-9] digits with at most a final 0
_REL_INTEGER = alt([_L("0"), seq([_plus(chars(("1", "9"))), _opt(_L("0"))])])
RELATIVE_JSON_POINTER = seq([_REL_INTEGER, alt([_L("#"), JSON_POINTER])])


# ------------------------------------------------------------------------------------------
# the table

_BUILDERS = {
    "date": lambda: _FULL_DATE,
    "time": lambda: _FULL_TIME,
    "date-time": lambda: _DATE_TIME,
    "duration": _duration,
    "email": lambda: _email(international=False),
    "idn-email": lambda: _email(international=True),
    "hostname": lambda: _HOSTNAME,
    "ipv4": lambda: IPV4,
    "ipv6": lambda: IPV6,
    "uuid": lambda: _UUID,
    "uri": lambda: _uri(iri=False, reference=False),
    "uri-reference": lambda: _uri(iri=False, reference=True),
    "iri": lambda: _uri(iri=True, reference=False),
    "iri-reference": lambda: _uri(iri=True, reference=True),
    "json-pointer": lambda: JSON_POINTER,
    "relative-json-pointer": lambda: RELATIVE_JSON_POINTER,
}

#: formats with an exact (or documented-subset) language
KNOWN_FORMATS = frozenset(_BUILDERS)
#: formats a validator checks but corral cannot enforce exactly, with the reason
UNSUPPORTED_FORMATS = {
    "regex": "ECMA-262 regular expression syntax is not a regular language",
    "idn-hostname": "IDNA 2008 validity (Unicode tables, contextual rules) is not encoded",
    "uri-template": "RFC 6570 templates are not encoded",
}


def format_language(name: str) -> Expr | None:
    """The value language of ``format: name``; ``None`` for a format with no constraint (unknown).

    Raises ``KeyError`` for a name in ``UNSUPPORTED_FORMATS`` (the caller turns it into
    ``UnsupportedSchemaError``).
    """
    if name in UNSUPPORTED_FORMATS:
        raise KeyError(name)
    builder = _BUILDERS.get(name)
    return None if builder is None else builder()
