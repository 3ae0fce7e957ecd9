"""The JSON Schema Test Suite runner: per-test verdicts, per-file and total tables, outputs.

A synthetic suite folder (two keyword files and an ``optional/`` folder that must be ignored)
runs through the worker pool with fake engines over a byte tokenizer (token id = byte, EOS =
256): accept-everything passes exactly the valid tests, reject-everything exactly the invalid
ones, a refusing engine none, an exact enum engine all. The real suite, when ``../shared`` is
present, must hold the 1,299 tests of 46 keyword files that the reference figures count.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import numpy as np
import pytest

from jsonschemabench import report
from jsonschemabench.maskbench import WorkerConfig
from jsonschemabench.peers import EngineRefused
from jsonschemabench.testsuite import _compile, list_keyword_files, load_groups, run_group, run_testsuite

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:  # spawned workers import the fakes from this module by name
    sys.path.insert(0, str(HERE))
MODULE = __name__
REPO_ROOT = HERE.parent.parent
SHARED_DIR = Path(os.environ.get("CORRAL_SHARED_DIR", REPO_ROOT.parent / "shared"))

EOS = 256
WIDTH = 257


class ByteTokenizer:
    vocab = None

    @staticmethod
    def encode(text: str) -> list[int]:
        return list(text.encode("utf-8"))


def byte_tokenizer(_arg=None) -> ByteTokenizer:
    return ByteTokenizer()


def _mask(bits) -> np.ndarray:
    mask = np.zeros((1, (WIDTH + 31) // 32), dtype=np.int32)
    flat = mask.view(np.uint32).reshape(-1)
    for bit in bits:
        flat[bit >> 5] |= np.uint32(1 << (bit & 31))
    return mask


class FakeEngine:
    name = "fake"
    version = "0"
    eos_token_ids = (EOS,)
    options: dict = {}

    def __init__(self, tokenizer):
        pass

    def reset_caches(self):
        pass

    def compile(self, kind, schema):
        assert kind == "json_schema", kind
        return schema

    def matcher(self, handle):
        return [handle, b""]

    def allowed(self, mask, token):
        return bool((int(mask.reshape(-1)[token >> 5]) >> (token & 31)) & 1)

    def advance(self, m, token):
        m[1] += bytes([token])
        return True

    def is_accepting(self, m):
        return True


class AcceptAll(FakeEngine):
    def fill_mask(self, m):
        return _mask(range(WIDTH))


class RejectAll(FakeEngine):
    def fill_mask(self, m):
        return _mask(())

    def is_accepting(self, m):
        return False


class RefuseAll(AcceptAll):
    def compile(self, kind, schema):
        raise EngineRefused("no", kind="FakeError")


class ExactEnum(FakeEngine):
    """Exact for ``{"enum": [...]}`` under the spaced serialization; refuses other schemas."""

    def compile(self, kind, schema):
        if not isinstance(schema, dict) or "enum" not in schema:
            raise EngineRefused("only enum schemas", kind="FakeError")
        return [json.dumps(v, ensure_ascii=False).encode() for v in schema["enum"]]

    def fill_mask(self, m):
        values, prefix = m
        bits = {v[len(prefix)] for v in values if v.startswith(prefix) and len(v) > len(prefix)}
        if prefix in values:
            bits.add(EOS)
        return _mask(bits)

    def is_accepting(self, m):
        return m[1] in m[0]


def spec(name: str) -> str:
    return f"{MODULE}:{name}"


SUITE = {
    "enum.json": [
        {"description": "simple", "schema": {"enum": [1, "x"]},
         "tests": [{"description": "1", "data": 1, "valid": True}, {"description": "x", "data": "x", "valid": True},
                   {"description": "2", "data": 2, "valid": False}]},
        {"description": "object", "schema": {"enum": [{"a": [1, 2]}]},
         "tests": [{"description": "same", "data": {"a": [1, 2]}, "valid": True},
                   {"description": "other", "data": {"a": []}, "valid": False}]},
    ],
    "const.json": [
        {"description": "const", "schema": {"enum": [None]},
         "tests": [{"description": "null", "data": None, "valid": True},
                   {"description": "false", "data": False, "valid": False},
                   {"description": "zero", "data": 0, "valid": False}]},
        {"description": "not enum", "schema": {"type": "string"},
         "tests": [{"description": "s", "data": "s", "valid": True}]},
    ],
}
OPTIONAL = {"format.json": [{"description": "ignored", "schema": {}, "tests": [{"description": "t", "data": 1,
                                                                                 "valid": True}]}]}


def write_suite(folder: Path) -> Path:
    (folder / "optional").mkdir(parents=True)
    for name, groups in SUITE.items():
        (folder / name).write_text(json.dumps(groups), encoding="utf-8")
    for name, groups in OPTIONAL.items():
        (folder / "optional" / name).write_text(json.dumps(groups), encoding="utf-8")
    return folder


def count(predicate) -> dict[str, int]:
    return {name: sum(1 for g in groups for t in g["tests"] if predicate(g, t)) for name, groups in SUITE.items()}


def test_keyword_files_skip_optional(tmp_path):
    suite = write_suite(tmp_path / "suite")
    assert [p.name for p in list_keyword_files(suite)] == ["const.json", "enum.json"]
    assert load_groups(suite / "enum.json")[1]["description"] == "object"


def test_run_group_in_process(tmp_path):
    suite = write_suite(tmp_path / "suite")
    path = str(suite / "enum.json")
    exact = run_group(ExactEnum(None), ByteTokenizer(), {"path": path, "group": 1}, lambda _: None)
    assert exact["outcome"] == "ok" and [t["passed"] for t in exact["tests"]] == [True, True]
    assert exact["tests"][1]["verdict"] == "rejected_token"
    # compact separators make the instance text differ from the enum's spaced text
    compact = run_group(ExactEnum(None), ByteTokenizer(), {"path": path, "group": 1, "separators": "compact"},
                        lambda _: None)
    assert [t["passed"] for t in compact["tests"]] == [False, True]
    refused = run_group(RefuseAll(None), ByteTokenizer(), {"path": path, "group": 0}, lambda _: None)
    assert refused["outcome"] == "compile_error" and not any(t["passed"] for t in refused["tests"])
    assert len(refused["tests"]) == 3


def test_corral_options_go_through_schema_options_for_one_call(tmp_path):
    """corral gets the suite's options (and the remotes as ``registry``) for its compile only."""
    remotes = tmp_path / "remotes"
    remotes.mkdir()
    (remotes / "integer.json").write_text('{"type": "integer"}', encoding="utf-8")

    class Corral(AcceptAll):
        name = "corral"
        schema_options = {"whitespace": "flexible"}

        def compile(self, kind, schema):
            self.seen = dict(self.schema_options)
            return schema

    engine = Corral(None)
    _compile(engine, {"type": "string"}, {"property_order": "any", "remotes": str(remotes)})
    assert engine.seen == {"whitespace": "flexible", "property_order": "any",
                           "registry": {"http://localhost:1234/integer.json": {"type": "integer"}}}
    assert engine.schema_options == {"whitespace": "flexible"}
    other = AcceptAll(None)
    assert _compile(other, {"type": "string"}, {"property_order": "any"}) == {"type": "string"}


def test_runner_tables_and_outputs(tmp_path):
    suite = write_suite(tmp_path / "suite")
    engines = [spec("AcceptAll"), spec("RejectAll"), spec("RefuseAll"), spec("ExactEnum")]
    out = tmp_path / "out"
    summary = run_testsuite(list_keyword_files(suite), engines, out,
                            config=WorkerConfig(tokenizer_loader=spec("byte_tokenizer")),
                            workers=2, timeout_s=30, progress=False, meta={"suite": str(suite)})
    total = count(lambda g, t: True)
    expected = {
        spec("AcceptAll"): count(lambda g, t: t["valid"]),
        spec("RejectAll"): count(lambda g, t: not t["valid"]),
        spec("RefuseAll"): {name: 0 for name in SUITE},
        spec("ExactEnum"): count(lambda g, t: "enum" in g["schema"]),
    }
    stored = json.loads((out / "summary.json").read_text(encoding="utf-8"))
    assert stored["meta"]["tests"] == sum(total.values()) and stored["meta"]["groups"] == 4
    assert set(stored["files"]) == set(SUITE)  # optional/ is not read
    for engine, per_file in expected.items():
        for name, passed in per_file.items():
            assert stored["files"][name][engine] == {"passed": passed, "total": total[name]}, (engine, name)
        assert stored["totals"][engine]["passed"] == sum(per_file.values())
        assert stored["totals"][engine]["total"] == sum(total.values())
    assert stored["totals"][spec("RefuseAll")]["compile_error_groups"] == 4
    assert stored["totals"][spec("ExactEnum")]["compile_error_groups"] == 1
    assert summary["totals"] == stored["totals"]

    rows = [json.loads(line) for line in (out / "results.jsonl").read_text(encoding="utf-8").splitlines()]
    assert len(rows) == 4 * len(engines)
    assert all(len(r["tests"]) == r["n_tests"] for r in rows)
    table = (out / "summary.md").read_text(encoding="utf-8")
    assert table == report.testsuite_markdown(stored)
    n = sum(total.values())
    assert f"| **total** | **{sum(expected[spec('AcceptAll')].values())}/{n}** |" in table
    assert "| enum.json |" in table and "| const.json |" in table


def test_real_suite_has_the_reference_test_count():
    suite = SHARED_DIR / "json-schema-test-suite" / "tests" / "draft2020-12"
    if not suite.is_dir():
        pytest.skip(f"shared data not found: {suite}")
    files = list_keyword_files(suite)
    groups = [g for path in files for g in load_groups(path)]
    assert len(files) == 46
    assert len(groups) == 383
    assert sum(len(g["tests"]) for g in groups) == 1299
