"""Continuous batching: one worker thread owns the model and steps every active sequence together.

Requests become ``Ticket``s of one or more ``SequenceSpec`` (``n`` choices, or several prompts).
The worker loop, each step:

1. drops sequences whose client left (``Ticket.cancel``: a disconnected stream frees its slot at
   the next step boundary);
2. admits waiting sequences into free slots (at most ``max_batch`` run at once), FIFO. A
   sequence joining a running batch changes the prefixes the model's KV cache holds, and
   ``engine.HFCausalLM`` then re-feeds the batch from the first column where rows diverge, so
   joiners are gathered for up to ``join_wait_ms`` and enter together; into an idle worker they
   enter at once;
3. runs ``Stepper.step``: masks, one batched ``LanguageModel.next_logits`` for all running rows
   (plus the prefixes sequence-level samplers such as SMC asked to score, see ``logits``),
   per-row draw and advance;
4. hands each ticket its new text (UTF-8 decoded incrementally, never past what a stop string
   could still remove) and the results of finished sequences, through the ticket's ``sink``
   (called on the worker thread: the server forwards to its event loop).

Sequences leave as soon as they finish; the next step runs without them.

The worker never dies on a request's error: a row that fails is finished with ``error`` (the
server answers 422/500 for it), a failed model call fails that step's rows and resets the model's
cache, and anything else is logged and fails the active rows. ``stop()`` fails what is left with
a 503 and joins the thread (graceful shutdown first lets the server finish in-flight requests).
"""

from __future__ import annotations

import codecs
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Hashable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

import torch

from grammars import CompiledGrammar, UnconstrainedMatcher
from server.stepper import Row, RowOptions, Stepper

__all__ = ["SequenceSpec", "Ticket", "Scheduler", "Overloaded", "ShuttingDown", "ScheduledLM", "Event"]

log = logging.getLogger("server.scheduler")


class Overloaded(Exception):
    """More sequences are waiting than ``max_queued`` allows."""


class ShuttingDown(Exception):
    """The scheduler stopped before the sequence finished."""


class Cancelled(Exception):
    """The ticket was cancelled (its client left)."""


@dataclass(frozen=True)
class SequenceSpec:
    """What one sequence needs: prompt ids, compiled grammar (None: unconstrained), a token
    sampler and its key (ASAp learns per key), a seed, and the loop options."""

    prompt: list[int]
    grammar: CompiledGrammar | None
    sampler: Any
    sampler_key: Hashable
    seed: int | None
    options: RowOptions


#: ``("delta", index, text)`` or ``("done", index, result)``; result keys: ``finish``
#: (stop, length, stop_string, error), ``text``, ``token_ids``, ``completion_tokens``, ``error``
Event = tuple[str, int, Any]


@dataclass
class Ticket:
    """A request's sequences and where their events go. ``sink(events)`` is called on the
    worker thread with a list of ``Event``s after each step that produced some."""

    specs: Sequence[SequenceSpec]
    sink: Callable[[list[Event]], None]
    cancelled: bool = False
    created: float = field(default_factory=time.monotonic)
    _scheduler: Any = field(default=None, repr=False)

    def cancel(self) -> None:
        """Stop this ticket's sequences at the next step boundary (idempotent)."""
        if not self.cancelled:
            self.cancelled = True
            if self._scheduler is not None:
                self._scheduler._wake()


@dataclass
class _Slot:
    ticket: Ticket
    index: int
    row: Row
    decoder: Any = field(default_factory=lambda: codecs.getincrementaldecoder("utf-8")(errors="replace"))
    sent: int = 0


@dataclass
class _Job:
    prefixes: list[list[int]]
    future: Future


class Scheduler:
    """The worker thread and its queues; see the module docstring."""

    def __init__(self, stepper: Stepper, *, max_batch: int = 32, max_queued: int = 1024, join_wait_ms: float = 20.0):
        self.stepper = stepper
        self.vocab = stepper.vocab
        self.max_batch = int(max_batch)
        self.max_queued = int(max_queued)
        self.join_wait_s = float(join_wait_ms) / 1000.0
        self._cond = threading.Condition()
        self._pending: deque[tuple[Ticket, int, float]] = deque()
        self._active: list[_Slot] = []
        self._jobs: list[_Job] = []
        self._stopping = False
        self._thread: threading.Thread | None = None
        device = getattr(stepper.lm, "device", None)
        self._device = device if isinstance(device, torch.device) else torch.device("cpu")
        self.stats = {"steps": 0, "forward_calls": 0, "sequences_finished": 0, "sequences_cancelled": 0,
                      "tokens_generated": 0, "max_batch_seen": 0, "errors": 0, "slowest_step_s": 0.0}

    # --- life cycle -----------------------------------------------------------------------------

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="corral-scheduler", daemon=True)
            self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        """Fail everything still queued or running with ``ShuttingDown`` and join the worker."""
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join(timeout)

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def snapshot(self) -> dict[str, Any]:
        """Counters for ``/health``: running and queued sequences, steps, the largest batch seen."""
        with self._cond:
            out = dict(self.stats)
            out.update(active=len(self._active), queued=len(self._pending), max_batch=self.max_batch,
                       worker_alive=self.alive)
        return out

    # --- the API the server uses ---------------------------------------------------------------

    def submit(self, ticket: Ticket) -> Ticket:
        """Queue a ticket's sequences; raises ``Overloaded`` or ``ShuttingDown``."""
        with self._cond:
            if self._stopping:
                raise ShuttingDown("the server is shutting down")
            if len(self._pending) + len(ticket.specs) > self.max_queued:
                raise Overloaded(f"{len(self._pending)} sequences are already waiting (limit {self.max_queued})")
            ticket._scheduler = self
            now = time.monotonic()
            self._pending.extend((ticket, i, now) for i in range(len(ticket.specs)))
            self._cond.notify_all()
        return ticket

    def logits(self, prefixes: Sequence[Sequence[int]]) -> Future:
        """Score ``prefixes`` in the next batched forward pass (for samplers that run their own
        loop in another thread); the future's result is ``[len(prefixes), width]`` logits."""
        fut: Future = Future()
        with self._cond:
            if self._stopping:
                fut.set_exception(ShuttingDown("the server is shutting down"))
                return fut
            self._jobs.append(_Job([list(p) for p in prefixes], fut))
            self._cond.notify_all()
        return fut

    def _wake(self) -> None:
        with self._cond:
            self._cond.notify_all()

    # --- the worker -----------------------------------------------------------------------------

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._stopping and not self._active and not self._jobs and not self._has_live_pending():
                    self._cond.wait()
                if self._stopping:
                    break
                joined = self._admit_locked()
                jobs, self._jobs = self._jobs, []
                if not self._active and not jobs and self._pending:
                    # only waiting for the join window: sleep until it ends or something arrives
                    self._cond.wait(self.join_wait_s)
                    continue
            try:
                self._one_step(joined, jobs)
            except Exception as exc:  # noqa: BLE001 - the worker must survive anything
                log.exception("scheduler step failed")
                self.stats["errors"] += 1
                for job in jobs:
                    if not job.future.done():
                        job.future.set_exception(exc)
                for slot in self._active:
                    if not slot.row.finished:
                        self.stepper.fail(slot.row, exc)
                self._emit()
        self._shutdown()

    def _has_live_pending(self) -> bool:
        while self._pending and self._pending[0][0].cancelled:
            self._pending.popleft()
            self.stats["sequences_cancelled"] += 1
        return bool(self._pending)

    def _admit_locked(self) -> list[_Slot]:
        """Move waiting sequences into free slots (caller holds the lock)."""
        if not self._pending:
            return []
        if self._active:
            oldest = self._pending[0][2]
            if time.monotonic() - oldest < self.join_wait_s and len(self._pending) < self.max_batch - len(self._active):
                return []
        joined = []
        while self._pending and len(self._active) < self.max_batch:
            ticket, index, _ = self._pending.popleft()
            if ticket.cancelled:
                self.stats["sequences_cancelled"] += 1
                continue
            slot = _Slot(ticket, index, self._new_row(ticket.specs[index]))
            self._active.append(slot)
            joined.append(slot)
        return joined

    def _new_row(self, spec: SequenceSpec) -> Row:
        matcher = spec.grammar.matcher() if spec.grammar is not None else UnconstrainedMatcher(self.vocab)
        generator = None
        if spec.seed is not None:
            generator = torch.Generator(device=self._device).manual_seed(int(spec.seed))
        row = Row(list(spec.prompt), matcher, spec.sampler.start(spec.sampler_key), generator, spec.options)
        row.closing = self.stepper.closing_for(matcher, spec.options)
        return row

    def _one_step(self, joined: list[_Slot], jobs: list[_Job]) -> None:
        for slot in list(self._active):
            if slot.ticket.cancelled:
                self.stepper.cancel(slot.row)
                self.stats["sequences_cancelled"] += 1
        with self._cond:
            self._active = [s for s in self._active if not s.ticket.cancelled]
        for slot in joined:
            if not slot.ticket.cancelled:
                self.stepper.begin(slot.row)
        rows = [s.row for s in self._active]
        running = sum(1 for r in rows if not r.finished)
        extra = [p for job in jobs for p in job.prefixes]
        self.stats["max_batch_seen"] = max(self.stats["max_batch_seen"], running + len(extra))
        before = sum(len(r.tokens) for r in rows)
        began = time.perf_counter()
        try:
            out = self.stepper.step(rows, extra)
        except Exception as exc:  # noqa: BLE001 - the model call failed; rows are failed already
            log.exception("model call failed")
            self.stats["errors"] += 1
            for job in jobs:
                job.future.set_exception(exc)
        else:
            self.stats["forward_calls"] = self.stepper.forward_calls
            start = 0
            for job in jobs:
                job.future.set_result(out[start:start + len(job.prefixes)])
                start += len(job.prefixes)
        self.stats["steps"] += 1
        self.stats["tokens_generated"] += sum(len(r.tokens) for r in rows) - before
        took = time.perf_counter() - began
        self.stats["slowest_step_s"] = max(self.stats["slowest_step_s"], took)
        if took > 2.0:  # every running sequence waited this long: worth knowing why
            log.warning("a batch step took %.1f s for %d sequences (a constraint's exact closing mask or a "
                        "pathological grammar holds up the whole batch)", took, running)
        self._emit()

    def _emit(self) -> None:
        """Send each ticket its new text and finished results; drop finished slots."""
        batches: dict[int, tuple[Ticket, list[Event]]] = {}
        keep = []
        for slot in self._active:
            row = slot.row
            events = batches.setdefault(id(slot.ticket), (slot.ticket, []))[1]
            stable = row.stable_length()
            if stable > slot.sent:
                text = slot.decoder.decode(bytes(row.text[slot.sent:stable]), final=row.finished)
                slot.sent = stable
                if text:
                    events.append(("delta", slot.index, text))
            if row.finished:
                tail = slot.decoder.decode(b"", final=True)
                if tail:
                    events.append(("delta", slot.index, tail))
                events.append(("done", slot.index, _result(row)))
                self.stats["sequences_finished"] += 1
                if row.finish == "error":
                    self.stats["errors"] += 1
            else:
                keep.append(slot)
        with self._cond:
            self._active = keep
        for ticket, events in batches.values():
            if events and not ticket.cancelled:
                _deliver(ticket, events)

    def _shutdown(self) -> None:
        exc = ShuttingDown("the server is shutting down")
        with self._cond:
            pending, self._pending = list(self._pending), deque()
            jobs, self._jobs = self._jobs, []
        for job in jobs:
            if not job.future.done():
                job.future.set_exception(exc)
        for slot in self._active:
            if not slot.row.finished:
                self.stepper.cancel(slot.row)
                slot.row.error = exc
                slot.row.finish = "error"
        self._emit()
        for ticket, index, _ in pending:
            _deliver(ticket, [("done", index, {"finish": "error", "error": exc, "text": "", "token_ids": [],
                                                "completion_tokens": 0})])


def _result(row: Row) -> dict[str, Any]:
    return {
        "finish": row.finish,
        "error": row.error,
        "text": bytes(row.text).decode("utf-8", errors="replace"),
        "token_ids": list(row.tokens),
        "completion_tokens": row.completion_tokens,
        "forced_tokens": row.forced,
    }


def _deliver(ticket: Ticket, events: list[Event]) -> None:
    try:
        ticket.sink(events)
    except Exception:  # noqa: BLE001 - a sink whose loop is gone must not stop the worker
        log.debug("dropping events for a ticket whose sink failed", exc_info=True)


class ScheduledLM:
    """A ``LanguageModel`` whose forward passes join the scheduler's batches.

    For code that runs its own decoding loop in another thread (SMC, infilling): each
    ``next_logits`` call is scored in the worker's next step together with everything else
    running. ``cancelled()`` returning True makes the next call raise, ending that loop."""

    def __init__(self, scheduler: Scheduler, cancelled: Callable[[], bool] = lambda: False):
        self._scheduler = scheduler
        self._cancelled = cancelled
        self.device = scheduler._device

    @property
    def logits_width(self) -> int:
        return self._scheduler.stepper.lm.logits_width

    def next_logits(self, prefixes: Sequence[Sequence[int]]) -> torch.Tensor:
        if self._cancelled():
            raise Cancelled("the request was cancelled")
        return self._scheduler.logits(prefixes).result()
