"""Boolean structure: ``allOf``/``anyOf``/``oneOf``/``not``/``if``-``then``-``else``/dependencies,
and the regular-language algebra that object keys and strings need (complement, intersection).

Schemas. ``allOf`` applies every branch to the same conjunction. ``anyOf``, ``if``/``then``/
``else`` and the dependency keywords become pending disjunctions (see ``compiler``). ``oneOf`` is
``anyOf`` once every pair of its branches is *provably disjoint* (``provably_disjoint``: different
types, finite value sets that the other branch rejects, a required property the other branch
forbids or constrains to disjoint values, disjoint numeric/length/count ranges); otherwise each
branch is intersected with the negation of the branches it may overlap (``oneOf`` of
``required`` lists: exactly one of the properties), unsupported only when such a negation is.
``not S`` is pushed inward (``negate``): ``S`` is a conjunction of keywords, so
``not S`` is the union of the keywords' negations, and most keywords have a negation in the same
vocabulary (``minimum`` <-> ``exclusiveMaximum``, ``required`` -> that property absent,
``enum`` -> excluded values, ``pattern`` -> a complemented pattern, ``anyOf`` -> ``allOf`` of
negations, ...). Keywords without one are *deferred*: they raise only if the type they
constrain survives in the leaf that needs them. Synthetic schemas use internal keywords
(``corral:nots``, ``corral:all``, ``corral:notIn``, ``corral:notPattern``, ``corral:unsupported``)
and remember their ``origin``, so a concrete value is always judged by ``jsonschema`` on the
real schema (``evaluate``).

``unevaluatedProperties``/``unevaluatedItems`` become ordinary key and item rules: what is
evaluated is static up to *conditions* (an ``anyOf``/``oneOf`` branch or ``if`` that holds, a
``dependentSchemas`` name that is present), so the keyword is a disjunction over sets of
conditions (``apply_unevaluated``); ``contains`` sources make matching items evaluated.

Languages. Patterns (JSON Schema ``pattern`` semantics: matches anywhere) become code-point
DFAs with interval transitions; keys allowed in a ``patternProperties`` region ("matches these
patterns, not those, and is not a declared name") are a product of such DFAs, encoded as JSON
string bodies by the strings module (which owns escaping) and handed to the scalars module's
``string_schema`` as the pattern. The same path serves strings under ``not: {pattern}`` and two
patterns in one conjunction; the string leaves of a disjunction over patterns are united there
too (``merge_string_leaves``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from grammars.automata.byte_dfa import ByteDFA, intersect, shared_regular
from grammars.automata.codepoint import CodePointDFA
from grammars.errors import (
    GrammarError,
    LimitExceeded,
    UnsupportedGrammarError,
    UnsupportedSchemaError,
)
from grammars.frontends.json_schema import scalars
from grammars.frontends.json_schema.conjunction import (
    IGNORED_KEYWORDS,
    UNSUPPORTED_KEYWORDS,
    Conjunction,
    Disjunction,
    ItemRule,
    KeyRule,
    ObjectRules,
    SchemaContext,
    intersect_types,
    parse_type,
    synthetic,
)
from grammars.frontends.json_schema.document import Located, count_keyword, escape_token
from grammars.frontends.json_schema.strings import encode_value_automaton, string_token
from grammars.frontends.json_schema.validation import check_negation
from grammars.frontends.json_schema.values import canonical, json_type
from grammars.ir import NOTHING, Expr

__all__ = [
    "apply_all_of", "apply_any_of", "apply_one_of", "apply_not", "apply_if", "ignore_branch",
    "apply_dependencies", "apply_dependent_required", "apply_dependent_schemas", "apply_internal",
    "apply_unevaluated_properties", "apply_unevaluated_items",
    "negate", "evaluate", "overlapping_pairs", "apply_negations", "provably_disjoint", "pattern_search",
    "pattern_strings",
    "add_pattern", "restricted_string", "merge_string_leaves", "key_regions", "member_parts",
]

ALL_TYPES = ("null", "boolean", "object", "array", "string", "number")
FORBIDDEN: dict = {"not": {}}  # a schema no value satisfies, valid in every draft (unlike `false` in draft 4)
#: branches of a ``oneOf`` whose negation is built (it has a piece per pair of branches)
MAX_NEGATED_ONE_OF = 6
#: patternProperties regions are 2**patterns; more patterns than this in one object is unsupported
MAX_KEY_PATTERNS = 6
_STRING_ONLY = frozenset({"string"})


def _schema_list(value: Any, keyword: str, where: str) -> list:
    if not isinstance(value, list) or not value:
        raise GrammarError(f"malformed schema at {where}: {keyword!r} must be a non-empty array of schemas, got {value!r}")
    return value


def _is_true(node: Any) -> bool:
    return node is True or node == {}


# --- keyword handlers ---------------------------------------------------------------------------


def apply_all_of(c: SchemaContext, conj: Conjunction, part: Located, value: Any) -> None:
    for i, sub in enumerate(_schema_list(value, "allOf", part.where)):
        c.apply(conj, c.document.child(part, sub, "allOf", str(i)))


def apply_any_of(c: SchemaContext, conj: Conjunction, part: Located, value: Any) -> None:
    subs = _schema_list(value, "anyOf", part.where)
    if any(_is_true(s) for s in subs):
        return
    branches = [_any_of_branch(c, part, subs, i) for i in range(len(subs))]
    if not _apply_enum_union(c, conj, branches):
        _disjunction(conj, "anyOf", part.where, [(b,) for b in branches])


def _any_of_branch(c: SchemaContext, part: Located, subs: list, i: int) -> Located:
    """Branch ``i`` of ``part``'s ``anyOf`` (its pointer keys ``SchemaContext.enum_unions``)."""
    return c.document.child(part, subs[i], "anyOf", str(i))


def _apply_enum_union(c: SchemaContext, conj: Conjunction, branches: list[Located]) -> bool:
    """An ``anyOf`` whose every branch is an ``enum`` or ``const`` and nothing else (annotations
    and unknown keywords aside) admits exactly the union of their values: applied as that one
    enum, not as a disjunction whose leaves each copy the rest of the conjunction (an object's
    ``anyOf`` of 240 one-value enums met by 240 patterns made 57,600 leaves). Returns whether it
    applied; the branches are applied as usual (to a scratch conjunction), so what they report
    (ignored keywords, malformed values) is reported the same."""
    key = branches[0].pointer  # ``_schema_list``: an anyOf has a branch
    if key not in c.enum_unions:  # an object's member schema is applied once per leaf of the object
        c.enum_unions[key] = _enum_union(c, branches)
    values = c.enum_unions[key]
    if values is None:
        return False
    if conj.enum is None:
        conj.enum_source = ("anyOf", branches[0].where.rsplit("/", 1)[0])
    conj.restrict_enum(values)
    return True


def _enum_union(c: SchemaContext, branches: list[Located]) -> list | None:
    """The values of ``branches`` when each is only an enum or const (see ``_apply_enum_union``)."""
    if len(branches) < 2 or not all(
        isinstance(b.node, dict) and ("enum" in b.node or "const" in b.node)
        and all(k in ("enum", "const") or k in IGNORED_KEYWORDS or c.is_unknown(k) for k in b.node)
        for b in branches
    ):
        return None
    values: list = []
    for branch in branches:
        scratch = Conjunction()
        c.apply(scratch, branch)
        if not scratch.enum_only:
            return None
        values += scratch.enum  # type: ignore[operator]  # enum_only: a list
    return values


def apply_one_of(c: SchemaContext, conj: Conjunction, part: Located, value: Any) -> None:
    subs = _schema_list(value, "oneOf", part.where)
    branches = [c.document.child(part, s, "oneOf", str(i)) for i, s in enumerate(subs)]
    for branch in branches:  # a branch may be negated (overlapping branches): it must not be the holder
        check_negation(c.document, part, "oneOf", branch)
    _disjunction(conj, "oneOf", part.where, [(b,) for b in branches])


def _disjunction(conj: Conjunction, keyword: str, where: str, branches: list, negated: Located | None = None) -> None:

    if not branches:
        conj.types = frozenset()
    else:
        conj.pending.append(Disjunction(keyword, where, branches, negated))


def apply_not(c: SchemaContext, conj: Conjunction, part: Located, value: Any) -> None:
    sub = c.document.child(part, value, "not")
    check_negation(c.document, part, "not", sub)
    _apply_negation(c, conj, sub, part.where)


def _apply_negation(c: SchemaContext, conj: Conjunction, sub: Located, where: str) -> None:
    alternatives = negate(c, sub)
    if not alternatives:
        conj.types = frozenset()
    elif len(alternatives) == 1:
        c.apply(conj, alternatives[0])
    else:
        _disjunction(conj, "not", where, [(a,) for a in alternatives], negated=sub)


def apply_if(c: SchemaContext, conj: Conjunction, part: Located, value: Any) -> None:
    node = c.active_keywords(part.node, part)
    if "then" not in node and "else" not in node:
        return  # `if` alone constrains nothing
    doc = c.document
    cond = doc.child(part, value, "if")
    then = doc.child(part, node.get("then", True), "then")
    other = doc.child(part, node.get("else", True), "else")
    if _is_true(value):
        c.apply(conj, then)
        return
    if value is False:
        c.apply(conj, other)
        return
    check_negation(c.document, part, "if", cond)
    negated = synthetic(cond, "not", {"corral:nots": [cond]}, ("not", cond))
    _disjunction(conj, "if", part.where, [(cond, then), (negated, other)])


def ignore_branch(c: SchemaContext, conj: Conjunction, part: Located, value: Any) -> None:
    """``then``/``else`` act through ``if`` (and mean nothing without it)."""


def apply_dependencies(c: SchemaContext, conj: Conjunction, part: Located, value: Any) -> None:
    if not isinstance(value, dict):
        raise GrammarError(f"malformed schema at {part.where}: 'dependencies' must be an object, got {value!r}")
    for name, dep in value.items():
        if isinstance(dep, list):
            _dependent_required(c, conj, part, "dependencies", name, dep)
        elif isinstance(dep, (dict, bool)):
            _dependent_schema(c, conj, part, "dependencies", name, dep)
        else:
            raise GrammarError(f"malformed schema at {part.where}: dependency {name!r} must be an array or a schema")


def apply_dependent_required(c: SchemaContext, conj: Conjunction, part: Located, value: Any) -> None:
    if not isinstance(value, dict):
        raise GrammarError(f"malformed schema at {part.where}: 'dependentRequired' must be an object, got {value!r}")
    for name, dep in value.items():
        _dependent_required(c, conj, part, "dependentRequired", name, dep)


def apply_dependent_schemas(c: SchemaContext, conj: Conjunction, part: Located, value: Any) -> None:
    if not isinstance(value, dict):
        raise GrammarError(f"malformed schema at {part.where}: 'dependentSchemas' must be an object, got {value!r}")
    for name, dep in value.items():
        _dependent_schema(c, conj, part, "dependentSchemas", name, dep)


def _dependent_required(c, conj, part: Located, keyword: str, name: str, names: Any) -> None:
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        raise GrammarError(f"malformed schema at {part.where}: {keyword}[{name!r}] must be an array of strings")
    if not names:
        return
    tag = f"{keyword}/{escape_token(name)}"
    absent = synthetic(part, tag + "/absent", {"properties": {name: FORBIDDEN}})
    present = synthetic(part, tag + "/present", {"type": "object", "required": [name, *names]})
    _disjunction(conj, keyword, part.where, [(absent,), (present,)])


def _dependent_schema(c, conj, part: Located, keyword: str, name: str, schema: Any) -> None:
    if _is_true(schema):
        return
    tag = f"{keyword}/{escape_token(name)}"
    absent = synthetic(part, tag + "/absent", {"properties": {name: FORBIDDEN}})
    present = synthetic(part, tag + "/present", {"type": "object", "required": [name]})
    _disjunction(conj, keyword, part.where, [(absent,), (present, c.document.child(part, schema, keyword, name))])


def apply_internal(c: SchemaContext, conj: Conjunction, part: Located, key: str, value: Any) -> None:
    """Internal keywords of synthetic schemas (see the module docstring)."""
    if key == "corral:nots":
        for sub in value:
            _apply_negation(c, conj, sub, part.where)
    elif key == "corral:all":
        for sub in value:
            c.apply(conj, sub)
    elif key == "corral:notIn":
        conj.excluded.extend(value)
    elif key == "corral:notPattern":
        conj.not_patterns.extend((p, site, False) for p, site in value)
    elif key == "corral:unsupported":
        for keyword, where, reason, types in value:
            conj.deferred.append((frozenset(types or ALL_TYPES), keyword, where, reason))
    elif key == "corral:notInteger":
        conj.not_integer = True
    elif key == "corral:any":
        _disjunction(conj, "anyOf", part.where, [tuple(branch) for branch in value])
    elif key in ("corral:unevaluatedProperties", "corral:unevaluatedItems"):
        _apply_unevaluated_rule(c, conj, part, key, value)
    else:  # pragma: no cover - only this module writes internal keywords
        raise GrammarError(f"unknown internal keyword {key!r}")


# --- unevaluatedProperties / unevaluatedItems ------------------------------------------------------

#: distinct conditional annotation sources (branches of anyOf/oneOf, if, ...) one holder may have
MAX_UNEVALUATED_CONDITIONS = 6


@dataclass(frozen=True)
class _Evaluated:
    """What a set of annotation sources evaluates: names and patterns (objects), a prefix length
    and ``contains`` schemas (arrays), or everything."""

    names: frozenset = frozenset()
    patterns: tuple = ()
    prefix: int = 0
    contains: tuple = ()
    everything: bool = False

    def __or__(self, other: "_Evaluated") -> "_Evaluated":
        return _Evaluated(self.names | other.names, tuple(dict.fromkeys(self.patterns + other.patterns)),
                          max(self.prefix, other.prefix), tuple(dict.fromkeys(self.contains + other.contains)),
                          self.everything or other.everything)


def apply_unevaluated(c: SchemaContext, conj: Conjunction, part: Located, value: Any, keyword: str) -> None:
    """``unevaluatedProperties``/``unevaluatedItems``: ordinary keywords, per set of annotation sources.

    What is evaluated is known statically up to *conditions*: an ``anyOf``/``oneOf`` branch or
    an ``if`` that holds, a ``dependentSchemas`` name that is present. With ``E(T)`` what the
    unconditional sources plus the sources under the conditions ``T`` evaluate, the keyword is
    exactly ``OR over T of (all conditions in T hold AND additionalProperties-like rule over
    E(T))``: a disjunct needs only conditions that really hold, and more holding conditions
    only weaken the rule, so the disjunct of the conditions that hold decides. ``contains``
    sources make an item evaluated when it matches them (unevaluated items must match
    ``contains`` or the keyword's schema)."""
    if _is_true(value):
        return
    items = keyword == "unevaluatedItems"
    sources: list[tuple[tuple, _Evaluated]] = []
    _annotation_sources(c, part, (), sources, items, {part.pointer}, top=True)
    static = _Evaluated()
    chains: dict[tuple, _Evaluated] = {}
    for chain, evaluated in sources:
        if chain:
            chains[chain] = chains.get(chain, _Evaluated()) | evaluated
        else:
            static = static | evaluated
    if static.everything:
        return
    chains = {ch: e for ch, e in chains.items() if (static | e) != static}
    if len(chains) > MAX_UNEVALUATED_CONDITIONS:
        raise UnsupportedSchemaError(keyword, part.where, f"more than {MAX_UNEVALUATED_CONDITIONS} conditional sources of evaluated {'items' if items else 'properties'}")
    rest = c.document.child(part, value, keyword)
    order = list(chains)
    kept: list[tuple[int, _Evaluated]] = []
    branches: list[tuple] = []
    for mask in range(1 << len(order)):  # by increasing subset
        chosen = [order[i] for i in range(len(order)) if mask >> i & 1]
        conditions = tuple(dict.fromkeys(loc for chain in chosen for loc in chain))
        held = {loc.pointer for loc in conditions}
        if any(not mask >> j & 1 and all(loc.pointer in held for loc in chain) for j, chain in enumerate(order)):
            continue  # a chain these conditions imply is left out: the subset with it is weaker and visited too
        if _two_one_of_branches(held):
            continue  # contradicts the oneOf that holds them: an empty disjunct
        evaluated = static
        for chain in chosen:
            evaluated = evaluated | chains[chain]
        if any(seen & mask == seen and e == evaluated for seen, e in kept):
            continue  # a subset with the same evaluated set already covers it
        kept.append((mask, evaluated))
        rule = () if evaluated.everything else (_unevaluated_rule(part, mask, rest, evaluated, items),)
        branches.append(conditions + rule)
    if len(branches) == 1:
        for loc in branches[0]:
            c.apply(conj, loc)
    else:
        _disjunction(conj, keyword, part.where, branches)


def _two_one_of_branches(pointers: set) -> bool:
    """Do ``pointers`` hold two branches of one ``oneOf`` (``.../oneOf/i`` and ``.../oneOf/j``)?"""
    owners = [p.rsplit("/", 1)[0] for p in pointers if p.rsplit("/", 1)[0].endswith("/oneOf")]
    return len(owners) != len(set(owners))


def _unevaluated_rule(part: Located, mask: int, rest: Located, evaluated: _Evaluated, items: bool) -> Located:
    """A synthetic schema: what is not in ``evaluated`` must satisfy ``rest``."""
    keyword = "corral:unevaluatedItems" if items else "corral:unevaluatedProperties"
    return synthetic(part, f"unevaluated{mask}", {keyword: (evaluated, rest)})


def _annotation_sources(c: SchemaContext, part: Located, chain: tuple, out: list, items: bool,
                        visited: set, top: bool = False) -> None:
    """Append ``(conditions, _Evaluated)`` for ``part`` and its in-place subschemas."""
    node = part.node
    if not isinstance(node, dict):
        return
    doc = c.document
    node = c.active_keywords(node, part)
    if "$recursiveRef" in node:
        raise UnsupportedSchemaError("unevaluatedItems" if items else "unevaluatedProperties", part.where,
                                     "evaluated locations through $recursiveRef are not supported")
    own = _own_evaluated(c, part, node, items, top)
    if own != _Evaluated():
        out.append((chain, own))
    if own.everything:
        return

    def walk(sub: Located, sub_chain: tuple) -> None:
        if sub.pointer in visited:
            return
        visited.add(sub.pointer)
        _annotation_sources(c, sub, sub_chain, out, items, visited)
        visited.discard(sub.pointer)

    if "$ref" in node:
        walk(doc.resolve(node["$ref"], part), chain)
        if doc.dialect.ref_overrides_siblings:
            return
    if "$dynamicRef" in node:
        walk(doc.resolve_dynamic(node["$dynamicRef"], part), chain)
    for i, sub in enumerate(node.get("allOf") or ()):
        walk(doc.child(part, sub, "allOf", str(i)), chain)
    for keyword in ("anyOf", "oneOf"):
        for i, sub in enumerate(node.get(keyword) or ()):
            branch = doc.child(part, sub, keyword, str(i))
            walk(branch, chain + (branch,))
    if "if" in node:
        cond = doc.child(part, node["if"], "if")
        holds = chain + ((cond,) if not _is_true(cond.node) else ())
        if cond.node is not False:
            walk(cond, holds)
            if "then" in node:
                walk(doc.child(part, node["then"], "then"), holds)
        if "else" in node and not _is_true(cond.node):
            fails = chain + ((synthetic(cond, "not", {"corral:nots": [cond]}, ("not", cond)),) if cond.node is not False else ())
            walk(doc.child(part, node["else"], "else"), fails)
    if not items and isinstance(node.get("dependentSchemas"), dict):
        for name, sub in node["dependentSchemas"].items():
            tag = f"dependentSchemas/{escape_token(name)}"
            present = synthetic(part, tag + "/present", {"type": "object", "required": [name]})
            child = doc.child(part, sub, "dependentSchemas", name)
            walk(child, chain + (present, child))


def _own_evaluated(c: SchemaContext, part: Located, node: dict, items: bool, top: bool) -> _Evaluated:
    """What ``node``'s own keywords evaluate (an inner ``unevaluated*`` evaluates everything)."""
    if items:
        if "items" in node and not (isinstance(node["items"], list) and int(c.document.dialect) < 2020):
            return _Evaluated(everything=True)
        if isinstance(node.get("items"), list):  # drafts before 2020-12: array-form items
            if "additionalItems" in node:
                return _Evaluated(everything=True)
            prefix = len(node["items"])
        else:
            prefix = len(node["prefixItems"]) if isinstance(node.get("prefixItems"), list) else 0
        if "unevaluatedItems" in node and not top:
            return _Evaluated(everything=True)
        contains = (c.document.child(part, node["contains"], "contains"),) if "contains" in node else ()
        return _Evaluated(prefix=prefix, contains=contains)
    if "additionalProperties" in node or ("unevaluatedProperties" in node and not top):
        return _Evaluated(everything=True)
    names = frozenset(node["properties"]) if isinstance(node.get("properties"), dict) else frozenset()
    patterns = tuple(node["patternProperties"]) if isinstance(node.get("patternProperties"), dict) else ()
    return _Evaluated(names=names, patterns=patterns)


def apply_unevaluated_properties(c: SchemaContext, conj: Conjunction, part: Located, value: Any) -> None:
    apply_unevaluated(c, conj, part, value, "unevaluatedProperties")


def apply_unevaluated_items(c: SchemaContext, conj: Conjunction, part: Located, value: Any) -> None:
    apply_unevaluated(c, conj, part, value, "unevaluatedItems")


def _apply_unevaluated_rule(c: SchemaContext, conj: Conjunction, part: Located, key: str, value: tuple) -> None:
    """The synthetic rule of ``_unevaluated_rule``, as an ordinary key or item rule."""

    evaluated, rest = value
    anything = Located(True, part.pointer + "/true", part.base)
    if key == "corral:unevaluatedProperties":
        if not conj.objects.key_rules and not conj.objects.required and conj.objects.where == "#":
            conj.objects.where = part.where
        conj.objects.key_rules.append(KeyRule(part.where, {name: anything for name in sorted(evaluated.names)},
                                              tuple((p, anything) for p in evaluated.patterns), rest))
        return
    after = rest
    if evaluated.contains:
        after = synthetic(part, "uneval-item", {"corral:any": [(s,) for s in evaluated.contains] + [(rest,)]})
    if not conj.arrays.item_rules and conj.arrays.where == "#":
        conj.arrays.where = part.where
    conj.arrays.item_rules.append(ItemRule((anything,) * evaluated.prefix, after))


# --- negation -------------------------------------------------------------------------------------

_NEGATED_BOUND = {"minimum": "exclusiveMaximum", "maximum": "exclusiveMinimum",
                  "exclusiveMinimum": "maximum", "exclusiveMaximum": "minimum"}
_COUNTS = {"minLength": ("string", "maxLength"), "maxLength": ("string", "minLength"),
           "minItems": ("array", "maxItems"), "maxItems": ("array", "minItems"),
           "minProperties": ("object", "maxProperties"), "maxProperties": ("object", "minProperties")}
_TYPE_OF_KEYWORD = {
    "multipleOf": "number", "additionalProperties": "object", "patternProperties": "object",
    "propertyNames": "object", "dependencies": "object", "dependentRequired": "object",
    "dependentSchemas": "object", "prefixItems": "array", "additionalItems": "array",
    "contains": "array", "minContains": "array", "maxContains": "array", "uniqueItems": "array",
    "unevaluatedProperties": "object", "unevaluatedItems": "array",
}


def negate(c: SchemaContext, sub: Located) -> list[Located]:
    """Schemas whose union is "not ``sub``" (empty list: nothing; may contain real schemas)."""
    node = sub.node
    if _is_true(node):
        return []
    if node is False:
        return [synthetic(sub, "not", True, ("not", sub))]
    if not isinstance(node, dict):
        raise GrammarError(f"malformed schema at {sub.where}: a schema must be an object or a boolean")
    where = sub.where
    doc = c.document
    node = c.active_keywords(node, sub)
    pieces: list = []
    if "$ref" in node:
        pieces.extend(negate(c, doc.resolve(node["$ref"], sub)))
        if doc.dialect.ref_overrides_siblings:
            return pieces
    if "$dynamicRef" in node:
        pieces.extend(negate(c, doc.resolve_dynamic(node["$dynamicRef"], sub)))
    numbers = scalars.normalized_number_keywords(node, where)
    for key, value in numbers.items():
        if key in _NEGATED_BOUND:
            pieces.append({"type": "number", _NEGATED_BOUND[key]: value})
    for key, value in node.items():
        if key in ("$ref", "$dynamicRef", "then", "else") or key in IGNORED_KEYWORDS or key in _NEGATED_BOUND:
            continue
        if key == "format" and not c.options.format_assertion:
            continue  # an annotation: constrains nothing
        if key in ("unevaluatedProperties", "unevaluatedItems", "additionalProperties", "propertyNames") and _is_true(value):
            continue  # constrains nothing
        if key == "patternProperties" and isinstance(value, dict) and all(_is_true(v) for v in value.values()):
            continue  # constrains nothing
        if key == "type":
            pieces.extend(_negate_type(parse_type(value, where), where))
        elif key == "enum":
            pieces.append({"corral:notIn": list(value)})
        elif key == "const":
            pieces.append({"corral:notIn": [value]})
        elif key in _COUNTS:
            kind, opposite = _COUNTS[key]
            if key.startswith("min"):
                if value > 0:
                    pieces.append({"type": kind, opposite: value - 1})
            else:
                pieces.append({"type": kind, opposite: value + 1})
        elif key == "pattern":
            pieces.append({"type": "string", "corral:notPattern": [(value, f"{where}/pattern")]})
        elif key == "required":
            pieces.extend({"type": "object", "properties": {name: FORBIDDEN}} for name in value)
        elif key == "properties" and isinstance(value, dict):
            for name, s in value.items():
                if not _is_true(s):
                    inner = doc.child(sub, s, "properties", name)
                    pieces.append({"type": "object", "required": [name], "properties": {name: {"corral:nots": [inner]}}})
        elif key == "items" and isinstance(value, (dict, bool)) and "prefixItems" not in node:
            if not _is_true(value):
                pieces.append({"type": "array", "contains": {"corral:nots": [doc.child(sub, value, "items")]}})
        elif key == "prefixItems" and isinstance(value, list) and "items" not in node:
            for i, s in enumerate(value):  # some element i exists and fails its prefix schema
                if not _is_true(s):
                    inner = doc.child(sub, s, "prefixItems", str(i))
                    pieces.append({"type": "array", "minItems": i + 1, "prefixItems": [True] * i + [{"corral:nots": [inner]}]})
        elif key == "contains" and isinstance(value, (dict, bool)):
            pieces.extend(_negate_contains(doc.child(sub, value, "contains"), node))
        elif key in ("minContains", "maxContains") and "contains" in node:
            continue
        elif key == "allOf":
            pieces.extend({"corral:nots": [doc.child(sub, s, "allOf", str(i))]} for i, s in enumerate(value))
        elif key == "anyOf":
            pieces.append({"corral:nots": [doc.child(sub, s, "anyOf", str(i)) for i, s in enumerate(value)]})
        elif key == "oneOf" and isinstance(value, list) and len(value) <= MAX_NEGATED_ONE_OF and not _refers_back(c, sub):
            branches = [doc.child(sub, s, "oneOf", str(i)) for i, s in enumerate(value)]
            pieces.append({"corral:nots": branches})  # no branch holds, or two do
            pieces.extend({"corral:all": [a, b]} for i, a in enumerate(branches) for b in branches[i + 1:])
        elif key == "not":
            pieces.append(doc.child(sub, value, "not"))
        elif key == "if":
            cond = doc.child(sub, value, "if")
            if "then" in node:
                pieces.append({"corral:all": [cond], "corral:nots": [doc.child(sub, node["then"], "then")]})
            if "else" in node:
                pieces.append({"corral:nots": [cond, doc.child(sub, node["else"], "else")]})
        elif key == "corral:nots":
            pieces.extend(value)
        elif key == "corral:all":
            pieces.extend({"corral:nots": [s]} for s in value)
        elif key == "corral:notIn":
            pieces.append({"enum": list(value)})
        elif key == "corral:notInteger":
            pieces.append({"type": "integer"})
        elif key == "corral:notPattern":
            pieces.extend({"type": "string", "pattern": p} for p, _ in value)
        elif key in scalars.STRING_KEYWORDS or key in scalars.NUMBER_KEYWORDS or key in _TYPE_OF_KEYWORD or key in (
            "items", "properties", "oneOf", "corral:unsupported", "unevaluatedProperties", "unevaluatedItems",
            "corral:any", "corral:unevaluatedProperties", "corral:unevaluatedItems") or key in UNSUPPORTED_KEYWORDS:
            kind = "string" if key in scalars.STRING_KEYWORDS else "number" if key in scalars.NUMBER_KEYWORDS else _TYPE_OF_KEYWORD.get(key)
            reason = f"'not' over {key!r} is not supported"
            pieces.append({"corral:unsupported": [(key, where, reason, [kind] if kind else None)], **({"type": kind} if kind else {})})
        # anything else is an annotation or unknown: it constrains nothing, so its negation is empty
    out: list[Located] = []
    for i, piece in enumerate(pieces):
        if isinstance(piece, Located):
            out.append(piece)
        else:
            out.append(synthetic(sub, f"not{i}", piece, ("not", sub)))
    return out


def _refers_back(c: SchemaContext, start: Located, limit: int = 200) -> bool:
    """Do ``start``'s references lead back into it (or its ancestors), or too far to tell?
    Negating a ``oneOf`` pairs its branches; through a recursive reference that builds a
    grammar far too large, so such a ``oneOf`` is left unnegated (unsupported)."""
    doc = c.document
    seen: set[str] = set()
    todo = [start]
    while todo:
        loc = todo.pop()
        if loc.pointer in seen:
            continue
        seen.add(loc.pointer)
        if len(seen) > limit:
            return True
        node = loc.node
        if isinstance(node, dict):
            for key, value in node.items():
                if key in ("enum", "const", "default", "examples"):
                    continue
                if key in ("$ref", "$dynamicRef") and isinstance(value, str):
                    try:
                        target = (doc.resolve if key == "$ref" else doc.resolve_dynamic)(value, loc)
                    except GrammarError:
                        return True
                    if start.pointer == target.pointer or start.pointer.startswith(target.pointer.rstrip("/") + "/") or target.pointer == "#":
                        return True
                    todo.append(target)
                elif isinstance(value, (dict, list)):
                    todo.append(doc.child(loc, value, key))
        elif isinstance(node, list):
            todo.extend(doc.child(loc, item, str(i)) for i, item in enumerate(node) if isinstance(item, (dict, list)))
    return False


def _negate_contains(inner: Located, node: dict) -> list[dict]:
    """Arrays whose count of elements matching ``inner`` is outside [minContains, maxContains]."""
    low = count_keyword(node.get("minContains", 1), "minContains", inner.where)
    high = node.get("maxContains")
    high = None if high is None else count_keyword(high, "maxContains", inner.where)
    pieces: list[dict] = []
    if low > 0:
        pieces.append({"type": "array", "contains": {"corral:all": [inner]}, "minContains": 0, "maxContains": low - 1})
    if high is not None:
        pieces.append({"type": "array", "contains": {"corral:all": [inner]}, "minContains": high + 1})
    return pieces


def _negate_type(types: frozenset, where: str) -> list[dict]:
    rest = [t for t in ALL_TYPES if t not in types and not (t == "number" and "integer" in types)]
    pieces: list[dict] = [{"type": rest}] if rest else []
    if "integer" in types and "number" not in types:
        pieces.append({"type": "number", "corral:notInteger": True})
    return pieces


# --- concrete values ----------------------------------------------------------------------------


def evaluate(c: SchemaContext, part: Located, value: Any, enum_known: bool = False) -> bool:
    """Whether ``value`` satisfies ``part``, judged by ``jsonschema`` on real schemas.

    ``enum_known``: ``value`` is known to lie in ``part``'s own ``enum``/``const`` (a member of
    the conjunction's intersected enum), so only the other keywords are judged."""
    if part.origin is not None:
        kind, inner = part.origin
        if kind == "not":
            return not evaluate(c, inner, value)
    if isinstance(part.node, bool):
        return part.node
    judge = _judge(c, part, enum_known)
    if judge.searched is not None:  # what ``jsonschema`` does for it, without building a validator run
        if isinstance(value, str) and judge.searched.search(value) is None:
            return False
    elif judge.plain:
        try:
            if not c.validator(judge.pointer, judge.plain).is_valid(value):
                return False
        except Exception as exc:  # jsonschema cannot evaluate this schema (e.g. a regex it rejects)
            raise UnsupportedSchemaError("enum", part.where, f"cannot evaluate values against this schema: {exc}") from None
    for key, arg in judge.internal.items():
        if key == "corral:nots" and any(evaluate(c, s, value) for s in arg):
            return False
        if key == "corral:all" and not all(evaluate(c, s, value) for s in arg):
            return False
        if key == "corral:notIn" and canonical(value) in _canonical_set(c, arg):
            return False
        if key == "corral:notPattern" and isinstance(value, str) and any(pattern_search(c, p, value, site) for p, site in arg):
            return False
        if key == "corral:any" and not any(all(evaluate(c, s, value) for s in branch) for branch in arg):
            return False
        if key == "corral:notInteger" and json_type(value) == "integer":
            return False
        # corral:unevaluated*: implied by the real schema holding the keyword, itself an atom
    return True


@dataclass(frozen=True)
class _Judge:
    """What ``evaluate`` checks of one schema's values, worked out once per schema: its internal
    keywords, and its other keywords (``plain``, a validator under ``pointer``) or, where they
    come down to one ``pattern``, that pattern. An enum of hundreds of values filtered by
    hundreds of leaves' atoms spent most of its time re-sorting each schema's keywords."""

    internal: dict
    plain: dict
    pointer: str
    searched: re.Pattern | None


def _judge(c: SchemaContext, part: Located, enum_known: bool) -> _Judge:
    key = (part.pointer, enum_known)
    hit = c.value_judges.get(key)
    if hit is None:
        node = part.node
        internal = {k: v for k, v in node.items() if k.startswith("corral:")}
        plain = {k: v for k, v in node.items() if not k.startswith("corral:")} if internal else node
        pointer = part.pointer
        if enum_known:
            # the enum intersected holds this schema's enum or const, and the union of an
            # ``anyOf`` of one-enum branches (``_apply_enum_union``): its members pass them
            known = [k for k in ("enum", "const") if k in plain]
            branches = plain.get("anyOf")
            first = _any_of_branch(c, part, branches, 0) if isinstance(branches, list) and branches else None
            if first is not None and c.enum_unions.get(first.pointer):
                known.append("anyOf")
            if known:
                plain = {k: v for k, v in plain.items() if k not in known}
                pointer += "!enum-known"
        hit = c.value_judges[key] = _Judge(internal, plain, pointer, _pattern_only(c, plain))
    return hit


def _pattern_only(c: SchemaContext, node: dict) -> re.Pattern | None:
    """``node``'s ``pattern`` compiled as ``jsonschema`` compiles it (Python's ``re``), when it is
    the only keyword a validator would check (annotations and unknown keywords aside); else None.
    Filtering an enum of hundreds of values by hundreds of such schemas (one per leaf) spent
    seconds in validator set-up around one ``re.search`` each."""
    if "pattern" not in node or not isinstance(node["pattern"], str) or \
            not all(k == "pattern" or k in IGNORED_KEYWORDS or c.is_unknown(k) for k in node):
        return None
    try:
        return re.compile(node["pattern"])
    except (re.error, OverflowError, RecursionError):
        return None  # the validator's path reports it


def _canonical_set(c: SchemaContext, values: list) -> frozenset:
    """``canonical`` of each of ``values`` (a list inside a synthetic schema), computed once per
    list: a value tested against a long exclusion list must not rebuild it each time."""
    memo = c.canonical_sets
    hit = memo.get(id(values))
    if hit is None or hit[0] is not values:
        hit = memo[id(values)] = (values, frozenset(canonical(v) for v in values))
    return hit[1]


# --- oneOf ------------------------------------------------------------------------------------


def overlapping_pairs(c: SchemaContext, groups: list[list[Conjunction]]) -> set[tuple[int, int]]:
    """Pairs of ``oneOf`` branches (by their leaves) not provably disjoint."""
    out = set()
    for i in range(len(groups)):
        for j in range(i + 1, len(groups)):
            if not all(provably_disjoint(c, a, b) for a in groups[i] for b in groups[j]):
                out.add((i, j))
    return out


def apply_negations(c: SchemaContext, conj: Conjunction, parts: tuple, where: str) -> None:
    """``conj`` and not (all of ``parts``)."""
    if len(parts) == 1:
        _apply_negation(c, conj, parts[0], where)
        return
    owner = parts[0]
    both = synthetic(owner, "all", {"corral:all": list(parts)})
    _apply_negation(c, conj, both, where)


#: Nested disjointness tests (through member values that are themselves ``oneOf``s) before the
#: answer is "not provably disjoint": a recursive schema would otherwise test itself forever.
MAX_DISJOINT_NESTING = 8
#: Nesting up to which two objects requiring the same member compare that member's values.
MAX_MEMBER_DISJOINT_NESTING = 3


def provably_disjoint(c: SchemaContext, a: Conjunction, b: Conjunction) -> bool:
    """True only when no value satisfies both ``a`` and ``b`` (a sound, incomplete test)."""
    if c.disjoint_nesting >= MAX_DISJOINT_NESTING:
        return False  # sound: the caller then treats the branches as overlapping
    c.disjoint_nesting += 1
    try:
        return _provably_disjoint(c, a, b)
    finally:
        c.disjoint_nesting -= 1


def _provably_disjoint(c: SchemaContext, a: Conjunction, b: Conjunction) -> bool:

    common = intersect_types(a.types, b.types)
    if not common or a.is_empty or b.is_empty:
        return True
    for x, y in ((a, b), (b, a)):
        if x.enum is not None:
            return not c.admitted(y, c.admitted(x, c.enum_members(x.enum), enum_members=True))
    return all(_type_disjoint(c, t, a, b) for t in common)


def _interval(keywords: dict, low: str, high: str, xlow: str | None = None, xhigh: str | None = None):
    lo = keywords.get(low)
    hi = keywords.get(high)
    lo_x = xlow is not None and xlow in keywords and (lo is None or keywords[xlow] >= lo)
    hi_x = xhigh is not None and xhigh in keywords and (hi is None or keywords[xhigh] <= hi)
    if lo_x:
        lo = keywords[xlow]
    if hi_x:
        hi = keywords[xhigh]
    return lo, lo_x, hi, hi_x


def _intervals_disjoint(p, q) -> bool:
    a_lo, a_lx, a_hi, a_hx = p
    b_lo, b_lx, b_hi, b_hx = q
    if a_hi is not None and b_lo is not None and (a_hi < b_lo or (a_hi == b_lo and (a_hx or b_lx))):
        return True
    if b_hi is not None and a_lo is not None and (b_hi < a_lo or (b_hi == a_lo and (b_hx or a_lx))):
        return True
    return False


def _type_disjoint(c: SchemaContext, t: str, a: Conjunction, b: Conjunction) -> bool:
    if t in ("number", "integer"):
        return _intervals_disjoint(
            _interval(a.number, "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"),
            _interval(b.number, "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"),
        )
    if t == "string":
        return _intervals_disjoint(_interval(a.string, "minLength", "maxLength"), _interval(b.string, "minLength", "maxLength"))
    if t == "array":
        ra, rb = a.arrays, b.arrays
        return _intervals_disjoint((ra.min_items, False, ra.max_items, False), (rb.min_items, False, rb.max_items, False))
    if t == "object":
        oa, ob = a.objects, b.objects
        if _intervals_disjoint((oa.min_properties, False, oa.max_properties, False), (ob.min_properties, False, ob.max_properties, False)):
            return True
        for x, y in ((a, b), (b, a)):
            for name in x.objects.required:
                if _forbids(c, y, name):
                    return True
        if c.disjoint_nesting <= MAX_MEMBER_DISJOINT_NESTING:  # the top-level test is nesting 1
            for name in oa.required:
                if name in ob.required:
                    pa = c.conjunction(member_parts(c, a.objects, name))
                    pb = c.conjunction(member_parts(c, b.objects, name))
                    la, lb = c.leaves(pa), c.leaves(pb)
                    if all(provably_disjoint(c, x, y) for x in la for y in lb):
                        return True
            if _optional_member_differs(c, oa, ob) or _optional_member_differs(c, ob, oa):
                return True
        return False
    return False  # null, boolean


def _optional_member_differs(c: SchemaContext, required: ObjectRules, optional: ObjectRules) -> bool:
    """A member ``required`` requires, optional in ``optional``, whose values there are an enum
    (or const) the other side's values never meet: ``optional`` then rejects it wherever it
    appears (an optional ``command`` whose enum differs from the one a ``oneOf`` branch requires).
    Only without pending alternatives on either side: a recursive schema compared member by
    member through its alternatives grows exponentially with the nesting."""
    for name in required.required:
        if name in optional.required:
            continue  # compared through their leaves (``_type_disjoint``)
        theirs = member_parts(c, optional, name)
        if not theirs:
            continue  # said nothing about it
        mine, other = c.conjunction(member_parts(c, required, name)), c.conjunction(theirs)
        if (mine.enum is not None or other.enum is not None) and not mine.pending and not other.pending \
                and provably_disjoint(c, mine, other):
            return True
    return False


def member_parts(c: SchemaContext, rules: ObjectRules, name: str) -> list[Located]:
    """The subschemas a member called ``name`` must satisfy: per key rule, its ``properties``
    entry and every matching ``patternProperties`` entry, else its ``additionalProperties``."""
    parts: list[Located] = []
    for rule in rules.key_rules:
        matched = [loc for p, loc in rule.patterns if pattern_search(c, p, name, loc.where)]
        if name in rule.properties:
            parts += [rule.properties[name], *matched]
        elif matched:
            parts += matched
        elif rule.additional is not None:
            parts.append(rule.additional)
    return parts


def _forbids(c: SchemaContext, conj: Conjunction, name: str) -> bool:
    rules = conj.objects
    if any(not evaluate(c, pn, name) for pn in rules.property_names):
        return True
    if not c.options.additional_properties_default and all(r.additional is None for r in rules.key_rules):
        if not any(name in r.properties or any(pattern_search(c, p, name, loc.where) for p, loc in r.patterns)
                   for r in rules.key_rules):
            return True
    return c.conjunction(member_parts(c, conj.objects, name)).is_empty


# --- strings and keys ------------------------------------------------------------------------------


def pattern_search(c: SchemaContext, pattern: str, text: str, site: str) -> bool:
    """JSON Schema ``pattern`` semantics on a concrete string, with corral's regex dialect;
    ``site`` is the pattern's own pointer (``#/a/pattern``, ``#/patternProperties/x``)."""
    return _pattern_dfa(c, pattern, site).matches(text)


def _pattern_dfa(c: SchemaContext, pattern: str, site: str) -> "CodePointDFA":
    cache = c.pattern_dfas
    dfa = cache.get(pattern)
    if dfa is None:
        expr = scalars.parse_pattern(pattern, site)
        try:
            dfa = CodePointDFA.of(expr)
        except (LimitExceeded, UnsupportedGrammarError) as exc:
            keyword, where = scalars.pattern_site(site)
            raise UnsupportedSchemaError(keyword, where, _reason(exc)) from None
        cache[pattern] = dfa
    return dfa


def pattern_strings(c: SchemaContext, pattern: str, site: str, limit: int) -> list[str] | None:
    """The strings ``pattern`` matches (search semantics) when finite and at most ``limit``; else ``None``."""
    return _pattern_dfa(c, pattern, site).finite_strings(limit)


def add_pattern(c: SchemaContext, conj: Conjunction, pattern: str, where: str) -> None:
    """A second ``pattern`` (of the schema at ``where``) in one conjunction: both must match
    (intersection at the leaf)."""
    conj.not_patterns.append((pattern, f"{where}/pattern", True))


def restricted_string(c: SchemaContext, conj: Conjunction, keywords: dict, patterns: list, excluded: list) -> Expr:
    """Strings under ``keywords`` that match every positive and no negative pattern, minus values."""
    keywords = dict(keywords)
    include, exclude = _pattern_sides(keywords.pop("pattern", None), conj.pattern_site, patterns)
    return _string_language(c, keywords, include, exclude, excluded, conj.string_where)


def _pattern_sides(pattern: str | None, site: str, patterns: list) -> tuple[list, list]:
    """(patterns to match, patterns to avoid), each ``(pattern, its pointer)``: the ``pattern``
    keyword at ``site`` (when not None) and the conjunction's further ``(pattern, pointer,
    must match)`` entries."""
    include = [(pattern, site)] if pattern is not None else []
    include += [(p, w) for p, w, positive in patterns if positive]
    return include, [(p, w) for p, w, positive in patterns if not positive]


def _string_language(c: SchemaContext, keywords: dict, include: list, exclude: list, names, where: str,
                     keyword: str = "pattern") -> Expr:
    """String tokens under ``keywords``, matching every ``include`` pattern and no ``exclude``
    pattern (each with its own pointer), whose value is none of ``names``.

    Intersections are taken on the byte automata of the scalars module's own tokens (every
    encoding of a value is kept); a complement is taken on code points, where it is exact, and
    its language encoded as string bodies directly (``strings.encode_value_automaton``), which
    ``string_schema`` meets as the pattern. ``keyword`` names what a too-large product refuses.
    """
    names = sorted(set(names))
    if not include and not exclude and not keywords:
        return scalars.string_not_in(names)
    if exclude:
        try:
            language = _value_language(c, _language_ops(include, exclude, names))
            if language.is_empty:
                return NOTHING
            body = encode_value_automaton(language, getattr(c.options, "string_escapes", "all"), c.layout.limits)
        except LimitExceeded as exc:
            raise UnsupportedSchemaError(keyword, where, _reason(exc)) from None
        return c.string_schema({**keywords, "pattern": body}, where)
    first = {**keywords, **({"pattern": include[0][0]} if include else {})}
    pieces = [c.string_schema(first, where, pattern_at=include[0][1] if include else None)]
    pieces += [c.string_schema({"pattern": p}, where, pattern_at=site) for p, site in include[1:]]
    if names:
        pieces.append(scalars.string_not_in(names))
    if len(pieces) == 1:
        return pieces[0]
    try:
        limits = c.layout.limits
        # smallest first: the keywords' piece (length bounds multiply a pattern's states) is
        # usually the largest, and meeting it last keeps the intermediate products small
        # shared: the leaves of an ``anyOf`` over patterns meet the same keywords' piece
        automata = sorted((shared_regular(piece, limits) for piece in pieces), key=lambda d: d.n_states)
        dfa = automata[0]
        for other in automata[1:]:
            dfa = intersect(dfa, other, limits)
    except LimitExceeded as exc:
        raise UnsupportedSchemaError(keyword, where, f"intersection of string languages too large: {exc}") from None
    return NOTHING if dfa.is_empty_language else dfa  # a ByteDFA embedded in the IR, as the scalars module does


#: string keywords a group of string leaves may share for ``merge_string_leaves``: bounds that
#: intersect with a pattern's language (``format`` and the content keywords are left per leaf)
_MERGEABLE_STRING_KEYWORDS = frozenset({"minLength", "maxLength"})


def merge_string_leaves(c: SchemaContext, leaves: list[Conjunction]) -> list:
    """``leaves`` with the string-only ones that differ only in patterns and excluded values
    merged: each such group becomes one string expression, at its first leaf's place; the other
    leaves are returned as they are.

    ``anyOf`` and ``not`` over patterns distribute into one leaf per combination, each the
    shared keywords (length bounds) and its own patterns. Built one by one, every leaf
    multiplies its patterns' automaton by the length bounds, and the lowering then unites the
    products. ``Str(K) & L1 | ... | Str(K) & Ln`` is ``Str(K) & (L1 | ... | Ln)``: the leaves'
    languages are united on code points (small automata), encoded once
    (``strings.encode_value_automaton``) and met with the bounds once. A group whose patterns
    the code-point automata refuse, or whose union is too large, keeps its leaves, built one by
    one as before.
    """
    groups: dict[tuple, list[int]] = {}
    for i, leaf in enumerate(leaves):
        if leaf.enum is None and not leaf.is_empty and leaf.types == _STRING_ONLY \
                and set(leaf.string) - {"pattern"} <= _MERGEABLE_STRING_KEYWORDS \
                and all(type(v) is int for k, v in leaf.string.items() if k != "pattern"):
            key = tuple(sorted((k, v) for k, v in leaf.string.items() if k != "pattern"))
            groups.setdefault(key, []).append(i)
    out: list = list(leaves)
    for key, members in groups.items():
        if len(members) < 2:
            continue
        for i in members:
            c.check_deferred(leaves[i])  # what building each leaf would raise, raised the same
        try:
            union = _leaves_union(c, [leaves[i] for i in members])
            body = None if union is None else encode_value_automaton(
                union, getattr(c.options, "string_escapes", "all"), c.layout.limits)
        except (LimitExceeded, UnsupportedSchemaError):
            continue
        first = leaves[members[0]]
        merged = _bounded_union(c, dict(key), first.string_where, body)
        if merged is None:
            continue
        out[members[0]] = merged
        for i in members[1:]:
            out[i] = None
    return [x for x in out if x is not None]


def _bounded_union(c: SchemaContext, keywords: dict, where: str, body: ByteDFA | None) -> Expr | None:
    """String tokens under the length ``keywords`` whose body is in ``body`` (every body when
    None), or None where the leaves one by one are the exact way: the bounds alone would be
    narrowed (a ``maxLength`` past the automaton budget, which a pattern in a leaf may make
    unnecessary) or the product is too large."""
    if body is not None and body.is_empty_language:
        return NOTHING
    narrowed: list[str] = []
    try:
        bounded = scalars.string_schema(keywords, where, c.options, narrowed=narrowed.append, limits=c.layout.limits)
        if narrowed:
            return None
        if body is None:
            return bounded
        limits = c.layout.limits
        dfa = intersect(shared_regular(bounded, limits), shared_regular(string_token(body), limits), limits)
    except (LimitExceeded, UnsupportedSchemaError):
        return None
    return NOTHING if dfa.is_empty_language else dfa  # a ByteDFA embedded in the IR, as the scalars module does


def _leaves_union(c: SchemaContext, leaves: list[Conjunction]) -> CodePointDFA | None:
    """The union of the leaves' own languages (every pattern matched, no negated one, none of the
    excluded values) on code points; ``None`` when a leaf has none of these (any string).

    Leaves distributed from the same disjunctions share their first patterns, so each leaf's
    product is built on the longest product already built for a prefix of its operations, and
    the union is taken pairwise (a balanced tree, not a growing left operand)."""
    built: dict[tuple, CodePointDFA] = {}
    parts: list[CodePointDFA] = []
    for leaf in leaves:
        include, exclude = _pattern_sides(leaf.string.get("pattern"), leaf.pattern_site, leaf.not_patterns)
        ops = _language_ops(include, exclude, sorted({v for v in leaf.excluded if isinstance(v, str)}))
        if not ops:
            return None
        dfa = _value_language(c, ops, built)
        if not dfa.is_empty:
            parts.append(dfa)
    if not parts:
        return CodePointDFA([[]], [False])
    while len(parts) > 1:
        parts = [a.product(b, "or") for a, b in zip(parts[::2], parts[1::2])] + parts[len(parts) - len(parts) % 2:]
    return parts[0]


def key_regions(c: SchemaContext, rules, known: set[str]) -> list[tuple[Expr, Expr]]:
    """(key language, value) for every region of undeclared keys, regions pairwise disjoint."""
    where = rules.where
    sites: dict[str, str] = {}  # pattern -> its pointer (the first patternProperties entry with it)
    for rule in rules.key_rules:
        for p, loc in rule.patterns:
            sites.setdefault(p, loc.where)
    patterns = list(sites)
    if len(patterns) > MAX_KEY_PATTERNS:
        c.unsupported("patternProperties", where, f"more than {MAX_KEY_PATTERNS} patterns in one object")
        patterns = []  # lenient: treat every undeclared key like an unmatched one
    closed = not c.options.additional_properties_default and all(r.additional is None for r in rules.key_rules)
    language = _property_names_language(c, rules)
    if language is None:
        return []  # propertyNames admits no string: no undeclared key
    names_kw, names_include, names_exclude, names_excluded = language
    regions = []
    for mask in range(1 << len(patterns)):
        matched = {patterns[i] for i in range(len(patterns)) if mask >> i & 1}
        if not matched and closed:
            continue
        parts = []
        for rule in rules.key_rules:
            hits = [loc for p, loc in rule.patterns if p in matched]
            if hits:
                parts.extend(hits)
            elif rule.additional is not None:
                parts.append(rule.additional)
        value = c.value(parts)
        if value == NOTHING:
            continue
        regions.append((mask, frozenset(p.pointer for p in parts), value))
    if not regions:
        return []
    uniform = len(regions) == 1 << len(patterns) and len({r[1] for r in regions}) == 1
    out = []
    if uniform:  # every undeclared key gets the same value: no need to split by pattern
        regions = [(None, regions[0][1], regions[0][2])]
    for mask, _, value in regions:
        include = list(names_include)
        exclude = list(names_exclude)
        if mask is not None:
            include += [(p, sites[p]) for i, p in enumerate(patterns) if mask >> i & 1]
            exclude += [(p, sites[p]) for i, p in enumerate(patterns) if not mask >> i & 1]
        names = [n for n in known | set(names_excluded) if _may_contain(c, include, exclude, names_kw, n)]
        key = _string_language(c, names_kw, include, exclude, names, where, "patternProperties" if patterns else "propertyNames")
        if key != NOTHING:
            out.append((key, value))
    return out


def _may_contain(c: SchemaContext, include, exclude, keywords: dict, name: str) -> bool:
    if not all(pattern_search(c, p, name, w) for p, w in include):
        return False
    if any(pattern_search(c, p, name, w) for p, w in exclude):
        return False
    return c.string_in(name, keywords, [])


def _property_names_language(c: SchemaContext, rules):
    """``propertyNames`` as string keywords, patterns to match/avoid and excluded names."""
    keywords: dict = {}
    include: list = []
    exclude: list = []
    excluded: list = []
    for pn in rules.property_names:
        conj = c.conjunction([pn])
        if conj.enum is not None:
            continue  # finite: handled as declared names by the object builder
        if "string" not in conj.types:
            return None
        if conj.pending or conj.deferred or any(k != "pattern" and k in keywords for k in conj.string):
            c.unsupported("propertyNames", pn.where, "only string keywords, patterns and excluded names are supported")
            continue
        for key, value in conj.string.items():
            if key == "pattern":
                include.append((value, conj.pattern_site))
            else:
                keywords[key] = value
        include += [(p, w) for p, w, positive in conj.not_patterns if positive]
        exclude += [(p, w) for p, w, positive in conj.not_patterns if not positive]
        excluded += [v for v in conj.excluded if isinstance(v, str)]
    return keywords, include, exclude, excluded


def _language_ops(include, exclude, names) -> tuple:
    """The products that make a string language on code points: ``("and", pattern, site)`` per
    pattern to match, ``("diff", pattern, site)`` per pattern to avoid, ``("names", names, "")``
    for values to exclude."""
    ops = [("and", p, w) for p, w in include] + [("diff", p, w) for p, w in exclude]
    if names:
        ops.append(("names", tuple(names), ""))
    return tuple(ops)


def _value_language(c: SchemaContext, ops: tuple, built: dict | None = None) -> CodePointDFA:
    """The code-point language of ``ops`` (``_language_ops``), from Unicode down. ``built``
    (ops prefix -> product) lets languages that share their first operations build them once."""
    built = built if built is not None else {}
    done = len(ops)
    while done and ops[:done] not in built:
        done -= 1
    dfa = built[ops[:done]] if done else CodePointDFA.universal()
    for i in range(done, len(ops)):
        mode, operand, site = ops[i]
        other = CodePointDFA.of_strings(operand) if mode == "names" else _pattern_dfa(c, operand, site)
        dfa = built[ops[: i + 1]] = dfa.product(other, "diff" if mode == "names" else mode)
    return dfa


def _reason(exc: Exception) -> str:
    """The message of an automaton's error, without ``LimitExceeded``'s limit name."""
    return exc.args[0] if exc.args else str(exc)
