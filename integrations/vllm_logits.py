"""corral inside vLLM (0.33): a logits-processor plugin that masks each constrained request's logits.

vLLM has no registry for structured-output backends; its extension point is the logits
processor. corral's ``pyproject.toml`` declares ``CorralLogitsProcessor`` in the entry-point group
``vllm.logits_processors``, so every vLLM engine in an environment where corral is installed builds
one per worker; a request opts in through ``SamplingParams.extra_args`` (OpenAI API:
``vllm_xargs``) with exactly one of these keys:

- ``corral_json_schema``: a JSON Schema, as a dict or bool or as its JSON text (``vllm_xargs``
  values are strings, numbers or lists, so over HTTP send the text);
- ``corral_regex``: a regular expression the whole output must match;
- ``corral_grammar``: a grammar, GBNF when it has ``name ::= ...`` rules, Lark otherwise;
- ``corral_choice``: a list of strings, the output being exactly one of them.

Keys are flat because ``vllm_xargs`` carries no nested objects. Any other ``corral_*`` key, two
constraints at once, or a constraint corral's front ends refuse (syntax error, unsupported JSON
Schema keyword, ...) fails the request at admission: ``validate_params`` raises ``ValueError``
with corral's message, which vLLM turns into an HTTP 400. Requests without a ``corral_*`` key are
never touched.

Per worker there is one ``TokenVocabulary``, built from the tokenizer vLLM itself loads for the
model (``model_config``: name or path, revision, mode) with the model's logits width (columns
beyond the tokenizer are padding and never allowed) and EOS ids = the tokenizer's plus
``generation_config.json``'s, and one ``grammars.Compiler`` shared by every request, so compiled
grammars and trie walks are reused across requests. Each constrained request gets a ``Matcher``
that follows the token ids vLLM reports; masks are corral's packed int32 bitmasks, written for the
whole batch and applied with ``samplers.apply_token_bitmask_inplace`` to the constrained rows only.
Once the grammar is complete only EOS is allowed; after an EOS (``ignore_eos`` keeps a request
going) only EOS again.

vLLM 0.33 has two model runners with two logits-processor interfaces, and it loads the same
entry-point group for both: the V1 runner constructs ``(vllm_config, device, is_pin_memory)`` and
calls ``update_state(batch_update)`` / ``apply(logits)``; Model Runner V2, the default on GPUs,
constructs ``(vllm_config, req_states)``, calls ``add_request(slot, params)`` /
``apply(logits, ctx)``, and refuses at start-up any plugin that is not a subclass of its own
``LogitsProcessor``. ``CorralLogitsProcessor`` therefore subclasses both and tells them apart by
its constructor's arguments:

* **V1**: a request's row holds vLLM's own output-id list, which vLLM appends to in place; each
  ``apply`` advances the matcher over the ids added since the last call (rolling back if vLLM
  shortened the list). Rows follow their requests through removals, moves and swaps (applied in
  the order the interface specifies: removed, added, moved). With async scheduling (vLLM's
  default) the list holds ``-1`` placeholders that vLLM replaces before sampling only when some
  processor was named with ``--logits-processors``: an entry-point plugin alone is not enough, so
  name corral there too (vLLM then builds it twice; both write the same mask) or pass
  ``--no-async-scheduling``. A placeholder seen at ``apply`` is logged and ends the request (EOS).
* **V2**: there is no list to read; ``apply`` learns each request's newest token from the row's
  ``input_ids``/``pos`` (the token fed to the model this step), fills a gap (tokens accepted from
  last step's drafts under speculative decoding) from the drafts it saw, and replays the output of
  a request resumed after preemption from ``req_states.all_token_ids``. Under speculative decoding
  each draft row is masked with a fork of the matcher advanced over the drafts before it.

Speculative decoding with the V1 runner: ``build_logitsprocs`` refuses processors named with
``--logits-processors`` and silently skips entry-point plugins, so corral does not constrain there
(use vLLM's own ``structured_outputs``, or the V2 runner).

A constraint that parses at admission but fails to compile in the worker (a grammar that accepts
nothing, a ``grammars.Limits`` bound) or a token the mask forbade (another processor re-enabled it)
cannot raise there without stopping the engine: the request is logged and allowed only EOS, so it
ends at once. vLLM is not a dependency of corral: only vLLM's plugin loader (or code already
running vLLM) imports this module.
"""

from __future__ import annotations

import json
import logging
import re
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from typing import TYPE_CHECKING, Any

import numpy as np

try:
    import torch
    from vllm.sampling_params import SamplingParams
    from vllm.v1.sample.logits_processor import BatchUpdate, MoveDirectionality
    from vllm.v1.sample.logits_processor import LogitsProcessor as V1LogitsProcessor
    from vllm.v1.worker.gpu.sample.logits_processor import (
        LogitsProcessor as V2LogitsProcessor,
    )
except ImportError as exc:  # pragma: no cover - exercised in a venv without vLLM
    raise ImportError(
        "integrations.vllm_logits is corral's vLLM logits-processor plugin and needs vLLM 0.33 installed "
        f"in this environment (pip install -r scripts/integration/vllm.txt): {exc}"
    ) from exc

from grammars import (
    CompiledGrammar,
    Compiler,
    ConstraintError,
    EmptyLanguageError,
    Limits,
    Matcher,
    MatchError,
    TokenVocabulary,
    allocate_token_bitmask,
    parse_gbnf,
    parse_lark,
    parse_regex,
)
from grammars.bitmask import pack_bool
from grammars.ir import Grammar, alt, literal
from samplers import apply_token_bitmask_inplace

if TYPE_CHECKING:
    from vllm.config import ModelConfig, VllmConfig
    from vllm.v1.worker.gpu.sample.logits_processor import (
        LogitsContext,
        LogitsProcRequestState,
    )

__all__ = ["CONSTRAINT_KEYS", "ConstraintSpec", "CorralLogitsProcessor", "constraint_of", "vocabulary_for"]

_log = logging.getLogger(__name__)

#: ``extra_args`` keys that carry a constraint, each to its kind.
CONSTRAINT_KEYS: dict[str, str] = {
    "corral_json_schema": "json_schema",
    "corral_regex": "regex",
    "corral_grammar": "grammar",
    "corral_choice": "choice",
}

#: What a constraint's front end or compiler may raise for bad input (beyond corral's own errors:
#: a value of the wrong type, bad options, nesting past Python's stack).
_CONSTRAINT_ERRORS = (ConstraintError, TypeError, ValueError, RecursionError)

_GBNF_RULE = re.compile(r"^\s*[A-Za-z_][A-Za-z0-9_-]*\s*::=", re.MULTILINE)


@dataclass(frozen=True)
class ConstraintSpec:
    """A request's constraint in canonical, hashable form: ``kind`` (``json_schema``, ``regex``,
    ``gbnf``, ``lark`` or ``choice``) and ``source`` (text; JSON text for schemas and choices)."""

    kind: str
    source: str

    def compile(self, compiler: Compiler) -> CompiledGrammar:
        """The compiled grammar (``compiler`` caches by source); ``EmptyLanguageError`` if it
        accepts nothing."""
        if self.kind == "json_schema":
            compiled = compiler.compile_json_schema(self.source)
        elif self.kind == "regex":
            compiled = compiler.compile_regex(self.source)
        elif self.kind == "gbnf":
            compiled = compiler.compile_gbnf(self.source)
        elif self.kind == "lark":
            compiled = compiler.compile_lark(self.source)
        else:
            compiled = compiler.compile_grammar(_choice_grammar(json.loads(self.source)))
        if compiled.accepts_nothing:
            raise EmptyLanguageError("the constraint accepts no output at all")
        return compiled

    def check(self) -> None:
        """Run the vocabulary-free front end: what a request can be refused for at admission."""
        if self.kind == "json_schema":
            from grammars.frontends.json_schema import (
                JsonSchemaOptions,
                load_schema,
                parse_json_schema,
            )

            parse_json_schema(load_schema(self.source), JsonSchemaOptions(), limits=Limits())
        elif self.kind == "regex":
            parse_regex(self.source)
        elif self.kind == "gbnf":
            parse_gbnf(self.source)
        elif self.kind == "lark":
            parse_lark(self.source)


def _choice_grammar(choices: Sequence[str]) -> Grammar:
    return Grammar.of({"root": alt([literal(c) for c in choices])}, "root", "<choice>")


def constraint_of(params: SamplingParams) -> ConstraintSpec | None:
    """The corral constraint named in ``params.extra_args``, or None; ``ValueError`` for a malformed
    one (unknown ``corral_*`` key, two constraints, a value of the wrong type)."""
    extra = params.extra_args or {}
    keys = [k for k in extra if isinstance(k, str) and k.startswith("corral_")]
    if not keys:
        return None
    unknown = sorted(k for k in keys if k not in CONSTRAINT_KEYS)
    if unknown:
        raise ValueError(f"unknown corral constraint key(s) {unknown} in extra_args; "
                         f"use exactly one of {sorted(CONSTRAINT_KEYS)}")
    if len(keys) > 1:
        raise ValueError(f"extra_args names {len(keys)} corral constraints {sorted(keys)}; give exactly one")
    key = keys[0]
    return _spec(key, CONSTRAINT_KEYS[key], extra[key])


def _spec(key: str, kind: str, value: Any) -> ConstraintSpec:
    if kind == "json_schema":
        if isinstance(value, (dict, bool)):
            try:
                return ConstraintSpec(kind, json.dumps(value, ensure_ascii=False, separators=(",", ":")))
            except (TypeError, ValueError) as exc:
                raise ValueError(f"{key} is not a JSON document: {exc}") from None
        if isinstance(value, str):
            return ConstraintSpec(kind, value)
        raise ValueError(f"{key} must be a JSON Schema (an object, a boolean or its JSON text), "
                         f"got {type(value).__name__}")
    if kind == "choice":
        if (not isinstance(value, (list, tuple)) or not value
                or not all(isinstance(c, str) and c for c in value)):
            raise ValueError(f"{key} must be a non-empty list of non-empty strings")
        return ConstraintSpec(kind, json.dumps(list(value), ensure_ascii=False))
    if not isinstance(value, str) or not value:
        raise ValueError(f"{key} must be a non-empty string, got {type(value).__name__}")
    if kind == "grammar":
        kind = "gbnf" if _GBNF_RULE.search(value) else "lark"
    return ConstraintSpec(kind, value)


@lru_cache(maxsize=256)
def _checked(spec: ConstraintSpec) -> str | None:
    """The front end's complaint about ``spec``, or None (cached: clients resend one schema)."""
    try:
        spec.check()
    except _CONSTRAINT_ERRORS as exc:
        return str(exc) or type(exc).__name__
    return None


# --- the vocabulary and compiler of a model, one per process --------------------------------

_shared_lock = threading.Lock()
_shared: dict[tuple, tuple[TokenVocabulary, Compiler]] = {}


def vocabulary_for(model_config: ModelConfig) -> TokenVocabulary:
    """The vocabulary of the tokenizer vLLM loads for ``model_config``, as wide as the model's logits.

    EOS ids: the tokenizer's ``eos_token_id`` plus ``generation_config.json``'s (vLLM stops on
    both). The width is the model's ``vocab_size`` (or the tokenizer's length when larger).
    """
    from vllm.tokenizers.registry import cached_tokenizer_from_config

    tokenizer = cached_tokenizer_from_config(model_config)
    if tokenizer is None:
        raise ValueError("corral's vLLM plugin needs the model's tokenizer; do not set skip_tokenizer_init")
    eos: set[int] = set()
    if isinstance(getattr(tokenizer, "eos_token_id", None), int):
        eos.add(tokenizer.eos_token_id)
    generation_eos = model_config.try_get_generation_config().get("eos_token_id")
    if isinstance(generation_eos, int):
        eos.add(generation_eos)
    elif isinstance(generation_eos, (list, tuple)):
        eos.update(i for i in generation_eos if isinstance(i, int))
    width = max(model_config.get_vocab_size(), len(tokenizer))
    return TokenVocabulary.from_tokenizer(tokenizer, eos_token_ids=eos or None, logits_width=width)


def _vocab_and_compiler(model_config: ModelConfig) -> tuple[TokenVocabulary, Compiler]:
    key = (model_config.tokenizer, model_config.tokenizer_revision, model_config.tokenizer_mode,
           model_config.get_vocab_size())
    with _shared_lock:
        found = _shared.get(key)
        if found is None:
            vocab = vocabulary_for(model_config)
            found = _shared[key] = (vocab, Compiler(vocab))
        return found


# --- per-request state -----------------------------------------------------------------------


@dataclass(eq=False)
class _Row:
    """One constrained request: its matcher (None: only EOS, after a failure) and how many output
    ids it has consumed. ``output`` is vLLM's own list of the request's output ids (V1 only)."""

    matcher: Matcher | None
    output: list[int] = field(default_factory=list)
    consumed: int = 0
    #: V2: the prompt length and the drafts fed last step (tokens that may have been accepted)
    prompt_len: int = 0
    drafts: list[int] = field(default_factory=list)
    #: V2: added this step; ``apply_staged_writes`` reads its prompt length and replays the output
    #: of a request resumed after preemption
    is_new: bool = False

    @property
    def forced_eos(self) -> bool:
        """Only EOS may come: the matcher is finished, or there is none to follow."""
        return self.matcher is None or self.matcher.is_terminated()

    def advance(self, token: int, where: str) -> None:
        """Feed one committed token (ignored after EOS; a rejected one ends the constraint)."""
        self.consumed += 1
        if self.forced_eos:
            return
        try:
            self.matcher.advance(token)
        except MatchError as exc:
            _log.error("corral: %s: token %d is not allowed by the request's constraint (%s); "
                       "allowing only EOS from now on", where, token, exc)
            self.matcher = None

    def rollback_to(self, consumed: int) -> None:
        """Forget the output after its first ``consumed`` tokens (the matcher was never fed those
        after an EOS, so it keeps at most ``consumed``)."""
        if self.matcher is not None:
            fed = self.matcher.num_consumed
            self.matcher.rollback(fed - min(fed, consumed))
        self.consumed = consumed

    def sync_v1(self) -> None:
        """Advance over the ids vLLM appended to ``output`` since the last call."""
        output = self.output
        if len(output) < self.consumed:  # vLLM discarded tokens (KV-load failure)
            self.rollback_to(len(output))
        for i in range(self.consumed, len(output)):
            token = output[i]
            if token < 0:
                _log.error(_PLACEHOLDER_ERROR)
                self.matcher = None
                break
            self.advance(token, "vLLM output")


#: V1 runner with async scheduling fills in the ids of its output lists (-1 until then) before
#: sampling only when a processor was named with ``--logits-processors`` (or penalties are used)
_PLACEHOLDER_ERROR = (
    "corral: vLLM did not fill in the request's output token ids (async scheduling with the V1 model "
    "runner and corral loaded only from its entry point); allowing only EOS. Start vLLM with "
    "--logits-processors integrations.vllm_logits:CorralLogitsProcessor or --no-async-scheduling"
)


class CorralLogitsProcessor(V1LogitsProcessor, V2LogitsProcessor):
    """Masks the logits of requests whose ``extra_args`` name a corral constraint; see the
    module docstring. One instance per worker, built by vLLM's loader for either model runner."""

    def __init__(self, vllm_config: VllmConfig, device_or_req_states: Any, is_pin_memory: bool | None = None):
        model_config = vllm_config.model_config
        if model_config is None:
            raise ValueError("CorralLogitsProcessor needs vllm_config.model_config (the model's tokenizer)")
        self._vocab, self._compiler = _vocab_and_compiler(model_config)
        eos = np.zeros(self._vocab.logits_width, dtype=bool)
        eos[sorted(self._vocab.eos_token_ids)] = True
        self._eos_row = pack_bool(eos, self._vocab.logits_width)
        #: V2 runner: the request-state buffers (token history); None under V1
        self._req_states: LogitsProcRequestState | None = None
        if is_pin_memory is None:
            self._req_states = device_or_req_states
            rows = self._req_states.max_num_reqs
        else:
            rows = vllm_config.scheduler_config.max_num_seqs
        self._rows: dict[int, _Row] = {}
        self._bitmask = allocate_token_bitmask(max(rows, 1), self._vocab.logits_width)

    @property
    def vocab(self) -> TokenVocabulary:
        return self._vocab

    # --- both runners --------------------------------------------------------------------------

    @classmethod
    def validate_params(cls, sampling_params: SamplingParams) -> None:
        """At request admission: ``ValueError`` with corral's message for a constraint it refuses."""
        spec = constraint_of(sampling_params)
        if spec is None:
            return
        problem = _checked(spec)
        if problem is not None:
            key = next(k for k, kind in CONSTRAINT_KEYS.items()
                       if k in (sampling_params.extra_args or {}))
            raise ValueError(f"{key}: {problem}")

    def is_argmax_invariant(self) -> bool:
        """Masking changes which token is most likely."""
        return False

    def _new_row(self, params: SamplingParams, output: list[int]) -> _Row | None:
        spec = constraint_of(params)
        if spec is None:
            return None
        try:
            matcher = spec.compile(self._compiler).matcher()
        except _CONSTRAINT_ERRORS as exc:
            _log.error("corral: the request's %s constraint failed to compile (%s); allowing only EOS",
                       spec.kind, exc)
            matcher = None
        return _Row(matcher, output)

    def _fill(self, row_index: int, row: _Row, bitmask) -> None:
        if row.forced_eos:
            bitmask[row_index] = self._eos_row
        else:
            row.matcher.fill_mask(bitmask, row_index)

    def _mask(self, logits: torch.Tensor, constrained: list[int]) -> torch.Tensor:
        """Apply the rows of ``self._bitmask`` listed in ``constrained`` to ``logits``."""
        if not constrained:
            return logits
        batch = logits.shape[0]
        bitmask = self._bitmask[:batch]  # the callers grew it to the batch before filling it
        if len(constrained) == batch:
            apply_token_bitmask_inplace(logits, bitmask)
        else:
            indices = torch.tensor(constrained, dtype=torch.long, device=logits.device)
            apply_token_bitmask_inplace(logits, bitmask, indices)
        return logits

    # --- V1 runner -----------------------------------------------------------------------------

    def update_state(self, batch_update: BatchUpdate | None) -> None:
        """Follow the persistent batch: removed, then added, then moved/swapped rows."""
        if batch_update is None:
            return
        rows = self._rows
        for index in batch_update.removed:
            rows.pop(index, None)
        for index, params, _prompt_ids, output_ids in batch_update.added:
            row = self._new_row(params, output_ids)
            if row is None:
                rows.pop(index, None)
            else:
                rows[index] = row
        for a, b, direction in batch_update.moved:
            row_a, row_b = rows.pop(a, None), rows.pop(b, None)
            if row_a is not None:
                rows[b] = row_a
            if row_b is not None and direction == MoveDirectionality.SWAP:
                rows[a] = row_b

    def apply(self, logits: torch.Tensor, ctx: LogitsContext | None = None) -> torch.Tensor:
        """Mask every constrained row in place (V1: ``apply(logits)``; V2: ``apply(logits, ctx)``)."""
        if ctx is not None:
            return self._apply_v2(logits, ctx)
        if not self._rows:
            return logits
        batch = logits.shape[0]
        if batch > self._bitmask.shape[0]:
            self._bitmask = allocate_token_bitmask(batch, self._vocab.logits_width)
        constrained = []
        for index in sorted(self._rows):
            if index >= batch:
                continue
            row = self._rows[index]
            row.sync_v1()
            self._fill(index, row, self._bitmask)
            constrained.append(index)
        return self._mask(logits, constrained)

    # --- V2 runner -----------------------------------------------------------------------------

    def add_request(self, req_idx: int, sampling_params: SamplingParams) -> bool:
        """A request takes slot ``req_idx`` (state of the slot's previous request is dropped)."""
        row = self._new_row(sampling_params, [])
        if row is None:
            self._rows.pop(req_idx, None)
            return False
        row.is_new = True
        self._rows[req_idx] = row
        return True

    def apply_staged_writes(self) -> None:
        """Learn the prompt length of new requests, and replay the output of resumed ones."""
        states = self._req_states
        for slot, row in self._rows.items():
            if not row.is_new:
                continue
            row.is_new = False
            row.prompt_len = int(states.prompt_len.np[slot])
            prefill_len = int(states.prefill_len.np[slot])
            if prefill_len > row.prompt_len:  # resumed after preemption: its output so far
                ids = states.all_token_ids.gpu[slot, row.prompt_len:prefill_len].tolist()
                for token in ids:
                    row.advance(int(token), "replayed output")

    def _apply_v2(self, logits: torch.Tensor, ctx: LogitsContext) -> torch.Tensor:
        if not self._rows:
            return logits
        slots = ctx.expanded_idx_mapping.tolist()
        if not any(slot in self._rows for slot in slots):
            return logits
        local = ctx.expanded_local_pos.tolist()
        positions = ctx.pos.tolist()
        fed = ctx.input_ids.tolist()
        batch = logits.shape[0]
        if batch > self._bitmask.shape[0]:
            self._bitmask = allocate_token_bitmask(batch, self._vocab.logits_width)
        by_slot: dict[int, list[int]] = {}
        for r, slot in enumerate(slots):
            if slot in self._rows:
                by_slot.setdefault(slot, []).append(r)
        constrained: list[int] = []
        for slot, request_rows in by_slot.items():
            row = self._rows[slot]
            request_rows.sort(key=local.__getitem__)
            first = request_rows[0]
            self._catch_up_v2(slot, row, positions[first], fed[first])
            self._fill(first, row, self._bitmask)
            constrained.append(first)
            drafts = [fed[r] for r in request_rows[1:]]
            if drafts:
                self._fill_drafts(row, request_rows[1:], drafts)
                constrained.extend(request_rows[1:])
            row.drafts = drafts
        return self._mask(logits, sorted(constrained))

    def _catch_up_v2(self, slot: int, row: _Row, position: int, token: int) -> None:
        """Consume the output up to the token fed at ``position`` (the newest committed one)."""
        index = position - row.prompt_len  # the fed token's index in the output
        if index < 0:
            return  # still in the prompt (a prefill chunk)
        if index < row.consumed:  # fed again (a step's tokens were discarded): go back
            row.rollback_to(index)
        gap = index - row.consumed
        if gap:
            known = row.drafts[:gap] if gap <= len(row.drafts) else None
            if known is None:  # not from last step's drafts: read the committed history
                start = row.prompt_len + row.consumed
                known = self._req_states.all_token_ids.gpu[slot, start:start + gap].tolist()
            for t in known:
                row.advance(int(t), "accepted draft")
        row.advance(token, "vLLM output")

    def _fill_drafts(self, row: _Row, draft_rows: list[int], drafts: list[int]) -> None:
        """Mask each draft row with the matcher advanced over the drafts before it. Rows after a
        draft the grammar refuses get EOS only: finite, and never used (the refused draft had
        probability 0, so it and everything after it is rejected)."""
        probe = None if row.forced_eos else row.matcher.fork()
        for r, token in zip(draft_rows, drafts):
            if probe is not None and probe.try_advance([token]) == 1 and not probe.is_terminated():
                probe.fill_mask(self._bitmask, r)
            else:
                self._bitmask[r] = self._eos_row
                probe = None
