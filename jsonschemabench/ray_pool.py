"""The benchmarks' tasks on a Ray cluster: ``python -m jsonschemabench maskbench|testsuite|e2e --ray [ADDRESS]``.

``run_tasks`` here has the interface of the local pool's (``workers.run_tasks``), so a runner
picks one function (``maskbench.worker_pool``) and writes the same rows and files either way:

- **one actor per worker** (``num_cpus=1``; by default one per CPU of the cluster), holding a
  ``workers.WorkerState``: the tokenizer and each engine are built once per actor, warmed up
  and their heap frozen, and every task runs the same task body as a local worker
  (``WorkerState.prepare`` then ``WorkerState.run``), single-threaded (``THREAD_ENV`` in the
  actor's ``runtime_env``);
- **the same limits**: the clock of ``timeout_s`` starts when the engine is ready, loading it has
  ``load_timeout_s``; past either the actor is killed (``ray.kill``: Ray refuses
  ``ray.cancel(force=True)`` for actor tasks) and replaced, and the task gets the local pool's
  ``timeout`` (or set-up ``crash``) record. An actor that dies (segfault, abort, the kernel's or
  Ray's out-of-memory killer) gives its task a ``crash`` row and is replaced; the run goes on;
- **the same progress**: what a task reports (``progress(...)``, e.g. its TTFM) goes to a small
  board actor before the task continues, so a timeout or crash row keeps it, as locally;
- **results stream back** as they finish (``ray.wait``), in completion order.

Memory: a Ray worker maps several GiB of address space before any task runs (7.7 GiB measured
with Ray 2.60), so the cap (``RLIMIT_AS``) is set *on top of* the actor's address space at start:
``WorkerConfig.mem_limit_bytes`` (``--mem-limit``) or, by default, min(40 GiB, node RAM / node
CPUs), computed on each node. A Python allocation past it is a ``MemoryError`` (a ``crash`` row,
the actor lives on); a native one may abort the actor (a ``crash`` row) or leave it stuck in Ray's
abort handler (a ``timeout`` row). Paths in payloads (MaskBench files, the tokenizer) must be
valid on every node: a local cluster's workers share the driver's working directory; on a
multi-node cluster give absolute paths on a shared file system, and install corral (with the
engines to compare) on every node.
"""

from __future__ import annotations

import functools
import os
import time
from collections import deque
from dataclasses import dataclass
from typing import Any, Callable, Iterable

from .workers import (
    THREAD_ENV,
    Task,
    WorkerConfig,
    WorkerState,
    _cap_address_space,
    _single_thread_env,
    default_mem_limit_gib,
    with_progress,
)

__all__ = ["RAY_INSTALL", "require_ray", "connect", "run_tasks", "executor"]

RAY_INSTALL = 'pip install "corral[ray]"'
#: seconds the driver waits for the board to hand over a dead or killed task's progress
_BOARD_TIMEOUT_S = 30.0


def require_ray() -> Any:
    """The ``ray`` module, or a ``ModuleNotFoundError`` that says how to install it."""
    try:
        import ray
    except ImportError as exc:
        raise ModuleNotFoundError(f"--ray needs Ray, which is not installed ({RAY_INSTALL})", name="ray") from exc
    return ray


def connect(address: str | None = None) -> int:
    """Join the cluster at ``address`` (``None``: ``ray.init()``'s own choice, RAY_ADDRESS's cluster
    or a new local one) unless this process already has; returns the cluster's CPU count."""
    ray = require_ray()
    if not ray.is_initialized():
        ray.init(address=address)
    return max(1, int(ray.cluster_resources().get("CPU", 1)))


def executor(*, node_mem_limit: bool = False) -> Callable[..., None]:
    """``run_tasks`` with the cap chosen on each node when the config has none (``node_mem_limit``)."""
    return functools.partial(run_tasks, node_mem_limit=node_mem_limit)


# --- inside the cluster ---------------------------------------------------------------------------


def _address_space_bytes() -> int:
    with open("/proc/self/statm", encoding="ascii") as statm:
        return int(statm.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")


class _Worker:
    """A Ray actor (made remote by ``_actor_classes``): one worker process of the pool."""

    def __init__(self, config: WorkerConfig, node_mem_limit: bool):
        import ray

        _single_thread_env()  # also in the actor's runtime_env, for libraries that read it at import
        limit = config.mem_limit_bytes
        if limit is None and node_mem_limit:
            node = ray.get_runtime_context().get_node_id()
            cpus = next((n["Resources"].get("CPU", 1) for n in ray.nodes() if n["NodeID"] == node), os.cpu_count())
            limit = int(default_mem_limit_gib(max(1, int(cpus or 1))) * 2**30)
        self.limit = limit
        if limit:
            _cap_address_space(_address_space_bytes() + limit)
        self.state = WorkerState(config)
        self.prepared: int | None = None

    def ready(self) -> int:
        return os.getpid()

    def prepare(self, task_id: int, engine: str, function: str) -> tuple[str, Any]:
        kind, data = self.state.prepare(engine, function)
        self.prepared = task_id if kind == "begin" else None
        return kind, data

    def run(self, task_id: int, engine: str, function: str, payload: Any, board: Any) -> dict | None:
        """The task, if ``prepare`` readied it (it is submitted right behind ``prepare``)."""
        import ray

        if self.prepared != task_id:
            return None
        self.prepared = None
        return self.state.run(engine, function, payload, lambda data: ray.get(board.put.remote(task_id, data)))


class _Board:
    """The progress tasks report, kept outside their actors so that it outlives a killed one."""

    def __init__(self) -> None:
        self.progress: dict[int, dict] = {}

    def put(self, task_id: int, data: dict) -> None:
        self.progress.setdefault(task_id, {}).update(data)

    def take(self, task_id: int) -> dict:
        return self.progress.pop(task_id, {})


@functools.lru_cache(maxsize=1)
def _actor_classes() -> tuple[Any, Any]:
    ray = require_ray()
    worker = ray.remote(num_cpus=1, max_restarts=0, max_task_retries=0)(_Worker)
    return worker.options(runtime_env={"env_vars": dict(THREAD_ENV)}), ray.remote(num_cpus=0)(_Board)


# --- the driver -----------------------------------------------------------------------------------


def _death_message(exc: BaseException) -> str:
    """What Ray says about a dead actor, without its troubleshooting advice."""
    text = str(exc)
    start = text.find("The actor is dead because")
    reason = text[start:] if start >= 0 else text.strip().splitlines()[0] if text.strip() else type(exc).__name__
    reason = reason.split(" Some common causes")[0].replace("\n", " ")
    hint = " (out of memory?)" if "memory" in reason.lower() else ""
    return f"worker died ({type(exc).__name__}): {reason}"[:400] + hint


@dataclass
class _Slot:
    actor: Any
    started: Any  # the actor's ``ready()``: no task is sent before it answers
    up: bool = False
    task: Task | None = None
    task_id: int = -1
    prepare_ref: Any = None
    run_ref: Any = None
    sent_at: float = 0.0
    begun_at: float | None = None
    info: dict | None = None

    @property
    def waiting_on(self) -> Any:
        if not self.up:
            return self.started
        return self.run_ref if self.begun_at is not None else self.prepare_ref


def run_tasks(
    tasks: Iterable[Task],
    config: WorkerConfig,
    on_result: Callable[[Task, dict, dict | None], None],
    *,
    workers: int | None = None,
    timeout_s: float = 900.0,
    load_timeout_s: float = 900.0,
    on_unavailable: Callable[[str, str], None] | None = None,
    address: str | None = None,
    node_mem_limit: bool = False,
) -> None:
    """``workers.run_tasks`` on Ray actors: the same calls of ``on_result`` and ``on_unavailable``.

    ``workers``: actors (default: one per CPU of the cluster). ``address``: the cluster to join if
    this process has none yet (``connect``). ``node_mem_limit``: when ``config`` has no cap, cap
    each actor at min(40 GiB, its node's RAM / CPUs) above its start-up address space.
    Raises ``RuntimeError`` when no actor can start (corral missing on the cluster's nodes).
    """
    queue = deque(tasks)
    if not queue:
        return
    ray = require_ray()
    from ray.exceptions import GetTimeoutError, RayError

    cpus = connect(address)
    worker_cls, board_cls = _actor_classes()
    board = board_cls.remote()

    def new_slot() -> _Slot:
        actor = worker_cls.remote(config, node_mem_limit)
        return _Slot(actor, actor.ready.remote())

    slots = [new_slot() for _ in range(max(1, min(workers or cpus, len(queue))))]
    unavailable: set[str] = set()
    failed_starts: list[str] = []
    next_id = 0

    def finish(slot: _Slot, record: dict) -> None:
        task, task_id = slot.task, slot.task_id
        slot.task = None
        progress: dict = {}
        if record.get("outcome") in ("timeout", "crash"):
            try:
                progress = ray.get(board.take.remote(task_id), timeout=_BOARD_TIMEOUT_S)
            except (RayError, GetTimeoutError):
                pass
        else:
            board.take.remote(task_id)  # dropped unread
        on_result(task, with_progress(record, progress), slot.info)

    def replace(index: int) -> None:
        ray.kill(slots[index].actor, no_restart=True)
        slots[index] = new_slot()

    try:
        while True:
            for slot in slots:
                if slot.up and slot.task is None and queue:
                    while queue and queue[0].engine in unavailable:
                        queue.popleft()
                    if not queue:
                        break
                    task = slot.task = queue.popleft()
                    slot.task_id, next_id = next_id, next_id + 1
                    slot.sent_at, slot.begun_at, slot.info = time.monotonic(), None, None
                    slot.prepare_ref = slot.actor.prepare.remote(slot.task_id, task.engine, task.function)
                    slot.run_ref = slot.actor.run.remote(slot.task_id, task.engine, task.function, task.payload, board)
            busy = [s for s in slots if s.task is not None]
            if not busy and not queue:
                break
            if not slots:
                raise RuntimeError("no Ray worker could start: " + "; ".join(failed_starts[-3:]))
            watched = busy + [s for s in slots if not s.up]
            now = time.monotonic()
            deadlines = [(s.begun_at + timeout_s) if s.begun_at is not None else (s.sent_at + load_timeout_s)
                         for s in busy]
            refs = [s.waiting_on for s in watched]
            ready, _ = ray.wait(refs, num_returns=1, timeout=max(0.0, min(deadlines) - now) if deadlines else None)
            if ready:
                ready, _ = ray.wait(refs, num_returns=len(refs), timeout=0)
            done = set(ready)
            for slot in watched:
                index = slots.index(slot)
                ref = slot.waiting_on
                if ref in done and not slot.up:
                    try:
                        ray.get(ref)
                        slot.up = True
                    except RayError as exc:
                        failed_starts.append(_death_message(exc))
                        ray.kill(slot.actor, no_restart=True)
                        slots.pop(index)
                    continue
                if ref in done and slot.begun_at is None:
                    try:
                        kind, data = ray.get(ref)
                    except RayError as exc:
                        finish(slot, {"outcome": "crash", "error": _death_message(exc)})
                        replace(index)
                        continue
                    if kind == "begin":
                        slot.begun_at = time.monotonic()
                        slot.info = data
                    elif kind == "unavailable":
                        engine = slot.task.engine
                        slot.task = None
                        if engine not in unavailable:
                            unavailable.add(engine)
                            if on_unavailable is not None:
                                on_unavailable(engine, data)
                    else:  # "done": the engine's set-up failed
                        finish(slot, data)
                    continue
                if ref in done:
                    try:
                        record = ray.get(ref)
                    except RayError as exc:
                        finish(slot, {"outcome": "crash", "error": _death_message(exc)})
                        replace(index)
                        continue
                    finish(slot, record)
                    continue
                now = time.monotonic()
                if slot.begun_at is not None and now > slot.begun_at + timeout_s:
                    ray.kill(slot.actor, no_restart=True)
                    finish(slot, {"outcome": "timeout", "error": f"no result within {timeout_s:g} s"})
                    replace(index)
                elif slot.begun_at is None and slot.up and slot.task is not None \
                        and now > slot.sent_at + load_timeout_s:
                    ray.kill(slot.actor, no_restart=True)
                    finish(slot, {"outcome": "crash", "error": f"engine set-up took over {load_timeout_s:g} s"})
                    replace(index)
    finally:
        for slot in slots:
            ray.kill(slot.actor, no_restart=True)
        ray.kill(board, no_restart=True)
