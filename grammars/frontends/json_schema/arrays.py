"""Arrays: ``items``/``prefixItems``/``additionalItems``, ``minItems``/``maxItems``, ``contains``,
``uniqueItems`` — merged across a conjunction, then laid out.

Both spellings of tuples are understood: 2020-12 ``prefixItems`` + ``items``, and drafts 4–2019's
array-form ``items`` + ``additionalItems``. Each schema contributes an ``ItemRule`` (its prefix
and what applies after it); element ``i`` must satisfy, for every rule, the rule's prefix entry
``i`` or its rest schema. A ``false`` element schema caps the length there.

``contains`` (at least ``minContains`` elements match) is exact without complements:
``I* (C I*){k}`` where ``C`` is "an item that also matches ``contains``"; supported with no
prefix, no ``maxContains`` and no ``minItems`` above ``minContains``/``maxItems`` (a count bound
would need to know which elements are the matching ones). ``uniqueItems: true`` is not
context-free in general and is unsupported unless at most one element is possible.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from grammars.errors import GrammarError
from grammars.frontends.json_schema.document import Located
from grammars.ir import NOTHING, Expr, alt, repeat, seq

if TYPE_CHECKING:  # pragma: no cover
    from grammars.frontends.json_schema.compiler import Conjunction, SchemaCompiler

__all__ = ["ARRAY_KEYWORDS", "ItemRule", "ArrayRules", "apply_array_keywords", "array_expr"]

ARRAY_KEYWORDS = frozenset(
    {"items", "prefixItems", "additionalItems", "minItems", "maxItems", "contains", "minContains", "maxContains", "uniqueItems"}
)


@dataclass(frozen=True)
class ItemRule:
    prefix: tuple  # Located per leading position
    rest: Located | None  # None: no constraint after the prefix

    def at(self, i: int) -> Located | None:
        return self.prefix[i] if i < len(self.prefix) else self.rest


@dataclass
class ArrayRules:
    item_rules: list = field(default_factory=list)
    min_items: int = 0
    max_items: int | None = None
    contains: list = field(default_factory=list)  # (Located, min, max|None)
    unique: bool = False
    where: str = "#"

    def copy(self) -> "ArrayRules":
        return ArrayRules(list(self.item_rules), self.min_items, self.max_items, list(self.contains), self.unique, self.where)


def _count(value: Any, keyword: str, where: str) -> int:
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise GrammarError(f"malformed schema at {where}: {keyword!r} must be a non-negative integer, got {value!r}")
    return value


def _schema(value: Any, keyword: str, where: str) -> None:
    if not isinstance(value, (dict, bool)):
        raise GrammarError(f"malformed schema at {where}: {keyword!r} must be a schema, got {value!r}")


def apply_array_keywords(c: "SchemaCompiler", conj: "Conjunction", part: Located, node: dict) -> None:
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
        rules.min_items = max(rules.min_items, _count(node["minItems"], "minItems", where))
    if "maxItems" in node:
        high = _count(node["maxItems"], "maxItems", where)
        rules.max_items = high if rules.max_items is None else min(rules.max_items, high)
    if "contains" in node:
        _schema(node["contains"], "contains", where)
        low = _count(node.get("minContains", 1), "minContains", where)
        high = _count(node["maxContains"], "maxContains", where) if "maxContains" in node else None
        rules.contains.append((doc.child(part, node["contains"], "contains"), low, high))
    if "uniqueItems" in node:
        if not isinstance(node["uniqueItems"], bool):
            raise GrammarError(f"malformed schema at {where}: 'uniqueItems' must be a boolean")
        rules.unique = rules.unique or node["uniqueItems"]


def array_expr(c: "SchemaCompiler", conj: "Conjunction") -> Expr:
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
    if high is not None and low > high:
        return NOTHING
    if rules.unique and (high is None or high > 1):
        c.unsupported("uniqueItems", rules.where, "uniqueItems with more than one possible element is not context-free")
    contains = [(loc, lo, hi) for loc, lo, hi in rules.contains if lo > 0 or hi is not None]
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


def _contains_body(c, rules, positions, rest_parts, rest, contains, low, high) -> Expr | None:
    """``I* (C I*){k}`` with separators; None (after reporting) when unsupported."""
    lay = c.layout
    loc, k, most = contains[0]
    if len(contains) > 1 or positions or most is not None or high is not None or low > k:
        c.unsupported("contains", rules.where, "contains with a prefix, maxContains, maxItems, minItems above minContains or several contains")
        return None
    match = c.value([*rest_parts, loc])
    if match == NOTHING:
        return NOTHING
    loop = repeat(seq([lay.comma, rest]))
    tail = seq([loop, lay.ws])  # after the k-th match: any items
    for _ in range(k - 1):
        tail = seq([loop, lay.comma, match, tail])
    # the first element is either a plain item (then more items before the first match) or the first match
    first_plain = seq([rest, loop, lay.comma, match, tail])
    first_match = seq([match, tail])
    return alt([first_plain, first_match])
