"""Loading a schema document and resolving ``$ref`` inside it.

``load_schema`` turns what users hand us (a dict, a bool, JSON text, a Pydantic model class) into
a plain JSON document, failing with a ``GrammarError`` subclass that says what is wrong.
``SchemaDocument`` indexes one document once: every schema position with its base URI (from
``$id``, or ``id`` in draft 4), every ``$anchor`` (and plain-name ``$id``/``id`` fragments), and
every embedded resource, so ``resolve`` can follow local references — JSON pointers
(``#/definitions/a``, ``#/$defs/a~1b``, percent-escaped), anchors (``#name``) and ``$id``-relative
URIs (``other.json#/x`` where ``other.json`` is an embedded resource), and documents of the
``registry`` option (indexed the same way, at pointers ``<uri>#/...``). References that leave
both are unsupported (``UnsupportedSchemaError``); references that point nowhere are errors.

Loading and indexing use explicit stacks, so a document nests as deep as ``MAX_DOCUMENT_DEPTH``
JSON levels (a structure containing itself stops there too) with a ``LimitExceeded`` beyond.

A schema position is identified by its JSON pointer from the document root, written as a URI
fragment (``#/properties/a``); the compiler uses it as the identity of a subschema (one grammar
rule per referenced subschema) and in every error message.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from enum import IntEnum
from typing import Any, Iterator
from urllib.parse import unquote, urldefrag, urljoin

from grammars.errors import (
    GrammarError,
    GrammarSyntaxError,
    LimitExceeded,
    UnsupportedSchemaError,
)

__all__ = [
    "Dialect",
    "Located",
    "SchemaDocument",
    "load_schema",
    "canonical_json",
    "pointer_child",
    "escape_token",
    "short_pointer",
    "MAX_DOCUMENT_DEPTH",
    "DEFAULT_BASE_URI",
]

#: JSON nesting (objects and arrays) a schema document may have: far beyond real schemas (a
#: schema nested 1,000 objects deep is about 2,000 levels), and what stops a Python structure
#: that contains itself
MAX_DOCUMENT_DEPTH = 10_000

#: Base URI of a document without ``$id``; ``.invalid`` guarantees it never names a real resource.
DEFAULT_BASE_URI = "https://corral.invalid/schema.json"


class Dialect(IntEnum):
    """The JSON Schema draft a document is written in (its ``$schema``), ordered by age."""

    DRAFT4 = 4
    DRAFT6 = 6
    DRAFT7 = 7
    DRAFT2019_09 = 2019
    DRAFT2020_12 = 2020

    @property
    def ref_overrides_siblings(self) -> bool:
        """Drafts 4–7: keywords next to ``$ref`` are ignored. 2019-09 on: they apply too."""
        return self <= Dialect.DRAFT7

    @property
    def id_keyword(self) -> str:
        return "id" if self == Dialect.DRAFT4 else "$id"


_DIALECT_MARKERS = (
    ("draft-04", Dialect.DRAFT4),
    ("draft-06", Dialect.DRAFT6),
    ("draft-07", Dialect.DRAFT7),
    ("2019-09", Dialect.DRAFT2019_09),
    ("2020-12", Dialect.DRAFT2020_12),
)


def _dialect_of(document: Any) -> Dialect:
    uri = document.get("$schema") if isinstance(document, dict) else None
    if uri is None:
        return Dialect.DRAFT2020_12  # what validators assume (jsonschema's default, the latest)
    if not isinstance(uri, str):
        raise GrammarError(f"malformed schema at #: '$schema' must be a string, got {uri!r}")
    for marker, dialect in _DIALECT_MARKERS:
        if marker in uri:
            return dialect
    if "draft-03" in uri or "draft-02" in uri or "draft-01" in uri:
        raise UnsupportedSchemaError("$schema", "#", f"draft 3 and older ({uri}) are not supported")
    return Dialect.DRAFT2020_12  # a custom meta-schema: validators fall back to the latest draft


# --- loading ------------------------------------------------------------------------------


def load_schema(schema: Any) -> dict | bool:
    """A JSON Schema as a plain JSON document (a fresh ``dict``, or a ``bool``).

    Accepts a ``dict``, ``True``/``False``, JSON text (``str`` or UTF-8 ``bytes``), or a Pydantic
    model class (anything with ``model_json_schema()``). Raises ``GrammarSyntaxError`` for text
    that is not JSON, ``GrammarError`` for anything that is not a JSON document (non-string
    keys, ``NaN``, sets, ...) or not a schema at all (a number, a list, ...).
    """
    if isinstance(schema, (bytes, bytearray)):
        try:
            schema = bytes(schema).decode("utf-8")
        except UnicodeDecodeError as exc:
            raise GrammarError(f"schema bytes are not UTF-8: {exc}") from None
    if isinstance(schema, str):
        try:
            document = json.loads(schema)
        except json.JSONDecodeError as exc:
            raise GrammarSyntaxError(f"schema is not valid JSON: {exc.msg}", schema, exc.pos, source="<json schema>") from None
    elif isinstance(schema, type) and callable(getattr(schema, "model_json_schema", None)):
        document = schema.model_json_schema()
    elif isinstance(schema, (dict, bool)):
        document = schema
    else:
        raise GrammarError(
            f"cannot load a JSON Schema from a {type(schema).__name__}: expected a dict, a bool, "
            "JSON text or a Pydantic model class"
        )
    if not isinstance(document, (dict, bool)):
        raise GrammarError(f"a JSON Schema must be an object or a boolean, got {type(document).__name__}")
    return _plain_copy(document, "#")


def canonical_json(document: Any) -> str:
    """The text of a loaded document with sorted keys: ``json.dumps(document, sort_keys=True,
    ensure_ascii=False)``, also for documents nested deeper than the C encoder's recursion
    limit (about a thousand levels), which are written with an explicit stack instead. A cache
    key: equal documents, equal texts."""
    try:
        return json.dumps(document, sort_keys=True, ensure_ascii=False)
    except RecursionError:
        pass
    out: list[str] = []
    stack: list[tuple[Any, bool]] = [(document, False)]  # (value, or text to write when True)
    while stack:
        item, text = stack.pop()
        if text:
            out.append(item)
        elif isinstance(item, dict) and item:
            out.append("{")
            stack.append(("}", True))
            members = sorted(item.items(), key=lambda member: member[0])
            for i in range(len(members) - 1, -1, -1):
                key, sub = members[i]
                stack.append((sub, False))
                stack.append(((", " if i else "") + json.dumps(key, ensure_ascii=False) + ": ", True))
        elif isinstance(item, (list, tuple)) and item:
            out.append("[")
            stack.append(("]", True))
            for i in range(len(item) - 1, -1, -1):
                stack.append((item[i], False))
                if i:
                    stack.append((", ", True))
        else:
            out.append(json.dumps(item, ensure_ascii=False))
    return "".join(out)


def _plain_copy(value: Any, pointer: str) -> Any:
    """Deep copy as plain JSON types, rejecting what JSON cannot represent.

    Iterative (an explicit stack of containers still to fill), so documents nested deeper than
    Python's recursion limit load like any other."""
    root: list = [None]
    stack: list[tuple[Any, str, Any, Any, int]] = [(value, pointer, root, 0, 0)]  # (value, pointer, parent, slot, depth)
    while stack:
        item, where, parent, slot, depth = stack.pop()
        if depth > MAX_DOCUMENT_DEPTH and isinstance(item, (dict, list, tuple)):
            raise LimitExceeded("schema_depth", MAX_DOCUMENT_DEPTH,
                                f"the schema document nests deeper than {MAX_DOCUMENT_DEPTH} levels at {short_pointer(where)} "
                                "(or contains itself)")
        if isinstance(item, dict):
            out: dict = {}
            parent[slot] = out
            for key in item:
                if not isinstance(key, str):
                    raise GrammarError(f"malformed schema at {where}: object key {key!r} is not a string")
                out[key] = None  # keeps the key order; filled below
            stack.extend((sub, where + "/" + escape_token(key), out, key, depth + 1) for key, sub in reversed(item.items()))
        elif isinstance(item, (list, tuple)):
            out_list: list = [None] * len(item)
            parent[slot] = out_list
            stack.extend((sub, f"{where}/{i}", out_list, i, depth + 1) for i, sub in reversed(list(enumerate(item))))
        elif isinstance(item, float) and not math.isfinite(item):
            raise GrammarError(f"malformed schema at {where}: {item!r} is not a JSON number")
        elif item is None or isinstance(item, (str, bool, int, float)):
            parent[slot] = item
        else:
            raise GrammarError(f"malformed schema at {where}: a {type(item).__name__} is not a JSON value")
    return root[0]


# --- pointers -----------------------------------------------------------------------------


def escape_token(token: str) -> str:
    """RFC 6901 escaping of one reference token."""
    return token.replace("~", "~0").replace("/", "~1")


def _unescape_token(token: str) -> str:
    return token.replace("~1", "/").replace("~0", "~")


def short_pointer(pointer: str, limit: int = 160) -> str:
    """``pointer`` for a message: a pointer longer than ``limit`` keeps its start and end."""
    if len(pointer) <= limit:
        return pointer
    half = limit // 2
    return f"{pointer[:half]}...{pointer[-half:]}"


def pointer_child(pointer: str, *tokens: str) -> str:
    """``#/a`` + ``b/c`` -> ``#/a/b~1c`` (each token escaped)."""
    return pointer + "".join("/" + escape_token(t) for t in tokens)


@dataclass(frozen=True, eq=False)
class Located:
    """A (sub)schema with where it lives: its identity for rule sharing and error messages.

    ``pointer`` identifies the schema (synthetic schemas the compiler derives, e.g. a negation,
    carry a pointer with a ``!`` suffix). ``base`` is the base URI its ``$ref``s resolve against.
    ``origin`` says how to evaluate a synthetic schema on a concrete value: ``None`` means
    validate ``node`` itself; ``("not", located)`` means "``located`` is not satisfied".
    """

    node: Any
    pointer: str
    base: str
    origin: tuple | None = None

    def __hash__(self) -> int:
        return hash(self.pointer)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Located) and other.pointer == self.pointer

    @property
    def where(self) -> str:
        """The pointer of the real schema this one comes from (for messages)."""
        return self.pointer.split("!", 1)[0]

    @property
    def is_synthetic(self) -> bool:
        """Derived by the compiler (a negation, a dependency split, ...), not found in a document."""
        return "!" in self.pointer

    def __repr__(self) -> str:
        return f"Located({self.pointer})"


# --- the document index -------------------------------------------------------------------

#: keywords whose value is one subschema / a list of subschemas / a map of subschemas
SUBSCHEMA_ONE = frozenset(
    {
        "additionalProperties", "additionalItems", "items", "contains", "propertyNames", "not",
        "if", "then", "else", "unevaluatedProperties", "unevaluatedItems", "contentSchema",
    }
)
SUBSCHEMA_LIST = frozenset({"allOf", "anyOf", "oneOf", "prefixItems", "items"})
SUBSCHEMA_MAP = frozenset({"properties", "patternProperties", "$defs", "definitions", "dependentSchemas", "dependencies"})


@dataclass
class SchemaDocument:
    """One loaded document, indexed for ``$ref`` resolution. Build with ``SchemaDocument.of``."""

    root: Any
    dialect: Dialect
    base_of: dict[str, str] = field(default_factory=dict)  # schema pointer -> base URI
    nodes: dict[str, Any] = field(default_factory=dict)  # schema pointer -> schema, in document order
    in_place: dict[str, list] = field(default_factory=dict)  # pointer -> same-instance positions (validation)
    resources: dict[str, str] = field(default_factory=dict)  # resource URI -> pointer
    anchors: dict[tuple[str, str], str] = field(default_factory=dict)  # (resource URI, name) -> pointer
    dynamic_anchors: dict[str, set] = field(default_factory=dict)  # name -> {(resource URI, pointer)}
    externals: dict[str, Any] = field(default_factory=dict)  # registry URI -> its document
    foreign: dict[str, Dialect] = field(default_factory=dict)  # registry URI -> its draft, where it differs
    _reachable: set | None = None

    @classmethod
    def of(cls, document: Any, registry: tuple[tuple[str, str], ...] = ()) -> "SchemaDocument":
        """Index ``document`` and the ``registry``'s documents (``(uri, JSON text)`` pairs).

        A registry document lives at pointers ``<uri>#/...``; the main document wins where both
        claim a URI. ``$ref`` into a registry document of another draft is unsupported.
        """
        doc = cls(document, _dialect_of(document))
        doc.resources[DEFAULT_BASE_URI] = "#"
        for pointer, node, base in doc._walk(document, "#", DEFAULT_BASE_URI):
            doc.base_of[pointer] = base
            doc.nodes[pointer] = node
        for uri, text in registry:
            uri = urldefrag(uri)[0]
            if uri in doc.resources:
                continue
            node = load_schema(text)
            doc.externals[uri] = node
            doc.resources[uri] = uri + "#"
            if isinstance(node, dict) and "$schema" in node and _dialect_of(node) != doc.dialect:
                doc.foreign[uri] = _dialect_of(node)
                continue
            for pointer, sub, base in doc._walk(node, uri + "#", uri):
                doc.base_of[pointer] = base
                doc.nodes[pointer] = sub
        return doc

    def located_root(self) -> Located:
        return Located(self.root, "#", self.base_of.get("#", DEFAULT_BASE_URI))

    def _walk(self, node: Any, pointer: str, base: str) -> Iterator[tuple[str, Any, str]]:
        """Every schema position below ``node`` (inclusive), registering ids and anchors."""
        stack = [(node, pointer, base)]
        while stack:
            node, pointer, base = stack.pop()
            if not isinstance(node, dict):
                if isinstance(node, bool):
                    yield pointer, node, base
                continue
            base = self._enter(node, pointer, base)
            yield pointer, node, base
            children = []
            for key, value in node.items():
                if key in ("enum", "const", "default", "examples"):
                    continue
                if key in SUBSCHEMA_MAP and isinstance(value, dict):
                    children += [(sub, pointer_child(pointer, key, name), base) for name, sub in value.items()]
                elif key in SUBSCHEMA_LIST and isinstance(value, list):
                    children += [(sub, pointer_child(pointer, key, str(i)), base) for i, sub in enumerate(value)]
                elif key in SUBSCHEMA_ONE and isinstance(value, (dict, bool)):
                    children.append((value, pointer_child(pointer, key), base))
            stack.extend(reversed(children))  # popped in document order

    def _enter(self, node: dict, pointer: str, base: str) -> str:
        """Register ``node``'s ``$id``/anchors; return its base URI."""
        ident = node.get(self.dialect.id_keyword)
        if isinstance(ident, str) and ident:
            if ident.startswith("#"):  # draft 4-7 plain-name fragment: a location-independent name
                self._anchor(base, ident[1:], pointer)
            else:
                uri, frag = urldefrag(urljoin(base, ident))
                base = uri
                self.resources.setdefault(uri, pointer)
                if frag and not frag.startswith("/"):
                    self._anchor(uri, frag, pointer)
        for key in ("$anchor", "$dynamicAnchor"):
            name = node.get(key)
            if isinstance(name, str) and name:
                self._anchor(base, name, pointer)
                if key == "$dynamicAnchor":
                    self.dynamic_anchors.setdefault(name, set()).add((urldefrag(base)[0], pointer))
        return base

    def _anchor(self, base: str, name: str, pointer: str) -> None:
        self.anchors.setdefault((urldefrag(base)[0], name), pointer)

    # --- resolution ---------------------------------------------------------------------

    def resolve(self, ref: Any, at: Located) -> Located:
        """The schema ``ref`` (the value of a ``$ref`` in ``at``) points to."""
        if not isinstance(ref, str):
            raise GrammarError(f"malformed schema at {at.where}: '$ref' must be a string, got {ref!r}")
        uri, fragment = urldefrag(urljoin(at.base, ref) if not ref.startswith("#") else urldefrag(at.base)[0] + ref)
        fragment = unquote(fragment)
        resource = self.resources.get(uri)
        if resource is None:
            raise UnsupportedSchemaError(
                "$ref", at.where, f"{ref!r} points outside this document and the registry (remote references are not fetched)"
            )
        home = resource.partition("#")[0]
        if home in self.foreign:
            raise UnsupportedSchemaError(
                "$ref", at.where, f"{ref!r} points into a registry document of draft {int(self.foreign[home])}, not this document's"
            )
        if fragment and not fragment.startswith("/"):
            target = self.anchors.get((uri, fragment))
            if target is None:
                raise GrammarError(f"$ref {ref!r} at {at.where}: no anchor named {fragment!r} in the document")
            return Located(self.node_at(target), target, self.base_of.get(target, uri))
        node = self.node_at(resource)
        pointer = resource
        raws = fragment.split("/")[1:] if fragment else []
        for i, raw in enumerate(raws):
            token = _unescape_token(raw)
            if isinstance(node, dict) and token in node:
                node = node[token]
            elif isinstance(node, list) and token.isdigit() and (token == "0" or not token.startswith("0")) and int(token) < len(node):
                node = node[int(token)]
            else:
                # echo the pointer as the reference wrote it (re-escaping "a~2b" would show "a~02b")
                written = resource.rstrip("/") + "/" + "/".join(raws[: i + 1])
                raise GrammarError(f"$ref {ref!r} at {at.where}: {written} does not exist in the document")
            pointer = pointer_child(pointer, token)
        if not isinstance(node, (dict, bool)):
            raise GrammarError(f"$ref {ref!r} at {at.where}: {pointer} is a {type(node).__name__}, not a schema")
        return Located(node, pointer, self.base_of.get(pointer, uri))

    def resolve_dynamic(self, ref: Any, at: Located) -> Located:
        """The schema a ``$dynamicRef`` reaches, where that does not depend on the dynamic scope.

        It starts as ``$ref`` would; only a target that carries the same ``$dynamicAnchor`` looks
        further, for the outermost resource of the dynamic scope defining that anchor. The root
        resource is always the outermost, so an anchor there wins; an anchor defined only at the
        target is the target. Anything else depends on the path taken and is unsupported.
        """
        target = self.resolve(ref, at)
        name = urldefrag(ref)[1] if isinstance(ref, str) else ""
        if not name or name.startswith("/") or not (isinstance(target.node, dict) and target.node.get("$dynamicAnchor") == name):
            return target
        reachable = self._reachable_documents()
        defined = {(uri, p) for uri, p in self.dynamic_anchors.get(name, set()) if p.partition("#")[0] in reachable}
        root_uri = urldefrag(self.base_of.get("#", DEFAULT_BASE_URI))[0]
        at_root = sorted(p for uri, p in defined if uri == root_uri)
        if at_root:
            return Located(self.node_at(at_root[0]), at_root[0], self.base_of.get(at_root[0], root_uri))
        if {p for _, p in defined} == {target.pointer}:
            return target
        raise UnsupportedSchemaError("$dynamicRef", at.where, f"{ref!r} resolves through the dynamic scope "
                                     f"(several resources define $dynamicAnchor {name!r}, none of them the root)")

    def _reachable_documents(self) -> set[str]:
        """The main document (``""``) and the registry documents its references reach, transitively:
        only their resources can ever be in a dynamic scope."""
        if self._reachable is None:
            by_home: dict[str, list[str]] = {}
            for pointer in self.base_of:
                by_home.setdefault(pointer.partition("#")[0], []).append(pointer)
            seen, todo = {""}, [""]
            while todo:
                for pointer in by_home.get(todo.pop(), ()):
                    node = self.node_at(pointer)
                    for key in ("$ref", "$dynamicRef"):
                        ref = node.get(key) if isinstance(node, dict) else None
                        if isinstance(ref, str):
                            resource = self.resources.get(urldefrag(urljoin(self.base_of[pointer], ref))[0])
                            home = resource.partition("#")[0] if resource is not None else None
                            if home is not None and home not in seen:
                                seen.add(home)
                                todo.append(home)
            self._reachable = seen
        return self._reachable

    def child(self, parent: Located, node: Any, *tokens: str) -> Located:
        """The subschema ``node`` found under ``parent`` at ``tokens``, with its own base URI."""
        pointer = pointer_child(parent.pointer, *tokens)
        base = self.base_of.get(pointer)
        if base is None:  # below a synthetic schema: apply the node's own $id, if any
            base = parent.base
            ident = node.get(self.dialect.id_keyword) if isinstance(node, dict) else None
            if isinstance(ident, str) and ident and not ident.startswith("#"):
                base = urldefrag(urljoin(base, ident))[0]
        return Located(node, pointer, base)

    def node_at(self, pointer: str) -> Any:
        home, _, fragment = pointer.partition("#")
        node = self.externals[home] if home else self.root
        for raw in fragment.split("/")[1:]:
            token = _unescape_token(raw)
            node = node[int(token)] if isinstance(node, list) else node[token]
        return node


def count_keyword(value: Any, keyword: str, where: str) -> int:
    """The value of a counting keyword (``minItems``, ``maxLength``, ``minContains``, ...): a
    non-negative integer, where ``2.0`` counts as ``2`` (JSON has one number type)."""
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise GrammarError(f"malformed schema at {where}: {keyword!r} must be a non-negative integer, got {value!r}")
    return value
