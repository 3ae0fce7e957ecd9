"""JSON text layout (where whitespace and separators go) and literal JSON values (``enum``/``const``).

``Layout`` is the one place that knows the whitespace policy. Containers are built as
``"[" ws BODY "]"`` and ``"{" ws BODY "}"`` where ``BODY`` is either empty or members/elements
followed by ``ws``; so an empty container is ``"[" ws "]"`` (one whitespace run, never two in a
row, so each run really is bounded by ``max_whitespace`` and the grammar stays unambiguous).

``literal_value`` gives every JSON text equal to a value under JSON Schema equality: numbers by
value (``1`` = ``1.0`` = ``1e0``, via the scalars module), strings in every escape spelling,
object members in any order (up to ``MAX_PERMUTED_MEMBERS`` members; larger object literals
keep their written order), with the layout's whitespace inside containers. Many values are built as few automata (the
strings as one, many integers as another: ``strings.json_string_values``,
``numbers.integer_texts``), so an enum costs time linear in its size; literals whose automata
would exceed the compiler's ``Limits`` are refused before they are built (``literal_states``).
"""

from __future__ import annotations

import json
from itertools import permutations
from math import factorial
from typing import Any, Callable, Iterable

from grammars.errors import LimitExceeded
from grammars.frontends.json_schema import scalars
from grammars.frontends.json_schema.options import JsonSchemaOptions
from grammars.ir import EMPTY, NOTHING, Expr, Literal, alt, chars, repeat, seq
from grammars.limits import Limits

__all__ = ["Layout", "literal_value", "literal_values", "number_twins", "value_text", "canonical", "json_type", "dedupe", "MAX_PERMUTED_MEMBERS"]

#: JSON's insignificant whitespace (RFC 8259 ``ws``)
WS_CHARS = chars(" \t\n\r")
#: object literals with more members than this keep their written member order
MAX_PERMUTED_MEMBERS = 4


class Layout:
    """Whitespace and punctuation of JSON text under one ``JsonSchemaOptions``."""

    def __init__(self, options: JsonSchemaOptions, integers_by_spelling: bool = False, limits: Limits | None = None):
        #: a number literal is spelled only as its Python type reads (see ``literal_value``)
        self.integers_by_spelling = integers_by_spelling
        #: the compiler's bounds, which literals (``const``, ``enum``, keys) are checked against
        self.limits = limits or Limits()
        flexible = options.whitespace == "flexible" and options.max_whitespace > 0
        self.ws: Expr = repeat(WS_CHARS, 0, options.max_whitespace) if flexible else EMPTY
        self.comma: Expr = seq([self.ws, Literal(","), self.ws])
        self.colon: Expr = seq([self.ws, Literal(":"), self.ws])

    def strings(self, values: tuple[str, ...]) -> Expr:
        """Every JSON string token whose value is one of ``values`` (a key, a string enum).

        Memoised per process (``json_string_values``): the same key met in several objects, or
        in another schema, is one automaton.
        """
        return scalars.json_string_values(values, self.limits)

    def document(self, value: Expr) -> Expr:
        """The whole text: the top value with optional whitespace around it."""
        return seq([self.ws, value, self.ws])

    def array(self, body: Expr) -> Expr:
        return seq([Literal("["), self.ws, body, Literal("]")])

    def object(self, body: Expr) -> Expr:
        return seq([Literal("{"), self.ws, body, Literal("}")])

    def member(self, key: Expr, value: Expr) -> Expr:
        return seq([key, self.colon, value])

    def sep(self, started: bool) -> Expr:
        """What comes before an element: a comma unless it is the first one."""
        return self.comma if started else EMPTY

    def end(self, started: bool) -> Expr:
        """What closes a body: trailing whitespace after at least one element, else nothing."""
        return self.ws if started else EMPTY

    def elements(self, items: Iterable[Expr]) -> Expr:
        """A body of exactly these elements, in order."""
        items = list(items)
        if not items:
            return EMPTY
        out: list[Expr] = []
        for i, item in enumerate(items):
            out.extend([self.sep(i > 0), item])
        out.append(self.ws)
        return seq(out)

    def repeated(self, item: Expr, low: int, high: int | None, *, started: bool = False) -> Expr:
        """A body (or, with ``started``, the rest of one) of ``low..high`` copies of ``item``."""
        if high is not None and high < low:
            return NOTHING
        if item == NOTHING:
            return self.end(started) if low == 0 else NOTHING
        if started:
            return seq([repeat(seq([self.comma, item]), low, high), self.ws])
        if high == 0:
            return EMPTY
        more = seq([item, repeat(seq([self.comma, item]), max(low - 1, 0), None if high is None else high - 1), self.ws])
        return more if low > 0 else alt([more, EMPTY])


# --- values ---------------------------------------------------------------------------------


def json_type(value: Any) -> str:
    """The JSON Schema type of a JSON value (``integer`` for numbers with no fraction)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "integer" if value.is_integer() else "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    return "object"


def canonical(value: Any) -> Any:
    """A hashable key with JSON Schema equality: ``1 == 1.0``, ``true != 1``, key order ignored."""
    if value is None or isinstance(value, str):
        return (json_type(value), value)
    if isinstance(value, bool):
        return ("boolean", value)
    if isinstance(value, float) and value.is_integer():
        return ("number", int(value))
    if isinstance(value, (int, float)):
        return ("number", value)
    if isinstance(value, list):
        return ("array", tuple(canonical(v) for v in value))
    return ("object", frozenset((k, canonical(v)) for k, v in value.items()))


def value_text(value: Any) -> str:
    """A text equal for equal values, except that ``1`` and ``1.0`` differ (draft 4 tells them
    apart; ``canonical`` does not): the JSON text, keys sorted, or for a string (most enum
    members, judged again and again) a quote and its value, unescaped: no other value's JSON
    text starts with a quote, and ``json.dumps`` cost most of a large enum's checks."""
    if type(value) is str:
        return '"' + value
    return json.dumps(value, sort_keys=True)


def dedupe(values: Iterable[Any], key_of: Callable[[Any], Any] = canonical) -> list[Any]:
    """Values without repeats under JSON Schema equality (or ``key_of``), first occurrence kept."""
    seen: set = set()
    out = []
    for value in values:
        key = key_of(value)
        if key not in seen:
            seen.add(key)
            out.append(value)
    return out


#: ``number_twins`` gives a value alone past this many integral numbers in it (fail closed: the
#: other spellings of its numbers are then not accepted).
MAX_TWIN_NUMBERS = 4


def number_twins(value: Any) -> list[Any]:
    """``value`` with each integral number read as an int and as a float, every combination.

    For draft 4, where ``1`` is an integer and ``1.0`` is not, yet both equal an enum's ``1``:
    each twin is checked on its own and spelled as its types read (``Layout.integers_by_spelling``).
    """
    count = _integral_numbers(value)
    if count == 0 or count > MAX_TWIN_NUMBERS:
        return [value]
    return _twins(value)


def _integral_numbers(value: Any) -> int:
    if isinstance(value, bool):
        return 0
    if isinstance(value, int) or (isinstance(value, float) and value.is_integer()):
        return 1
    if isinstance(value, list):
        return sum(_integral_numbers(v) for v in value)
    if isinstance(value, dict):
        return sum(_integral_numbers(v) for v in value.values())
    return 0


def _twins(value: Any) -> list[Any]:
    if isinstance(value, bool):
        return [value]
    if isinstance(value, int):
        return [value, float(value)] if abs(value) < 2**1024 and float(value) == value else [value]
    if isinstance(value, float) and value.is_integer():
        return [int(value), value]
    if isinstance(value, list):
        out: list[list] = [[]]
        for item in value:
            out = [head + [twin] for head in out for twin in _twins(item)]
        return out
    if isinstance(value, dict):
        keyed: list[dict] = [{}]
        for key, item in value.items():
            keyed = [{**head, key: twin} for head in keyed for twin in _twins(item)]
        return keyed
    return [value]


#: an enum with more integers than this builds their texts as one automaton (``_integer_literals``)
BULK_INTEGERS = 16


def literal_values(values: Iterable[Any], layout: Layout) -> Expr:
    """Every JSON text equal to one of ``values``; the strings among them as one automaton, and
    many integers as another (so a large enum costs time linear in its size, not an
    alternative per value for the automaton builder to weigh against every other).

    Under ``layout.integers_by_spelling`` ``1`` and ``1.0`` stay apart: each is spelled only
    as its own type."""
    values = dedupe(values, value_text if layout.integers_by_spelling else canonical)
    strings = tuple(v for v in values if isinstance(v, str))
    rest = [v for v in values if not isinstance(v, str)]
    _check_size([v for v in rest if not _bulk_integer(v)], layout.limits)
    parts: list[Expr] = []
    if len(strings) >= 2:
        parts.append(layout.strings(strings))
    else:
        rest = list(strings) + rest
    integral = [v for v in rest if _bulk_integer(v)]
    if len(integral) > BULK_INTEGERS:
        parts += _integer_literals(integral, layout)
        rest = [v for v in rest if not _bulk_integer(v)]
    return alt([*parts, *(literal_value(v, layout) for v in rest)])


#: estimated automaton states per number and per string character of a literal (the other
#: spellings of each: fractions and exponents, escapes)
STATES_PER_NUMBER = 10
STATES_PER_CHARACTER = 5


def _check_size(values: list, limits: Limits) -> None:
    """Refuse, before any automaton is built, literals whose automata would exceed ``limits``
    (the compiler's): a value's texts need about ``literal_states`` DFA states (its compact text is a
    path of distinct states, and every number and string character brings its other
    spellings), and the alternatives together about as many NFA states. ``LimitExceeded``
    names the limit; the compiler adds the keyword and pointer."""
    total = 0
    for value in values:
        size = literal_states(value)
        if size > limits.max_dfa_states:
            raise LimitExceeded("max_dfa_states", limits.max_dfa_states,
                                f"a value whose texts need about {size} DFA states, more than max_dfa_states="
                                f"{limits.max_dfa_states}")
        total += size
    if total > limits.max_nfa_states:
        raise LimitExceeded("max_nfa_states", limits.max_nfa_states,
                            f"{len(values)} values whose texts need about {total} automaton states, more than "
                            f"max_nfa_states={limits.max_nfa_states}")


def literal_states(value: Any) -> int:
    """About how many automaton states the texts of ``value`` need (see ``_check_size``); an
    object of 2 to ``MAX_PERMUTED_MEMBERS`` members counts once per member order. Post-order
    with explicit stacks: a value may nest deeper than Python's recursion limit."""
    results: list[int] = []  # sizes of finished values, in the order they finished
    stack: list[tuple[Any, bool]] = [(value, False)]
    while stack:
        item, ready = stack.pop()
        children = item if isinstance(item, list) else list(item.values()) if isinstance(item, dict) else []
        if children and not ready:
            stack.append((item, True))
            stack.extend((sub, False) for sub in children)
            continue
        if isinstance(item, str):
            size = STATES_PER_CHARACTER * len(item) + 2
        elif isinstance(item, bool) or item is None:
            size = 5
        elif isinstance(item, (int, float)):
            size = STATES_PER_NUMBER
        else:
            size = 2 * len(item) + 2
            if children:
                size += sum(results[-len(children):])
                del results[-len(children):]
            if isinstance(item, dict):
                size += sum(STATES_PER_CHARACTER * len(key) + 3 for key in item)
                if 1 < len(item) <= MAX_PERMUTED_MEMBERS:
                    size *= factorial(len(item))
        results.append(size)
    return results[0]


def _bulk_integer(value: Any) -> bool:
    """An integer value (an ``int``, or a ``float`` with an integer value) small enough that
    every spelling of it reads as itself (``numbers.EXACT_INTEGERS``)."""
    from grammars.frontends.json_schema.numbers import EXACT_INTEGERS

    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    if isinstance(value, float) and not value.is_integer():
        return False
    return abs(value) <= EXACT_INTEGERS


def _integer_literals(values: list, layout: Layout) -> list[Expr]:
    """The texts of many integer values at once: their integer texts as one automaton and, as
    ``scalars.json_number_value`` spells each value, their fraction and exponent spellings
    (``numbers.integral_spellings``). Under ``integers_by_spelling`` (draft 4) an ``int`` is its
    integer text only and an integral ``float`` its other spellings only."""
    from grammars.frontends.json_schema.numbers import integer_texts, integral_spellings

    ints = [int(v) for v in values if isinstance(v, int)]
    floats = [int(v) for v in values if isinstance(v, float)]
    states = layout.limits.max_dfa_states
    if not layout.integers_by_spelling:
        texts = integer_texts(ints + floats, states)
        return [texts, integral_spellings(texts)]
    parts: list[Expr] = []
    if ints:
        parts.append(integer_texts(ints, states))
    if floats:
        parts.append(integral_spellings(integer_texts(floats, states)))
    return parts


def literal_value(value: Any, layout: Layout) -> Expr:
    """Every JSON text equal to ``value`` (see the module docstring)."""
    if value is None:
        return Literal("null")
    if value is True:
        return Literal("true")
    if value is False:
        return Literal("false")
    if isinstance(value, (int, float)):
        return scalars.json_number_value(value, same_type=layout.integers_by_spelling)
    if isinstance(value, str):
        return layout.strings((value,))
    if isinstance(value, list):
        return layout.array(layout.elements(literal_value(v, layout) for v in value))
    members = [
        layout.member(layout.strings((k,)), literal_value(v, layout)) for k, v in value.items()
    ]
    if 1 < len(members) <= MAX_PERMUTED_MEMBERS:
        return layout.object(alt(layout.elements(order) for order in permutations(members)))
    return layout.object(layout.elements(members))
