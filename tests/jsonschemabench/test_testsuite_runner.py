"""The JSON Schema Test Suite runner: per-test verdicts, per-file and total tables, outputs.

A synthetic suite folder (two keyword files and an ``optional/`` folder that must be ignored)
runs through the worker pool with the fake engines of ``fake_engines`` (byte tokenizer, EOS =
256): accept-everything passes exactly the valid tests, reject-everything exactly the invalid
ones, a refusing engine none, an exact enum engine all. The real suite, when ``../shared`` is
present, must hold the 1,299 tests of 46 keyword files that the reference figures count.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from jsonschemabench import report
from jsonschemabench.testsuite import _compile, list_keyword_files, load_groups, run_group, run_testsuite
from fake_engines import AcceptAll, ByteTokenizer, ExactEnum, RefuseAll, RejectAll, spec
from shared_data import SHARED_DIR

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


def test_runner_tables_and_outputs(tmp_path, byte_workers):
    suite = write_suite(tmp_path / "suite")
    engines = [spec(AcceptAll), spec(RejectAll), spec(RefuseAll), spec(ExactEnum)]
    out = tmp_path / "out"
    summary = run_testsuite(list_keyword_files(suite), engines, out,
                            config=byte_workers,
                            workers=2, timeout_s=30, progress=False, meta={"suite": str(suite)})
    total = count(lambda g, t: True)
    expected = {
        spec(AcceptAll): count(lambda g, t: t["valid"]),
        spec(RejectAll): count(lambda g, t: not t["valid"]),
        spec(RefuseAll): {name: 0 for name in SUITE},
        spec(ExactEnum): count(lambda g, t: "enum" in g["schema"]),
    }
    stored = json.loads((out / "summary.json").read_text(encoding="utf-8"))
    assert stored["meta"]["tests"] == sum(total.values()) and stored["meta"]["groups"] == 4
    assert set(stored["files"]) == set(SUITE)  # optional/ is not read
    for engine, per_file in expected.items():
        for name, passed in per_file.items():
            assert stored["files"][name][engine] == {"passed": passed, "total": total[name]}, (engine, name)
        assert stored["totals"][engine]["passed"] == sum(per_file.values())
        assert stored["totals"][engine]["total"] == sum(total.values())
    assert stored["totals"][spec(RefuseAll)]["compile_error_groups"] == 4
    assert stored["totals"][spec(ExactEnum)]["compile_error_groups"] == 1
    assert summary["totals"] == stored["totals"]

    rows = [json.loads(line) for line in (out / "results.jsonl").read_text(encoding="utf-8").splitlines()]
    assert len(rows) == 4 * len(engines)
    assert all(len(r["tests"]) == r["n_tests"] for r in rows)
    table = (out / "summary.md").read_text(encoding="utf-8")
    assert table == report.testsuite_markdown(stored)
    n = sum(total.values())
    assert f"| **total** | **{sum(expected[spec(AcceptAll)].values())}/{n}** |" in table
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
