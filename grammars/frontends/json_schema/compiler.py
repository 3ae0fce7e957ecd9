"""Schema -> grammar IR: the driver, the conjunction of constraints, and keyword dispatch.

How a schema position becomes IR
--------------------------------
A value position is described by a *conjunction* of subschemas (one normally; several after
``allOf``, ``$ref`` with siblings, or merged ``properties``/``patternProperties``). ``value(parts)``
applies every part's keywords to a ``Conjunction`` — a typed record of what is allowed: JSON types,
a finite ``enum``, excluded values, string and number keywords (for the scalars module), object
rules, array rules — intersecting as it goes, exactly or not at all (``UnsupportedSchemaError``).
Disjunctions (``anyOf``, ``oneOf``, ``not`` with several outcomes, ``if``/``then``/``else``,
``dependencies``) are kept pending and then distributed: each combination of branches is one
*leaf* conjunction, and the value is the union of the leaves' expressions. ``oneOf`` is exact
only when its branches are provably disjoint (``combinators.provably_disjoint``).

A leaf with a finite ``enum``/``const`` is the list of those values that satisfy every part,
decided by ``jsonschema`` itself on the concrete values (so no keyword is missed). Otherwise each
allowed type contributes one branch: ``null``, ``true``/``false``, the scalars module's string and
number expressions, and the array and object builders.

Rules: every ``$ref`` target becomes one IR rule (so recursion becomes IR recursion), and so does
every merged conjunction (keyed by the set of parts, which makes recursive merges terminate);
plain subschemas are inlined. The grammar compiler later inlines small rules into DFAs.

References: ``$ref`` anywhere in the document or the ``registry`` option's documents;
``$dynamicRef`` where its target does not depend on the dynamic scope
(``SchemaDocument.resolve_dynamic``).

Dialects: keywords of every draft from 4 to 2020-12 are understood (``definitions``, ``id``,
``dependencies``, boolean ``exclusiveMinimum``, array-form ``items`` + ``additionalItems``);
``$ref`` siblings are ignored in drafts 4–7 and applied from 2019-09 on, as the drafts say.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Iterable

from grammars.errors import (
    GrammarError,
    UnsupportedSchemaError,
)
from grammars.frontends.json_schema import arrays, combinators, objects, scalars
from grammars.frontends.json_schema.conjunction import (
    ALL_TYPES,
    ARRAY_KEYWORDS,
    IGNORED_KEYWORDS,
    INTERNAL,
    KEYWORD_DRAFTS,
    OBJECT_KEYWORDS,
    UNSUPPORTED_KEYWORDS,
    ArrayRules,
    Conjunction,
    Disjunction,
    ObjectRules,
    intersect_types,
    parse_type,
    value_has_type,
)
from grammars.frontends.json_schema.document import (
    Located,
    SchemaDocument,
    count_keyword,
)
from grammars.frontends.json_schema.options import JsonSchemaOptions
from grammars.frontends.json_schema.values import (
    Layout,
    canonical,
    dedupe,
    json_type,
    literal_values,
    number_twins,
    value_text,
)
from grammars.ir import EMPTY, NOTHING, Expr, Grammar, Literal, Ref, alt

__all__ = [
    "SchemaReport",
    "Relaxation",
    "parse_json_schema",
    "analyze_json_schema",
    "SchemaCompiler",
    "Conjunction",
]

#: nesting of ``$ref``/``allOf``/``not`` applications before the schema is declared degenerate
MAX_APPLY_DEPTH = 200



@dataclass(frozen=True)
class Relaxation:
    """A constraint ``lenient=True`` dropped: the grammar accepts a superset at ``pointer``."""

    keyword: str
    pointer: str
    reason: str


@dataclass(frozen=True)
class SchemaReport:
    """What ``analyze_json_schema`` learned while compiling a schema.

    ``grammar``: the IR. ``relaxed``: constraints dropped under ``lenient=True`` (empty means the
    grammar is exact, up to the documented key-order policy). ``ignored``: keywords that are
    not JSON Schema (validators ignore them too), as ``(keyword, pointer)``. ``narrowed``: places
    where the grammar accepts fewer valid texts than the schema by design, e.g. an object too big
    for ``property_order="any"`` that falls back to schema order.
    """

    grammar: Grammar
    relaxed: tuple[Relaxation, ...] = ()
    ignored: tuple[tuple[str, str], ...] = ()
    narrowed: tuple[str, ...] = ()

    @property
    def exact(self) -> bool:
        return not self.relaxed


def parse_json_schema(document: dict | bool, options: JsonSchemaOptions | None = None) -> Grammar:
    """The grammar of JSON texts valid under ``document`` (a loaded schema, see ``load_schema``).

    Raises ``UnsupportedSchemaError`` (keyword, pointer) for constraints it cannot enforce
    exactly unless ``options.lenient``; ``GrammarError`` for malformed schemas and dangling
    ``$ref``s. Use ``analyze_json_schema`` to also learn what ``lenient`` relaxed.
    """
    return analyze_json_schema(document, options).grammar


def analyze_json_schema(document: dict | bool, options: JsonSchemaOptions | None = None) -> SchemaReport:
    """``parse_json_schema`` plus a ``SchemaReport`` of relaxed, ignored and narrowed constraints."""
    options = options or JsonSchemaOptions()
    return SchemaCompiler(SchemaDocument.of(document, options.registry), options).run()


# --- the compiler -------------------------------------------------------------------------------


class SchemaCompiler:
    """Compiles one document under one set of options. Single use: call ``run()`` once.

    The family modules (``objects``, ``arrays``, ``combinators``) call back into it through
    ``value``, ``apply``, ``satisfies``, ``unsupported``, ``add_rule`` and the attributes
    ``document``, ``options``, ``layout``.
    """

    def __init__(self, document: SchemaDocument, options: JsonSchemaOptions):
        self.document = document
        self.options = options
        #: draft 4's ``integer`` is a number written without fraction or exponent (``1.0`` is not
        #: one), as its validators read JSON: then a number's spelling decides its type
        self.integers_by_spelling = int(document.dialect) < 6
        self.layout = Layout(options, integers_by_spelling=self.integers_by_spelling)
        self.rules: dict[str, Expr] = {}
        self._rule_of: dict[frozenset, str] = {}
        self._inline: dict[frozenset, Expr] = {}
        self._building: dict[frozenset, str | None] = {}
        self._in_progress: set[str] = set()  # rules whose body is being built
        #: references met to a rule still being built (recursion); objects.object_expr compares
        #: the count before and after its members to learn whether its subtree recurses
        self.back_references = 0
        self._validators: dict[str, Any] = {}
        self._satisfied: dict[tuple[str, str], bool] = {}
        self._names: set[str] = set()
        self._suffixes: dict[str, int] = {}  # hint -> last ``~n`` handed out for it
        self._relaxed: list[Relaxation] = []
        self._ignored: list[tuple[str, str]] = []
        #: depth of nested ``provably_disjoint`` calls (see ``combinators.MAX_DISJOINT_NESTING``)
        self.disjoint_nesting = 0
        self.pattern_dfas: dict = {}  # pattern -> CodePointDFA (combinators)
        self._narrowed: list[str] = []
        self._depth = 0

    def run(self) -> SchemaReport:
        root = self.value((self.document.located_root(),), rule=True)
        self.rules["start"] = self.layout.document(root)
        grammar = Grammar.of(dict(self.rules), "start", source="<json schema>")
        return SchemaReport(grammar, tuple(dict.fromkeys(self._relaxed)), tuple(dict.fromkeys(self._ignored)), tuple(dict.fromkeys(self._narrowed)))

    # --- errors, relaxations ---------------------------------------------------------------

    def unsupported(self, keyword: str, where: str, reason: str) -> None:
        """Raise, or under ``lenient`` record the relaxation and return (the caller drops it)."""
        if not self.options.lenient:
            raise UnsupportedSchemaError(keyword, where, reason)
        self._relaxed.append(Relaxation(keyword, where, reason))

    def narrowed(self, note: str) -> None:
        self._narrowed.append(note)

    # --- rules ---------------------------------------------------------------------------

    def add_rule(self, hint: str, expr: Expr) -> Expr:
        """``expr`` as a fresh named rule (a ``Ref``); trivial expressions stay inline."""
        if expr in (NOTHING, EMPTY) or isinstance(expr, (Literal, Ref)):
            return expr
        name = self.fresh_rule_name(hint)
        self.rules[name] = expr
        return Ref(name)

    def add_recursive_rule(self, hint: str, build) -> Expr:
        """A fresh rule whose body ``build(ref)`` may refer to the rule itself through ``ref``."""
        return self.add_rules([hint], lambda refs: [build(refs[0])])[0]

    def add_rules(self, hints: list[str], build) -> list[Expr]:
        """Fresh rules, one per hint, whose bodies ``build(refs)`` may refer to one another (and
        to themselves) through ``refs``."""
        names = [self.fresh_rule_name(hint) for hint in hints]
        refs: list[Expr] = [Ref(name) for name in names]
        for name in names:
            self.rules[name] = NOTHING
        bodies = build(refs)
        for name, body in zip(names, bodies, strict=True):
            self.rules[name] = body
        return refs

    def fresh_rule_name(self, hint: str) -> str:
        """``hint``, or ``hint~n`` for the next free n: the count per hint keeps the thousands of
        states of one any-order object from each scanning the suffixes taken before them."""
        name = hint
        n = self._suffixes.get(hint, 1)
        while name in self._names:
            n += 1
            name = f"{hint}~{n}"
        self._suffixes[hint] = n
        self._names.add(name)
        return name

    def any_value(self) -> Expr:
        """Any JSON value (the ``true`` schema), as the shared recursive rule ``json_value``."""
        if "json_value" not in self._names:
            self._names.add("json_value")
            lay = self.layout
            ref = Ref("json_value")
            self.rules["json_value"] = NOTHING
            string = scalars.string_schema({}, "#", self.options)
            self.rules["json_value"] = alt(
                [
                    Literal("null"),
                    Literal("true"),
                    Literal("false"),
                    scalars.number_schema({}, "#", self.options, integer=False),
                    string,
                    lay.array(lay.repeated(ref, 0, None)),
                    lay.object(lay.repeated(lay.member(string, ref), 0, None)),
                ]
            )
        return Ref("json_value")

    # --- values ----------------------------------------------------------------------------

    def value(self, parts: Iterable[Located], *, rule: bool = False) -> Expr:
        """The JSON values satisfying every schema in ``parts`` (an empty conjunction: any value)."""
        resolved: list[Located] = []
        via_ref = rule
        seen: set[str] = set()
        for part in parts:
            part, followed = self._follow_plain_refs(part)
            via_ref |= followed
            node = part.node
            if node is False:
                return NOTHING
            if node is True or node == {} or part.pointer in seen:
                continue
            if not isinstance(node, dict):
                raise GrammarError(f"malformed schema at {part.where}: a schema must be an object or a boolean, got {type(node).__name__}")
            seen.add(part.pointer)
            resolved.append(part)
        if not resolved:
            return self.any_value()
        key = frozenset(seen)
        name = self._rule_of.get(key)
        if name is not None:
            self.back_references += name in self._in_progress
            return Ref(name)
        if key in self._inline:  # asked for twice: share it as a rule
            name = self.fresh_rule_name(_rule_hint(resolved))
            self.rules[name] = self._inline.pop(key)
            self._rule_of[key] = name
            return Ref(name)
        if key in self._building:  # recursion through merged $refs: this conjunction needs a rule
            self.back_references += 1
            name = self._building[key] or self.fresh_rule_name(_rule_hint(resolved))
            self._building[key] = name
            return Ref(name)
        if via_ref or len(resolved) > 1 or any("$ref" in p.node for p in resolved):
            name = self.fresh_rule_name(_rule_hint(resolved))
            self._rule_of[key] = name
            self.rules[name] = NOTHING  # placeholder while building (recursion sees the Ref)
            self._in_progress.add(name)
            try:
                self.rules[name] = self._build(resolved)
            finally:
                self._in_progress.discard(name)
            return Ref(name)
        self._building[key] = None
        try:
            expr = self._build(resolved)
        finally:
            name = self._building.pop(key)
        if name is not None:
            self.rules[name] = expr
            self._rule_of[key] = name
            return Ref(name)
        self._inline[key] = expr
        return expr

    def _follow_plain_refs(self, part: Located) -> tuple[Located, bool]:
        """Replace a schema that is only a ``$ref`` (plus annotations) by its target."""
        followed = False
        for _ in range(MAX_APPLY_DEPTH):
            node = part.node
            dynamic = isinstance(node, dict) and "$dynamicRef" in node and "$ref" not in node and self.document.dialect >= 2020
            key = "$dynamicRef" if dynamic else "$ref"
            if not (isinstance(node, dict) and key in node):
                break
            if (dynamic or not self.document.dialect.ref_overrides_siblings) and any(
                k not in IGNORED_KEYWORDS and k != key and not self._is_unknown(k) for k in node
            ):
                break
            try:
                resolve = self.document.resolve_dynamic if dynamic else self.document.resolve
                part = resolve(node[key], part)
            except UnsupportedSchemaError as exc:
                self.unsupported(exc.keyword, exc.pointer, exc.reason)
                return Located(True, part.pointer + "!relaxed", part.base), followed
            followed = True
        else:
            raise UnsupportedSchemaError("$ref", part.where, "a cycle of references that never reaches a schema")
        return part, followed

    def _build(self, parts: list[Located]) -> Expr:
        conj = self.conjunction(parts)
        if len(conj.pending) == 1 and conj.pending[0].keyword in ("anyOf", "oneOf") and _unconstrained(conj):
            # a bare anyOf (or a oneOf of disjoint branches): each branch is a value of its own,
            # so a $ref branch stays one shared rule
            disjunction = conj.pending[0]
            disjoint = disjunction.keyword == "anyOf" or not combinators.overlapping_pairs(
                self, [self.leaves(self.conjunction(branch), [self.options.max_combinations]) for branch in disjunction.branches]
            )
            if disjoint:
                return alt(self.value(branch) for branch in disjunction.branches)
        leaves = self.leaves(conj)
        return alt(self._leaf(leaf, sole=len(leaves) == 1) for leaf in leaves)

    def conjunction(self, parts: Iterable[Located]) -> Conjunction:
        conj = Conjunction()
        for part in parts:
            self.apply(conj, part)
        return conj

    # --- applying keywords -------------------------------------------------------------------

    def apply(self, conj: Conjunction, part: Located) -> None:
        """Intersect ``conj`` with the schema ``part`` (idempotent per schema)."""
        if part.pointer in conj.applied:
            return
        conj.applied.add(part.pointer)
        node = part.node
        if node is True:
            return
        if node is False:
            conj.types = frozenset()
            return
        if not isinstance(node, dict):
            raise GrammarError(f"malformed schema at {part.where}: a schema must be an object or a boolean, got {type(node).__name__}")
        self._depth += 1
        try:
            if self._depth > MAX_APPLY_DEPTH:
                raise UnsupportedSchemaError("$ref", part.where, "schema applies itself without end")
            conj.atoms.append(part)
            if "$ref" in node:
                try:
                    self.apply(conj, self.document.resolve(node["$ref"], part))
                except UnsupportedSchemaError as exc:
                    self.unsupported(exc.keyword, exc.pointer, exc.reason)
                if self.document.dialect.ref_overrides_siblings:
                    return
            if "$dynamicRef" in node and self.document.dialect >= 2020:
                try:
                    self.apply(conj, self.document.resolve_dynamic(node["$dynamicRef"], part))
                except UnsupportedSchemaError as exc:
                    self.unsupported(exc.keyword, exc.pointer, exc.reason)
            self._apply_keywords(conj, part, node)
        finally:
            self._depth -= 1

    def active_keywords(self, node: dict, part: Located) -> dict:
        """``node`` (the schema of ``part``) without the keywords its draft does not define (those
        are recorded as ignored). Synthetic schemas are the compiler's own, written with today's
        keywords (a negated ``items`` is a ``contains``), whatever the document's draft."""
        if part.is_synthetic:
            return node
        where = part.where
        dialect = int(self.document.dialect)
        inactive = [k for k in node if k in KEYWORD_DRAFTS and not KEYWORD_DRAFTS[k][0] <= dialect <= KEYWORD_DRAFTS[k][1]]
        if not inactive:
            return node
        self._ignored.extend((k, where) for k in inactive)
        return {k: v for k, v in node.items() if k not in inactive}

    def _apply_keywords(self, conj: Conjunction, part: Located, node: dict) -> None:
        where = part.where
        node = self.active_keywords(node, part)
        for family in (objects.apply_object_keywords, arrays.apply_array_keywords, self._apply_scalar_keywords):
            try:
                family(self, conj, part, node)
            except UnsupportedSchemaError as exc:
                self.unsupported(exc.keyword, exc.pointer, exc.reason)
        for key, value in node.items():
            if key in _CONSUMED:
                continue
            handler = _HANDLERS.get(key)
            if handler is not None:
                try:
                    handler(self, conj, part, value)
                except UnsupportedSchemaError as exc:
                    self.unsupported(exc.keyword, exc.pointer, exc.reason)
            elif key in IGNORED_KEYWORDS or key == "$ref" or key == "$dynamicRef":
                continue
            elif key in UNSUPPORTED_KEYWORDS:
                if not _trivial_unsupported(key, value):
                    self.unsupported(key, where, f"{key!r} is not supported")
            elif key.startswith(INTERNAL):
                combinators.apply_internal(self, conj, part, key, value)
            elif self._is_unknown(key):
                if self.options.unknown_keywords == "error" and not key.startswith("x-"):
                    raise UnsupportedSchemaError(key, where, "not a JSON Schema keyword (unknown_keywords='error')")
                self._ignored.append((key, where))

    def _is_unknown(self, key: str) -> bool:
        """Not a keyword of any draft (``id`` is one only in draft 4)."""
        if key == "id":
            return self.document.dialect.id_keyword != "id"
        return not (
            key in _HANDLERS or key in _CONSUMED or key in IGNORED_KEYWORDS or key in UNSUPPORTED_KEYWORDS
            or key in ("$ref", "$dynamicRef") or key.startswith(INTERNAL)
        )

    def _apply_scalar_keywords(self, compiler: "SchemaCompiler", conj: Conjunction, part: Located, node: dict) -> None:
        strings = {k: v for k, v in node.items() if k in scalars.STRING_KEYWORDS
                   and (k != "format" or self.options.format_assertion)}
        if strings:
            _merge_string_keywords(self, conj, strings, part.where)
        numbers = scalars.normalized_number_keywords(node, part.where)
        if numbers:
            _merge_number_keywords(conj, numbers, part.where)

    # --- disjunctions -------------------------------------------------------------------------

    def leaves(self, conj: Conjunction, budget: list[int] | None = None) -> list[Conjunction]:
        """Distribute pending disjunctions: conjunctions without any, whose union is ``conj``."""
        budget = budget if budget is not None else [self.options.max_combinations]
        if conj.is_empty:
            return []
        if conj.enum is not None or not conj.pending:
            budget[0] -= 1
            if budget[0] < 0:
                raise UnsupportedSchemaError("anyOf", conj.pending[0].where if conj.pending else "#", f"more than {self.options.max_combinations} combinations of alternatives (JsonSchemaOptions.max_combinations)")
            return [conj]
        rest = conj.copy()
        disjunction = rest.pending.pop(0)
        groups: list[list[Conjunction]] = []
        for branch in disjunction.branches:
            option = rest.copy()
            for part in branch:
                self.apply(option, part)
            groups.append(self.leaves(option, budget))
        if disjunction.keyword == "oneOf":
            # judge overlaps without the atoms applied so far: they include the schema holding
            # this oneOf, whose validation (exactly one branch) would make any overlap look empty
            probe = rest.copy()
            probe.atoms = []
            probes = []
            for branch in disjunction.branches:
                option = probe.copy()
                for part in branch:
                    self.apply(option, part)
                probes.append(self.leaves(option, [self.options.max_combinations]))
            overlapping = combinators.overlapping_pairs(self, probes)
            if overlapping:
                groups = self._exclusive(rest, disjunction, overlapping, groups, budget)
        return [leaf for group in groups for leaf in group]

    def _exclusive(self, rest: Conjunction, disjunction: Disjunction, overlapping: set, groups: list, budget: list[int]) -> list:
        """``oneOf`` whose branches may overlap: branch ``i`` and not every branch it overlaps.

        ``oneOf(B1..Bk) = OR_i (Bi AND NOT Bj for j != i)``; only overlapping pairs need the
        negation. Unsupported when a needed negation is (the leaf would keep a deferred keyword);
        under ``lenient`` the branches are then taken as ``anyOf``.
        """
        out = []
        for i, branch in enumerate(disjunction.branches):
            option = rest.copy()
            for part in branch:
                self.apply(option, part)
            before = set(option.deferred)
            for j, other in enumerate(disjunction.branches):
                if j != i and (min(i, j), max(i, j)) in overlapping:
                    combinators.apply_negations(self, option, other, disjunction.where)
            leaves = self.leaves(option, budget)
            for leaf in leaves:
                for types, keyword, where, reason in leaf.deferred:
                    if (types, keyword, where, reason) not in before and intersect_types(types, leaf.types):
                        self.unsupported("oneOf", disjunction.where, f"branches may overlap and excluding one needs {reason} (at {where})")
                        return groups
            out.append(leaves)
        return out

    # --- concrete values -------------------------------------------------------------------

    def enum_members(self, enum: list) -> list:
        """The JSON values an ``enum`` admits, to be checked one by one: the values themselves or,
        where a number's spelling decides its type (draft 4), each with its ``number_twins``."""
        return [t for v in enum for t in number_twins(v)] if self.integers_by_spelling else enum

    def admitted(self, conj: Conjunction, candidates: Iterable[Any]) -> list:
        """The ``candidates`` ``conj`` admits: of one of its types and satisfying every atom."""
        return [v for v in candidates if value_has_type(v, conj.types, self.integers_by_spelling)
                and all(self.satisfies(v, a) for a in conj.atoms)]

    def satisfies(self, value: Any, part: Located) -> bool:
        """Does the concrete JSON ``value`` satisfy the (possibly synthetic) schema ``part``?

        Memoised per (schema pointer, value as JSON text): the leaves of an expanded
        ``anyOf``/``oneOf`` filter the same ``enum`` values against the same atoms again and
        again (JsonSchemaStore service-schema: 115,000 checks, three minutes of ``jsonschema``).
        The text keeps ``1`` and ``1.0`` apart, as draft 4's ``integer`` does.
        """
        key = (part.pointer, value_text(value))
        hit = self._satisfied.get(key)
        if hit is None:
            hit = self._satisfied[key] = combinators.evaluate(self, part, value)
        return hit

    def validator(self, pointer: str, node: Any):
        """A ``jsonschema`` validator of the document's draft for ``node`` (refs resolve in the document)."""
        hit = self._validators.get(pointer)
        if hit is None:
            import jsonschema

            classes = {4: jsonschema.Draft4Validator, 6: jsonschema.Draft6Validator, 7: jsonschema.Draft7Validator,
                       2019: jsonschema.Draft201909Validator, 2020: jsonschema.Draft202012Validator}
            cls = classes[int(self.document.dialect)]
            root = self._validators.get("<root>")
            if root is None:
                checker = cls.FORMAT_CHECKER if self.options.format_assertion else None
                extra = {"registry": _referencing_registry(self.options.registry)} if self.options.registry else {}
                root = cls(self.document.root, format_checker=checker, **extra)
                self._validators["<root>"] = root
            hit = root.evolve(schema=node)
            self._validators[pointer] = hit
        return hit

    # --- leaves ---------------------------------------------------------------------------------

    def _leaf(self, conj: Conjunction, sole: bool = True) -> Expr:
        """The value's expression for one leaf; ``sole``: no other leaf shares the value (see
        ``objects.object_body``)."""
        if conj.is_empty:
            return NOTHING
        if conj.enum is not None:
            return literal_values(self.admitted(conj, self.enum_members(conj.enum)), self.layout)
        self._check_deferred(conj)
        excluded = _excluded_by_type(conj)
        branches: list[Expr] = []
        if "null" in conj.types and "null" not in excluded:
            branches.append(Literal("null"))
        if "boolean" in conj.types:
            gone = excluded.get("boolean", [])
            branches += [Literal(t) for t, v in (("true", True), ("false", False)) if v not in gone]
        if "string" in conj.types:
            branches.append(self._string(conj, excluded.get("string", [])))
        if "number" in conj.types or ("integer" in conj.types and not conj.not_integer):
            branches.append(self._number(conj, excluded.get("number", [])))
        if "array" in conj.types:
            branches.append(arrays.array_expr(self, conj))
        if "object" in conj.types:
            branches.append(objects.object_expr(self, conj, sole=sole))
        for kind in ("array", "object"):
            if excluded.get(kind) and kind in conj.types:
                self.unsupported("not", conj.string_where, f"excluding particular {kind} values is not supported")
        return alt(branches)

    def _check_deferred(self, conj: Conjunction) -> None:
        for types, keyword, where, reason in conj.deferred:
            if intersect_types(frozenset(types), conj.types):
                self.unsupported(keyword, where, reason)

    def _string(self, conj: Conjunction, excluded: list) -> Expr:
        keywords = dict(conj.string)
        patterns = list(conj.not_patterns)
        excluded = [v for v in excluded if self.string_in(v, keywords, patterns)]
        if patterns or excluded:
            return combinators.restricted_string(self, conj, keywords, patterns, excluded)
        return self.string_schema(keywords, conj.string_where)

    def string_schema(self, keywords: dict, where: str) -> Expr:
        """The scalars module's string expression; under ``lenient``, retried without what it rejects."""
        return self._relaxing(keywords, lambda kept: scalars.string_schema(kept, where, self.options, narrowed=self.narrowed))

    def _relaxing(self, keywords: dict, build) -> Expr:
        """``build(keywords)``; each ``UnsupportedSchemaError`` is reported (``unsupported``: it
        raises unless ``lenient``) and the build retried without the keyword it names (without
        every keyword when it names none of them)."""
        keywords = dict(keywords)
        while True:
            try:
                return build(keywords)
            except UnsupportedSchemaError as exc:
                self.unsupported(exc.keyword, exc.pointer, exc.reason)
                if exc.keyword in keywords:
                    del keywords[exc.keyword]
                elif keywords:
                    keywords = {}
                else:
                    raise

    def string_in(self, value: str, keywords: dict, patterns: list) -> bool:
        """Is ``value`` a string ``keywords`` and ``patterns`` (pattern, where, positive) allow?"""
        node = {"type": "string", **{k: v for k, v in keywords.items() if k != "pattern"}}
        try:
            ok = self.validator(f"<string {sorted(node.items())!r}>", node).is_valid(value)
        except Exception:  # a keyword jsonschema cannot evaluate: assume the value may be allowed
            ok = True
        checks = list(patterns) + ([(keywords["pattern"], "#", True)] if "pattern" in keywords else [])
        return ok and all(combinators.pattern_search(self, p, value, w) == positive for p, w, positive in checks)

    def _number(self, conj: Conjunction, excluded: list) -> Expr:
        integer = "number" not in conj.types
        keywords = dict(conj.number)
        node = {"type": "integer" if integer else "number", **keywords}
        live = []
        for v in excluded:
            try:
                if self.validator(f"<number {sorted(node.items())!r}>", node).is_valid(v):
                    live.append(v)
            except Exception:  # a keyword jsonschema cannot evaluate: assume the value may be allowed
                live.append(v)
        if live:
            expr = alt(self._number_keywords(gap, conj.number_where, integer) for gap in _gaps(keywords, live, conj.number_where))
        else:
            expr = self._number_keywords(keywords, conj.number_where, integer)
        if integer and expr != NOTHING and self.document.dialect >= 6:
            expr = _with_zero_fractions(expr)
        if conj.not_integer and expr != NOTHING:
            from grammars.automata.byte_dfa import compile_regular, intersect
            from grammars.frontends.json_schema.numbers import non_integer_text

            self.narrowed(f"{conj.number_where}: non-integer numbers are plain decimals of at most 15 significant digits")
            dfa = intersect(compile_regular(expr), compile_regular(non_integer_text()))
            expr = NOTHING if dfa.is_empty_language else dfa
        return expr

    def _number_keywords(self, keywords: dict, where: str, integer: bool) -> Expr:
        """The scalars module's number expression; under ``lenient``, retried without what it rejects."""
        return self._relaxing(keywords, lambda kept: scalars.number_schema(kept, where, self.options, integer=integer))


def _with_zero_fractions(ints: Expr) -> Expr:
    """Integer texts plus, for those of at most 15 digits, ``.0``, ``.00``, ...: from draft 6 on
    ``1.0`` is an integer. Python reads it as a ``float``, which is exact up to 15 digits, so
    bounds and ``multipleOf`` judge it as they judge ``1``; longer texts keep the integer form.

    Memoised for range expressions (a pure function of the bounds; most schemas' integers are
    unbounded or share a few bounds); a ``multipleOf`` automaton, compared by identity and
    possibly large, is not kept."""
    from grammars.automata.byte_dfa import ByteDFA
    from grammars.ir import Alt, Repeat, Seq

    stack = [ints]
    while stack:
        e = stack.pop()
        if isinstance(e, ByteDFA):
            return _zero_fractions(ints)
        if isinstance(e, (Seq, Alt)):
            stack.extend(e.items)
        elif isinstance(e, Repeat):
            stack.append(e.item)
    return _zero_fractions_of_range(ints)


@lru_cache(maxsize=256)
def _zero_fractions_of_range(ints: Expr) -> Expr:
    return _zero_fractions(ints)


def _zero_fractions(ints: Expr) -> Expr:
    from grammars.automata.byte_dfa import compile_regular, intersect
    from grammars.ir import repeat, seq

    dfa = intersect(compile_regular(ints), _short_integers())
    if dfa.is_empty_language:
        return ints
    return alt([ints, seq([dfa, Literal("."), repeat(Literal("0"), 1, None)])])


@lru_cache(maxsize=1)
def _short_integers():
    """Integer texts of at most ``ROUND_TRIP_DIGITS`` digits."""
    from grammars.automata.byte_dfa import compile_regular
    from grammars.frontends.json_schema.numbers import (
        DIGIT,
        NONZERO_DIGIT,
        ROUND_TRIP_DIGITS,
    )
    from grammars.ir import repeat, seq

    digits = alt([Literal("0"), seq([NONZERO_DIGIT, repeat(DIGIT, 0, ROUND_TRIP_DIGITS - 1)])])
    return compile_regular(seq([repeat(Literal("-"), 0, 1), digits]))


def _gaps(keywords: dict, excluded: list, where: str) -> list[dict]:
    """``keywords`` minus finitely many values: one keyword set per open interval between them
    (``x != v`` is ``x < v or x > v``, bounds the number module enforces exactly)."""
    from fractions import Fraction

    values = sorted({Fraction(str(v)) if isinstance(v, float) else Fraction(v): v for v in excluded}.items())
    points = [v for _, v in values]
    out = []
    for low, high in zip([None, *points], [*points, None]):
        probe = Conjunction(number=dict(keywords), number_where=where)
        _merge_number_keywords(probe, {k: v for k, v in (("exclusiveMinimum", low), ("exclusiveMaximum", high)) if v is not None}, where)
        out.append(probe.number)
    return out


def _referencing_registry(registry: tuple[tuple[str, str], ...]):
    """The ``registry`` option as a ``referencing.Registry`` for ``jsonschema`` validators."""
    import json

    from referencing import Registry, Resource
    from referencing.jsonschema import DRAFT202012

    return Registry().with_resources(
        (uri, Resource.from_contents(json.loads(text), default_specification=DRAFT202012)) for uri, text in registry
    )


# --- keyword handlers (generic families) ------------------------------------------------------


def _type(c: SchemaCompiler, conj: Conjunction, part: Located, value: Any) -> None:
    conj.restrict_types(parse_type(value, part.where))


def _enum(c: SchemaCompiler, conj: Conjunction, part: Located, value: Any) -> None:
    if not isinstance(value, list):
        raise GrammarError(f"malformed schema at {part.where}: 'enum' must be an array, got {value!r}")
    conj.restrict_enum(value)


def _const(c: SchemaCompiler, conj: Conjunction, part: Located, value: Any) -> None:
    conj.restrict_enum([value])


_HANDLERS = {
    "type": _type,
    "enum": _enum,
    "const": _const,
    "allOf": combinators.apply_all_of,
    "anyOf": combinators.apply_any_of,
    "oneOf": combinators.apply_one_of,
    "not": combinators.apply_not,
    "if": combinators.apply_if,
    "then": combinators.ignore_branch,
    "else": combinators.ignore_branch,
    "dependencies": combinators.apply_dependencies,
    "dependentRequired": combinators.apply_dependent_required,
    "dependentSchemas": combinators.apply_dependent_schemas,
    "unevaluatedProperties": combinators.apply_unevaluated_properties,
    "unevaluatedItems": combinators.apply_unevaluated_items,
}

_CONSUMED = OBJECT_KEYWORDS | ARRAY_KEYWORDS | scalars.STRING_KEYWORDS | scalars.NUMBER_KEYWORDS | frozenset(scalars.NUMBER_BOUNDS) | {"multipleOf"}


def _trivial_unsupported(key: str, value: Any) -> bool:
    """``unevaluatedProperties: true`` and the like constrain nothing."""
    return key in ("unevaluatedProperties", "unevaluatedItems") and (value is True or value == {})


def _unconstrained(conj: Conjunction) -> bool:
    """Nothing but pending disjunctions (and annotations) so far."""
    return (
        conj.types == ALL_TYPES and conj.enum is None and not conj.excluded and not conj.string
        and not conj.not_patterns and not conj.number and not conj.deferred and not conj.not_integer
        and conj.objects == ObjectRules() and conj.arrays == ArrayRules()
    )


def _rule_hint(parts: list[Located]) -> str:
    return "&".join(sorted(p.pointer for p in parts))


def _excluded_by_type(conj: Conjunction) -> dict[str, list]:
    out: dict[str, list] = {}
    for v in dedupe(conj.excluded):
        t = json_type(v)
        out.setdefault("number" if t == "integer" else t, []).append(v)
    return out


def _merge_number_keywords(conj: Conjunction, numbers: dict, where: str) -> None:
    merged = dict(conj.number)
    if not conj.number:
        conj.number_where = where
    for key, value in numbers.items():
        if key not in merged:
            merged[key] = value
        elif key in ("minimum", "exclusiveMinimum"):
            merged[key] = max(merged[key], value)
        elif key in ("maximum", "exclusiveMaximum"):
            merged[key] = min(merged[key], value)
        elif key == "multipleOf":
            merged[key] = _merge_multiple_of(merged[key], value, where)
        elif canonical(merged[key]) != canonical(value):
            raise UnsupportedSchemaError(key, where, f"two different {key!r} values in one conjunction")
    # keep only the tighter of inclusive/exclusive bounds on each side
    for inclusive, exclusive in (("minimum", "exclusiveMinimum"), ("maximum", "exclusiveMaximum")):
        if inclusive in merged and exclusive in merged:
            lower = inclusive == "minimum"
            a, b = merged[inclusive], merged[exclusive]
            if (b >= a) if lower else (b <= a):
                del merged[inclusive]
            else:
                del merged[exclusive]
    conj.number = merged


def _merge_multiple_of(a: int | float, b: int | float, where: str) -> int | float:
    from fractions import Fraction

    fa, fb = Fraction(str(a)), Fraction(str(b))
    if (fa / fb).denominator == 1:
        return a
    if (fb / fa).denominator == 1:
        return b
    if fa.denominator == 1 and fb.denominator == 1:
        from math import lcm

        return lcm(int(fa), int(fb))
    raise UnsupportedSchemaError("multipleOf", where, f"multipleOf {a} and {b} together")


def _merge_string_keywords(c: SchemaCompiler, conj: Conjunction, strings: dict, where: str) -> None:
    merged = dict(conj.string)
    if not conj.string:
        conj.string_where = where
    for key, value in strings.items():
        if key in ("minLength", "maxLength"):
            value = count_keyword(value, key, where)
        if key == "pattern" and not isinstance(value, str):
            raise GrammarError(f"malformed schema at {where}: 'pattern' must be a string, got {value!r}")
        if key not in merged:
            merged[key] = value
        elif key == "minLength":
            merged[key] = max(merged[key], value)
        elif key == "maxLength":
            merged[key] = min(merged[key], value)
        elif merged[key] == value:
            continue
        elif key == "pattern":
            conj.string = merged
            combinators.add_pattern(c, conj, value, where)
            merged = conj.string
        else:
            raise UnsupportedSchemaError(key, where, f"two different {key!r} values in one conjunction")
    conj.string = merged
