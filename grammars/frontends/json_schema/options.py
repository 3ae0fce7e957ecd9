"""``JsonSchemaOptions``: how a JSON Schema becomes a grammar (whitespace, key order, defaults).

Frozen and hashable, so a ``Compiler`` keys its cache by it. Every field is keyword-only and
checked on construction: a wrong type raises ``TypeError``, a value outside the allowed set
``ValueError`` naming the allowed values (both are standard-library errors on purpose: a bad
option is a programming error, not a property of the schema).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, fields
from typing import Any, Literal, Mapping, get_args

__all__ = ["JsonSchemaOptions", "Whitespace", "PropertyOrder", "UnknownKeywords"]

Whitespace = Literal["compact", "flexible"]
PropertyOrder = Literal["schema", "required_first", "any"]
UnknownKeywords = Literal["ignore", "error"]


@dataclass(frozen=True, kw_only=True)
class JsonSchemaOptions:
    """Options of the JSON Schema front end.

    ``whitespace``
        ``"compact"`` (default, what generation wants): no insignificant whitespace at all, the
        text ``json.dumps(value, separators=(",", ":"))`` writes. ``"flexible"``: JSON's
        insignificant whitespace ``[ \\t\\n\\r]`` wherever RFC 8259 allows it (around the top
        value, around ``:`` and ``,``, inside brackets), at most ``max_whitespace`` characters per
        run so generation always terminates. Whitespace inside strings is content, never layout.
    ``max_whitespace``
        Bound on one run of flexible whitespace (default 20; ignored when compact).
    ``property_order``
        Order in which object members are accepted. ``"schema"``: declared properties in
        ``properties`` order (each optional unless required); undeclared members may sit
        anywhere between them. ``"required_first"``: the same, but required properties come
        before optional ones. ``"any"``: every order, exactly. Objects with at most
        ``any_order_limit`` declared properties track every property (each at most once);
        larger ones track only the required properties (at most 6) and let a declared property
        appear again — every occurrence's value is checked and a JSON parser keeps the last, so
        each accepted text is still valid (what validators and MaskBench's instances need; a
        generator in this mode may repeat a key). With more required properties, the required
        ones must first appear in the order of ``properties`` or in that of ``required`` (the
        optional ones still anywhere). Larger objects with ``minProperties``/``maxProperties``,
        which repeats would miscount, fall back to ``"schema"`` order. Both are subsets of the
        valid texts, recorded in ``SchemaReport.narrowed``.
    ``any_order_limit``
        Largest number of declared properties for which ``property_order="any"`` builds the
        exact any-order language (default 8). It needs one grammar state per subset of
        properties (times the ``minProperties``/``maxProperties`` count; at most 4,096 states per
        object, beyond which the object falls back too), so the grammar doubles with each
        property. Measured on MaskBench with the compiled DFA construction: an object merged to 6
        properties compiles in 0.18 s at limit 8 against 0.17 s at 5 (98 productions become 871),
        a 7-property one in 0.07 s.
    ``any_order_budget``
        Subset states the exact any-order layouts of one schema may hold together (default
        1,024). Objects of more than 16 subset states (more than 4 declared properties; count
        bounds multiply the states) draw their states from it as they are built; once it is
        spent, a further object that may repeat members takes the repeating layout above (every
        order still accepted, every value checked, a declared key may repeat), as if it were
        past ``any_order_limit``. Objects that cannot repeat (property count bounds, more than 6
        required properties) stay exact. Objects are built inner first (an object's member
        values before the object). A few schemas hold hundreds of 5-8-property objects:
        MaskBench's ``Kubernetes---kb_1161`` has 13,491 subset states in 499 objects, and
        compiles in 4.8 s instead of 6.5 s at the default (one machine, one phase); 2% of
        MaskBench's schemas have more than 1,024. ``0``: every object of more than 4 properties
        that may repeat members does.
    ``additional_properties_default``
        What an absent ``additionalProperties`` means. ``True`` follows the specification;
        ``False`` mimics engines (XGrammar) that only allow declared properties, which makes
        generation stay on the schema's keys but rejects valid instances with extra keys.
    ``lenient``
        ``False`` (default): a keyword the compiler cannot enforce exactly raises
        ``UnsupportedSchemaError``. ``True``: drop that constraint (the grammar accepts a
        superset there) and record it; see ``analyze_json_schema``.
    ``unknown_keywords``
        Keywords that belong to no JSON Schema draft (``javaType``, ``markdownDescription``,
        typos, vendor extensions) have no validation meaning: validators ignore them, so
        ``"ignore"`` (default) is exact. ``"error"`` raises ``UnsupportedSchemaError`` for them
        (``x-`` prefixed keywords are always ignored). Known keywords from any draft are never
        ignored silently: they are enforced or raise, except that a keyword of another draft
        than the document's ``$schema`` (``const`` in draft 4, ``dependencies`` in 2020-12) is
        not a keyword there and is ignored and reported, exactly as validators do.
    ``format_assertion``
        ``True`` (default): ``format`` is enforced (known formats exactly, others raise), which
        is what generation wants and how MaskBench labels instances. ``False``: ``format`` is
        an annotation, as drafts 2019-09 and 2020-12 specify unless the format-assertion
        vocabulary is in use (and as the JSON Schema Test Suite's main files expect): it
        constrains nothing, whatever the format name.
    ``max_combinations``
        Most leaves one value's alternatives (``anyOf``, ``oneOf``, ``if``, dependencies,
        negations, ``unevaluated*`` conditions) may expand into before the schema is refused
        (default 256). Each leaf is a grammar of its own: raising it lets more deeply combined
        schemas compile, at a compile time that grows with it (some MaskBench schemas that fail
        in a second at 256 take over a minute to fail at 1024).
    ``registry``
        Schema documents by URI, for ``$ref``s that leave the document (multi-file schemas,
        ``http://example.com/common.json#/$defs/x``). A mapping ``{uri: schema}`` (schemas as
        dicts or booleans); stored as a sorted tuple of ``(uri, JSON text)`` so the options stay
        hashable. Nothing is ever fetched: a reference to a URI that is neither in the document
        nor here raises ``UnsupportedSchemaError``.
    """

    whitespace: Whitespace = "compact"
    max_whitespace: int = 20
    property_order: PropertyOrder = "schema"
    any_order_limit: int = 8
    any_order_budget: int = 1024
    additional_properties_default: bool = True
    lenient: bool = False
    unknown_keywords: UnknownKeywords = "ignore"
    format_assertion: bool = True
    max_combinations: int = 256
    registry: Any = ()

    def __post_init__(self) -> None:
        _choice("whitespace", self.whitespace, Whitespace)
        _choice("property_order", self.property_order, PropertyOrder)
        _choice("unknown_keywords", self.unknown_keywords, UnknownKeywords)
        _integer("max_whitespace", self.max_whitespace, low=0)
        _integer("any_order_limit", self.any_order_limit, low=0, high=16)
        _integer("any_order_budget", self.any_order_budget, low=0)
        _integer("max_combinations", self.max_combinations, low=1, high=1 << 16)
        object.__setattr__(self, "registry", _registry(self.registry))
        for name in ("additional_properties_default", "lenient", "format_assertion"):
            if not isinstance(getattr(self, name), bool):
                raise TypeError(f"JsonSchemaOptions.{name} must be a bool, got {getattr(self, name)!r}")

    @classmethod
    def field_names(cls) -> frozenset[str]:
        """The accepted keyword arguments."""
        return frozenset(f.name for f in fields(cls))


def _choice(name: str, value: object, allowed_type: object) -> None:
    allowed = get_args(allowed_type)
    if not isinstance(value, str):
        raise TypeError(f"JsonSchemaOptions.{name} must be one of {allowed}, got {value!r}")
    if value not in allowed:
        raise ValueError(f"JsonSchemaOptions.{name} must be one of {allowed}, got {value!r}")


def _integer(name: str, value: object, *, low: int, high: int | None = None) -> None:
    if not isinstance(value, int) or isinstance(value, bool):
        raise TypeError(f"JsonSchemaOptions.{name} must be an int, got {value!r}")
    if value < low or (high is not None and value > high):
        bound = f">= {low}" if high is None else f"in [{low}, {high}]"
        raise ValueError(f"JsonSchemaOptions.{name} must be {bound}, got {value}")


def _registry(value: object) -> tuple[tuple[str, str], ...]:
    """``{uri: schema}`` (or its normalized tuple form) as a sorted tuple of ``(uri, JSON text)``."""
    if isinstance(value, tuple) and all(isinstance(e, tuple) and len(e) == 2 and isinstance(e[0], str)
                                        and isinstance(e[1], str) for e in value):
        return tuple(sorted(value))
    if not isinstance(value, Mapping):
        raise TypeError(f"JsonSchemaOptions.registry must be a mapping of URI to schema, got {type(value).__name__}")
    out = []
    for uri, schema in value.items():
        if not isinstance(uri, str):
            raise TypeError(f"JsonSchemaOptions.registry keys must be URI strings, got {uri!r}")
        if not isinstance(schema, (dict, bool)):
            raise TypeError(f"JsonSchemaOptions.registry[{uri!r}] must be a schema (dict or bool), got {type(schema).__name__}")
        out.append((uri, json.dumps(schema, sort_keys=True, ensure_ascii=False)))
    return tuple(sorted(out))
