"""Shared helpers for the JSON Schema front-end tests: compile, run texts, ask ``jsonschema``.

The oracle is ``jsonschema``'s validator for the schema's declared draft (2020-12 when none is
declared), with its format checker; the unit under test is the compiled grammar, driven token by
token through ``Matcher.try_advance`` on a byte vocabulary (token ``b`` is the byte ``b``).
"""

from __future__ import annotations

import json
from typing import Any, Iterable

import jsonschema

from grammars import Compiler, EmptyLanguageError


def oracle(schema: Any):
    """A ``jsonschema`` validator of the schema's declared draft (default 2020-12)."""
    cls = (
        jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
        if isinstance(schema, dict)
        else jsonschema.Draft202012Validator
    )
    return cls(schema, format_checker=cls.FORMAT_CHECKER)


def texts_of(instance: Any, whitespace: str) -> list[str]:
    """JSON texts of ``instance`` the grammar must judge like the oracle, per whitespace policy."""
    texts = [json.dumps(instance, separators=(",", ":")), json.dumps(instance, ensure_ascii=False, separators=(",", ":"))]
    if whitespace == "flexible":
        texts += [json.dumps(instance), json.dumps(instance, indent=2), json.dumps(instance, indent="\t", ensure_ascii=False)]
    return list(dict.fromkeys(texts))


class Checker:
    """Compiles schemas for a byte vocabulary (one ``Compiler``, so results are cached)."""

    def __init__(self, vocab):
        self.vocab = vocab
        self.compiler = Compiler(vocab)

    def compile(self, schema: Any, **options):
        return self.compiler.compile_json_schema(schema, **options)

    def accepts(self, schema: Any, text: str, **options) -> bool:
        """Is ``text`` a complete sentence of the schema's grammar (fed as single bytes)?

        A schema no value satisfies compiles to ``EmptyLanguageError``: it accepts no text."""
        try:
            matcher = self.compile(schema, **options).matcher()
        except EmptyLanguageError:
            return False
        data = list(text.encode("utf-8"))
        return matcher.try_advance(data) == len(data) and matcher.is_accepting()

    def disagreements(self, schema: Any, instances: Iterable[Any], **options) -> list[str]:
        """Texts of ``instances`` on which the grammar and the oracle disagree (empty: agreement)."""
        validator = oracle(schema)
        out = []
        for instance in instances:
            expected = validator.is_valid(instance)
            for text in texts_of(instance, options.get("whitespace", "compact")):
                if self.accepts(schema, text, **options) != expected:
                    out.append(f"{text!r}: oracle says {'valid' if expected else 'invalid'}")
        return out
