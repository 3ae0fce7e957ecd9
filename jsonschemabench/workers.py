"""The benchmarks' local worker pool: tasks run in spawned worker processes, one at a time each,
with a per-task timeout, an address-space cap and crash isolation (``run_tasks``).

Every benchmark that runs engines on many inputs (``maskbench``, ``testsuite``, ``e2e``) hands its
``Task`` list to an ``Executor``: ``run_tasks`` here, or ``ray_pool``'s on a Ray cluster. Both run
the same task body (``WorkerState``), so rows and files are the same whichever pool drives them.
"""

from __future__ import annotations

import gc
import multiprocessing
import multiprocessing.connection
import os
import pickle
import signal
import sys
import time
import traceback
from collections import deque
from dataclasses import dataclass
from typing import Any, Callable, Iterable

__all__ = ["THREAD_ENV", "WorkerConfig", "Task", "WorkerState", "Executor", "Pool", "run_tasks", "with_progress",
           "default_mem_limit_gib"]

THREAD_ENV = {
    "RAYON_NUM_THREADS": "1",
    "OMP_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
    "OPENBLAS_NUM_THREADS": "1",
    "NUMBA_NUM_THREADS": "1",
    "TOKENIZERS_PARALLELISM": "false",
}

def default_mem_limit_gib(workers: int) -> float:
    """min(40 GiB, physical memory / workers): MaskBench's cap, shrunk to fit this machine."""
    try:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    except (ValueError, OSError, AttributeError):
        return 40.0
    return max(1.0, min(40.0, total / max(1, workers)))



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


def _cap_address_space(limit_bytes: int | None) -> None:
    """``RLIMIT_AS`` of this process: an allocation past it fails (``MemoryError``) or aborts the worker."""
    if limit_bytes:
        import resource

        resource.setrlimit(resource.RLIMIT_AS, (limit_bytes, limit_bytes))


class WorkerState:
    """What one worker process keeps across its tasks, and the task body every executor runs.

    The tokenizer, each engine (warmed up, its set-up heap frozen) and each task function are
    built once per process, on first use: compile caches and allocator state then match a long
    MaskBench run's, whichever pool (``run_tasks`` here, ``ray_pool.run_tasks``) drives it.
    """

    def __init__(self, config: WorkerConfig):
        self.config = config
        self.tokenizer: Any = None
        self.engines: dict[str, Any] = {}
        self.functions: dict[str, Callable] = {}

    def prepare(self, engine_spec: str, function_spec: str) -> tuple[str, Any]:
        """Load what a task needs: ``("begin", info)`` when ready, ``("unavailable", message)``
        when the engine is not installed, ``("done", crash record)`` when its set-up failed."""
        from .peers import EngineUnavailable, load_engine, resolve, warm_up

        config = self.config
        try:
            if self.tokenizer is None:
                self.tokenizer = resolve(config.tokenizer_loader)(config.tokenizer_arg)
            engine = self.engines.get(engine_spec)
            if engine is None:
                engine = load_engine(engine_spec, self.tokenizer)
                if "torch" in sys.modules:
                    sys.modules["torch"].set_num_threads(1)
                if config.warm_up:
                    warm_up(engine, "json_schema", {"type": "integer"})
                self.engines[engine_spec] = engine
                _freeze_heap()
            if function_spec not in self.functions:
                self.functions[function_spec] = resolve(function_spec)
        except EngineUnavailable as exc:
            return "unavailable", str(exc)
        except BaseException as exc:
            return "done", {"outcome": "crash", "error": f"engine set-up failed: {type(exc).__name__}: {exc}"[:500]}
        return "begin", {"version": getattr(engine, "version", "unknown"), "options": getattr(engine, "options", {}),
                         "name": getattr(engine, "name", engine_spec)}

    def run(self, engine_spec: str, function_spec: str, payload: Any, progress: Callable[[dict], None]) -> dict:
        """One task on a prepared engine; an exception is the task's ``crash`` record, never the worker's end."""
        try:
            record = self.functions[function_spec](self.engines[engine_spec], self.tokenizer, payload, progress)
        except MemoryError:
            record = {"outcome": "crash", "error": "out of memory (MemoryError)"}
        except BaseException as exc:  # an engine bug is a result, not the end of the worker
            tb = traceback.format_exc(limit=-3)
            record = {"outcome": "crash", "error": f"{type(exc).__name__}: {exc}"[:500], "traceback": tb[-2000:]}
        gc.collect()
        return record


def _worker_main(conn, config: WorkerConfig) -> None:  # pragma: no cover - runs in a child process
    _single_thread_env()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent decides when to stop
    _cap_address_space(config.mem_limit_bytes)
    state = WorkerState(config)
    while True:
        try:
            message = conn.recv()
        except (EOFError, OSError):
            return
        if message is None:
            return
        task_id, engine_spec, function_spec, payload = message
        kind, data = state.prepare(engine_spec, function_spec)
        conn.send((kind, task_id, data))
        if kind == "begin":
            record = state.run(engine_spec, function_spec, payload,
                               lambda data, task_id=task_id: conn.send(("progress", task_id, data)))
            conn.send(("done", task_id, record))


def with_progress(record: dict, progress: dict) -> dict:
    """A task's record, with the last progress it reported under a ``timeout`` or ``crash``
    (the TTFM of a schema that compiled before the walk went wrong)."""
    if record.get("outcome") in ("timeout", "crash"):
        return {**progress, **record}
    return record


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
        on_result(task, with_progress(record, slot.progress), slot.info)

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


#: ``run_tasks``'s signature: the local pool, or ``ray_pool.run_tasks`` bound to a cluster
Executor = Callable[..., None]


@dataclass(frozen=True)
class Pool:
    """Where a run's tasks go: ``run`` (an ``Executor``) on ``workers`` worker processes."""

    run: Executor
    workers: int
    where: str = "local"

