"""MaskBench sample: schemas from JSONSchemaBench, their valid and invalid instances, Llama-3 tokens.

A fixed, deterministic sample of the local MaskBench files (``shared/jsonschemabench/maskbench``):
sorted by name, those with test instances and a schema of at most ``MAX_SCHEMA_CHARS`` characters
(compiling big schemas takes seconds each, and this test must stay under a minute), every
``STRIDE``-th. Each schema is compiled with flexible whitespace and any key order (MaskBench
instances list keys in any order) for the Llama-3 vocabulary; each instance is serialized as
MaskBench does (``json.dumps(data, ensure_ascii=False)``), tokenized with the vocabulary, and fed
to ``Matcher.try_advance``:

* an invalid instance fully accepted is a hard failure, always;
* a valid instance not fully accepted is a failure, unless the schema's ``SchemaReport`` says
  the grammar was deliberately narrowed there (``narrowed``: an object too big for any-order,
  a ``maxLength`` beyond the string automaton budget);
* a schema raising ``UnsupportedSchemaError`` (or ``LimitExceeded``) is skipped with the reason,
  and their number must stay below ceilings measured when this test was written, so a
  regression in coverage shows up here.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from shared_data import SHARED_DIR, shared_path

from grammars import Compiler, LimitExceeded, TokenVocabulary, UnsupportedSchemaError
from grammars.frontends.json_schema import (
    JsonSchemaOptions,
    analyze_json_schema,
    load_schema,
)

MAX_SCHEMA_CHARS = 600
STRIDE = 50
OPTIONS = JsonSchemaOptions(whitespace="flexible", property_order="any")
#: measured when written (75 files): 0 unsupported, 0 over limits; one unsupported is tolerated
UNSUPPORTED_CEILING = 1
LIMIT_CEILING = 0


def _sample() -> list[Path]:
    root = SHARED_DIR / "jsonschemabench" / "maskbench"
    if not root.exists():
        return []
    chosen = []
    for path in sorted(root.iterdir()):
        data = json.loads(path.read_text())
        if data.get("tests") and len(json.dumps(data["schema"])) <= MAX_SCHEMA_CHARS:
            chosen.append(path)
    return chosen[::STRIDE]


SAMPLE = _sample()


@dataclass
class Outcome:
    status: str  # ok | unsupported | limit
    reason: str = ""
    failures: list[str] = field(default_factory=list)


@pytest.fixture(scope="module")
def vocab():
    return TokenVocabulary.from_pretrained(shared_path("vocab", "ggml-vocab-llama-bpe.gguf"))


@pytest.fixture(scope="module")
def outcomes(vocab):
    """Lazily computed outcome per file, shared by the per-file tests and the ceiling test."""
    compiler = Compiler(vocab)
    cache: dict[str, Outcome] = {}

    def outcome(path: Path) -> Outcome:
        if path.name not in cache:
            cache[path.name] = _run(compiler, vocab, json.loads(path.read_text()))
        return cache[path.name]

    return outcome


def _run(compiler: Compiler, vocab, data: dict) -> Outcome:
    try:
        report = analyze_json_schema(load_schema(data["schema"]), OPTIONS)
        compiled = compiler.compile_grammar(report.grammar)
    except UnsupportedSchemaError as exc:
        return Outcome("unsupported", f"{exc.keyword} at {exc.pointer}: {exc.reason}")
    except LimitExceeded as exc:
        return Outcome("limit", str(exc))
    failures = []
    for i, case in enumerate(data["tests"]):
        text = json.dumps(case["data"], ensure_ascii=False)
        tokens = vocab.encode(text)
        matcher = compiled.matcher()
        accepted = matcher.try_advance(tokens) == len(tokens) and matcher.is_accepting()
        if accepted and not case["valid"]:
            failures.append(f"invalid instance {i} accepted: {text[:200]}")
        elif not accepted and case["valid"] and not report.narrowed_values:
            failures.append(f"valid instance {i} rejected: {text[:200]}")
    return Outcome("ok", failures=failures)


@pytest.mark.parametrize("path", SAMPLE, ids=[p.name for p in SAMPLE])
def test_maskbench_file(outcomes, path):
    outcome = outcomes(path)
    if outcome.status != "ok":
        pytest.skip(f"{outcome.status}: {outcome.reason}")
    assert not outcome.failures, "\n".join(outcome.failures)


def test_maskbench_sample_is_there():
    if not SAMPLE:
        shared_path("jsonschemabench", "maskbench")  # skips with the missing path
    assert len(SAMPLE) >= 50


def test_unsupported_schemas_stay_below_the_ceiling(outcomes):
    if not SAMPLE:
        pytest.skip("MaskBench data not found")
    results = [outcomes(path) for path in SAMPLE]
    unsupported = [r.reason for r in results if r.status == "unsupported"]
    over_limit = [r.reason for r in results if r.status == "limit"]
    assert len(unsupported) <= UNSUPPORTED_CEILING, unsupported
    assert len(over_limit) <= LIMIT_CEILING, over_limit
