"""The MaskBench runner: outcome classification, worker isolation, percentiles and outputs.

Fake engines over a byte tokenizer (token id = byte value, EOS = 256) run on tiny synthetic
MaskBench files, in-process (``run_case``) and through the worker pool (``run_maskbench``):
accept-everything (invalidation errors), reject-everything (validation errors), refuse at
compile (compile errors), an exact enum engine (passes), and traps that sleep (timeout), exit
or segfault (crash) or raise mid-walk (crash); they live in ``fake_engines``, where the spawned
workers import them by name. The plot is written with matplotlib and, without it, said to be
skipped and recorded in the summary. A smoke test runs corral and llguidance on two real files
when ``../shared`` is present.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from jsonschemabench import outputs, report
from jsonschemabench.maskbench import (
    OUTCOMES,
    Task,
    WorkerConfig,
    list_cases,
    run_case,
    run_maskbench,
    run_tasks,
    select_sample,
    serialize_instance,
    split_of,
)
from jsonschemabench.peers import EngineUnavailable
from fake_engines import AcceptAll, ByteTokenizer, ExactEnum, RefuseAll, RejectAll, spec
from shared_data import SHARED_DIR


def missing_engine(tokenizer):
    raise EngineUnavailable("not installed here")


# --- synthetic MaskBench files -------------------------------------------------------------------

CASES = {
    "Synth_1.json": {"schema": {"enum": ["a", 1]},
                     "tests": [{"valid": True, "data": "a"}, {"valid": True, "data": 1},
                               {"valid": False, "data": "b"}, {"valid": False, "data": 2}]},
    "Synth_2.json": {"schema": {"enum": [{"k": "é"}]}, "tests": [{"valid": True, "data": {"k": "é"}}]},
    "Synth_3.json": {"schema": {"enum": [True]}, "tests": [{"valid": False, "data": False}]},
    "Synth_4.json": {"schema": {"type": "object"}, "tests": []},
}
TRAPS = {
    "Trap---sleep.json": {"schema": {"x-trap": "sleep", "enum": [1]}, "tests": [{"valid": True, "data": 1}]},
    "Trap---exit.json": {"schema": {"x-trap": "exit", "enum": [1]}, "tests": [{"valid": True, "data": 1}]},
    "Trap---segv.json": {"schema": {"x-trap": "segv", "enum": [1]}, "tests": [{"valid": True, "data": 1}]},
    "Trap---raise.json": {"schema": {"x-trap": "raise", "enum": [1]}, "tests": [{"valid": True, "data": 1}]},
}

# outcome per (file, engine) for the synthetic cases, derived by hand from each fake's behaviour
EXPECTED = {
    ("Synth_1.json", "accept_all"): "invalidation_error",
    ("Synth_1.json", "reject_all"): "validation_error",
    ("Synth_1.json", "exact"): "pass",
    ("Synth_2.json", "accept_all"): "pass",
    ("Synth_2.json", "reject_all"): "validation_error",
    ("Synth_2.json", "exact"): "pass",
    ("Synth_3.json", "accept_all"): "invalidation_error",
    ("Synth_3.json", "reject_all"): "pass",
    ("Synth_3.json", "exact"): "pass",
    ("Synth_4.json", "accept_all"): "pass",
    ("Synth_4.json", "reject_all"): "pass",
    ("Synth_4.json", "exact"): "compile_error",
    ("Trap---sleep.json", "exact"): "timeout",
    ("Trap---exit.json", "exact"): "crash",
    ("Trap---segv.json", "exact"): "crash",
    ("Trap---raise.json", "exact"): "crash",
}


def write_cases(folder: Path, cases: dict) -> list[Path]:
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for name, case in cases.items():
        path = folder / name
        path.write_text(json.dumps({"description": name, "meta": {}, **case}, ensure_ascii=False), encoding="utf-8")
        paths.append(path)
    return paths


def no_progress(_data):
    pass


# --- pure functions ----------------------------------------------------------------------------


def test_percentiles_follow_maskbench_index_rule():
    values = list(range(100, 0, -1))  # 1..100, unsorted
    p = report.percentiles(values)
    assert list(p) == ["avg", "p25", "p50", "p75", "p90", "p95", "p99", "p99.9", "max"]
    assert p["avg"] == pytest.approx(50.5)
    # sorted[int(n * q / 100)]: n = 100 -> index q, value q + 1
    assert (p["p25"], p["p50"], p["p75"], p["p90"], p["p95"], p["p99"]) == (26, 51, 76, 91, 96, 100)
    assert p["p99.9"] == 100 and p["max"] == 100
    assert report.percentiles([7.5]) == {k: 7.5 for k in report.PERCENTILE_KEYS}
    assert all(v is None for v in report.percentiles([]).values())
    big = report.percentiles(range(1, 10001))
    assert big["p99.9"] == 9991 and big["p50"] == 5001 and big["max"] == 10000


def test_serialization_matches_maskbench():
    data = {"a": [1, 2.5, None], "b": "é\u2028", "c": {"d": True}}
    assert serialize_instance(data) == '{"a": [1, 2.5, null], "b": "é\u2028", "c": {"d": true}}'
    assert serialize_instance(data) == json.dumps(data, ensure_ascii=False)


def test_sample_is_seeded_sorted_and_stable(tmp_path):
    files = write_cases(tmp_path, {f"S_{i}.json": {"schema": {}, "tests": []} for i in range(30)})
    a = select_sample(files, 7, seed=3)
    assert a == select_sample(list(reversed(files)), 7, seed=3)
    assert a == sorted(a, key=lambda p: p.name) and len(set(a)) == 7 and set(a) <= set(files)
    assert select_sample(files, 7, seed=4) != a
    assert select_sample(files, None) == sorted(files, key=lambda p: p.name)
    assert select_sample(files, 100) == sorted(files, key=lambda p: p.name)
    assert [p.name for p in list_cases(tmp_path, "S_1*")] == sorted(f"S_{i}.json" for i in (1, 10, 11, 12, 13, 14,
                                                                                                15, 16, 17, 18, 19))


def test_split_of_both_name_styles():
    assert split_of("Github_easy---o9.json") == "Github_easy"
    assert split_of("BFCL_parallel_multiple_12.json") == "BFCL_parallel_multiple"
    assert split_of("JME.json") == "JME"


# --- run_case in process -------------------------------------------------------------------------


@pytest.mark.parametrize("engine_cls", [AcceptAll, RejectAll, RefuseAll, ExactEnum])
def test_run_case_outcomes_in_process(tmp_path, engine_cls):
    paths = write_cases(tmp_path, CASES)
    engine = engine_cls(None)
    for path in paths:
        record = run_case(engine, ByteTokenizer(), {"path": str(path)}, no_progress)
        key = (path.name, engine.name)
        expected = "compile_error" if engine.name == "refuse_all" else EXPECTED[key]
        assert record["outcome"] == expected, (key, record)
        tests = CASES[path.name]["tests"]
        assert record["tests"] == len(tests)
        if expected == "compile_error":
            assert record["ttfm_us"] is None and record["tokens"] == 0 and "tbm_us" not in record
            assert record["error"]
            continue
        assert record["ttfm_us"] > 0
        assert len(record["tbm_us"]) == record["tokens"]
        if engine.name == "accept_all":  # every token plus the final EOS mask
            assert record["tokens"] == sum(len(serialize_instance(t["data"]).encode()) + 1 for t in tests)
            assert record["invalid_accepted"] == sum(1 for t in tests if not t["valid"])
        if engine.name == "reject_all":  # one mask per walk, then stop
            assert record["tokens"] == len(tests)
            assert record["valid_rejected"] == sum(1 for t in tests if t["valid"])
        assert record["mask_advance_disagree"] == 0 and record["accept_disagree"] == 0


def test_refusal_details_are_kept(tmp_path):
    (path,) = write_cases(tmp_path, {"One.json": CASES["Synth_1.json"]})
    record = run_case(RefuseAll(None), ByteTokenizer(), {"path": str(path)}, no_progress)
    assert record["keyword"] == "enum" and record["pointer"] == "#/enum"
    assert record["error"].startswith("FakeError: refused on purpose")


def test_failure_notes_name_the_test(tmp_path):
    (path,) = write_cases(tmp_path, {"One.json": CASES["Synth_1.json"]})
    record = run_case(RejectAll(None), ByteTokenizer(), {"path": str(path)}, no_progress)
    assert record["failures"][0].startswith("test #0 (valid) token 0/3")
    record = run_case(AcceptAll(None), ByteTokenizer(), {"path": str(path)}, no_progress)
    assert record["failures"] == ['test #2 (invalid) accepted: "b"', "test #3 (invalid) accepted: 2"]


# --- the whole runner, through worker processes ---------------------------------------------------


def test_runner_classifies_isolates_and_writes_outputs(tmp_path, byte_workers, matplotlib_present):
    files = write_cases(tmp_path / "data", {**CASES, **TRAPS})
    engines = [spec(AcceptAll), spec(RejectAll), spec(RefuseAll), spec(ExactEnum), spec(missing_engine)]
    names = {spec(AcceptAll): "accept_all", spec(RejectAll): "reject_all", spec(RefuseAll): "refuse_all",
             spec(ExactEnum): "exact"}
    out = tmp_path / "out"
    summary = run_maskbench(files, engines, out, config=byte_workers, workers=2, timeout_s=3.0, progress=False,
                            meta={"tokenizer": "bytes"})

    rows = [json.loads(line) for line in (out / "results.jsonl").read_text(encoding="utf-8").splitlines()]
    available = [e for e in engines if e != spec(missing_engine)]
    assert len(rows) == len(files) * len(available)
    assert {(r["file"], r["engine"]) for r in rows} == {(p.name, e) for p in files for e in available}
    for row in rows:
        assert row["outcome"] in OUTCOMES
        name = names[row["engine"]]
        expected = "compile_error" if name == "refuse_all" else EXPECTED.get((row["file"], name))
        if expected is None:  # the other fakes on the trap files: traps only fire in ExactEnum
            expected = "pass" if name == "accept_all" else "validation_error"
        assert row["outcome"] == expected, row
    by_key = {(r["file"], names[r["engine"]]): r for r in rows}
    assert "within 3 s" in by_key[("Trap---sleep.json", "exact")]["error"]
    assert "status 3" in by_key[("Trap---exit.json", "exact")]["error"]
    assert "SIGSEGV" in by_key[("Trap---segv.json", "exact")]["error"]
    raised = by_key[("Trap---raise.json", "exact")]
    assert "RuntimeError: engine bug in advance" in raised["error"] and raised["ttfm_us"] > 0

    # summary.json: schema and consistency with the rows
    stored = json.loads((out / "summary.json").read_text(encoding="utf-8"))
    assert stored["order"] == available == summary["order"]
    assert stored["meta"]["skipped"] == {spec(missing_engine): "not installed here"}
    for engine in available:
        entry = stored["engines"][engine]
        mine = [r for r in rows if r["engine"] == engine]
        for key in ("schemas", "passing", "compile_error", "validation_error", "invalidation_error", "timeout",
                    "crash", "tbm_us", "ttfm_us", "version", "options"):
            assert key in entry, key
        assert set(entry["tbm_us"]) == set(report.PERCENTILE_KEYS) == set(entry["ttfm_us"])
        assert entry["schemas"] == len(mine) == len(files)
        assert entry["schemas"] == sum(entry[k] for k in ("passing", "compile_error", "validation_error",
                                                          "invalidation_error", "timeout", "crash"))
        assert entry["passing"] == sum(r["outcome"] == "pass" for r in mine)
        assert entry["masks"] == sum(len(r.get("tbm_us") or ()) for r in mine)
        assert entry["options"]["call"].endswith("()") and entry["version"] == "0"
    exact = stored["engines"][spec(ExactEnum)]
    assert (exact["timeout"], exact["crash"], exact["compile_error"]) == (1, 3, 1)
    # the compile-time timeout counts at the limit in TTFM; the mid-walk crash keeps its TTFM
    assert exact["ttfm_us"]["max"] == pytest.approx(3.0e6)
    assert stored["engines"][spec(RefuseAll)]["compile_error_keywords"] == {"enum": len(files)}
    assert stored["engines"][spec(RefuseAll)]["tbm_us"]["avg"] is None

    table = (out / "summary.md").read_text(encoding="utf-8")
    assert "| TBM p99.9 |" in table and "| invalidation error (invalid instance accepted) |" in table
    assert "skipped (not installed here)" in table
    assert (out / "maskbench.png").read_bytes().startswith(b"\x89PNG\r\n\x1a\n")
    assert stored["meta"]["skipped_outputs"] == {} and "not written" not in table


def test_runner_without_matplotlib_says_and_records_the_skipped_plot(tmp_path, byte_workers, matplotlib_missing,
                                                                     capsys):
    files = write_cases(tmp_path / "data", {"Synth_1.json": CASES["Synth_1.json"]})
    out = tmp_path / "out"
    summary = run_maskbench(files, [spec(AcceptAll)], out, config=byte_workers, workers=1, timeout_s=30.0,
                            progress=False)
    reason = outputs.not_installed("matplotlib")
    assert reason == 'matplotlib is not installed (pip install -e ".[bench]")'
    assert f"maskbench: plot skipped: {reason}" in capsys.readouterr().err
    assert not (out / "maskbench.png").exists()
    assert summary["meta"]["skipped_outputs"] == {"maskbench.png": reason}
    assert json.loads((out / "summary.json").read_text(encoding="utf-8"))["meta"] == summary["meta"]
    assert f"- maskbench.png: not written ({reason})" in (out / "summary.md").read_text(encoding="utf-8")
    assert summary["engines"][spec(AcceptAll)]["schemas"] == 1  # the run itself is whole


def test_resume_keeps_finished_rows_and_runs_the_rest(tmp_path, byte_workers):
    files = write_cases(tmp_path / "data", CASES)
    engines = [spec(AcceptAll), spec(RejectAll)]
    out = tmp_path / "out"
    run_maskbench(files, engines, out, config=byte_workers, workers=1, timeout_s=5.0, progress=False)
    lines = (out / "results.jsonl").read_text(encoding="utf-8").splitlines()
    first = json.loads(lines[0])
    first["marker"] = "kept"  # not what a re-run would write
    interrupted = [json.dumps(first)] + lines[1:2] + [lines[2][: len(lines[2]) // 2]]  # a line cut mid-write
    (out / "results.jsonl").write_text("\n".join(interrupted), encoding="utf-8")

    summary = run_maskbench(files, engines, out, config=byte_workers, workers=1, timeout_s=5.0, progress=False,
                            resume=True)
    rows = [json.loads(line) for line in (out / "results.jsonl").read_text(encoding="utf-8").splitlines()]
    keys = [(r["file"], r["engine"]) for r in rows]
    assert sorted(keys) == sorted((p.name, e) for p in files for e in engines)  # each pair once
    assert [r for r in rows if r.get("marker") == "kept"] == [first]
    assert summary["engines"][spec(AcceptAll)]["schemas"] == len(files)
    again = run_maskbench(files, engines, out, config=byte_workers, workers=1, timeout_s=5.0, progress=False,
                          resume=True)
    assert again["engines"][spec(RejectAll)]["schemas"] == len(files)  # nothing left to run...
    assert again["engines"][spec(RejectAll)]["version"] == "0"  # ...and the versions come from engines.json


def report_heap_state(engine, tokenizer, payload, progress):
    """A task function: what the collector sees in a worker once its engine is set up."""
    import gc

    return {"outcome": "pass", "frozen": gc.get_freeze_count(),
            "engine_frozen": gc.is_tracked(engine) and all(obj is not engine for obj in gc.get_objects())}


def test_worker_set_up_state_is_out_of_the_collectors_reach(byte_workers):
    """Every task begins with ``gc.collect()``: the tokenizer and engines must be frozen, or each
    collection walks their whole heap (most of a full run's wall time, untimed)."""
    records = []
    tasks = [Task(key=i, engine=spec(AcceptAll), function=spec(report_heap_state), payload=None)
             for i in range(2)]
    run_tasks(tasks, byte_workers,
              lambda task, record, info: records.append(record), workers=1, timeout_s=30.0)
    assert len(records) == 2
    for record in records:
        assert record["frozen"] > 0 and record["engine_frozen"], record


# --- smoke: corral and llguidance on two real files -----------------------------------------------


@pytest.mark.slow
def test_smoke_real_engines_on_two_files(tmp_path):
    data = SHARED_DIR / "jsonschemabench" / "maskbench"
    vocab = SHARED_DIR / "vocab" / "ggml-vocab-llama-bpe.gguf"
    if not data.is_dir() or not vocab.is_file():
        pytest.skip(f"shared data not found under {SHARED_DIR}")
    pytest.importorskip("llguidance")
    files = [data / "Glaiveai2K---calculate_area_c6576e96.json", data / "BFCL_simple_191.json"]
    files = [f for f in files if f.is_file()] or select_sample(list_cases(data), 2, seed=0)
    out = tmp_path / "smoke"
    summary = run_maskbench(files, ["corral", "llguidance"], out,
                            config=WorkerConfig(tokenizer_arg=str(vocab)), workers=1, timeout_s=120,
                            progress=False)
    rows = [json.loads(line) for line in (out / "results.jsonl").read_text(encoding="utf-8").splitlines()]
    assert len(rows) == 2 * len(files)
    for row in rows:
        outcome = row["outcome"]
        assert outcome in OUTCOMES, row
        if outcome == "compile_error":
            assert row["ttfm_us"] is None and row["tokens"] == 0 and row["error"]
        elif outcome in ("pass", "validation_error", "invalidation_error"):
            assert row["ttfm_us"] > 0 and len(row["tbm_us"]) == row["tokens"]
            assert (row["valid_rejected"] > 0) == (outcome == "validation_error")
            if outcome == "pass":
                assert row["invalid_accepted"] == 0
                assert row["tokens"] >= row["valid_tests"]  # at least one mask per valid instance
    for name in ("corral", "llguidance"):
        entry = summary["engines"][name]
        assert entry["schemas"] == len(files)
        assert entry["schemas"] == sum(entry[k] for k in ("passing", "compile_error", "validation_error",
                                                          "invalidation_error", "timeout", "crash"))
        assert entry["version"] not in ("", "unknown")
    assert summary["engines"]["llguidance"]["crash"] == 0
