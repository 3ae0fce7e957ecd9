"""What one JSON value must satisfy: the conjunction, its rule records, and the keyword tables.

The shared vocabulary of the JSON Schema front end. The driver (``compiler``) builds
``Conjunction``s; the keyword families (``objects``, ``arrays``, ``combinators``, ``scalars``)
read and extend them and call back into the driver through ``SchemaContext``, the part of
``SchemaCompiler`` they may use. Depending on this module instead of on ``compiler`` keeps the
front end free of import cycles: ``compiler`` imports the families, never the reverse.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any, Callable, Iterable, Protocol

from grammars.errors import GrammarError
from grammars.frontends.json_schema.document import Located, SchemaDocument
from grammars.frontends.json_schema.options import JsonSchemaOptions
from grammars.frontends.json_schema.values import Layout, canonical, dedupe, json_type
from grammars.ir import Expr

__all__ = [
    "TYPE_NAMES", "ALL_TYPES", "IGNORED_KEYWORDS", "UNSUPPORTED_KEYWORDS", "KEYWORD_DRAFTS", "INTERNAL",
    "OBJECT_KEYWORDS", "ARRAY_KEYWORDS",
    "intersect_types", "parse_type", "value_has_type",
    "KeyRule", "ObjectRules", "ItemRule", "ArrayRules", "Disjunction", "Conjunction",
    "synthetic", "SchemaContext",
]

# --- keyword tables ----------------------------------------------------------------------------

#: JSON types; ``integer`` is the subset of ``number`` with no fractional part
TYPE_NAMES = frozenset({"null", "boolean", "object", "array", "string", "number", "integer"})
ALL_TYPES = frozenset({"null", "boolean", "object", "array", "string", "number"})

#: keywords with no validation meaning (annotations and document structure)
IGNORED_KEYWORDS = frozenset(
    {
        "$schema", "$id", "$anchor", "$dynamicAnchor", "$recursiveAnchor", "$defs", "definitions",
        "$vocabulary", "$comment", "title", "description", "default", "examples", "readOnly",
        "writeOnly", "deprecated", "contentEncoding", "contentMediaType", "contentSchema",
    }
)
#: keywords of some draft that validators enforce and this compiler does not
UNSUPPORTED_KEYWORDS = frozenset(
    {
        "$recursiveRef", "extends",
        "disallow", "divisibleBy",
    }
)
#: keywords a draft does not define are not keywords there: validators ignore them, and so do we
#: (recorded in ``SchemaReport.ignored``). First and last draft (inclusive) defining each.
KEYWORD_DRAFTS = {
    "const": (6, 2020), "contains": (6, 2020), "propertyNames": (6, 2020),
    "if": (7, 2020), "then": (7, 2020), "else": (7, 2020),
    "dependencies": (4, 7), "dependentRequired": (2019, 2020), "dependentSchemas": (2019, 2020),
    "minContains": (2019, 2020), "maxContains": (2019, 2020), "prefixItems": (2020, 2020),
    "$anchor": (2019, 2020), "unevaluatedProperties": (2019, 2020), "unevaluatedItems": (2019, 2020),
    "$recursiveRef": (2019, 2019), "$recursiveAnchor": (2019, 2019), "$dynamicRef": (2020, 2020),
    "$dynamicAnchor": (2020, 2020),
}
#: internal keywords of synthetic schemas (never valid in user schemas: ``:`` is not used by drafts)
INTERNAL = "corral:"
OBJECT_KEYWORDS = frozenset(
    {"properties", "patternProperties", "additionalProperties", "required", "minProperties", "maxProperties", "propertyNames"}
)
ARRAY_KEYWORDS = frozenset(
    {"items", "prefixItems", "additionalItems", "minItems", "maxItems", "contains", "minContains", "maxContains", "uniqueItems"}
)


# --- rule records ------------------------------------------------------------------------------


@dataclass(frozen=True)
class KeyRule:
    """What one schema says about member values, by name."""

    where: str
    properties: dict  # name -> Located
    patterns: tuple  # ((pattern, Located), ...)
    additional: Located | None  # None: keyword absent



@dataclass
class ObjectRules:
    """The object keywords of a conjunction, merged."""

    key_rules: list = field(default_factory=list)
    required: dict = field(default_factory=dict)  # ordered set
    min_properties: int = 0
    max_properties: int | None = None
    property_names: list = field(default_factory=list)
    where: str = "#"

    def copy(self) -> "ObjectRules":
        return ObjectRules(list(self.key_rules), dict(self.required), self.min_properties, self.max_properties,
                           list(self.property_names), self.where)


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


# --- type sets -------------------------------------------------------------------------------


def intersect_types(a: frozenset, b: frozenset) -> frozenset:
    out = set((a & b) - {"number", "integer"})
    a_num, b_num = "number" in a, "number" in b
    if a_num and b_num:
        out.add("number")
    elif (a_num or "integer" in a) and (b_num or "integer" in b):
        out.add("integer")
    return frozenset(out)


def parse_type(value: Any, where: str) -> frozenset:
    names = [value] if isinstance(value, str) else value
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        raise GrammarError(f"malformed schema at {where}: 'type' must be a type name or a list of them, got {value!r}")
    bad = [n for n in names if n not in TYPE_NAMES]
    if bad:
        raise GrammarError(f"malformed schema at {where}: unknown type {bad[0]!r} (expected one of {sorted(TYPE_NAMES)})")
    types = frozenset(names)
    return types - {"integer"} if "number" in types else types


def value_has_type(value: Any, types: frozenset, integers_by_spelling: bool = False) -> bool:
    """Whether ``value`` has one of ``types``; with ``integers_by_spelling`` (draft 4) a float is
    never an integer, as Python reads ``1.0``."""
    t = json_type(value)
    if integers_by_spelling and isinstance(value, float):
        t = "number"
    if t == "integer":
        return "integer" in types or "number" in types
    return t in types


# --- the conjunction -------------------------------------------------------------------------


@dataclass
class Disjunction:
    """Pending alternatives: each branch is a conjunction of parts."""

    keyword: str  # anyOf | oneOf | not | if | dependencies ...
    where: str
    branches: list[tuple[Located, ...]]
    #: for ``not``: the schema whose negation the branches are; the disjunction holds at once for
    #: a conjunction provably disjoint from it (``SchemaCompiler.leaves``)
    negated: Located | None = None


@dataclass
class Conjunction:
    """Everything one value must satisfy, as far as applied so far."""

    types: frozenset = ALL_TYPES
    enum: list | None = None
    #: (keyword, pointer) of the first ``enum``/``const`` in ``enum``, for messages
    enum_source: tuple = ("enum", "#")
    excluded: list = field(default_factory=list)
    string: dict = field(default_factory=dict)
    string_where: str = "#"
    #: keyword -> pointer of the schema whose value of it is in force in ``string`` / ``number``
    #: (a merged conjunction's keywords come from several schemas; messages name the right one)
    string_sources: dict = field(default_factory=dict)
    #: (pattern, pointer of the pattern itself, must match) beyond ``string["pattern"]``
    not_patterns: list = field(default_factory=list)
    number: dict = field(default_factory=dict)
    number_where: str = "#"
    number_sources: dict = field(default_factory=dict)
    objects: ObjectRules = field(default_factory=ObjectRules)
    arrays: ArrayRules = field(default_factory=ArrayRules)
    pending: list = field(default_factory=list)
    atoms: list = field(default_factory=list)  # Located parts, for evaluating concrete values
    applied: set = field(default_factory=set)
    deferred: list = field(default_factory=list)  # (types, keyword, where, reason)
    not_integer: bool = False  # numbers must have a fractional part ("not type integer")

    def copy(self) -> "Conjunction":
        return Conjunction(
            types=self.types,
            enum=None if self.enum is None else list(self.enum),
            enum_source=self.enum_source,
            excluded=list(self.excluded),
            string=dict(self.string),
            string_where=self.string_where,
            string_sources=dict(self.string_sources),
            not_patterns=list(self.not_patterns),
            number=dict(self.number),
            number_where=self.number_where,
            number_sources=dict(self.number_sources),
            objects=self.objects.copy(),
            arrays=self.arrays.copy(),
            pending=list(self.pending),
            atoms=list(self.atoms),
            applied=set(self.applied),
            deferred=list(self.deferred),
            not_integer=self.not_integer,
        )

    @property
    def enum_only(self) -> bool:
        """An ``enum`` (or ``const``) and nothing else: every other constraint as a fresh
        conjunction has it (the atoms and applied schemas aside: they only record the sources)."""
        return self.enum is not None and all(getattr(self, name) == default for name, default in _UNCONSTRAINED)

    def restrict_types(self, types: frozenset) -> None:
        self.types = intersect_types(self.types, types)

    def restrict_enum(self, values: list) -> None:
        if self.enum is None:
            self.enum = dedupe(values)
        else:
            keep = {canonical(v) for v in values}
            self.enum = [v for v in self.enum if canonical(v) in keep]

    @property
    def is_empty(self) -> bool:
        return not self.types or (self.enum is not None and not self.enum)

    @property
    def pattern_site(self) -> str:
        """The pointer of ``string["pattern"]`` itself."""
        return self.string_sources.get("pattern", self.string_where) + "/pattern"


#: (field, value) of every constraint a fresh ``Conjunction`` holds besides its enum (``enum_only``)
_UNCONSTRAINED = tuple((f.name, getattr(Conjunction(), f.name)) for f in fields(Conjunction)
                       if f.name not in ("enum", "enum_source", "atoms", "applied"))


def synthetic(owner: Located, tag: str, node: Any, origin: tuple | None = None) -> Located:
    return Located(node, f"{owner.pointer}!{tag}", owner.base, origin)


# --- what the keyword families may ask of the compiler -----------------------------------------


class SchemaContext(Protocol):
    """The part of ``SchemaCompiler`` the keyword families call back into.

    One document compiled under one set of options: resolve and combine subschemas (``value``,
    ``conjunction``, ``apply``, ``leaves``), decide concrete values (``satisfies``,
    ``admitted``), name IR rules, and report what could not be enforced exactly.
    """

    document: SchemaDocument
    options: JsonSchemaOptions
    layout: Layout
    rules: dict[str, Expr]
    back_references: int
    #: subset states the exact any-order layouts may still take (``objects.object_body``)
    any_order_states_left: int
    disjoint_nesting: int
    #: pattern -> its code-point DFA, memoised by ``combinators``
    pattern_dfas: dict
    #: id(list) -> (list, frozenset of its ``canonical`` values), memoised by ``combinators``
    canonical_sets: dict
    #: (schema pointer, enum known) -> what ``combinators.evaluate`` checks of its values
    value_judges: dict
    #: pointer of an ``anyOf``'s first branch -> the union of its one-enum branches, or None
    enum_unions: dict

    def value(self, parts: Iterable[Located], *, rule: bool = False) -> Expr: ...
    def conjunction(self, parts: Iterable[Located]) -> Conjunction: ...
    def apply(self, conj: Conjunction, part: Located) -> None: ...
    def active_keywords(self, node: dict, part: Located) -> dict: ...
    def leaves(self, conj: Conjunction, budget: list[int] | None = None, origin: Disjunction | None = None) -> list[Conjunction]: ...
    def enum_members(self, enum: list) -> list: ...
    def admitted(self, conj: Conjunction, candidates: Iterable[Any], enum_members: bool = False) -> list: ...
    def satisfies(self, value: Any, part: Located, enum_known: bool = False) -> bool: ...
    def validator(self, pointer: str, node: Any): ...
    def any_value(self) -> Expr: ...
    def string_schema(self, keywords: dict, where: str, sources: dict | None = None,
                      pattern_at: str | None = None) -> Expr: ...
    def string_in(self, value: str, keywords: dict, patterns: list, pattern_site: str = "#/pattern") -> bool: ...
    def fresh_rule_name(self, hint: str) -> str: ...
    def add_rule(self, hint: str, expr: Expr) -> Expr: ...
    def add_recursive_rule(self, hint: str, build: Callable[[Expr], Expr]) -> Expr: ...
    def add_rules(self, hints: list[str], build: Callable[[list[Expr]], list[Expr]]) -> list[Expr]: ...
    def unsupported(self, keyword: str, where: str, reason: str) -> None: ...
    def check_deferred(self, conj: Conjunction) -> None: ...
    def is_unknown(self, key: str) -> bool: ...
    def narrowed(self, note: str) -> None: ...
