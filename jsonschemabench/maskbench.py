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
import gc
import json
import multiprocessing
import multiprocessing.connection
import os
import pickle
import platform
import random
import signal
import sys
import time
import traceback
from collections import deque
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

import numpy as np

from . import outputs, report

__all__ = [
    "DEFAULT_ENGINES",
    "OUTCOMES",
    "serialize_instance",
    "list_cases",
    "select_sample",
    "split_of",
    "run_case",
    "WorkerConfig",
    "Task",
    "run_tasks",
    "run_with_progress",
    "run_maskbench",
    "add_arguments",
    "main",
]

DEFAULT_ENGINES = ("corral", "llguidance", "xgrammar", "outlines")
OUTCOMES = ("pass", "compile_error", "validation_error", "invalidation_error", "timeout", "crash")
THREAD_ENV = {
    "RAYON_NUM_THREADS": "1",
    "OMP_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
    "OPENBLAS_NUM_THREADS": "1",
    "NUMBA_NUM_THREADS": "1",
    "TOKENIZERS_PARALLELISM": "false",
}
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
    gc.collect()
    gc.disable()
    try:
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
    finally:
        gc.enable()

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


@dataclass(frozen=True)
class WorkerConfig:
    """How a worker builds its state: ``tokenizer_loader`` (``module:function``) called with
    ``tokenizer_arg``; engines are loaded by name on first use (``peers.load_engine``)."""

    tokenizer_loader: str = "jsonschemabench.peers:load_bench_tokenizer"
    tokenizer_arg: Any = None
    mem_limit_bytes: int | None = None
    warm_up: bool = True


@dataclass
class Task:
    """One unit of work: ``function`` (``module:function``) called in a worker as
    ``function(engine, tokenizer, payload, progress)`` and returning a record dict."""

    key: Any
    engine: str
    function: str
    payload: Any


def _single_thread_env() -> None:
    for name, value in THREAD_ENV.items():
        os.environ[name] = value


def _freeze_heap() -> None:
    """Move everything alive now (tokenizer, engines, imported modules) out of the collector's reach.

    Each task starts and ends with ``gc.collect()``; over a worker's set-up heap (a 128k-token
    vocabulary, torch, transformers) one collection took ~140 ms, twice per task — most of a
    full MaskBench run's wall time, none of it measured. Frozen objects are never freed, so only
    set-up state is frozen; what a task builds is collected as before.
    """
    gc.collect()
    gc.freeze()


def _worker_main(conn, config: WorkerConfig) -> None:  # pragma: no cover - runs in a child process
    _single_thread_env()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent decides when to stop
    if config.mem_limit_bytes:
        import resource

        resource.setrlimit(resource.RLIMIT_AS, (config.mem_limit_bytes, config.mem_limit_bytes))
    from .peers import EngineUnavailable, load_engine, resolve, warm_up

    tokenizer = None
    engines: dict[str, Any] = {}
    functions: dict[str, Callable] = {}
    while True:
        try:
            message = conn.recv()
        except (EOFError, OSError):
            return
        if message is None:
            return
        task_id, engine_spec, function_spec, payload = message
        try:
            if tokenizer is None:
                tokenizer = resolve(config.tokenizer_loader)(config.tokenizer_arg)
            engine = engines.get(engine_spec)
            if engine is None:
                engine = load_engine(engine_spec, tokenizer)
                if "torch" in sys.modules:
                    sys.modules["torch"].set_num_threads(1)
                if config.warm_up:
                    warm_up(engine, "json_schema", {"type": "integer"})
                engines[engine_spec] = engine
                _freeze_heap()
            function = functions.get(function_spec)
            if function is None:
                function = functions[function_spec] = resolve(function_spec)
        except EngineUnavailable as exc:
            conn.send(("unavailable", task_id, str(exc)))
            continue
        except BaseException as exc:
            conn.send(("done", task_id, {"outcome": "crash", "error": f"engine set-up failed: "
                                         f"{type(exc).__name__}: {exc}"[:500]}))
            continue
        info = {"version": getattr(engine, "version", "unknown"), "options": getattr(engine, "options", {}),
                "name": getattr(engine, "name", engine_spec)}
        conn.send(("begin", task_id, info))
        try:
            record = function(engine, tokenizer, payload, lambda data: conn.send(("progress", task_id, data)))
        except MemoryError:
            record = {"outcome": "crash", "error": "out of memory (MemoryError)"}
        except BaseException as exc:  # an engine bug is a result, not the end of the worker
            tb = traceback.format_exc(limit=-3)
            record = {"outcome": "crash", "error": f"{type(exc).__name__}: {exc}"[:500], "traceback": tb[-2000:]}
        gc.collect()
        conn.send(("done", task_id, record))


def _death_message(exitcode: int | None) -> str:
    if exitcode is None:
        return "worker vanished"
    if exitcode < 0:
        try:
            name = signal.Signals(-exitcode).name
        except ValueError:
            name = f"signal {-exitcode}"
        hint = " (out of memory?)" if name in ("SIGABRT", "SIGKILL") else ""
        return f"worker killed by {name}{hint}"
    return f"worker exited with status {exitcode}"


class _Slot:
    def __init__(self, ctx, config: WorkerConfig):
        self.conn, child = ctx.Pipe(duplex=True)
        self.process = ctx.Process(target=_worker_main, args=(child, config), daemon=True)
        self.process.start()
        child.close()
        self.task: Task | None = None
        self.sent_at = 0.0
        self.begun_at: float | None = None
        self.progress: dict = {}
        self.info: dict | None = None

    def assign(self, task_id: int, task: Task) -> None:
        self.task = task
        self.task_id = task_id
        self.sent_at = time.monotonic()
        self.begun_at = None
        self.progress = {}
        self.info = None
        try:
            self.conn.send((task_id, task.engine, task.function, task.payload))
        except OSError:  # the worker just died; the pool sees its sentinel and records a crash
            pass

    def kill(self) -> None:
        if self.process.is_alive():
            self.process.kill()
        self.process.join(10)
        self.conn.close()

    def stop(self) -> None:
        try:
            self.conn.send(None)
        except (OSError, BrokenPipeError):
            pass
        self.process.join(5)
        if self.process.is_alive():
            self.process.kill()
            self.process.join(5)
        self.conn.close()


def run_tasks(
    tasks: Iterable[Task],
    config: WorkerConfig,
    on_result: Callable[[Task, dict, dict | None], None],
    *,
    workers: int = 2,
    timeout_s: float = 900.0,
    load_timeout_s: float = 900.0,
    on_unavailable: Callable[[str, str], None] | None = None,
) -> None:
    """Run ``tasks`` on ``workers`` spawned processes; call ``on_result(task, record, info)``.

    ``record`` is the task function's dict, or ``{"outcome": "timeout" | "crash", "error": ...}``
    merged with the last progress the task reported; ``info`` is the engine's name, version and
    options (``None`` if the engine never started). The clock of ``timeout_s`` starts when the
    worker has its engine ready; loading it has ``load_timeout_s``. When a worker finds an engine
    not installed, ``on_unavailable(engine, message)`` is called and the engine's remaining tasks
    are dropped without a result.
    """
    queue = deque(tasks)
    if not queue:
        return
    _single_thread_env()  # inherited by the spawned workers
    ctx = multiprocessing.get_context("spawn")
    slots = [_Slot(ctx, config) for _ in range(max(1, min(workers, len(queue))))]
    unavailable: set[str] = set()
    next_id = 0

    def finish(slot: _Slot, record: dict) -> None:
        task = slot.task
        slot.task = None
        if record.get("outcome") in ("timeout", "crash"):
            record = {**slot.progress, **record}
        on_result(task, record, slot.info)

    try:
        while True:
            for index, slot in enumerate(slots):
                if slot.task is None and queue:
                    while queue and queue[0].engine in unavailable:
                        queue.popleft()
                    if not queue:
                        break
                    if not slot.process.is_alive():
                        slot.kill()
                        slots[index] = slot = _Slot(ctx, config)
                    slot.assign(next_id, queue.popleft())
                    next_id += 1
            busy = [s for s in slots if s.task is not None]
            if not busy:
                break
            now = time.monotonic()
            deadlines = [(s.begun_at + timeout_s) if s.begun_at is not None else (s.sent_at + load_timeout_s)
                         for s in busy]
            wait_for = max(0.0, min(deadlines) - now)
            multiprocessing.connection.wait([s.conn for s in busy] + [s.process.sentinel for s in busy],
                                            timeout=wait_for)
            for slot in busy:
                index = slots.index(slot)
                finished = False
                while slot.task is not None:
                    try:
                        if not slot.conn.poll():
                            break
                        kind, task_id, data = slot.conn.recv()
                    except (EOFError, OSError, ValueError, TypeError, AttributeError, ImportError,
                            pickle.UnpicklingError):
                        break  # a worker that died mid-message; handled below
                    if task_id != slot.task_id:
                        continue
                    if kind == "begin":
                        slot.begun_at = time.monotonic()
                        slot.info = data
                    elif kind == "progress":
                        slot.progress.update(data)
                    elif kind == "unavailable":
                        engine = slot.task.engine
                        slot.task = None
                        if engine not in unavailable:
                            unavailable.add(engine)
                            if on_unavailable is not None:
                                on_unavailable(engine, data)
                        finished = True
                    elif kind == "done":
                        finish(slot, data)
                        finished = True
                if finished or slot.task is None:
                    continue
                if not slot.process.is_alive():
                    slot.process.join(1)
                    finish(slot, {"outcome": "crash", "error": _death_message(slot.process.exitcode)})
                    slot.kill()
                    slots[index] = _Slot(ctx, config)
                    continue
                now = time.monotonic()
                if slot.begun_at is not None and now > slot.begun_at + timeout_s:
                    slot.kill()
                    finish(slot, {"outcome": "timeout", "error": f"no result within {timeout_s:g} s"})
                    slots[index] = _Slot(ctx, config)
                elif slot.begun_at is None and now > slot.sent_at + load_timeout_s:
                    slot.kill()
                    finish(slot, {"outcome": "crash", "error": f"engine set-up took over {load_timeout_s:g} s"})
                    slots[index] = _Slot(ctx, config)
    finally:
        for slot in slots:
            if slot.task is not None:
                slot.kill()
            else:
                slot.stop()


# --- the benchmark ---------------------------------------------------------------------------


def default_mem_limit_gib(workers: int) -> float:
    """min(40 GiB, physical memory / workers): MaskBench's cap, shrunk to fit this machine."""
    try:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    except (ValueError, OSError, AttributeError):
        return 40.0
    return max(1.0, min(40.0, total / max(1, workers)))


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
) -> dict[str, str]:
    """``run_tasks`` behind a progress bar, as every runner drives it.

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
        run_tasks(tasks, config, on_result, workers=workers, timeout_s=timeout_s, on_unavailable=on_unavailable)
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
) -> dict:
    """Run every file on every engine; write ``OUTPUTS`` (the plot only with matplotlib).

    ``resume``: keep the rows an earlier, interrupted run of the same command left in
    ``out_dir/results.jsonl`` (a line cut off mid-write is dropped) and run only the (file,
    engine) pairs without one; engine versions come from ``engines.json`` beside it.
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
                                    timeout_s=timeout_s, progress=progress)

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


def _earlier_rows(path: Path, keys: set) -> list[dict]:
    """The complete rows of an earlier run's results for these (file, engine) keys, last one per key."""
    if not path.exists():
        return []
    rows: dict = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            row = json.loads(line)
        except json.JSONDecodeError:  # the line the interrupted run was writing
            continue
        key = (row.get("file"), row.get("engine"))
        if key in keys:
            rows[key] = row
    return list(rows.values())


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


def start_run(args: argparse.Namespace) -> tuple[WorkerConfig, list[str], dict[str, str]]:
    """The workers' set-up, the requested engines that are installed, and why the others are not.

    Exits with status 1 when none of them is installed.
    """
    config = worker_config(args)
    engines, skipped = available_engines(parse_engines(args.engines))
    if not engines:
        raise SystemExit("no engine available")
    return config, engines, skipped


def add_common_arguments(parser: argparse.ArgumentParser, engines: Sequence[str]) -> None:
    """Options shared by the maskbench and testsuite subcommands."""
    parser.add_argument("--tokenizer", type=Path, default=None,
                        help="a .gguf vocabulary or tokenizer folder "
                        "(default: ../shared/vocab/ggml-vocab-llama-bpe.gguf)")
    parser.add_argument("--engines", default=",".join(engines),
                        help="comma-separated engines, in column order (default: %(default)s)")
    parser.add_argument("--workers", type=int, default=2, help="worker processes (default 2)")
    parser.add_argument("--mem-limit", type=float, default=None, metavar="GIB",
                        help="address-space cap per worker in GiB (default: min(40, RAM / workers))")
    parser.add_argument("--out", type=Path, default=None, help="output folder (default: runs/<benchmark>-<timestamp>)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")


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


def worker_config(args: argparse.Namespace) -> WorkerConfig:
    tokenizer = args.tokenizer or default_shared("vocab", "ggml-vocab-llama-bpe.gguf")
    if not Path(tokenizer).exists():
        raise SystemExit(f"tokenizer not found: {tokenizer}")
    if args.workers < 1:
        raise SystemExit("--workers must be at least 1")
    limit = args.mem_limit if args.mem_limit is not None else default_mem_limit_gib(args.workers)
    return WorkerConfig(tokenizer_arg=str(tokenizer), mem_limit_bytes=int(limit * 2**30) if limit > 0 else None)


def run_meta(args: argparse.Namespace, config: WorkerConfig) -> dict:
    return {
        "command": " ".join(sys.argv),
        "tokenizer": config.tokenizer_arg,
        "mem_limit_gib": (config.mem_limit_bytes or 0) / 2**30 or None,
        "cpu": report.cpu_name(),
        "python": platform.python_version(),
        "started": datetime.now().isoformat(timespec="seconds"),
        "single_thread": THREAD_ENV,
    }


def main(args: argparse.Namespace) -> int:
    """Run MaskBench with parsed ``args``; returns the process exit status."""
    config, engines, skipped = start_run(args)
    files = select_sample(list_cases(args.data or default_shared("jsonschemabench", "maskbench"), args.only),
                          args.sample, args.seed)
    if not files:
        outputs.log("no MaskBench files selected")
        return 1
    out = args.out or Path("runs") / f"maskbench-{datetime.now():%Y%m%d-%H%M%S}"
    meta = run_meta(args, config) | {"sample": args.sample, "seed": args.seed,
                                      "data": str(args.data or default_shared("jsonschemabench", "maskbench")),
                                      "skipped": skipped}
    outputs.log(f"maskbench: {len(files)} files x {len(engines)} engines, {args.workers} workers, "
                f"timeout {args.timeout:g} s -> {out}")
    corral_options = {"property_order": args.property_order}
    meta["corral_options"] = corral_options
    summary = run_maskbench(files, engines, out, config=config, workers=args.workers, timeout_s=args.timeout,
                            progress=not args.no_progress, meta=meta, corral_options=corral_options,
                            resume=args.resume)
    return outputs.show_run(out, OUTPUTS, summary["meta"]["skipped_outputs"])
