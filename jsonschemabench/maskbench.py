"""MaskBench: time-to-first-mask, time-between-masks and exactness on JSONSchemaBench's test cases.

``python -m jsonschemabench maskbench --data DIR --tokenizer PATH --engines corral,llguidance,...``
runs every MaskBench file (``{"schema", "tests": [{"valid", "data"}]}``) on every engine, the way
guidance-ai/jsonschemabench's ``maskbench/runner.py`` does:

1. **TTFM** — compile the schema, make a matcher and fill its first mask, timed together (µs).
   Compile errors are the engine's refusals (``EngineRefused``).
2. For each test instance, serialized as MaskBench does (``json.dumps(data, ensure_ascii=False)``,
   separators ``", "`` and ``": "``) and tokenized canonically (``TokenVocabulary.encode``), walk
   the tokens from a fresh matcher: fill the mask, check the token's bit, advance. **TBM** for one
   step is mask + advance (MaskBench times ``compute_mask`` + ``commit_token``; our bit check is
   not timed). A walk stops at the first token not in the mask (or that ``advance`` refuses).
   After the last token the mask is filled once more (timed, counted as a TBM sample) and the
   instance is *accepted* when an EOS token is allowed there.
3. Outcome per (file, engine): ``pass``; ``compile_error``; ``validation_error`` (a valid
   instance rejected); ``invalidation_error`` (an invalid instance fully consumed and accepted);
   ``timeout`` (past ``--timeout`` seconds from the start of compilation); ``crash`` (the worker
   died — segfault, abort, out of memory — or the engine raised something other than a refusal).
   A file with both kinds of error counts as ``validation_error``.

Each (file, engine) runs in a worker process (``--workers``, spawned; each loads the tokenizer
and the engines it needs once, warms every engine up on a trivial schema, then freezes that
set-up heap so the untimed ``gc.collect()`` around each task skips it). A worker that
runs past the time limit is killed and replaced; one that dies is recorded as a crash and
replaced, so a peer's segfault never ends the run. Workers are single-threaded
(``RAYON_NUM_THREADS=1``, one OpenMP/torch thread, xgrammar ``max_threads=1``), time with
``perf_counter_ns`` and pause the garbage collector while timing; engines that cache compiled
grammars across files have that cache disabled (see ``peers``). Each worker's address
space is capped (``--mem-limit``, default min(40 GiB, RAM / workers); MaskBench used 40 GiB).
With ``--ray [ADDRESS]`` the same tasks run on a Ray cluster's actors, one per CPU (``ray_pool``:
the same task body, limits and rows; ``--resume`` works the same).

Outputs (``--out``, default ``runs/maskbench-<timestamp>``): ``results.jsonl`` (one line per
file × engine, written as results arrive, with every TBM sample), ``summary.json`` (per engine:
counts per outcome, TBM/TTFM percentiles, version and options), ``summary.md`` (the MaskBench
README table, also printed) and ``maskbench.png`` (TBM and TTFM tail distributions; needs matplotlib,
the ``bench`` extra: without it the run says so and ``summary.json`` lists it under ``skipped_outputs``).
Percentiles follow MaskBench's ``maskbench_results.py``: the sorted sample at index
``int(n * p / 100)``; TTFM pools every compiled schema plus compile-time timeouts at the limit.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import sys
import time
from datetime import datetime
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from . import outputs, report
from .timing import gc_paused
from .workers import (
    THREAD_ENV,
    Executor,
    Pool,
    Task,
    WorkerConfig,
    WorkerState,
    default_mem_limit_gib,
    run_tasks,
)

__all__ = [
    "DEFAULT_ENGINES",
    "OUTCOMES",
    "Executor",
    "Pool",
    "Task",
    "WorkerConfig",
    "WorkerState",
    "add_arguments",
    "list_cases",
    "main",
    "read_rows",
    "run_case",
    "run_maskbench",
    "run_tasks",
    "run_with_progress",
    "select_sample",
    "serialize_instance",
    "split_of",
    "worker_pool",
]

DEFAULT_ENGINES = ("corral", "llguidance", "xgrammar", "outlines")
OUTCOMES = ("pass", "compile_error", "validation_error", "invalidation_error", "timeout", "crash")
MAX_FAILURE_NOTES = 3
#: what a run writes to its folder, in the order the closing line lists them
OUTPUTS = ("results.jsonl", "summary.json", "summary.md", "maskbench.png")


def serialize_instance(data: Any) -> str:
    """A test instance as MaskBench writes it: one line, ``", "`` and ``": "``, non-ASCII kept."""
    return json.dumps(data, ensure_ascii=False, separators=(", ", ": "))


def default_shared(*parts: str) -> Path:
    """``$CORRAL_SHARED_DIR/...`` when that is set, else ``../shared/...`` from the working directory."""
    shared = os.environ.get("CORRAL_SHARED_DIR")
    return (Path(shared) if shared else Path("..") / "shared").joinpath(*parts)


def list_cases(data_dir: Path, only: str = "") -> list[Path]:
    """Every ``*.json`` in ``data_dir``, sorted by name; ``only`` is an fnmatch pattern on the name."""
    import fnmatch

    if not data_dir.is_dir():
        raise FileNotFoundError(f"MaskBench folder not found: {data_dir} (pass --data DIR or set CORRAL_SHARED_DIR)")
    files = sorted(data_dir.glob("*.json"), key=lambda p: p.name)
    if only:
        files = [p for p in files if fnmatch.fnmatch(p.name, only)]
    return files


def select_sample(files: Sequence[Path], n: int | None, seed: int = 0) -> list[Path]:
    """``n`` files drawn with ``random.Random(seed)`` from the name-sorted list, returned sorted."""
    ordered = sorted(files, key=lambda p: p.name)
    if n is None or n >= len(ordered):
        return ordered
    if n < 0:
        raise ValueError("--sample must be positive")
    return sorted(random.Random(seed).sample(ordered, n), key=lambda p: p.name)


def split_of(name: str) -> str:
    """The benchmark split of a MaskBench file name (``Github_easy---o123.json`` -> ``Github_easy``)."""
    stem = name[:-5] if name.endswith(".json") else name
    if "---" in stem:
        return stem.split("---", 1)[0]
    head, sep, tail = stem.rpartition("_")
    return head if sep and tail.isdigit() else stem


# --- one (file, engine) measurement: runs inside a worker ------------------------------------


def _token_text(tokenizer: Any, ids: Sequence[int]) -> str:
    vocab = getattr(tokenizer, "vocab", None)
    if vocab is None:
        return str(list(ids))
    try:
        return repr(vocab.decode(list(ids)))
    except Exception:  # a description only
        return str(list(ids))


def walk_instance(engine: Any, handle: Any, ids: Sequence[int], tbm_ns: list[int],
                  clock: Callable[[], int] = time.perf_counter_ns) -> tuple[str, int, dict]:
    """Walk ``ids`` from a fresh matcher; returns (verdict, position, counters).

    ``verdict`` is ``"accepted"`` (every token allowed, EOS allowed at the end),
    ``"rejected_token"`` (token at ``position`` not in the mask or refused by ``advance``) or
    ``"rejected_end"`` (all tokens consumed, EOS not allowed). One TBM sample per step is
    appended to ``tbm_ns``.
    """
    counters = {"mask_advance_disagree": 0, "accept_disagree": 0, "advance_ns": 0}
    m = engine.matcher(handle)
    for pos, token in enumerate(ids):
        start = clock()
        mask = engine.fill_mask(m)
        masked = clock()
        if not engine.allowed(mask, token):
            tbm_ns.append(masked - start)
            return "rejected_token", pos, counters
        start_advance = clock()
        ok = engine.advance(m, token)
        done = clock()
        tbm_ns.append(masked - start + done - start_advance)
        counters["advance_ns"] += done - start_advance
        if not ok:
            counters["mask_advance_disagree"] += 1
            return "rejected_token", pos, counters
    start = clock()
    mask = engine.fill_mask(m)
    tbm_ns.append(clock() - start)
    eos_ok = any(engine.allowed(mask, eos) for eos in engine.eos_token_ids)
    if eos_ok != bool(engine.is_accepting(m)):
        counters["accept_disagree"] += 1
    return ("accepted" if eos_ok else "rejected_end"), len(ids), counters


def _compile_error_fields(exc: BaseException) -> dict:
    out = {"error": f"{getattr(exc, 'kind', '') or type(exc).__name__}: {exc}"}
    for name in ("keyword", "pointer"):
        value = getattr(exc, name, None)
        if value is not None:
            out[name] = value
    return out


def run_case(engine: Any, tokenizer: Any, payload: dict, progress: Callable[[dict], None]) -> dict:
    """Measure one MaskBench file (``payload["path"]``) on ``engine``; the record of results.jsonl."""
    from .peers import EngineRefused, compile_schema

    path = Path(payload["path"])
    case = json.loads(path.read_text(encoding="utf-8"))
    tests = case.get("tests") or []
    instances = [serialize_instance(test["data"]) for test in tests]
    token_lists = [list(tokenizer.encode(text)) for text in instances]
    record: dict[str, Any] = {
        "tests": len(tests),
        "valid_tests": sum(1 for t in tests if t.get("valid")),
        "invalid_tests": sum(1 for t in tests if not t.get("valid")),
        "ttfm_us": None,
        "tokens": 0,
        "valid_rejected": 0,
        "invalid_accepted": 0,
        "mask_advance_disagree": 0,
        "accept_disagree": 0,
        "failures": [],
    }
    clock = time.perf_counter_ns
    engine.reset_caches()
    with gc_paused():
        start = clock()
        try:
            handle = compile_schema(engine, case["schema"], payload.get("corral_options"))
            engine.fill_mask(engine.matcher(handle))
        except EngineRefused as exc:
            record.update(outcome="compile_error", **_compile_error_fields(exc))
            return record
        record["ttfm_us"] = (clock() - start) / 1e3
        progress({"ttfm_us": record["ttfm_us"]})

        tbm_ns: list[int] = []
        advance_ns = 0
        for index, (test, ids) in enumerate(zip(tests, token_lists)):
            before = len(tbm_ns)
            verdict, pos, counters = walk_instance(engine, handle, ids, tbm_ns, clock)
            record["tokens"] += len(tbm_ns) - before
            record["mask_advance_disagree"] += counters["mask_advance_disagree"]
            record["accept_disagree"] += counters["accept_disagree"]
            advance_ns += counters["advance_ns"]
            valid = bool(test.get("valid"))
            if valid and verdict != "accepted":
                record["valid_rejected"] += 1
                if len(record["failures"]) < MAX_FAILURE_NOTES:
                    if verdict == "rejected_end":
                        why = "EOS not allowed after the last token"
                    else:
                        why = (f"token {pos}/{len(ids)} {_token_text(tokenizer, ids[pos:pos + 1])} rejected "
                               f"after ...{_token_text(tokenizer, ids[max(0, pos - 6):pos])}")
                    record["failures"].append(f"test #{index} (valid) {why}")
            elif not valid and verdict == "accepted":
                record["invalid_accepted"] += 1
                if len(record["failures"]) < MAX_FAILURE_NOTES:
                    record["failures"].append(f"test #{index} (invalid) accepted: {instances[index][:120]}")

    record["tbm_us"] = [round(ns / 1e3, 3) for ns in tbm_ns]
    record["advance_us_total"] = round(advance_ns / 1e3, 3)
    if record["valid_rejected"]:
        record["outcome"] = "validation_error"
    elif record["invalid_accepted"]:
        record["outcome"] = "invalidation_error"
    else:
        record["outcome"] = "pass"
    record["error"] = record["failures"][0] if record["failures"] else None
    return record


# --- worker pool: one process per worker, killed and replaced on timeout or death -------------


def worker_pool(args: argparse.Namespace, *, default_workers: int = 2, default_mem_limit: bool = True) -> Pool:
    """The local pool, or with ``--ray`` the Ray cluster (connected here, so that its CPU count,
    one worker each, is known before the run). ``default_mem_limit``: the runner caps workers
    when ``--mem-limit`` is not given (under Ray, per node: see ``ray_pool``)."""
    workers = getattr(args, "workers", None)
    if workers is not None and workers < 1:
        raise SystemExit("--workers must be at least 1")
    address = getattr(args, "ray", None)
    if address is None:
        return Pool(run_tasks, workers or default_workers)
    from . import ray_pool

    try:
        cpus = ray_pool.connect(address or None)
    except ModuleNotFoundError as exc:
        raise SystemExit(str(exc)) from exc
    node_cap = default_mem_limit and getattr(args, "mem_limit", None) is None
    return Pool(ray_pool.executor(node_mem_limit=node_cap), workers or cpus, f"Ray cluster ({cpus} CPUs)")


# --- the benchmark ---------------------------------------------------------------------------


def _progress_bar(total: int, desc: str):
    """A tqdm bar on stderr, or ``None`` (said) without tqdm."""
    tqdm = outputs.optional_module("tqdm", desc, "progress bar")
    if tqdm is None:
        return None
    return tqdm.tqdm(total=total, desc=desc, unit="run", dynamic_ncols=True, file=sys.stderr)


def run_with_progress(
    tasks: Sequence[Task],
    config: WorkerConfig,
    on_row: Callable[[Task, dict, dict | None], dict],
    *,
    desc: str,
    workers: int,
    timeout_s: float,
    progress: bool = True,
    notable: Callable[[Task, dict], str | None] | None = None,
    executor: Executor | None = None,
) -> dict[str, str]:
    """``executor`` (default: the local pool, ``run_tasks``) behind a progress bar, as every runner drives it.

    ``on_row(task, record, info)`` stores one result and returns its row; ``notable(task, row)``
    gives a line to print above the bar, or ``None`` (default: timeouts and crashes). Returns the
    engines that could not start, with the reason (their tasks are dropped, the bar shrinks).
    """
    skipped: dict[str, str] = {}
    bar = _progress_bar(len(tasks), desc) if progress else None

    def default_notable(task: Task, row: dict) -> str | None:
        if row["outcome"] in ("timeout", "crash"):
            return f"{task.engine} {task.key}: {row['outcome']} ({row.get('error')})"
        return None

    def on_result(task: Task, record: dict, info: dict | None) -> None:
        row = on_row(task, record, info)
        if bar is not None:
            bar.update(1)
            line = (notable or default_notable)(task, row)
            if line:
                bar.write(line[:300])

    def on_unavailable(engine: str, message: str) -> None:
        skipped[engine] = message
        if bar is not None:
            bar.write(f"{engine}: skipped ({message})")
            bar.total -= sum(1 for t in tasks if t.engine == engine)
            bar.refresh()

    try:
        (executor or run_tasks)(tasks, config, on_result, workers=workers, timeout_s=timeout_s,
                                on_unavailable=on_unavailable)
    finally:
        if bar is not None:
            bar.close()
    return skipped


def run_maskbench(
    files: Sequence[Path],
    engines: Sequence[str],
    out_dir: Path,
    *,
    config: WorkerConfig,
    workers: int = 2,
    timeout_s: float = 900.0,
    progress: bool = True,
    meta: dict | None = None,
    corral_options: dict | None = None,
    resume: bool = False,
    executor: Executor | None = None,
) -> dict:
    """Run every file on every engine; write ``OUTPUTS`` (the plot only with matplotlib).

    ``resume``: keep the rows an earlier, interrupted run of the same command left in
    ``out_dir/results.jsonl`` (a line cut off mid-write is dropped) and run only the (file,
    engine) pairs without one; engine versions come from ``engines.json`` beside it.
    ``executor``: the local pool (default) or ``ray_pool.run_tasks``; rows and files are the same.
    Returns the summary (``report.summarize_maskbench``) with ``meta`` attached.
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    results_path = out_dir / "results.jsonl"
    info_path = out_dir / "engines.json"
    payloads = [{"path": str(path), "corral_options": corral_options or {}} for path in files]
    tasks = [Task((Path(p["path"]).name, engine), engine, "jsonschemabench.maskbench:run_case", p)
             for p in payloads for engine in engines]
    kept = _earlier_rows(results_path, {t.key for t in tasks}) if resume else []
    engine_info: dict[str, dict] = json.loads(info_path.read_text(encoding="utf-8")) if resume and info_path.exists() else {}
    done = {(row["file"], row["engine"]) for row in kept}
    tasks = [t for t in tasks if t.key not in done]
    records: list[dict] = []

    with results_path.open("w", encoding="utf-8") as sink:
        def keep(row: dict) -> dict:
            sink.write(json.dumps(row, ensure_ascii=False) + "\n")
            sink.flush()
            if "tbm_us" in row:  # 8 bytes a sample in memory; a full run holds millions
                row["tbm_us"] = np.asarray(row["tbm_us"], dtype=np.float64)
            records.append(row)
            return row

        def on_row(task: Task, record: dict, info: dict | None) -> dict:
            file_name, engine = task.key
            if info is not None and engine not in engine_info:
                engine_info[engine] = info
                info_path.write_text(json.dumps(engine_info, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
            row = {"file": file_name, "split": split_of(file_name), "engine": engine, **record}
            row.setdefault("error", None)
            return keep(row)

        for row in kept:
            keep(row)

        skipped = run_with_progress(tasks, config, on_row, desc="maskbench", workers=workers,
                                    timeout_s=timeout_s, progress=progress, executor=executor)

    order = [e for e in engines if e not in skipped]
    not_plotted = report.plot_maskbench(records, order, out_dir / "maskbench.png", timeout_s=timeout_s)
    summary = report.summarize_maskbench(records, order, engine_info, timeout_s=timeout_s)
    meta = dict(meta or {})
    summary["meta"] = {**meta, "skipped": {**meta.get("skipped", {}), **skipped}, "timeout_s": timeout_s,
                       "workers": workers, "files": len(files), "skipped_outputs": not_plotted}
    (out_dir / "summary.json").write_text(json.dumps(summary, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    table = report.maskbench_markdown(summary)
    (out_dir / "summary.md").write_text(table, encoding="utf-8")
    return summary


def read_rows(path: Path) -> dict[tuple[str, str], dict]:
    """The complete rows of a run's ``results.jsonl`` by (file, engine), the last one per key (a
    line cut off by an interrupted run is skipped); empty when the file does not exist."""
    if not path.exists():
        return {}
    rows: dict = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            row = json.loads(line)
        except json.JSONDecodeError:  # the line the interrupted run was writing
            continue
        rows[(row.get("file"), row.get("engine"))] = row
    return rows


def _earlier_rows(path: Path, keys: set) -> list[dict]:
    """The complete rows of an earlier run's results for these (file, engine) keys, last one per key."""
    return [row for key, row in read_rows(path).items() if key in keys]


def parse_engines(text: str) -> list[str]:
    """Comma-separated engine names (or ``module:factory`` specs), checked against the registry."""
    from .peers import ENGINES

    names = [n.strip() for n in text.split(",") if n.strip()]
    unknown = [n for n in names if n not in ENGINES and ":" not in n]
    if unknown:
        raise SystemExit(f"unknown engine(s) {', '.join(unknown)}; choose from {', '.join(ENGINES)}")
    if not names:
        raise SystemExit("--engines is empty")
    return names


def available_engines(names: Sequence[str]) -> tuple[list[str], dict[str, str]]:
    """``names`` whose packages are importable, and a reason (also said) for each one that is not."""
    from .peers import ENGINE_MODULES, engine_installed

    keep, skipped = [], {}
    for name in names:
        if engine_installed(name):
            keep.append(name)
        else:
            skipped[name] = f"module {ENGINE_MODULES[name]!r} is not installed"
            outputs.log(f"{name}: skipped ({skipped[name]})")
    return keep, skipped


def start_run(args: argparse.Namespace) -> tuple[WorkerConfig, list[str], dict[str, str], Pool]:
    """The workers' set-up, the requested engines that are installed, why the others are not,
    and the pool that runs them (``worker_pool``: local, or the Ray cluster of ``--ray``).

    Exits with status 1 when none of them is installed.
    """
    worker_config(args)  # a missing tokenizer or a bad --workers is said before a cluster is joined
    engines, skipped = available_engines(parse_engines(args.engines))
    if not engines:
        raise SystemExit("no engine available")
    pool = worker_pool(args)
    return worker_config(args, pool), engines, skipped, pool


def add_common_arguments(parser: argparse.ArgumentParser, engines: Sequence[str]) -> None:
    """Options shared by the maskbench and testsuite subcommands."""
    parser.add_argument("--tokenizer", type=Path, default=None,
                        help="a .gguf vocabulary or tokenizer folder "
                        "(default: ../shared/vocab/ggml-vocab-llama-bpe.gguf)")
    parser.add_argument("--engines", default=",".join(engines),
                        help="comma-separated engines, in column order (default: %(default)s)")
    parser.add_argument("--workers", type=int, default=None,
                        help="worker processes (default 2; with --ray, one per CPU of the cluster)")
    parser.add_argument("--mem-limit", type=float, default=None, metavar="GIB",
                        help="address-space cap per worker in GiB (default: min(40, RAM / workers)); with --ray, "
                        "counted above the Ray worker's own address space, default min(40, node RAM / node CPUs)")
    add_ray_argument(parser)
    parser.add_argument("--out", type=Path, default=None, help="output folder (default: runs/<benchmark>-<timestamp>)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")


def add_ray_argument(parser: argparse.ArgumentParser) -> None:
    """``--ray [ADDRESS]``: run the tasks on a Ray cluster instead of the local pool (``worker_pool``)."""
    parser.add_argument("--ray", nargs="?", const="", default=None, metavar="ADDRESS",
                        help="spread the tasks over a Ray cluster: at ADDRESS (e.g. ray://head:10001 or "
                        "head:6379), or without one, RAY_ADDRESS's or a new local one (ray.init()); "
                        "needs pip install \"corral[ray]\"")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Register the ``maskbench`` subcommand's options on ``parser``."""
    parser.add_argument("--data", type=Path, default=None,
                        help="folder of MaskBench *.json files (default: ../shared/jsonschemabench/maskbench)")
    add_common_arguments(parser, DEFAULT_ENGINES)
    parser.add_argument("--sample", type=int, default=None, metavar="N",
                        help="run a deterministic sample of N files (seeded, sorted)")
    parser.add_argument("--seed", type=int, default=0, help="sample seed (default 0)")
    parser.add_argument("--only", default="", metavar="GLOB", help="only files whose name matches GLOB")
    parser.add_argument("--timeout", type=float, default=900.0, metavar="SECONDS",
                        help="limit per file and engine, compilation included (default 900, as MaskBench)")
    parser.add_argument("--resume", action="store_true",
                        help="with --out of an interrupted run of the same command: keep its rows, run the rest")
    parser.add_argument("--property-order", choices=("any", "schema", "required_first"), default="any",
                        help="corral's property_order (default 'any': MaskBench's valid instances list members "
                        "in any order, and validators accept every order; 'schema' is generation's default)")
    parser.set_defaults(run=main)


def worker_config(args: argparse.Namespace, pool: Pool | None = None) -> WorkerConfig:
    """The workers' tokenizer and address-space cap; under Ray without ``--mem-limit`` the cap is
    left to each node (``Pool`` of ``worker_pool``)."""
    tokenizer = args.tokenizer or default_shared("vocab", "ggml-vocab-llama-bpe.gguf")
    if not Path(tokenizer).exists():
        raise SystemExit(f"tokenizer not found: {tokenizer}")
    workers = pool.workers if pool is not None else (args.workers if args.workers is not None else 2)
    if workers < 1:
        raise SystemExit("--workers must be at least 1")
    if args.mem_limit is None and pool is not None and pool.where != "local":
        return WorkerConfig(tokenizer_arg=str(tokenizer), mem_limit_bytes=None)
    limit = args.mem_limit if args.mem_limit is not None else default_mem_limit_gib(workers)
    return WorkerConfig(tokenizer_arg=str(tokenizer), mem_limit_bytes=int(limit * 2**30) if limit > 0 else None)


def run_meta(args: argparse.Namespace, config: WorkerConfig, pool: Pool | None = None) -> dict:
    meta = {
        "command": " ".join(sys.argv),
        "tokenizer": config.tokenizer_arg,
        "mem_limit_gib": (config.mem_limit_bytes or 0) / 2**30 or None,
        "cpu": report.cpu_name(),
        "python": platform.python_version(),
        "started": datetime.now().isoformat(timespec="seconds"),
        "single_thread": THREAD_ENV,
    }
    if pool is not None and pool.where != "local":
        meta["pool"] = pool.where
        if config.mem_limit_bytes is None:
            meta["mem_limit_gib"] = "min(40, node RAM / node CPUs) per Ray worker"
    return meta


def main(args: argparse.Namespace) -> int:
    """Run MaskBench with parsed ``args``; returns the process exit status."""
    config, engines, skipped, pool = start_run(args)
    files = select_sample(list_cases(args.data or default_shared("jsonschemabench", "maskbench"), args.only),
                          args.sample, args.seed)
    if not files:
        outputs.log("no MaskBench files selected")
        return 1
    out = args.out or Path("runs") / f"maskbench-{datetime.now():%Y%m%d-%H%M%S}"
    meta = run_meta(args, config, pool) | {"sample": args.sample, "seed": args.seed,
                                      "data": str(args.data or default_shared("jsonschemabench", "maskbench")),
                                      "skipped": skipped}
    where = "" if pool.where == "local" else f" on a {pool.where}"
    outputs.log(f"maskbench: {len(files)} files x {len(engines)} engines, {pool.workers} workers{where}, "
                f"timeout {args.timeout:g} s -> {out}")
    corral_options = {"property_order": args.property_order}
    meta["corral_options"] = corral_options
    summary = run_maskbench(files, engines, out, config=config, workers=pool.workers, timeout_s=args.timeout,
                            progress=not args.no_progress, meta=meta, corral_options=corral_options,
                            resume=args.resume, executor=pool.run)
    return outputs.show_run(out, OUTPUTS, summary["meta"]["skipped_outputs"])
