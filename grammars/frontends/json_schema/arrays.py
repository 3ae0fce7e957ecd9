"""Arrays: ``items``/``prefixItems``/``additionalItems``, ``minItems``/``maxItems``, ``contains``,
``uniqueItems`` — merged across a conjunction, then laid out.

Both spellings of tuples are understood: 2020-12 ``prefixItems`` + ``items``, and drafts 4–2019's
array-form ``items`` + ``additionalItems``. Each schema contributes an ``ItemRule`` (its prefix
and what applies after it); element ``i`` must satisfy, for every rule, the rule's prefix entry
``i`` or its rest schema. A ``false`` element schema caps the length there.

``contains`` (``minContains``..``maxContains`` elements match) is an automaton over (index,
matches so far), see ``_contains_body``; ``maxContains`` needs ``not contains`` (``negate``),
several ``contains`` in one conjunction are counted together (up to ``MAX_CONTAINS``). ``uniqueItems: true`` is not
context-free in general and is unsupported unless at most one element is possible.

Counts are bounded (``MAX_COUNTED_ITEMS``, ``MAX_CONTAINS_COUNT``): a larger lower bound raises
``UnsupportedSchemaError`` naming the keyword, a larger upper bound is narrowed and reported.
"""

from __future__ import annotations

from itertools import product
from typing import Any

from grammars.errors import GrammarError
from grammars.frontends.json_schema.conjunction import (
    ARRAY_KEYWORDS,
    ArrayRules,
    Conjunction,
    ItemRule,
    SchemaContext,
    synthetic,
)
from grammars.frontends.json_schema.document import Located, count_keyword
from grammars.frontends.json_schema.values import literal_values
from grammars.ir import NOTHING, Expr, Literal, Ref, Seq, alt, seq

__all__ = ["ARRAY_KEYWORDS", "ItemRule", "ArrayRules", "apply_array_keywords", "array_expr"]

#: ``contains`` schemas counted together in one array (elements claim subsets of them)
MAX_CONTAINS = 3
#: largest ``minItems``/``maxItems`` enforced as written: each counted element is a copy of the
#: element's automaton. A larger ``minItems`` raises; a larger ``maxItems`` is narrowed to it
#: (reported). MaskBench's largest is 1024.
MAX_COUNTED_ITEMS = 1024
#: largest ``minContains``/``maxContains`` enforced as written: each count is a state (an IR
#: rule) of the counting automaton. A larger ``minContains`` raises; a larger ``maxContains`` is
#: narrowed to it (reported).
MAX_CONTAINS_COUNT = 64
#: candidate arrays enumerated for ``uniqueItems`` over finite element sets
MAX_FINITE_ARRAYS = 4096


def _schema(value: Any, keyword: str, where: str) -> None:
    if not isinstance(value, (dict, bool)):
        raise GrammarError(f"malformed schema at {where}: {keyword!r} must be a schema, got {value!r}")


def apply_array_keywords(c: SchemaContext, conj: Conjunction, part: Located, node: dict) -> None:
    """Merge ``node``'s array keywords into ``conj``."""
    if not ARRAY_KEYWORDS.intersection(node):
        return
    rules = conj.arrays
    where = part.where
    if not rules.item_rules and rules.where == "#":
        rules.where = where
    doc = c.document
    items = node.get("items")
    prefix: tuple = ()
    rest: Located | None = None
    if "prefixItems" in node:
        if not isinstance(node["prefixItems"], list):
            raise GrammarError(f"malformed schema at {where}: 'prefixItems' must be an array of schemas")
        prefix = tuple(doc.child(part, s, "prefixItems", str(i)) for i, s in enumerate(node["prefixItems"]))
        if items is not None:
            _schema(items, "items", where)
            rest = doc.child(part, items, "items")
    elif isinstance(items, list):
        prefix = tuple(doc.child(part, s, "items", str(i)) for i, s in enumerate(items))
        if "additionalItems" in node:
            _schema(node["additionalItems"], "additionalItems", where)
            rest = doc.child(part, node["additionalItems"], "additionalItems")
    elif items is not None:
        _schema(items, "items", where)
        rest = doc.child(part, items, "items")
    if rest is not None and (rest.node is True or rest.node == {}):
        rest = None
    if prefix or rest is not None:
        rules.item_rules.append(ItemRule(prefix, rest))
    if "minItems" in node:
        low = _counted(c, count_keyword(node["minItems"], "minItems", where), "minItems", where, MAX_COUNTED_ITEMS, "elements")
        rules.min_items = max(rules.min_items, low)
    if "maxItems" in node:
        high = _counted(c, count_keyword(node["maxItems"], "maxItems", where), "maxItems", where, MAX_COUNTED_ITEMS, "elements")
        rules.max_items = high if rules.max_items is None else min(rules.max_items, high)
    if "contains" in node:
        _schema(node["contains"], "contains", where)
        low = _counted(c, count_keyword(node.get("minContains", 1), "minContains", where), "minContains", where,
                       MAX_CONTAINS_COUNT, "matching elements")
        high = None
        if "maxContains" in node:
            high = _counted(c, count_keyword(node["maxContains"], "maxContains", where), "maxContains", where,
                            MAX_CONTAINS_COUNT, "matching elements")
        rules.contains.append((doc.child(part, node["contains"], "contains"), low, high))
    if "uniqueItems" in node:
        if not isinstance(node["uniqueItems"], bool):
            raise GrammarError(f"malformed schema at {where}: 'uniqueItems' must be a boolean")
        rules.unique = rules.unique or node["uniqueItems"]


def _counted(c: SchemaContext, value: int, keyword: str, where: str, ceiling: int, what: str) -> int:
    """A count keyword's value within ``ceiling``: a larger lower bound (``min*``) cannot be
    enforced and raises ``UnsupportedSchemaError`` (under ``lenient`` it is dropped, reported); a
    larger upper bound (``max*``) is narrowed to the ceiling and reported (the grammar then
    accepts fewer valid arrays, never an invalid one)."""
    if value <= ceiling:
        return value
    if keyword.startswith("min"):
        c.unsupported(keyword, where, f"{keyword} {_shown(value)} needs more than {ceiling} counted {what}")
        return 0
    c.narrowed(f"{where}: {keyword} {_shown(value)} accepted only up to {ceiling} {what}")
    return ceiling


def _shown(value: int) -> str:
    text = str(value)
    return text if len(text) <= 24 else f"{text[:12]}...({len(text)} digits)"


def array_expr(c: SchemaContext, conj: Conjunction) -> Expr:
    """The array branch of a leaf conjunction."""
    rules: ArrayRules = conj.arrays
    lay = c.layout
    low, high = rules.min_items, rules.max_items
    length = max((len(r.prefix) for r in rules.item_rules), default=0)
    positions = []
    for i in range(length):
        expr = c.value([loc for r in rules.item_rules if (loc := r.at(i)) is not None])
        if expr == NOTHING:
            high = i if high is None else min(high, i)
            break
        positions.append(expr)
    rest_parts = [r.rest for r in rules.item_rules if r.rest is not None]
    rest = c.value(rest_parts)
    if rest == NOTHING:
        high = len(positions) if high is None else min(high, len(positions))
    elif _inline_array(rest):
        # the element is written twice (first, then after each comma): an array of arrays
        # inline would double at every level, so a nested array becomes a rule of its own
        rest = c.add_rule(f"{rules.where}@items", rest)
    if high is not None and low > high:
        return NOTHING
    if rules.unique and (high is None or high > 1):
        arrays = _finite_arrays(c, conj, rules, low, high)
        if arrays is not None:
            return literal_values(arrays, lay)
        c.unsupported("uniqueItems", rules.where, "uniqueItems over more than a small finite set of arrays is not context-free")
    contains = _merged_contains(rules.contains)
    if contains:
        body = _contains_body(c, rules, positions, rest_parts, rest, contains, low, high)
        if body is not None:
            return lay.array(body)
    # elements 0..len(positions)-1 are positional, the rest repeat `rest`
    if high is not None and high <= len(positions):
        positions = positions[:high]
        body = lay.end(bool(positions)) if len(positions) >= low else NOTHING
    else:
        count = len(positions)
        body = lay.repeated(rest, max(low - count, 0), None if high is None else high - count, started=count > 0)
    for i in range(len(positions) - 1, -1, -1):
        take = seq([lay.sep(i > 0), positions[i], body])
        stop = lay.end(i > 0) if i >= low else NOTHING
        body = alt([take, stop])
    return lay.array(body)


def _inline_array(expr: Expr) -> bool:
    """Is ``expr`` an array expression written inline (``Layout.array``)?"""
    return isinstance(expr, Seq) and bool(expr.items) and expr.items[0] == Literal("[")


def _finite_values(c, parts: list) -> list | None:
    """The values ``parts`` allow when they are few and known (an enum, or only null/booleans)."""
    conj = c.conjunction(parts)
    if conj.pending or conj.is_empty:
        return None if conj.pending else []
    if conj.enum is not None:
        return c.admitted(conj, c.enum_members(conj.enum), enum_members=True)
    if conj.types <= {"null", "boolean"}:
        return c.admitted(conj, [None, True, False])
    return None


def _finite_arrays(c, conj, rules: ArrayRules, low: int, high: int | None) -> list | None:
    """Every array the conjunction allows, when its length is bounded and each element comes
    from a small finite set (``uniqueItems`` is then a filter); None otherwise."""
    if high is None:
        return None
    length = max((len(r.prefix) for r in rules.item_rules), default=0)
    choices = []
    for i in range(high):
        parts = [loc for r in rules.item_rules if (loc := r.at(i)) is not None] if i < length else [r.rest for r in rules.item_rules if r.rest is not None]
        values = _finite_values(c, parts)
        if values is None:
            return None
        choices.append(values)
    total, count = 0, 1
    for n in range(low, high + 1):
        count = 1
        for values in choices[:n]:
            count *= max(len(values), 1)
        total += count
    if total > MAX_FINITE_ARRAYS:
        return None
    out = []
    for n in range(low, high + 1):
        for array in product(*choices[:n]):
            value = list(array)
            if all(c.satisfies(value, a) for a in conj.atoms):
                out.append(value)
    return out


def _merged_contains(entries: list) -> list:
    """Constraining ``contains`` entries, one per schema (a negation's ``{"corral:all": [S]}`` is
    ``S``): the count ranges of one schema intersect."""
    merged: dict[str, list] = {}
    for loc, lo, hi in entries:
        node = loc.node
        if isinstance(node, dict) and list(node) == ["corral:all"] and len(node["corral:all"]) == 1:
            loc = node["corral:all"][0]
        if loc.pointer in merged:
            entry = merged[loc.pointer]
            entry[1] = max(entry[1], lo)
            entry[2] = hi if entry[2] is None else entry[2] if hi is None else min(entry[2], hi)
        else:
            merged[loc.pointer] = [loc, lo, hi]
    return [tuple(e) for e in merged.values() if e[1] > 0 or e[2] is not None]


def _contains_body(c, rules, positions, rest_parts, rest, contains, low, high) -> Expr | None:
    """Elements counted by each ``contains``: a right-recursive automaton over (index, counts).

    Each element *claims* a set of the ``contains`` schemas it matches: its item schemas, the
    claimed schemas, and ``not S`` for each unclaimed ``S`` that has a ``maxContains`` (an
    element may leave a schema without a maximum unclaimed even if it matches: counting fewer
    matches than there are is harmless when only a minimum is asked, so no negation is needed
    there). Indexes are tracked up to the prefix length, ``minItems`` and ``maxItems``; each
    count up to its ``minContains`` (or ``maxContains`` + 1)."""

    lay = c.layout
    if any(most is not None and k > most for _, k, most in contains):
        return NOTHING
    if len(contains) > MAX_CONTAINS:
        c.unsupported("contains", rules.where, f"more than {MAX_CONTAINS} contains in one conjunction")
        return None
    prefix = [[p for r in rules.item_rules if (p := r.at(i)) is not None] for i in range(len(positions))]
    negated = [synthetic(loc, "not", {"corral:nots": [loc]}, ("not", loc)) if most is not None else None
               for loc, _, most in contains]
    caps = [most + 1 if most is not None else k for _, k, most in contains]
    claims = [tuple(bool(mask >> j & 1) for j in range(len(contains))) for mask in range(1 << len(contains))]
    cache: dict[tuple[int, tuple], Expr] = {}

    def element(i: int, claim: tuple) -> Expr:
        key = (min(i, len(prefix)), claim)
        if key not in cache:
            parts = list(prefix[i] if i < len(prefix) else rest_parts)
            for (loc, _, _), neg, claimed in zip(contains, negated, claim):
                if claimed:
                    parts.append(loc)
                elif neg is not None:
                    parts.append(neg)
            cache[key] = c.value(parts) if parts else c.any_value()
        return cache[key]

    last = high if high is not None else max(low, len(positions), 1)  # index at which the state saturates
    names: dict[tuple[int, tuple], str] = {}
    pending: list[tuple[int, tuple]] = []

    def state(i: int, counts: tuple) -> Expr:
        """The rule of state (index, counts), named now and built by the loop below, so chains of
        states as long as the counts never nest Python calls."""
        key = (i, counts)
        if key not in names:
            names[key] = c.fresh_rule_name(f"{rules.where}@contains{i}.{'.'.join(map(str, counts))}")
            c.rules[names[key]] = NOTHING
            pending.append(key)
        return Ref(names[key])

    def build(i: int, counts: tuple) -> Expr:
        options: list[Expr] = []
        if i >= low and all(n >= k and (most is None or n <= most) for n, (_, k, most) in zip(counts, contains)):
            options.append(lay.end(i > 0))
        if high is None or i < high:
            after = min(i + 1, last) if high is None else i + 1
            for claim in claims:
                new = tuple(min(n + 1, cap) if claimed else n for n, cap, claimed in zip(counts, caps, claim))
                if any(most is not None and n > most for n, (_, _, most) in zip(new, contains)):
                    continue
                item = element(i, claim)
                if item != NOTHING:
                    options.append(seq([lay.sep(i > 0), item, state(after, new)]))
        return alt(options)

    start = state(0, tuple(0 for _ in contains))
    while pending:
        key = pending.pop()
        c.rules[names[key]] = build(*key)
    return start
