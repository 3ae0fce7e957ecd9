"""Refusing malformed and paradoxical schemas before anything is compiled.

Malformed. Every keyword value is checked against its draft's meta-schema (the copies the
``jsonschema`` package ships), one schema position and one keyword at a time: a keyword whose
value the meta-schema rejects (``exclusiveMinimum: true`` in draft 2020-12, ``minLength: -1``,
``type: "strin"``) raises ``GrammarError("malformed schema at <pointer of the value>: ...")``.
Checking keyword by keyword, with the subschemas a keyword holds replaced by ``true`` (each is
checked at its own position), keeps the work linear in the document and free of recursion, so
documents nested far deeper than Python's stack are checked too; verdicts are memoised per
(keyword, value), since most values (``"type": "string"``) recur throughout a document. Formats
inside the meta-schemas (``pattern`` is a ``regex``) are not asserted: whether a pattern is
malformed is decided where it is parsed (``scalars.parse_pattern``), in the regex dialect that
compiles it.

Paradoxical. A schema position whose validity depends on its own negation for the same
instance — ``{"not": {"$ref": "#"}}``, or a ``$ref`` cycle through ``not``, an ``if`` condition or
``oneOf`` that never descends into a member or an item — has no consistent meaning (validators
recurse forever on it), so ``check_negation`` refuses it with a ``GrammarError`` when the
compiler meets the negation (an unused ``$defs`` entry is never judged, as by validators). In-place
cycles without a negation (``{"allOf": [{"$ref": "#"}]}``) are left to the compiler.
"""

from __future__ import annotations

import json
from functools import cache
from typing import Any
from urllib.parse import urljoin

from grammars.errors import ConstraintError, GrammarError
from grammars.frontends.json_schema.document import (
    SUBSCHEMA_LIST,
    SUBSCHEMA_MAP,
    SUBSCHEMA_ONE,
    Dialect,
    Located,
    SchemaDocument,
    pointer_child,
)

__all__ = ["check_negation", "check_schema"]

#: keywords whose values are data, not schemas: only their container type is checked (and, where
#: the draft's meta-schema asks for it, that enum values are distinct)
_DATA_KEYWORDS = frozenset({"enum", "const", "default", "examples"})
#: longest rendering of an offending value in a message
_MAX_MESSAGE = 300


def check_schema(document: SchemaDocument) -> None:
    """Raise ``GrammarError`` for the first keyword value (in document order) of the main document
    that the meta-schema of its draft rejects. Registry documents are resources the schema may
    reference, as a validator's registry holds them, and are not checked (``check_schema``
    does not check them either)."""
    dialect = document.dialect
    for pointer, node in document.nodes.items():
        if isinstance(node, dict) and pointer.startswith("#"):
            _check_node(node, pointer, dialect)


def _check_node(node: dict, pointer: str, dialect: Dialect) -> None:
    checks = _keyword_checks(int(dialect))
    for keyword, value in node.items():
        if keyword not in checks:
            continue  # not a keyword of this draft: validators ignore it
        problem = _verdict(int(dialect), keyword, _key(keyword, value, int(dialect)), value)
        if problem is not None:
            path, message = problem
            where = pointer_child(pointer, keyword, *path)
            raise GrammarError(f"malformed schema at {where}: {message}")
    for keyword, needs in _dependencies(int(dialect)).items():
        if keyword in node:
            missing = [k for k in needs if k not in node]
            if missing:
                where = pointer_child(pointer, keyword)
                raise GrammarError(f"malformed schema at {where}: {keyword!r} needs {missing[0]!r} beside it in this draft")


def _key(keyword: str, value: Any, dialect: int) -> Any:
    """A hashable stand-in for ``value`` under which the meta-schema's verdict is memoised."""
    if value is None or isinstance(value, (str, bool, int, float)):
        return (type(value).__name__, value)
    if keyword in _DATA_KEYWORDS:
        return None  # judged by shape (``_representative``), never memoised by content
    return json.dumps(_representative(keyword, value, dialect), sort_keys=True, default=repr)


def _verdict(dialect: int, keyword: str, key: Any, value: Any) -> tuple[tuple[str, ...], str] | None:
    """(path below the keyword, message) of the meta-schema's objection to ``value``, or None."""
    if key is None:
        return _judge(dialect, keyword, value)
    memo_key = (dialect, keyword, key)
    if memo_key not in _VERDICTS:
        if len(_VERDICTS) >= _MAX_VERDICTS:
            _VERDICTS.clear()
        _VERDICTS[memo_key] = _judge(dialect, keyword, value)
    return _VERDICTS[memo_key]


#: (draft, keyword, value key) -> verdict; verdicts are pure, so the table is shared by compiles
_VERDICTS: dict[tuple, tuple[tuple[str, ...], str] | None] = {}
_MAX_VERDICTS = 65536


def _judge(dialect: int, keyword: str, value: Any) -> tuple[tuple[str, ...], str] | None:
    import jsonschema

    check = _keyword_checks(dialect)[keyword]
    shown = _representative(keyword, value, dialect)
    errors = list(check.iter_errors(shown))
    if not errors:
        return None
    best = jsonschema.exceptions.best_match(errors)
    message = best.message if len(best.message) <= _MAX_MESSAGE else best.message[:_MAX_MESSAGE] + "..."
    return tuple(str(p) for p in best.absolute_path), message


def _representative(keyword: str, value: Any, dialect: int) -> Any:
    """``value`` with what is checked elsewhere taken out, so the meta-schema judges only this
    keyword: every subschema it holds is checked at its own position, so a map of subschemas
    keeps only entries that are not schemas at all, a list of them one ``{}`` (some lists must
    not be empty), a single one ``{}``; a list of distinct data values becomes two placeholder
    items. Anything malformed stays where it is, so paths in messages stay right. Booleans
    are schemas from draft 6 on only."""
    def schema(sub: Any) -> bool:
        return isinstance(sub, dict) or (dialect >= 6 and isinstance(sub, bool))

    if keyword in _DATA_KEYWORDS:
        if keyword in ("const", "default"):
            return None
        if isinstance(value, list) and _distinct(value):
            return list(range(min(len(value), 2)))
        return value
    if keyword in SUBSCHEMA_MAP and isinstance(value, dict):
        return {name: sub for name, sub in value.items() if not schema(sub)}
    if keyword in SUBSCHEMA_LIST and isinstance(value, list):
        if all(schema(sub) for sub in value):
            return [{}] if value else []
        return [{} if schema(sub) else sub for sub in value]
    if keyword in SUBSCHEMA_ONE and schema(value):
        return {}
    return value


def _distinct(values: list) -> bool:
    from grammars.frontends.json_schema.values import canonical

    try:
        return len({canonical(v) for v in values}) == len(values)
    except RecursionError:  # data nested deeper than the stack: let the meta-schema judge it
        return False


@cache
def _keyword_checks(dialect: int) -> dict[str, Any]:
    """keyword -> a ``jsonschema`` validator of the keyword's meta-schema entry, for one draft.

    Drafts 4-7 list every keyword in their meta-schema's ``properties``; 2019-09 and 2020-12 split
    them over vocabulary meta-schemas (``allOf``), each resolved from the specifications
    ``jsonschema`` ships, plus the deprecated keywords the top meta-schema still describes."""
    cls = _validator_class(dialect)
    meta = cls.META_SCHEMA
    root = cls(meta)
    checks = {keyword: root.evolve(schema=sub) for keyword, sub in meta.get("properties", {}).items()}
    if dialect >= 2019:
        from jsonschema_specifications import REGISTRY

        for entry in meta.get("allOf", ()):
            contents = REGISTRY.contents(urljoin(meta["$id"], entry["$ref"]))
            vocabulary = cls(contents)
            for keyword, sub in contents.get("properties", {}).items():
                checks.setdefault(keyword, vocabulary.evolve(schema=sub))
    return checks


@cache
def _dependencies(dialect: int) -> dict[str, list[str]]:
    """Keywords that need another keyword beside them (draft 4's ``exclusiveMinimum`` needs
    ``minimum``)."""
    deps = _validator_class(dialect).META_SCHEMA.get("dependencies", {})
    return {k: list(v) for k, v in deps.items() if isinstance(v, list)}


def _validator_class(dialect: int):
    import jsonschema

    return {4: jsonschema.Draft4Validator, 6: jsonschema.Draft6Validator, 7: jsonschema.Draft7Validator,
            2019: jsonschema.Draft201909Validator, 2020: jsonschema.Draft202012Validator}[dialect]


# --- paradoxes -------------------------------------------------------------------------------

#: in-place applicators: their subschemas judge the same instance as the schema holding them
_IN_PLACE_ONE = frozenset({"not", "if", "then", "else"})
_IN_PLACE_LIST = frozenset({"allOf", "anyOf", "oneOf"})
_IN_PLACE_MAP = frozenset({"dependentSchemas", "dependencies"})


def check_negation(document: SchemaDocument, holder: Located, keyword: str, target: Located) -> None:
    """Raise ``GrammarError`` when ``target`` — the subschema that ``keyword`` of ``holder``
    negates (``not``, an ``if`` condition, a ``oneOf`` branch) — judges the same instance as
    ``holder`` through in-place references back to it (see the module docstring). Called as
    the compiler meets each negation, so only schemas that are used are judged."""
    if holder.is_synthetic or target.is_synthetic:
        return
    goal = holder.pointer
    todo = [target.pointer]
    seen = {target.pointer}
    while todo:
        pointer = todo.pop()
        if pointer == goal:
            raise GrammarError(
                f"paradoxical schema at {pointer_child(goal, keyword)}: {keyword!r} reaches the schema holding it "
                "again through in-place references, for the same instance, so its validity would depend on "
                "its own negation")
        for nxt in _in_place_edges(document, pointer):
            if nxt not in seen:
                seen.add(nxt)
                todo.append(nxt)


def _in_place_edges(document: SchemaDocument, pointer: str) -> list[str]:
    """The positions that judge the same instance as the one at ``pointer`` (its references and
    in-place applicators), memoised on the document."""
    memo = document.in_place
    hit = memo.get(pointer)
    if hit is None:
        hit = memo[pointer] = _node_edges(document, pointer)
    return hit


def _node_edges(document: SchemaDocument, pointer: str) -> list[str]:
    node = document.nodes.get(pointer)
    if not isinstance(node, dict):
        return []
    here = Located(node, pointer, document.base_of.get(pointer, ""))
    out: list[str] = []
    for key, resolve in (("$ref", document.resolve), ("$dynamicRef", document.resolve_dynamic)):
        if key in node and (key == "$ref" or document.dialect >= Dialect.DRAFT2020_12):
            try:
                out.append(resolve(node[key], here).pointer)
            except ConstraintError:
                pass  # a dangling or unsupported reference is reported where it is compiled
    if "$ref" in node and document.dialect.ref_overrides_siblings:
        return out
    for key, value in node.items():
        if key in _IN_PLACE_MAP and isinstance(value, dict):
            out += [pointer_child(pointer, key, name) for name, sub in value.items() if isinstance(sub, (dict, bool))]
        elif key in _IN_PLACE_LIST and isinstance(value, list):
            out += [pointer_child(pointer, key, str(i)) for i, sub in enumerate(value) if isinstance(sub, (dict, bool))]
        elif key in _IN_PLACE_ONE and isinstance(value, (dict, bool)):
            out.append(pointer_child(pointer, key))
    return [p for p in out if p in document.nodes]
