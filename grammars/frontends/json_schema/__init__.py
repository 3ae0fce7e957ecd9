"""JSON Schema front end: a schema document to the grammar IR (docs/ARCHITECTURE.md, "Front ends").

::

    document = load_schema(schema)            # dict, bool, JSON text or a Pydantic model class
    grammar = parse_json_schema(document, JsonSchemaOptions(whitespace="flexible"))
    report = analyze_json_schema(document, JsonSchemaOptions(lenient=True))
    report.grammar, report.relaxed            # what lenient mode had to drop

The language is exactly the JSON texts valid under the schema (up to the key-order policy of
``JsonSchemaOptions.property_order`` and the whitespace policy); whatever cannot be enforced
exactly raises ``UnsupportedSchemaError`` with the keyword and its JSON pointer, or, with
``lenient=True``, is relaxed to a superset and listed in ``SchemaReport.relaxed``. Malformed
schemas (a keyword value the draft's meta-schema rejects) and paradoxical ones (a negation that
reaches itself) raise ``GrammarError`` naming the pointer; work past ``Limits`` raises
``LimitExceeded`` before it is done. Modules: ``document`` (loading, ``$ref``), ``validation``
(meta-schema checks, paradoxes), ``compiler`` (dispatch, conjunctions), ``objects``, ``arrays``,
``combinators`` (boolean structure, key languages), ``values`` (layout, literals), ``scalars``
(strings and numbers).
"""

from grammars.frontends.json_schema.compiler import (
    Relaxation,
    SchemaReport,
    analyze_json_schema,
    parse_json_schema,
)
from grammars.frontends.json_schema.document import load_schema
from grammars.frontends.json_schema.options import JsonSchemaOptions

__all__ = [
    "JsonSchemaOptions",
    "load_schema",
    "parse_json_schema",
    "analyze_json_schema",
    "SchemaReport",
    "Relaxation",
]
