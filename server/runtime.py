"""What a server process holds: the model, its vocabulary, the compile service, the scheduler.

``Runtime.load(config)`` loads a transformers model (a folder or hub id) with
``engine.generate.load_model``/``load_vocabulary``; ``Runtime(config, lm, vocab)`` wraps any
``engine.LanguageModel`` (tests use ``engine.ScriptedLM``). ``start()`` starts the scheduler's
worker thread; ``close()`` stops it (what is still running fails with 503) and the compile pool.

``submit(request)`` runs a planned request (``Generation``): token samplers (masked, ASAp, AWRS)
go through the scheduler's continuous batch; SMC, a sequence-level sampler that runs its own
loop, runs in a small thread pool and borrows the batch for its forward passes
(``ScheduledLM``), so its particles share steps with every other sequence.

A masked-diffusion model (``*ForMaskedLM``, LLaDA, Dream: ``engine.generate.load_model`` tells
them apart by their config) is served too: each sequence is one canvas of ``max_tokens``
positions decoded by ``engine.diffusion`` (DINGO for regular constraints, completability checks
otherwise) in the same thread pool, with the masked sampler only; ``/infill`` writes all holes of
a request in one canvas. Canvases are not batched across requests (each runs its own forward
passes), and a stream delivers the text when the canvas is done, in one chunk.
"""

from __future__ import annotations

import functools
import inspect
import logging
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from engine.closing import BudgetClosing, ClosingPlanner
from engine.generate import _is_diffusion_model, load_model, load_vocabulary, resolve_sampler
from engine.lm import HFCausalLM, LanguageModel
from grammars import CompiledGrammar, Compiler, TokenVocabulary, UnconstrainedMatcher
from samplers import MaskedSampler, SamplingParams
from server.chat import PromptEncoder
from server.config import ServerConfig
from server.constraints import CompileService
from server.protocol import ApiError
from server.scheduler import (
    Event,
    Overloaded,
    ScheduledLM,
    Scheduler,
    SequenceSpec,
    ShuttingDown,
    Ticket,
)
from server.stepper import RowOptions, Stepper

__all__ = ["Runtime", "Generation", "SAMPLERS"]

log = logging.getLogger("server.runtime")

SAMPLERS = ("masked", "asap", "awrs", "smc")

#: model calls per canvas of a masked-diffusion model (fewer than positions: several per step)
DIFFUSION_STEPS = 64


@dataclass(frozen=True)
class Generation:
    """A planned request: prompts (token ids), ``n`` sequences per prompt, the compiled
    constraint (None: unconstrained), the sampler and its parameters, the loop options."""

    prompts: list[list[int]]
    n: int
    grammar: CompiledGrammar | None
    sampler: str
    params: SamplingParams
    seed: int | None
    max_tokens: int
    stop: tuple[str, ...] = ()
    ignore_eos: bool = False

    @property
    def total(self) -> int:
        return len(self.prompts) * self.n


class Runtime:
    """The loaded model and the machinery around it; see the module docstring."""

    def __init__(self, config: ServerConfig, lm: LanguageModel, vocab: TokenVocabulary, *,
                 context_length: int | None = None):
        self.config = config
        self.lm = lm
        self.vocab = vocab
        self.context_length = context_length
        self.model_name = config.model_name or Path(str(config.model).rstrip("/")).name or str(config.model)
        self.compiler = Compiler(vocab, limits=config.compile_limits, cache_size=config.compile_cache_size)
        self.compiles = CompileService(self.compiler, cache_size=config.compile_cache_size,
                                       timeout_s=config.compile_timeout_s, workers=config.compile_workers)
        self.encoder = PromptEncoder(vocab)
        self.stepper = Stepper(lm, vocab)
        self.scheduler = Scheduler(self.stepper, max_batch=config.max_batch, max_queued=config.max_queued,
                                   join_wait_ms=config.join_wait_ms)
        self._samplers: dict[tuple, Any] = {}
        self._samplers_lock = threading.Lock()
        self._sequence_pool = ThreadPoolExecutor(max_workers=4, thread_name_prefix="corral-smc")
        #: a masked-diffusion model: requests decode canvases (``engine.diffusion``), not token steps
        self.diffusion = _is_diffusion_model(lm)
        self._pool_waiting = 0  # sequences submitted to the pool and not finished (bounded by max_queued)
        self._pool_lock = threading.Lock()
        self.closing = False

    @classmethod
    def load(cls, config: ServerConfig) -> Runtime:
        """Load ``config.model`` (transformers folder or hub id) and build the runtime."""
        if config.threads is not None:
            torch.set_num_threads(config.threads)
        lm, tok_source = load_model(config.model, config.tokenizer, device=config.device, dtype=config.dtype)
        # (a masked-diffusion checkpoint gives an ``HFMaskedDiffusionLM``: see the module docstring)
        if config.last_logits_only and isinstance(lm, HFCausalLM):
            _keep_last_logits_only(lm.model)
        vocab = load_vocabulary(tok_source, lm)
        runtime = cls(config, lm, vocab, context_length=_context_length(lm))
        runtime.warmup()
        return runtime

    def warmup(self) -> None:
        """Compile a small schema once, so the vocabulary-level tables (token trie, string-body
        walks) are built before the first request rather than inside its compile budget."""
        from server.constraints import schema_spec

        try:
            self.compiles.compile_sync(schema_spec({"type": "object"}, "warmup"))
        except ApiError as exc:  # pragma: no cover - a warm-up failure only costs the first request time
            log.warning("warm-up compile failed: %s", exc.message)

    def start(self) -> None:
        self.scheduler.start()

    def fim_tokens(self) -> Any:
        """The tokenizer's fill-in-the-middle markers for ``engine.infill`` (None: a causal model)."""
        if not hasattr(self, "_fim"):
            self._fim = None
            try:
                import importlib

                finder = getattr(importlib.import_module("engine.infill"), "find_fim_tokens", None)
                if finder is not None and self.vocab.hf_tokenizer is not None:
                    self._fim = finder(self.vocab.hf_tokenizer)
            except Exception:  # noqa: BLE001 - no FIM markers: holes see the text before them
                self._fim = None
        return self._fim

    def close(self) -> None:
        self.closing = True
        self.scheduler.stop()
        self.compiles.close()
        self._sequence_pool.shutdown(wait=False, cancel_futures=True)

    # --- samplers ---------------------------------------------------------------------------------

    def sampler(self, name: str, params: SamplingParams) -> Any:
        """The sampler instance for ``name``: one per (name, parameters), kept across requests so
        ASAp keeps learning per (prompt, grammar); SMC gets a fresh one per request."""
        if name == "smc":
            return resolve_sampler("smc", params)
        key = (name, params)
        with self._samplers_lock:
            found = self._samplers.get(key)
            if found is None:
                if len(self._samplers) >= 64:  # bounded: distinct parameter sets are few in practice
                    self._samplers.clear()
                found = self._samplers[key] = resolve_sampler(name, params)
            return found

    # --- running a request ----------------------------------------------------------------------

    def row_options(self, sampler: Any, gen: Generation) -> RowOptions:
        """``engine.generate``'s loop settings for this sampler (masked: premasked logits, direct
        draws and forced-token fast-forward; ASAp and AWRS: raw logits, every token drawn)."""
        masked = isinstance(sampler, MaskedSampler) or bool(getattr(sampler, "premask", False))
        return RowOptions(
            max_tokens=gen.max_tokens,
            stop=gen.stop,
            fast_forward=masked and not getattr(sampler, "draws_every_token", False),
            premask=masked,
            budget_closing=True,
            ignore_eos=gen.ignore_eos,
            direct_params=sampler.params if type(sampler) is MaskedSampler else None,
        )

    def submit(self, gen: Generation, sink) -> Ticket:
        """Start ``gen``; events go to ``sink`` (called from a worker thread). Raises ``ApiError``
        429 when the queue is full and 503 when the server is shutting down."""
        if self.closing:
            raise ApiError(503, "the server is shutting down", code="shutting_down")
        if self.diffusion:
            return self._submit_diffusion(gen, sink)
        sampler = self.sampler(gen.sampler, gen.params)
        budget = gen.max_tokens if gen.grammar is not None else None
        specs = []
        for p, prompt in enumerate(gen.prompts):
            key = (tuple(prompt), None if gen.grammar is None else gen.grammar.key)
            if budget is not None:
                key = key + (("budget", budget),)
            for j in range(gen.n):
                seed = None if gen.seed is None else gen.seed + p * gen.n + j
                specs.append(SequenceSpec(prompt, gen.grammar, sampler, key, seed,
                                          self.row_options(sampler, gen) if gen.sampler != "smc" else
                                          RowOptions(max_tokens=gen.max_tokens)))
        ticket = Ticket(specs, sink)
        if gen.sampler == "smc":
            self._sequence_pool.submit(self._run_smc, ticket, sampler)
            return ticket
        try:
            return self.scheduler.submit(ticket)
        except Overloaded as exc:
            raise ApiError(429, f"the server is busy: {exc}; retry later", code="server_overloaded") from None
        except ShuttingDown:
            raise ApiError(503, "the server is shutting down", code="shutting_down") from None

    def _submit_diffusion(self, gen: Generation, sink) -> Ticket:
        if gen.sampler != "masked":
            raise ApiError(400, f"sampler {gen.sampler!r} needs an autoregressive model; {self.model_name} is a "
                           "masked-diffusion model, which decodes with the masked sampler", param="sampler",
                           code="invalid_value")
        self._reserve(gen.total)
        specs = [SequenceSpec(prompt, gen.grammar, None, None,
                              None if gen.seed is None else gen.seed + p * gen.n + j,
                              RowOptions(max_tokens=gen.max_tokens, stop=gen.stop))
                 for p, prompt in enumerate(gen.prompts) for j in range(gen.n)]
        ticket = Ticket(specs, sink)
        self._sequence_pool.submit(self._run_diffusion, ticket, gen.params)
        return ticket

    def _reserve(self, count: int) -> None:
        """Count ``count`` sequences into the pool's queue, or refuse with 429 past ``max_queued``."""
        with self._pool_lock:
            if self._pool_waiting + count > self.config.max_queued:
                raise ApiError(429, f"the server is busy: {self._pool_waiting} sequences are waiting; retry later",
                               code="server_overloaded")
            self._pool_waiting += count

    def _run_diffusion(self, ticket: Ticket, params: SamplingParams) -> None:
        """Each sequence of ``ticket`` as one canvas (see the module docstring)."""
        try:
            self._run_sequences(ticket, lambda spec: self.diffusion_sequence(spec, params.temperature))
        finally:
            with self._pool_lock:
                self._pool_waiting -= len(ticket.specs)

    def diffusion_sequence(self, spec: SequenceSpec, temperature: float) -> dict[str, Any]:
        """One canvas of ``spec.options.max_tokens`` positions after ``spec.prompt``: the result dict
        the sinks take (``finish``: ``DiffusionResult.finish_reason``)."""
        from engine.diffusion import diffusion_decode

        generator = None if spec.seed is None else torch.Generator().manual_seed(int(spec.seed))
        length = spec.options.max_tokens
        out = diffusion_decode(self.lm, self.vocab, list(spec.prompt), spec.grammar,
                               canvas_length=length, steps=min(length, DIFFUSION_STEPS), temperature=temperature,
                               generator=generator)
        text = out.text.decode("utf-8", errors="replace")
        finish = out.finish_reason
        cut = min((i for i in (text.find(s) for s in spec.options.stop) if i >= 0), default=-1)
        if cut >= 0:  # a stop string ends the text as in autoregressive decoding (it is not included)
            text, finish = text[:cut], "stop_string"
        return {"finish": finish, "error": None, "text": text, "token_ids": list(out.token_ids),
                "completion_tokens": len(out.token_ids)}

    def _run_smc(self, ticket: Ticket, sampler: Any) -> None:
        """Each sequence of ``ticket`` with SMC, its forward passes batched by the scheduler."""
        lm = ScheduledLM(self.scheduler, lambda: ticket.cancelled)
        self._run_sequences(ticket, lambda spec: _smc_sequence(sampler, lm, self.vocab, spec))

    def _run_sequences(self, ticket: Ticket, run_one: Any) -> None:
        """The sequences of ``ticket`` one after another in this pool thread, each ``run_one(spec)``'s
        result dict (or its exception, as that choice's error) sent to the ticket's sink."""
        for index, spec in enumerate(ticket.specs):
            if ticket.cancelled or self.closing:
                return
            events: list[Event]
            try:
                result = run_one(spec)
                events = [("delta", index, result["text"])] if result["text"] else []
                events.append(("done", index, result))
            except Exception as exc:  # noqa: BLE001 - reported to the client as this choice's error
                if ticket.cancelled:
                    return
                events = [("done", index, {"finish": "error", "error": exc, "text": "", "token_ids": [],
                                           "completion_tokens": 0})]
            try:
                ticket.sink(events)
            except Exception:  # noqa: BLE001 - a sink whose loop is gone
                return

def _smc_sequence(sampler: Any, lm: ScheduledLM, vocab: TokenVocabulary, spec: SequenceSpec) -> dict[str, Any]:
    """One sequence from a sequence-level sampler (``engine.generate`` does the same for one prompt)."""
    matcher = spec.grammar.matcher() if spec.grammar is not None else UnconstrainedMatcher(vocab)
    if spec.grammar is not None:  # budget-aware closing, with a planner of this thread's own
        matcher = BudgetClosing(ClosingPlanner(vocab), matcher.num_consumed + spec.options.max_tokens).narrow(matcher)
    generator = None if spec.seed is None else torch.Generator(device=lm.device).manual_seed(int(spec.seed))
    prompt = list(spec.prompt)
    outcome = sampler.run(lambda prefixes: lm.next_logits([prompt + list(p) for p in prefixes]), matcher,
                          max_tokens=spec.options.max_tokens, generator=generator)
    finish = "length"
    tokens: list[int] = []
    if any(bool(c) for c in outcome.completed):
        try:
            tokens, finish = list(outcome.sample(generator)), "stop"
        except ValueError:  # every complete particle has zero weight
            tokens = []
    if finish == "length":
        best = max(range(len(outcome.tokens)), key=lambda i: float(outcome.log_weights[i]))
        tokens = list(outcome.tokens[best])
    eos = vocab.eos_token_ids
    had_eos = bool(tokens) and tokens[-1] in eos
    while tokens and tokens[-1] in eos:
        tokens.pop()
    return {"finish": finish, "error": None, "text": vocab.decode(tokens).decode("utf-8", errors="replace"),
            "token_ids": tokens, "completion_tokens": len(tokens) + int(had_eos)}


def _keep_last_logits_only(model: Any) -> None:
    """Make ``model(...)`` compute the output layer for the last position only, when the model
    takes ``logits_to_keep`` (``HFCausalLM`` reads ``logits[:, -1]`` and nothing else)."""
    try:
        takes = "logits_to_keep" in inspect.signature(model.forward).parameters
    except (TypeError, ValueError):
        takes = False
    if takes:
        model.forward = functools.partial(model.forward, logits_to_keep=1)


def _context_length(lm: Any) -> int | None:
    config = getattr(getattr(lm, "model", None), "config", None)
    if config is None:
        return None
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    for name in ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length"):
        value = getattr(text, name, None)
        if isinstance(value, int) and value > 0:
            return value
    return None
