"""The Ray executor (``--ray``): the local pool's rows, limits and resume, on a real local cluster.

A two-CPU cluster (``ray.init(num_cpus=2)``) starts once for the module. corral runs a MaskBench
sample and two Test Suite keyword files through the command line with and without ``--ray``, and
every row's outcome and counts must match file for file (timings aside). The fake engines of
``fake_engines`` (byte tokenizer) drive the limits: a task past its timeout gets a ``timeout`` row,
a worker that segfaults gets a ``crash`` row (keeping the progress its task reported),
a ``MemoryError`` past the cap is a ``crash`` row and its actor lives on, and the run continues
each time; ``--resume`` keeps an earlier Ray run's rows and runs only the missing ones.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path

import pytest

from jsonschemabench import maskbench
from jsonschemabench.maskbench import Task, WorkerConfig, run_maskbench
from fake_engines import AcceptAll, ExactEnum, byte_tokenizer, spec

# Ray's workers import this module by name (``report_then``) with only this folder on their path:
# the command line and the shared-data helpers are imported by the tests that use them

HERE = Path(__file__).resolve().parent
#: what a row holds that depends on timing, not on the engine's verdicts
TIMING_FIELDS = ("ttfm_us", "tbm_us", "advance_us_total")


@pytest.fixture(scope="module")
def cluster():
    """A local two-CPU cluster whose workers import the fakes and this module by name."""
    ray = pytest.importorskip("ray")
    if ray.is_initialized():
        pytest.skip("Ray is already initialized in this process")
    path = os.pathsep.join([str(HERE)] + [p for p in [os.environ.get("PYTHONPATH")] if p])
    ray.init(num_cpus=2, include_dashboard=False, runtime_env={"env_vars": {"PYTHONPATH": path}})
    yield ray
    ray.shutdown()


def ray_run_tasks():
    from jsonschemabench import ray_pool

    return ray_pool.run_tasks


def rows_of(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "results.jsonl").read_text(encoding="utf-8").splitlines()]


def verdicts(rows: list[dict]) -> dict:
    """Each row without its timings, by (file, engine)."""
    return {(r["file"], r["engine"]): {k: v for k, v in r.items() if k not in TIMING_FIELDS} for r in rows}


def write_cases(folder: Path, cases: dict) -> list[Path]:
    folder.mkdir(parents=True, exist_ok=True)
    for name, case in cases.items():
        (folder / name).write_text(json.dumps(case, ensure_ascii=False), encoding="utf-8")
    return sorted(folder / name for name in cases)


ENUM = {"schema": {"enum": ["a", 1]}, "tests": [{"valid": True, "data": "a"}, {"valid": False, "data": 2}]}


# --- the command line ------------------------------------------------------------------------------


def test_ray_option_parses_with_and_without_an_address():
    from jsonschemabench.__main__ import build_parser

    parser = build_parser()
    assert parser.parse_args(["maskbench"]).ray is None
    assert parser.parse_args(["maskbench", "--ray"]).ray == ""
    assert parser.parse_args(["testsuite", "--ray", "head:6379"]).ray == "head:6379"
    assert parser.parse_args(["e2e", "--model", "m", "--ray", "ray://head:10001"]).ray == "ray://head:10001"
    assert parser.parse_args(["maskbench"]).workers is None  # 2 locally, one per CPU under Ray


def test_without_ray_installed_the_option_says_how_to_install_it(monkeypatch):
    from jsonschemabench.__main__ import build_parser

    monkeypatch.setitem(sys.modules, "ray", None)  # ``import ray`` fails, as without the extra
    args = build_parser().parse_args(["maskbench", "--ray"])
    with pytest.raises(SystemExit, match=r'pip install "corral\[ray\]"'):
        maskbench.worker_pool(args)
    assert maskbench.worker_pool(build_parser().parse_args(["maskbench"])) == maskbench.Pool(maskbench.run_tasks, 2)


@pytest.mark.slow
def test_maskbench_on_ray_gives_the_local_rows(cluster, tmp_path, capsys):
    from jsonschemabench.__main__ import main
    from shared_data import shared_path, vocab_file

    data = shared_path("jsonschemabench", "maskbench")
    vocab = vocab_file("gpt-2")
    # eight small function-calling schemas: about 5 s of work on one core
    common = ["maskbench", "--data", str(data), "--only", "Glaiveai2K---*", "--sample", "8", "--engines", "corral",
              "--tokenizer", str(vocab), "--timeout", "120", "--no-progress"]
    assert main(common + ["--out", str(tmp_path / "local"), "--workers", "1"]) == 0
    assert main(common + ["--out", str(tmp_path / "ray"), "--ray"]) == 0  # one worker per CPU
    assert "2 workers on a Ray cluster (2 CPUs)" in capsys.readouterr().err

    local, remote = rows_of(tmp_path / "local"), rows_of(tmp_path / "ray")
    assert len(local) == 8 and {r["outcome"] for r in local} <= set(maskbench.OUTCOMES)
    assert not {r["outcome"] for r in local} & {"timeout", "crash"}, local
    assert verdicts(remote) == verdicts(local)
    assert all(r["ttfm_us"] > 0 for r in remote if r["outcome"] != "compile_error")
    written = {p.name for p in (tmp_path / "local").iterdir()}
    assert written == {p.name for p in (tmp_path / "ray").iterdir()}
    assert written >= {"results.jsonl", "summary.json", "summary.md", "engines.json"}
    local_summary, ray_summary = (json.loads((tmp_path / side / "summary.json").read_text(encoding="utf-8"))
                                  for side in ("local", "ray"))
    counts = ("schemas", "passing", "compile_error", "validation_error", "invalidation_error", "timeout", "crash")
    assert {k: ray_summary["engines"]["corral"][k] for k in counts} == \
        {k: local_summary["engines"]["corral"][k] for k in counts}
    assert ray_summary["meta"]["pool"] == "Ray cluster (2 CPUs)" and "pool" not in local_summary["meta"]


@pytest.mark.slow
def test_testsuite_on_ray_gives_the_local_passed_total(cluster, tmp_path):
    from jsonschemabench.__main__ import main
    from shared_data import shared_path, vocab_file

    suite = shared_path("json-schema-test-suite", "tests", "draft2020-12")
    common = ["testsuite", "--suite", str(suite), "--only", "m[ai][xn]Items.json", "--engines", "corral",
              "--tokenizer", str(vocab_file("gpt-2")), "--workers", "1", "--no-progress"]
    assert main(common + ["--out", str(tmp_path / "local")]) == 0
    assert main(common + ["--out", str(tmp_path / "ray"), "--ray"]) == 0
    local, remote = (json.loads((tmp_path / side / "summary.json").read_text(encoding="utf-8"))
                     for side in ("local", "ray"))
    assert set(local["files"]) == {"maxItems.json", "minItems.json"}
    assert remote["files"] == local["files"] and remote["totals"] == local["totals"]
    assert local["totals"]["corral"]["passed"] > 0


# --- limits, isolation and resume, with the fake engines -----------------------------------------


@pytest.mark.slow
def test_timeouts_and_deaths_are_rows_the_run_goes_on_and_resume_runs_the_rest(cluster, tmp_path):
    traps = {name: {"schema": {"x-trap": trap, "enum": [1]}, "tests": [{"valid": True, "data": 1}]}
             for name, trap in (("Trap---sleep.json", "sleep"), ("Trap---segv.json", "segv"))}
    files = write_cases(tmp_path / "data", {**traps, **{f"Synth_{i}.json": ENUM for i in range(1, 4)}})
    out = tmp_path / "out"
    config = WorkerConfig(tokenizer_loader=spec(byte_tokenizer))
    start = time.monotonic()
    run_maskbench(files, [spec(ExactEnum)], out, config=config, workers=2, timeout_s=3.0, progress=False,
                  executor=ray_run_tasks())
    assert time.monotonic() - start < 50  # the sleeping trap (60 s) was cut off
    rows = {r["file"]: r for r in rows_of(out)}
    assert {name: r["outcome"] for name, r in rows.items()} == {
        "Trap---sleep.json": "timeout", "Trap---segv.json": "crash",
        "Synth_1.json": "pass", "Synth_2.json": "pass", "Synth_3.json": "pass"}
    assert rows["Trap---sleep.json"]["error"] == "no result within 3 s"
    assert rows["Trap---segv.json"]["error"].startswith("worker died")

    # an interrupted run: the trap rows were written (one edited, to tell it from a re-run), a
    # synthetic one was cut mid-write, the others never came; --resume runs exactly those
    kept = [rows["Trap---sleep.json"] | {"marker": "kept"}, rows["Trap---segv.json"]]
    (out / "results.jsonl").write_text("\n".join([json.dumps(r) for r in kept] + ['{"file": "Synth_1.js']),
                                       encoding="utf-8")
    ran: list[Task] = []

    def recording(tasks, *args, **kwargs):
        ran.extend(tasks)
        return ray_run_tasks()(ran, *args, **kwargs)

    summary = run_maskbench(files, [spec(ExactEnum)], out, config=config, workers=2, timeout_s=3.0,
                            progress=False, resume=True, executor=recording)
    assert sorted(t.key[0] for t in ran) == ["Synth_1.json", "Synth_2.json", "Synth_3.json"]
    again = rows_of(out)
    assert again[:2] == kept and sorted(r["file"] for r in again) == sorted(p.name for p in files)
    assert {r["file"]: r["outcome"] for r in again[2:]} == {f"Synth_{i}.json": "pass" for i in range(1, 4)}
    assert summary["engines"][spec(ExactEnum)]["timeout"] == 1


def report_then(engine, tokenizer, payload, progress):
    """A task function: report progress, then segfault, allocate or finish as ``payload`` says."""
    progress({"ttfm_us": 12.5})
    if payload == "segv":
        os.kill(os.getpid(), signal.SIGSEGV)
    elif payload == "allocate":
        block = bytearray(3 * 2**30)  # past the 1 GiB cap above the worker's start-up address space
        return {"outcome": "pass", "allocated": len(block)}
    return {"outcome": "pass", "pid": os.getpid()}


@pytest.mark.slow
def test_progress_outlives_a_dead_worker_and_memory_errors_are_rows(cluster):
    results: dict = {}
    infos: dict = {}
    tasks = [Task(key=what, engine=spec(AcceptAll), function=spec(report_then), payload=what)
             for what in ("segv", "allocate", "after")]

    def on_result(task, record, info):
        results[task.key] = record
        infos[task.key] = info

    ray_run_tasks()(tasks, WorkerConfig(tokenizer_loader=spec(byte_tokenizer), mem_limit_bytes=2**30), on_result,
                    workers=1, timeout_s=30.0)
    assert results["segv"]["outcome"] == "crash" and results["segv"]["ttfm_us"] == 12.5
    assert "worker died" in results["segv"]["error"]
    assert results["allocate"] == {"ttfm_us": 12.5, "outcome": "crash", "error": "out of memory (MemoryError)"}
    assert results["after"]["outcome"] == "pass" and "ttfm_us" not in results["after"]  # the worker lived on
    assert infos["after"]["name"] == "accept_all"
