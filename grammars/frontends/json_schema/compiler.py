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

Before anything is compiled, ``validation.check_schema`` refuses keyword values the draft's
meta-schema rejects. Values are built depth first, but never more than ``DEFER_DEPTH`` inline
ones inside each other: a deeper one becomes a rule built later from a work list, so the front
end's Python stack stays flat however deep a schema nests (objects in objects, ``$defs``
chains); a ``RecursionError`` anyway (in-place chains, deep literals) becomes ``LimitExceeded``.
Integers get their other spellings (``1.0``, ``1e2``) where the draft makes them valid, and
every narrowing of spellings is reported (``NUMBER_SPELLINGS``, ``SchemaReport.narrowed_values``).

Dialects: keywords of every draft from 4 to 2020-12 are understood (``definitions``, ``id``,
``dependencies``, boolean ``exclusiveMinimum``, array-form ``items`` + ``additionalItems``);
``$ref`` siblings are ignored in drafts 4–7 and applied from 2019-09 on, as the drafts say.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any, Iterable

from grammars.errors import (
    GrammarError,
    LimitExceeded,
    UnsupportedSchemaError,
)
from grammars.frontends.json_schema import (
    arrays,
    combinators,
    objects,
    scalars,
    validation,
)
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
    short_pointer,
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
from grammars.ir import EMPTY, NOTHING, Expr, Grammar, Literal, Ref, alt, references
from grammars.limits import Limits
from grammars.memo import shared_automata

__all__ = [
    "SchemaReport",
    "Relaxation",
    "parse_json_schema",
    "analyze_json_schema",
    "SchemaCompiler",
    "Conjunction",
]

#: marks the ``SchemaReport.narrowed`` notes that only limit how numbers may be written
NUMBER_SPELLINGS = "number spellings:"

#: nesting of in-place applications (``$ref``, ``allOf``, ``not``, ``if`` ...) within one value:
#: each is a few Python frames, so this stays well inside the recursion limit (an in-place chain
#: this long is no real schema; structural nesting, objects in objects, has no such bound)
MAX_APPLY_DEPTH = 200
#: values built inline, one inside the other, before a deeper one becomes a rule built from a
#: work list (``SchemaCompiler._defer``): bounds the Python stack whatever the schema's depth
DEFER_DEPTH = 16



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

    @property
    def narrowed_values(self) -> tuple[str, ...]:
        """``narrowed`` without the notes that only limit how numbers may be written (every
        ``type: integer`` from draft 6 on rejects some spellings of its integers, such as
        ``1e+20`` or ``15e1``): the places where some valid *value* has no accepted text."""
        return tuple(note for note in self.narrowed if NUMBER_SPELLINGS not in note)


def parse_json_schema(document: dict | bool, options: JsonSchemaOptions | None = None, *,
                      limits: Limits | None = None) -> Grammar:
    """The grammar of JSON texts valid under ``document`` (a loaded schema, see ``load_schema``).

    Raises ``UnsupportedSchemaError`` (keyword, pointer) for constraints it cannot enforce
    exactly unless ``options.lenient``; ``GrammarError`` for malformed schemas and dangling
    ``$ref``s; ``LimitExceeded`` for literals (``const``, ``enum``, keys) and string automata
    past ``limits`` (the compiler's; the defaults when None). Use ``analyze_json_schema`` to
    also learn what ``lenient`` relaxed.
    """
    return analyze_json_schema(document, options, limits=limits).grammar


def analyze_json_schema(document: dict | bool, options: JsonSchemaOptions | None = None, *,
                        limits: Limits | None = None) -> SchemaReport:
    """``parse_json_schema`` plus a ``SchemaReport`` of relaxed, ignored and narrowed constraints."""
    options = options or JsonSchemaOptions()
    indexed = SchemaDocument.of(document, options.registry)
    validation.check_schema(indexed)
    return SchemaCompiler(indexed, options, limits).run()


# --- the compiler -------------------------------------------------------------------------------


class SchemaCompiler:
    """Compiles one document under one set of options. Single use: call ``run()`` once.

    The family modules (``objects``, ``arrays``, ``combinators``) call back into it through
    ``value``, ``apply``, ``satisfies``, ``unsupported``, ``add_rule`` and the attributes
    ``document``, ``options``, ``layout``.
    """

    def __init__(self, document: SchemaDocument, options: JsonSchemaOptions, limits: Limits | None = None):
        self.document = document
        self.options = options
        #: draft 4's ``integer`` is a number written without fraction or exponent (``1.0`` is not
        #: one), as its validators read JSON: then a number's spelling decides its type
        self.integers_by_spelling = int(document.dialect) < 6
        #: the layout also carries the compiler's ``Limits`` (``layout.limits``) to the families
        self.layout = Layout(options, integers_by_spelling=self.integers_by_spelling, limits=limits)
        self.rules: dict[str, Expr] = {}
        self._rule_of: dict[frozenset, str] = {}
        self._inline: dict[frozenset, Expr] = {}
        self._building: dict[frozenset, str | None] = {}
        self._in_progress: set[str] = set()  # rules whose body is being built
        #: references met to a rule still being built (recursion); objects.object_expr compares
        #: the count before and after its members to learn whether its subtree recurses
        self.back_references = 0
        #: subset states the exact any-order layouts may still take (``objects.object_body``)
        self.any_order_states_left = options.any_order_budget
        self._validators: dict[str, Any] = {}
        self._satisfied: dict[tuple[str, str], bool] = {}
        #: negated schema pointer -> its leaves, None where they cannot be built (``_excludes``)
        self._negated_leaves: dict[str, list[Conjunction] | None] = {}
        self._names: set[str] = set()
        self._suffixes: dict[str, int] = {}  # hint -> last ``~n`` handed out for it
        self._relaxed: list[Relaxation] = []
        self._ignored: list[tuple[str, str]] = []
        #: depth of nested ``provably_disjoint`` calls (see ``combinators.MAX_DISJOINT_NESTING``)
        self.disjoint_nesting = 0
        self.pattern_dfas: dict = {}  # pattern -> CodePointDFA (combinators)
        self.canonical_sets: dict = {}  # id(list) -> (list, its canonical values) (combinators.evaluate)
        self.value_judges: dict = {}  # (schema pointer, enum known) -> what combinators.evaluate checks
        self.enum_unions: dict = {}  # anyOf of one-enum branches -> their values (combinators.apply_any_of)
        self._narrowed: list[str] = []
        self._depth = 0  # in-place applications (``apply``) now open
        self._value_depth = 0  # values (``value``) now being built inline, up the Python stack
        self._deferred: list[tuple[str, list[Located]]] = []  # (rule, parts) built later (``_defer``)
        self._where = "#"  # the schema being applied, for a message past Python's stack

    def run(self) -> SchemaReport:
        try:
            root = self.value((self.document.located_root(),), rule=True)
            while self._deferred:  # values nested deeper than DEFER_DEPTH, one work item each
                name, resolved = self._deferred.pop()
                self._build_rule(name, resolved)
        except RecursionError:
            raise LimitExceeded(
                "recursion", sys.getrecursionlimit(),
                f"the schema at {short_pointer(self._where)} combines subschemas in place (allOf, $ref, anyOf, "
                "not, ...) or holds values nested too deeply for Python's recursion limit") from None
        self.rules["start"] = self.layout.document(root)
        grammar = Grammar.of(_referenced_first(self.rules, "start"), "start", source="<json schema>")
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
            string = scalars.string_schema({}, "#", self.options, limits=lay.limits)
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
        if self._value_depth >= DEFER_DEPTH:
            return self._defer(key, resolved)
        if via_ref or len(resolved) > 1 or any("$ref" in p.node for p in resolved):
            name = self.fresh_rule_name(_rule_hint(resolved))
            self._rule_of[key] = name
            self.rules[name] = NOTHING  # placeholder while building (recursion sees the Ref)
            self._build_rule(name, resolved)
            return Ref(name)
        self._building[key] = None
        self._value_depth += 1
        try:
            expr = self._build(resolved)
        finally:
            self._value_depth -= 1
            name = self._building.pop(key)
        if name is not None:
            self.rules[name] = expr
            self._rule_of[key] = name
            return Ref(name)
        self._inline[key] = expr
        return expr

    def _build_rule(self, name: str, resolved: list[Located]) -> None:
        """Build the body of rule ``name`` (already named, a placeholder in ``rules``)."""
        self._in_progress.add(name)
        self._value_depth += 1
        try:
            self.rules[name] = self._build(resolved)
        finally:
            self._value_depth -= 1
            self._in_progress.discard(name)

    def _defer(self, key: frozenset, resolved: list[Located]) -> Expr:
        """A value nested ``DEFER_DEPTH`` values deep: a rule now, built later by ``run`` from its
        work list, so schemas and documents nest as deep as they like without Python recursion.

        The caller cannot look into the value (it is a ``Ref``): an empty value then makes its
        member or element underivable rather than dropped, the same language; and the subtree
        is assumed to lead back to an enclosing rule (``back_references``), which only keeps
        ``objects`` from layouts that would multiply parses through a recursion."""
        name = self.fresh_rule_name(_rule_hint(resolved))
        self._rule_of[key] = name
        self.rules[name] = NOTHING
        self._deferred.append((name, resolved))
        self.back_references += 1
        return Ref(name)

    def _follow_plain_refs(self, part: Located) -> tuple[Located, bool]:
        """Replace a schema that is only a ``$ref`` (plus annotations) by its target; a chain of
        such references may be as long as the document, a cycle of them is refused."""
        followed = False
        visited: set[str] = set()
        while True:
            if part.pointer in visited:
                raise UnsupportedSchemaError("$ref", part.where, "a cycle of references that never reaches a schema")
            visited.add(part.pointer)
            node = part.node
            dynamic = isinstance(node, dict) and "$dynamicRef" in node and "$ref" not in node and self.document.dialect >= 2020
            key = "$dynamicRef" if dynamic else "$ref"
            if not (isinstance(node, dict) and key in node):
                break
            if (dynamic or not self.document.dialect.ref_overrides_siblings) and any(
                k not in IGNORED_KEYWORDS and k != key and not self.is_unknown(k) for k in node
            ):
                break
            try:
                resolve = self.document.resolve_dynamic if dynamic else self.document.resolve
                part = resolve(node[key], part)
            except UnsupportedSchemaError as exc:
                self.unsupported(exc.keyword, exc.pointer, exc.reason)
                return Located(True, part.pointer + "!relaxed", part.base), followed
            followed = True
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
        sole = len(leaves) == 1
        return alt(self._leaf(leaf, sole=sole) if isinstance(leaf, Conjunction) else leaf
                   for leaf in combinators.merge_string_leaves(self, leaves))

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
        self._where = part.where
        try:
            if self._depth > MAX_APPLY_DEPTH:
                raise LimitExceeded("apply_depth", MAX_APPLY_DEPTH,
                                    f"the schema at {short_pointer(part.where)} is applied in place ($ref, allOf, not, "
                                    f"if, ...) more than {MAX_APPLY_DEPTH} levels deep")
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
            elif self.is_unknown(key):
                if self.options.unknown_keywords == "error" and not key.startswith("x-"):
                    raise UnsupportedSchemaError(key, where, "not a JSON Schema keyword (unknown_keywords='error')")
                self._ignored.append((key, where))

    def is_unknown(self, key: str) -> bool:
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

    def leaves(self, conj: Conjunction, budget: list[int] | None = None, origin: Disjunction | None = None) -> list[Conjunction]:
        """Distribute pending disjunctions: conjunctions without any, whose union is ``conj``.
        ``origin``: the disjunction being distributed, named when the leaves run out."""
        budget = budget if budget is not None else [self.options.max_combinations]
        if conj.is_empty:
            return []
        if conj.enum is not None or not conj.pending:
            budget[0] -= 1
            if budget[0] < 0:
                keyword, where = (origin.keyword, origin.where) if origin is not None else ("anyOf", conj.objects.where)
                raise UnsupportedSchemaError(keyword, where, f"more than {self.options.max_combinations} combinations "
                                             "of alternatives (JsonSchemaOptions.max_combinations)")
            return [conj]
        rest = conj.copy()
        disjunction = rest.pending.pop(0)
        if disjunction.negated is not None and self._excludes(rest, disjunction.negated):
            return self.leaves(rest, budget, origin)
        groups: list[list[Conjunction]] = []
        for branch in disjunction.branches:
            option = rest.copy()
            for part in branch:
                self.apply(option, part)
            groups.append(self.leaves(option, budget, disjunction))
        if disjunction.keyword == "oneOf":
            # judge overlaps without the atoms applied so far: they include the schema holding
            # this oneOf, whose validation (exactly one branch) would make any overlap look empty
            probe = _without_atoms(rest)
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

    def _excludes(self, conj: Conjunction, negated: Located) -> bool:
        """Is ``conj`` provably disjoint from ``negated``, so that ``not negated`` adds nothing?

        A negation distributes into a leaf per way to fail (for an object, one per member and
        per required name). Where the rest already excludes the schema (items of two ``oneOf``
        branches whose required member differs in type), those leaves only cut ``conj`` into
        pieces, each its own object automaton. The negated schema's leaves are a probe: what
        building them records (relaxations, ignored keywords) is dropped, and a schema they
        cannot be built for is not excluded. ``conj`` is judged without its atoms
        (``_without_atoms``), which hold the negation itself."""
        if negated.pointer not in self._negated_leaves:
            marks = len(self._relaxed), len(self._ignored), len(self._narrowed)
            probes: list[Conjunction] | None
            try:
                probes = self.leaves(self.conjunction([negated]), [self.options.max_combinations])
            except (UnsupportedSchemaError, LimitExceeded, GrammarError, RecursionError):
                probes = None
            finally:
                del self._relaxed[marks[0]:], self._ignored[marks[1]:], self._narrowed[marks[2]:]
            self._negated_leaves[negated.pointer] = probes
        probes = self._negated_leaves[negated.pointer]
        if probes is None:
            return False
        probe = _without_atoms(conj)
        return all(combinators.provably_disjoint(self, probe, leaf) for leaf in probes)

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
            leaves = self.leaves(option, budget, disjunction)
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

    def admitted(self, conj: Conjunction, candidates: Iterable[Any], enum_members: bool = False) -> list:
        """The ``candidates`` ``conj`` admits: of one of its types and satisfying every atom.

        ``enum_members``: the candidates are members of ``conj.enum`` (``enum_members``), which
        already lie in every ``enum`` and ``const`` of the atoms (``Conjunction.restrict_enum``
        intersected them), so those keywords are not judged again: judging each value against
        each whole ``enum`` made a large enum cost its size squared."""
        return [v for v in candidates if value_has_type(v, conj.types, self.integers_by_spelling)
                and all(self.satisfies(v, a, enum_members) for a in conj.atoms)]

    def satisfies(self, value: Any, part: Located, enum_known: bool = False) -> bool:
        """Does the concrete JSON ``value`` satisfy the (possibly synthetic) schema ``part``?
        (``enum_known``: ``value`` is known to be in ``part``'s own ``enum``/``const``.)

        Memoised per (schema pointer, value as JSON text): the leaves of an expanded
        ``anyOf``/``oneOf`` filter the same ``enum`` values against the same atoms again and
        again (JsonSchemaStore service-schema: 115,000 checks, three minutes of ``jsonschema``).
        The text keeps ``1`` and ``1.0`` apart, as draft 4's ``integer`` does.
        """
        key = (part.pointer, value_text(value), enum_known)
        hit = self._satisfied.get(key)
        if hit is None:
            hit = self._satisfied[key] = combinators.evaluate(self, part, value, enum_known)
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
            members = self.admitted(conj, self.enum_members(conj.enum), enum_members=True)
            try:
                return literal_values(members, self.layout)
            except LimitExceeded as exc:
                keyword, where = conj.enum_source
                raise LimitExceeded(exc.limit, exc.value, f"{keyword!r} at {where}: {exc.args[0]}") from None
        self.check_deferred(conj)
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

    def check_deferred(self, conj: Conjunction) -> None:
        """Raise (or, under ``lenient``, record) the keywords ``conj`` deferred that constrain a
        type the leaf still allows."""
        for types, keyword, where, reason in conj.deferred:
            if intersect_types(frozenset(types), conj.types):
                self.unsupported(keyword, where, reason)

    def _string(self, conj: Conjunction, excluded: list) -> Expr:
        keywords = dict(conj.string)
        patterns = list(conj.not_patterns)
        excluded = [v for v in excluded if self.string_in(v, keywords, patterns, conj.pattern_site)]
        if patterns or excluded:
            return combinators.restricted_string(self, conj, keywords, patterns, excluded)
        return self.string_schema(keywords, conj.string_where, conj.string_sources)

    def string_schema(self, keywords: dict, where: str, sources: dict | None = None, pattern_at: str | None = None) -> Expr:
        """The scalars module's string expression; under ``lenient``, retried without what it
        rejects. ``sources``: keyword -> pointer of the schema it came from (``where`` when
        absent); ``pattern_at``: the pointer of the pattern itself, where it is no ``.../pattern``."""
        sources = sources or {}
        site = pattern_at or sources.get("pattern", where) + "/pattern"
        return self._relaxing(
            keywords, lambda kept: scalars.string_schema(kept, where, self.options, narrowed=self.narrowed, pattern_at=site,
                                                         limits=self.layout.limits),
            sources)

    def _relaxing(self, keywords: dict, build, sources: dict | None = None) -> Expr:
        """``build(keywords)``; each ``UnsupportedSchemaError`` is reported (``unsupported``: it
        raises unless ``lenient``) and the build retried without the keyword it names (without
        every keyword when it names none of them). An error about a keyword is reported at the
        schema it came from (``sources``), not at the conjunction's first schema."""
        keywords = dict(keywords)
        sources = sources or {}
        while True:
            try:
                return build(keywords)
            except UnsupportedSchemaError as exc:
                pointer = sources.get(exc.keyword, exc.pointer) if exc.keyword != "pattern" else exc.pointer
                self.unsupported(exc.keyword, pointer, exc.reason)
                if exc.keyword in keywords:
                    del keywords[exc.keyword]
                elif keywords:
                    keywords = {}
                else:
                    raise

    def string_in(self, value: str, keywords: dict, patterns: list, pattern_site: str = "#/pattern") -> bool:
        """Is ``value`` a string ``keywords`` and ``patterns`` (pattern, its pointer, positive)
        allow? ``pattern_site``: the pointer of ``keywords["pattern"]``."""
        node = {"type": "string", **{k: v for k, v in keywords.items() if k != "pattern"}}
        try:
            ok = self.validator(f"<string {sorted(node.items())!r}>", node).is_valid(value)
        except Exception:  # a keyword jsonschema cannot evaluate: assume the value may be allowed
            ok = True
        checks = list(patterns) + ([(keywords["pattern"], pattern_site, True)] if "pattern" in keywords else [])
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
            expr = alt(self._number_keywords(gap, conj.number_where, integer, conj.number_sources)
                       for gap in _gaps(keywords, live, conj.number_where))
        else:
            expr = self._number_keywords(keywords, conj.number_where, integer, conj.number_sources)
        if expr != NOTHING and not conj.not_integer:
            expr = self._number_spellings(expr, keywords, integer, conj.number_where)
        if conj.not_integer and expr != NOTHING:
            from grammars.automata.byte_dfa import compile_regular, intersect
            from grammars.frontends.json_schema.numbers import non_integer_text

            self.narrowed(f"{conj.number_where}: non-integer numbers are plain decimals of at most 15 significant digits")
            dfa = intersect(compile_regular(expr), compile_regular(non_integer_text()))
            expr = NOTHING if dfa.is_empty_language else dfa
        return expr

    def _number_spellings(self, expr: Expr, keywords: dict, integer: bool, where: str) -> Expr:
        """``expr`` with the other spellings of its integers where they are numbers of the
        value's type, and the spelling narrowing reported.

        ``scalars.number_schema`` gives integer texts only for ``type: integer`` and for an
        integer ``multipleOf``. From draft 6 on ``1.0`` is an integer, and under ``multipleOf``
        ``9.0`` is a multiple of 3 in every draft, so those spellings are valid too:
        ``numbers.integral_spellings`` adds the exactly judged ones (zero fractions, normalised
        exponents, up to 15 digits). Draft 4's ``integer`` is the integer text alone: exact."""
        if integer and self.document.dialect < 6:
            return expr
        if integer or "multipleOf" in keywords:
            self.narrowed(f"{where}: {NUMBER_SPELLINGS} integers written with a fraction or an exponent ('1.0', "
                          "'1e2') are accepted at most up to 15 digits, as zero fractions and normalised exponents")
            return _with_spellings(expr)
        if any(k in keywords for k in scalars.NUMBER_BOUNDS):
            self.narrowed(f"{where}: {NUMBER_SPELLINGS} bounded numbers are accepted as integer, plain decimal and "
                          "normalised scientific texts (not '12e3' or '0.5e1')")
        return expr

    def _number_keywords(self, keywords: dict, where: str, integer: bool, sources: dict | None = None) -> Expr:
        """The scalars module's number expression; under ``lenient``, retried without what it rejects."""
        return self._relaxing(keywords, lambda kept: scalars.number_schema(kept, where, self.options, integer=integer),
                              sources)


def _with_spellings(ints: Expr) -> Expr:
    """Integer texts plus their other spellings (``numbers.integral_spellings``).

    Memoised per process for range expressions (``grammars.memo``: a pure function of the bounds;
    most schemas' integers are unbounded or share a few bounds); an expression holding an
    automaton (``multipleOf``, a large bound) is not kept: it may be large, and the table's byte
    bound counts only automata stored as values."""
    from grammars.automata.byte_dfa import ByteDFA
    from grammars.ir import Alt, Repeat, Seq

    stack = [ints]
    while stack:
        e = stack.pop()
        if isinstance(e, ByteDFA):
            return _spellings(ints)
        if isinstance(e, (Seq, Alt)):
            stack.extend(e.items)
        elif isinstance(e, Repeat):
            stack.append(e.item)
    key = ("integral_spellings", ints)
    known = shared_automata().get(key)
    if known is None:
        known = _spellings(ints)
        shared_automata().put(key, known)
    return known


def _spellings(ints: Expr) -> Expr:
    from grammars.automata.byte_dfa import compile_regular
    from grammars.frontends.json_schema.numbers import integral_spellings

    others = integral_spellings(compile_regular(ints))
    return ints if others.is_empty_language else alt([ints, others])


def _referenced_first(rules: dict[str, Expr], start: str) -> dict[str, Expr]:
    """``rules`` ordered so that every rule comes after the rules it refers to (where no cycle
    forbids it), found with an explicit stack: a consumer that walks rules in order and recurses
    into references (the lowering's inlining analysis) then finds each reference done already,
    and its recursion stays shallow however deep the schema nests. References come from
    ``ir.references`` (cached on the nodes; rules share large subtrees, the encodings of strings)."""
    order: dict[str, Expr] = {}
    seen: set[str] = set()
    for root in [start, *rules]:
        if root in seen:
            continue
        seen.add(root)
        stack = [(root, iter(references(rules[root])))]
        while stack:
            name, refs = stack[-1]
            for ref in refs:
                if ref in rules and ref not in seen:
                    seen.add(ref)
                    stack.append((ref, iter(references(rules[ref]))))
                    break
            else:
                stack.pop()
                order[name] = rules[name]
    return order


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
    if conj.enum is None:
        conj.enum_source = ("enum", part.where)
    conj.restrict_enum(value)


def _const(c: SchemaCompiler, conj: Conjunction, part: Located, value: Any) -> None:
    if conj.enum is None:
        conj.enum_source = ("const", part.where)
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
    sources = conj.number_sources
    if not conj.number:
        conj.number_where = where
    for key, value in numbers.items():
        if key not in merged:
            merged[key] = value
            sources[key] = where
        elif key in ("minimum", "exclusiveMinimum"):
            if _exact(value) > _exact(merged[key]):
                merged[key] = value
                sources[key] = where
        elif key in ("maximum", "exclusiveMaximum"):
            if _exact(value) < _exact(merged[key]):
                merged[key] = value
                sources[key] = where
        elif key == "multipleOf":
            merged[key] = _merge_multiple_of(merged[key], value, where)
            sources[key] = where
        elif canonical(merged[key]) != canonical(value):
            raise UnsupportedSchemaError(key, where, f"two different {key!r} values in one conjunction")
    # keep only the tighter of inclusive/exclusive bounds on each side
    for inclusive, exclusive in (("minimum", "exclusiveMinimum"), ("maximum", "exclusiveMaximum")):
        if inclusive in merged and exclusive in merged:
            lower = inclusive == "minimum"
            a, b = _exact(merged[inclusive]), _exact(merged[exclusive])
            if (b >= a) if lower else (b <= a):
                del merged[inclusive]
            else:
                del merged[exclusive]
    conj.number = merged


def _exact(value: float):
    """A bound as an exact rational: a float as the decimal its ``repr`` writes, an int as itself
    (comparing an int beyond the float range with a float is exact in Python, but a float's
    binary value is not the decimal the schema wrote)."""
    from fractions import Fraction

    return Fraction(repr(value)) if isinstance(value, float) else Fraction(value)


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
            raise GrammarError(f"malformed schema at {where}/pattern: 'pattern' must be a string, got {value!r}")
        if key not in merged:
            merged[key] = value
            conj.string_sources[key] = where
        elif key == "minLength":
            if value > merged[key]:
                merged[key] = value
                conj.string_sources[key] = where
        elif key == "maxLength":
            if value < merged[key]:
                merged[key] = value
                conj.string_sources[key] = where
        elif merged[key] == value:
            continue
        elif key == "pattern":
            conj.string = merged
            combinators.add_pattern(c, conj, value, where)
            merged = conj.string
        else:
            raise UnsupportedSchemaError(key, where, f"two different {key!r} values in one conjunction")
    conj.string = merged


def _without_atoms(conj: Conjunction) -> Conjunction:
    """A copy of ``conj`` for disjointness tests: its atoms include the schema whose branches or
    negation are being judged, and judging an enum by them would judge it by the answer."""
    probe = conj.copy()
    probe.atoms = []
    return probe
