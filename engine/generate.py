"""``generate`` and ``generate_batch``: prompt + constraint + model -> ``GenerationResult``.

The one-call API::

    from engine import generate
    result = generate("A person as JSON: ", schema={"type": "object", ...}, model="models/tiny-json")
    result.value          # the parsed JSON (a Pydantic instance when schema= is a Pydantic class)
    result.finish_reason  # "stop" | "length" | "stop_string"

Settings live in one frozen dataclass, ``GenerationOptions``: both functions take its fields as
keyword arguments or a prepared ``options=`` (a server keeps one per route and overrides the
seed per request). Everything else here is wiring: resolve the model (``LanguageModel``), the
vocabulary (for the model's logits width and EOS ids), compile the constraint, pick the
sampler, then hand over to ``engine.decoding.decode`` — the loop that owns masking, sampling,
forced tokens, stop strings and budget-aware closing.

Reuse across calls: pass ``compiler=Compiler(vocab)`` (holds the vocabulary, the compiled
grammars and the shared trie walks) and a loaded model or ``HFCausalLM``; with a path each call
loads the model again.
"""

from __future__ import annotations

import dataclasses
import difflib
import importlib
import inspect
import json
import os
import sys
import time
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol, runtime_checkable

import torch

from engine.closing import BudgetClosing, ClosingPlanner
from engine.decoding import DecodeOptions, FinishReason, decode
from engine.lm import HFCausalLM, LanguageModel, resolve_dtype, resolve_device
from engine.speculative import (
    DEFAULT_MAX_SPECULATIVE_TOKENS,
    check_speculative_options,
    resolve_draft,
    speculative_decode,
)
from grammars import (
    CompiledGrammar,
    Compiler,
    EmptyLanguageError,
    Grammar,
    TokenVocabulary,
    UnconstrainedMatcher,
    builtin_grammar,
    shared_compiler,
)
from grammars.builtin import BUILTIN_GRAMMARS
from samplers import MaskedSampler, SamplingParams, TokenSampler

__all__ = [
    "GenerationOptions",
    "GenerationResult",
    "SequenceSampler",
    "generate",
    "generate_batch",
    "resolve_sampler",
    "load_model",
    "load_vocabulary",
]

SamplerName = Literal["masked", "asap", "awrs", "smc"]

#: Named samplers, resolved lazily: (module, class). Imported only when asked for.
_NAMED_SAMPLERS: dict[str, tuple[str, str]] = {
    "masked": ("samplers.masked", "MaskedSampler"),
    "asap": ("samplers.asap", "ASAp"),
    "awrs": ("samplers.awrs", "AWRS"),
    "smc": ("samplers.smc", "SMC"),
}


@dataclass
class GenerationResult:
    """One generated sequence.

    ``text`` is the generated text (prompt excluded; cut before a stop string), ``token_ids`` the
    generated tokens (EOS excluded). ``value`` is the parsed JSON for ``schema=`` generations —
    a Pydantic instance when the schema was a Pydantic model class — or ``None`` when there is
    no schema or the text does not parse. ``finish_reason``: ``"stop"`` (EOS at an accepting
    state, or the grammar allowed nothing else), ``"length"`` (``max_tokens`` reached; for a
    diffusion model, ``DiffusionResult.finish_reason``: a constrained canvas whose holes could not
    be closed within the parser's limits, cut short, or an unconstrained one without EOS) or
    ``"stop_string"``.

    Timings (seconds): ``compile_s`` (constraint compilation, 0 on a cache hit or none),
    ``first_token_s`` (decode start to this row's first token, prefill included) and
    ``per_token_s`` (one entry per decoding step of this row; ``mean_token_s`` averages them),
    ``mask_wait_s`` (per step, how long the step waited on grammar masks: masks are filled while
    the forward pass runs, ``engine.decoding``, so this is ≈ 0 when they are cache hits).
    ``forced_tokens`` counts tokens appended without sampling, ``budget_steered`` steps where
    budget-aware closing refused a token the sampler asked about (the sampler then drew among the
    tokens that still close in time), ``log_weight`` the sampler's importance weight (for SMC: the
    log marginal-likelihood estimate ``log_ml``; ``nan`` for a sampler that does not estimate one,
    ``AWRS(weight=False)``, and for SMC at ``temperature=0``, which decodes greedily).
    """

    text: str
    token_ids: list[int]
    finish_reason: FinishReason
    value: Any = None
    prompt_token_ids: list[int] = field(default_factory=list)
    compile_s: float = 0.0
    first_token_s: float | None = None
    per_token_s: list[float] = field(default_factory=list)
    mask_wait_s: list[float] = field(default_factory=list)
    forced_tokens: int = 0
    budget_steered: int = 0
    log_weight: float = 0.0

    @property
    def mean_token_s(self) -> float | None:
        """Mean seconds per decoding step, or None when no step ran."""
        return sum(self.per_token_s) / len(self.per_token_s) if self.per_token_s else None


@runtime_checkable
class SequenceSampler(Protocol):
    """A decoder-level sampler (``samplers.SMC``): it runs its own loop over a batch logits callback.

    ``run`` gets ``logits_fn(prefixes) -> [len(prefixes), width]`` where each prefix is the
    *generated* tokens of one particle (the engine prepends the prompt and calls
    ``LanguageModel.next_logits``), the start ``matcher`` (not modified), the token budget and a
    generator. Its result has ``tokens`` (per particle, ending with EOS when complete),
    ``completed``, ``log_ml`` and ``sample(generator)`` (one complete sequence in proportion to
    the weights), as ``samplers.SMCResult`` does.
    """

    def run(self, logits_fn, matcher, *, max_tokens: int, generator: torch.Generator | None) -> Any:
        """Sample weighted sequences from ``matcher``'s state within ``max_tokens`` steps."""
        ...


# --- options -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class GenerationOptions:
    """Everything ``generate`` and ``generate_batch`` take besides the prompt(s) and the model.

    The one place where these settings, their defaults and their checks live: both functions
    take them as keyword arguments (``generate(prompt, model=m, schema=s, max_tokens=64)``) or as
    a prepared ``options=GenerationOptions(...)``, keyword arguments overriding its fields.
    Invalid combinations raise ``ValueError``/``TypeError`` here, before any model is loaded.

    Constraint (at most one; none means unconstrained): ``schema`` — a JSON Schema (dict, JSON
    text, bool) or a Pydantic model class; ``regex`` — full-match regular expression; ``grammar``
    — GBNF text, a built-in grammar's name (``"cpp"``, ``"json"``: ``grammars.builtin_grammar``),
    a ``grammars.Grammar`` IR or an already ``CompiledGrammar``. ``whitespace``: the
    JSON front end's whitespace policy (``"compact"`` or ``"flexible"``), schema only.

    Model side: ``tokenizer`` — a transformers tokenizer, a ``TokenVocabulary`` or a path
    (derived from the model when that is a path); ``compiler`` — a ``grammars.Compiler`` that
    supplies the vocabulary and caches compiled grammars across calls; ``device``/``dtype`` for a
    transformers model or path; ``chat_template`` — wrap each prompt as one user message with the
    tokenizer's chat template.

    Sampling: ``sampler`` — ``"masked"`` (default), ``"asap"``, ``"awrs"``, ``"smc"`` or an
    instance; ``temperature``/``top_p``/``top_k`` configure named samplers (``temperature=0``:
    greedy); ``seed`` — an int seeds a ``torch.Generator`` per row (row ``i`` gets ``seed + i``),
    or one int per prompt: same seed, same output.

    Masked-diffusion models (an ``engine.MaskedDiffusionLM`` as ``model``): ``canvas_length``
    masked positions filled in ``steps`` model calls, in blocks of ``block_length`` (default: one
    block), ``unmasking`` ``"confidence"`` (LLaDA's k per step), ``"threshold"``, ``"entropy"`` or
    a policy object, and ``diffusion_mode`` ``"auto"`` (DINGO for regular constraints, grammar
    infilling otherwise), ``"dingo"``, ``"infill"``, ``"greedy"`` or ``"none"``
    (``engine.diffusion`` describes each); ``max_tokens``, ``stop`` and the sampler do not apply.

    Speculative decoding (``engine.speculative``): ``draft_model`` — a smaller causal model (a
    transformers model, a path or a ``LanguageModel`` sharing the tokenizer), ``"prompt_lookup"``
    (n-gram copy from prompt + output), ``"jacobi"`` (the target's own guesses from its last
    verification and an n-gram pool of them), a masked-diffusion model or ``"diffusion:PATH"``
    (``DiffusionDraft``: a block in one pass, the most probable valid path through it) or a draft
    source (``DraftModel``, ``PromptLookup``, ``ForcedTokens``, ``DraftTree`` for token trees
    verified in one pass with a tree attention mask, ``JacobiDraft``, ``DiffusionDraft``) —
    proposes up to ``num_speculative_tokens`` tokens (``"auto"``: adapted
    per request from measured acceptance and costs, up to ``max_speculative_tokens``, 0 when
    drafting does not pay), checked against the
    grammar, that the target verifies in one call; the output's law is exactly masked sampling
    from the target (greedy: the same tokens). Only the masked sampler composes: the acceptance
    rule reproduces a per-token distribution given the prefix, while ASAp, AWRS and SMC reweight
    whole sequences (learnt future-validity estimates, importance weights, resampling), so they
    raise ``ValueError`` here. ``stop`` and ``ignore_eos`` do not apply on this path; budget-aware
    closing does, with the sequential sampler's law (``engine.speculative``).

    The loop: ``max_tokens`` bounds generated tokens, EOS included; ``stop`` — stop strings (not
    with ``schema``, whose grammar decides the end); ``fast_forward`` — append forced tokens
    without sampling (default: on for the masked sampler; refused for ASAp, which must draw every
    token); ``budget_closing`` — steer to close the constraint before ``max_tokens`` runs out
    (see ``engine.decoding``; every sampler, SMC included, then draws from the constraint narrowed
    to what still closes in time, and ASAp's state is keyed by the budget too); ``ignore_eos`` —
    unconstrained rows never end on EOS and produce exactly ``max_tokens`` tokens (throughput
    baselines; a grammar still decides where constrained rows end); ``progress`` — a tqdm bar on
    stderr.
    """

    schema: Any = None
    regex: str | None = None
    grammar: str | Grammar | CompiledGrammar | None = None
    whitespace: str | None = None
    tokenizer: Any = None
    compiler: Compiler | None = None
    device: str | torch.device | None = None
    dtype: torch.dtype | str | None = None
    chat_template: bool = False
    sampler: SamplerName | TokenSampler | SequenceSampler = "masked"
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | Sequence[int] | None = None
    max_tokens: int = 256
    stop: str | Sequence[str] | None = None
    fast_forward: bool | None = None
    budget_closing: bool = True
    ignore_eos: bool = False
    progress: bool = False
    canvas_length: int = 128
    steps: int = 64
    block_length: int | None = None
    unmasking: Any = "confidence"
    diffusion_mode: str = "auto"
    draft_model: Any = None
    num_speculative_tokens: int | str = 4
    max_speculative_tokens: int = DEFAULT_MAX_SPECULATIVE_TOKENS

    def __post_init__(self) -> None:
        given = [name for name in ("schema", "regex", "grammar") if getattr(self, name) is not None]
        if len(given) > 1:
            raise ValueError(f"pass at most one constraint; got {' and '.join(given)}")
        if self.regex is not None and not isinstance(self.regex, str):
            raise TypeError(f"regex must be a str, got {type(self.regex).__name__}")
        if self.schema is not None and not _is_schema(self.schema):
            raise TypeError(f"schema must be a dict, a bool, JSON text or a Pydantic model class; "
                            f"got {type(self.schema).__name__}")
        if self.compiler is not None and not isinstance(self.compiler, Compiler):
            raise TypeError(f"compiler must be a grammars.Compiler, got {type(self.compiler).__name__}")
        for name in ("chat_template", "budget_closing", "ignore_eos", "progress"):
            if not isinstance(getattr(self, name), bool):
                raise TypeError(f"{name} must be a bool, got {type(getattr(self, name)).__name__}")
        if self.fast_forward is not None and not isinstance(self.fast_forward, bool):
            raise TypeError(f"fast_forward must be a bool or None, got {type(self.fast_forward).__name__}")
        if self.grammar is not None and not isinstance(self.grammar, (str, Grammar, CompiledGrammar)):
            raise TypeError(f"grammar must be GBNF text, a grammars.Grammar or a CompiledGrammar; "
                            f"got {type(self.grammar).__name__}")
        if self.whitespace is not None and self.schema is None:
            raise ValueError("whitespace= applies to schema= only; set the whitespace in your regex or grammar instead")
        if self.stop_strings and self.schema is not None:
            raise ValueError("stop= cannot be combined with schema=: the schema's grammar decides where the output ends")
        if isinstance(self.max_tokens, bool) or not isinstance(self.max_tokens, int) or self.max_tokens < 1:
            raise ValueError(f"max_tokens must be a positive int, got {self.max_tokens!r}")
        _ = self.sampling_params  # SamplingParams checks temperature, top_p and top_k
        _check_sampler(self.sampler)
        check_speculative_options(self)
        if self.device is not None:
            resolve_device(self.device)  # "cuda" without CUDA: an argument error, before any model loads
        if self.dtype is not None:
            resolve_dtype(self.dtype)
        if self.seed is not None and not isinstance(self.seed, (str, bytes)) and not isinstance(self.seed, int):
            for one in self.seed:
                _check_seed(one)
        elif self.seed is not None:
            _check_seed(self.seed)

    @classmethod
    def of(cls, options: GenerationOptions | None, settings: dict[str, Any], caller: str) -> GenerationOptions:
        """``options`` (or the defaults) with ``settings`` — keyword arguments of ``caller`` — applied."""
        unknown = sorted(set(settings) - _OPTION_NAMES)
        if unknown:
            hint = difflib.get_close_matches(unknown[0], _OPTION_NAMES, n=1)
            raise TypeError(f"{caller}() got an unexpected keyword argument {unknown[0]!r}"
                            + (f"; did you mean {hint[0]!r}?" if hint else ""))
        base = options if options is not None else cls()
        return dataclasses.replace(base, **settings) if settings else base

    @property
    def stop_strings(self) -> tuple[str, ...]:
        """``stop`` as a tuple of non-empty strings."""
        return _stop_strings(self.stop)

    @property
    def sampling_params(self) -> SamplingParams:
        """The ``process_logits`` settings named samplers are built with."""
        return SamplingParams(temperature=self.temperature, top_k=self.top_k, top_p=self.top_p)


_OPTION_NAMES = frozenset(f.name for f in dataclasses.fields(GenerationOptions))


def _check_sampler(sampler: Any) -> None:
    """A sampler name we know, or an instance with ``start`` or ``run`` (checked without importing it)."""
    if isinstance(sampler, str):
        if sampler.lower() not in _NAMED_SAMPLERS:
            raise ValueError(f"unknown sampler {sampler!r}; choose one of {sorted(_NAMED_SAMPLERS)} or pass an instance")
    elif not (callable(getattr(sampler, "start", None)) or callable(getattr(sampler, "run", None))):
        raise TypeError(f"sampler must be a name or an object with start(key) (TokenSampler) or "
                        f"run(logits_fn, matcher, ...) (SequenceSampler); got {type(sampler).__name__}")


def _is_schema(schema: Any) -> bool:
    """What ``compile_json_schema`` takes: a dict, a bool, JSON text or a Pydantic model class."""
    if isinstance(schema, (dict, bool, str, bytes, bytearray)):
        return True
    return isinstance(schema, type) and callable(getattr(schema, "model_json_schema", None))


def _takes_options(func):
    """Show ``GenerationOptions``' fields as ``func``'s keyword parameters (``help``, IDEs): derived
    from the dataclass, so each default is written once."""
    signature = inspect.signature(func)
    kept = [p for p in signature.parameters.values() if p.kind is not inspect.Parameter.VAR_KEYWORD]
    derived = [inspect.Parameter(f.name, inspect.Parameter.KEYWORD_ONLY, default=f.default, annotation=f.type)
               for f in dataclasses.fields(GenerationOptions)]
    func.__signature__ = signature.replace(parameters=kept + derived)
    return func


# --- public entry points ----------------------------------------------------------------------


@_takes_options
def generate(
    prompt: str | Sequence[int], *, model: Any, options: GenerationOptions | None = None, **settings: Any
) -> GenerationResult:
    """Generate one completion of ``prompt`` under at most one constraint.

    ``model``: a transformers causal LM, a path (or hub id) for ``from_pretrained``, or any
    ``LanguageModel`` (``HFCausalLM``, ``ScriptedLM``). Everything else — ``schema=``/``regex=``/
    ``grammar=``, ``tokenizer=``, ``compiler=``, ``sampler=``, ``temperature=``, ``seed=``,
    ``max_tokens=``, ``stop=`` … — is a ``GenerationOptions`` field, given by name or as
    ``options=`` (see ``GenerationOptions`` for each).

    Raises ``ValueError``/``TypeError`` for bad arguments (the message says how to fix them),
    and corral's typed errors (``grammars.ConstraintError`` and subclasses: ``GrammarError``,
    ``VocabularyError``, ``NoAllowedToken``) unchanged.
    """
    return generate_batch([prompt], model=model, options=GenerationOptions.of(options, settings, "generate"))[0]


@_takes_options
def generate_batch(
    prompts: Sequence[str | Sequence[int]], *, model: Any, options: GenerationOptions | None = None,
    **settings: Any,
) -> list[GenerationResult]:
    """``generate`` for several prompts in one batch (one model call per step for all rows).

    Same options as ``generate``; the constraint applies to every prompt. ``seed`` is one int
    (row ``i`` uses ``seed + i``), one int per prompt, or None. Row ``i`` then draws exactly
    what ``generate(prompts[i], seed=seed + i, ...)`` draws *given the same logits*: each row
    has its own generator and matcher. The logits of a padded batch may differ from a single
    row's in the last float bits, so with a real model batch and sequential results agree
    except where a draw falls on such a boundary (they matched in our float32 CPU tests); with a
    ``ScriptedLM`` they are identical.
    """
    opts = GenerationOptions.of(options, settings, "generate_batch")
    if isinstance(prompts, (str, bytes)):
        raise TypeError("generate_batch takes a list of prompts; use generate() for one prompt")
    prompts = list(prompts)
    if not prompts:
        return []
    seeds = _seeds(opts.seed, len(prompts))
    resolved = resolve_sampler(opts.sampler, opts.sampling_params)
    if _is_diffusion_model(model):
        lm, tok_source = model, opts.tokenizer
    else:  # a masked-diffusion checkpoint comes back as HFMaskedDiffusionLM
        lm, tok_source = load_model(model, opts.tokenizer, device=opts.device, dtype=opts.dtype)
    if _is_diffusion_model(lm):
        return _generate_diffusion(prompts, lm, dataclasses.replace(opts, tokenizer=tok_source), seeds)
    vocab = load_vocabulary(tok_source, lm, opts.compiler)
    compiler = opts.compiler if opts.compiler is not None and opts.compiler.vocab == vocab else shared_compiler(vocab)
    compiled, compile_s = _compile_timed(compiler, vocab, opts)

    prompt_ids = [_encode_prompt(p, vocab, opts.chat_template) for p in prompts]
    device_of_logits = getattr(lm, "device", torch.device("cpu"))
    generators = [None if s is None else torch.Generator(device=device_of_logits).manual_seed(int(s)) for s in seeds]

    def new_matcher():
        return compiled.matcher() if compiled is not None else UnconstrainedMatcher(vocab)

    planner = ClosingPlanner(vocab) if opts.budget_closing and compiled is not None else None
    if opts.draft_model is not None:  # speculative decoding: masked sampler only (checked in the options)
        source = resolve_draft(opts.draft_model, device=opts.device, dtype=opts.dtype)
        if (compiled is not None and callable(getattr(source, "with_grammar", None))
                and getattr(getattr(source, "grammar", None), "key", None) != compiled.key):
            source = source.with_grammar(compiled)  # a diffusion drafter runs DINGO on a regular constraint
        outputs = []
        for ids, gen in zip(prompt_ids, generators):
            matcher = new_matcher()
            closing = BudgetClosing(planner, matcher.num_consumed + opts.max_tokens) if planner is not None else None
            outputs.append(speculative_decode(lm, source, vocab, ids, matcher, k=opts.num_speculative_tokens,
                                              max_k=opts.max_speculative_tokens, max_tokens=opts.max_tokens,
                                              params=resolved.params, generator=gen, closing=closing))
        return [_result(out.text, out.token_ids, out.finish_reason, opts.schema, ids, compile_s, out)
                for out, ids in zip(outputs, prompt_ids)]
    if isinstance(resolved, SequenceSampler) and not isinstance(resolved, TokenSampler):
        if opts.stop_strings:
            raise ValueError("stop= is not supported with a sequence-level sampler (SMC); use a token sampler")
        return [
            _run_sequence_sampler(resolved, lm, vocab, ids, _closed(new_matcher(), planner, opts.max_tokens), gen,
                                  opts.max_tokens, opts.schema, compile_s)
            for ids, gen in zip(prompt_ids, generators)
        ]

    matchers = [new_matcher() for _ in prompts]
    budget = opts.max_tokens if planner is not None else None
    runs = [resolved.start(_sampler_key(p, compiled, budget)) for p in prompt_ids]
    bar = _progress_bar(opts.progress, total=opts.max_tokens * len(prompts))
    try:
        outputs = decode(
            lm, vocab, prompt_ids, matchers, runs, generators, _decode_options(opts, resolved),
            planner=planner, on_tokens=bar.update if bar is not None else None,
        )
    finally:
        if bar is not None:
            bar.close()
    return [
        _result(out.text, out.token_ids, out.finish_reason, opts.schema, ids, compile_s, out)
        for out, ids in zip(outputs, prompt_ids)
    ]


def _closed(matcher: Any, planner: ClosingPlanner | None, max_tokens: int) -> Any:
    """The start matcher of a sequence-level sampler, narrowed by budget-aware closing when it is on."""
    if planner is None:
        return matcher
    return BudgetClosing(planner, matcher.num_consumed + max_tokens).narrow(matcher)


def _decode_options(opts: GenerationOptions, sampler: Any) -> DecodeOptions:
    """The loop's settings: masked samplers get premasked logits and, by default, fast-forwarding."""
    masked = isinstance(sampler, MaskedSampler) or bool(getattr(sampler, "premask", False))
    return DecodeOptions(
        max_tokens=opts.max_tokens,
        stop=opts.stop_strings,
        fast_forward=masked if opts.fast_forward is None else bool(opts.fast_forward),
        premask=masked,
        budget_closing=opts.budget_closing,
        ignore_eos=opts.ignore_eos,
        direct_params=sampler.params if type(sampler) is MaskedSampler else None,
    )


# --- resolution helpers -------------------------------------------------------------------------


def resolve_sampler(sampler: Any, params: SamplingParams | None = None) -> Any:
    """A sampler instance from a name (``"masked"``, ``"asap"``, ``"awrs"``, ``"smc"``) or an instance.

    Named samplers are imported lazily; a name whose module is not installed raises
    ``ValueError`` saying so. Instances must have ``start(key)`` (a ``TokenSampler``) or
    ``run(logits_fn, matcher, ...)`` (a ``SequenceSampler``, like ``samplers.SMC``). ``params``
    is passed to named samplers whose constructor takes ``params``.
    """
    if isinstance(sampler, str):
        name = sampler.lower()
        if name not in _NAMED_SAMPLERS:
            choices = sorted(_NAMED_SAMPLERS)
            raise ValueError(f"unknown sampler {sampler!r}; choose one of {choices} or pass an instance")
        module_name, class_name = _NAMED_SAMPLERS[name]
        try:
            cls = getattr(importlib.import_module(module_name), class_name)
        except (ImportError, AttributeError) as exc:
            raise ValueError(
                f"sampler {sampler!r} needs {module_name}.{class_name}, which is not available in this "
                f"installation ({exc}); use sampler='masked' or pass a sampler instance"
            ) from exc
        try:
            accepts_params = "params" in inspect.signature(cls).parameters
        except (TypeError, ValueError):  # pragma: no cover - builtins without signatures
            accepts_params = False
        sampler = cls(params=params or SamplingParams()) if accepts_params else cls()
    if callable(getattr(sampler, "start", None)) or callable(getattr(sampler, "run", None)):
        return sampler
    raise TypeError(
        f"sampler must be a name or an object with start(key) (TokenSampler) or run(logits_fn, matcher, ...) "
        f"(SequenceSampler); got {type(sampler).__name__}"
    )


def _diffusion_model_of(model: Any, device: Any = None, dtype: Any = None) -> Any:
    """``model`` as a ``HFMaskedDiffusionLM`` when it is a masked-diffusion checkpoint (a path or a
    loaded transformers model, see ``is_masked_diffusion_config``); otherwise ``model`` itself."""
    from engine.diffusion_lm import HFMaskedDiffusionLM, is_masked_diffusion_checkpoint, is_masked_diffusion_model

    if isinstance(model, (str, os.PathLike)):
        local = Path(model).expanduser().exists()
        if is_masked_diffusion_checkpoint(model, local_files_only=local):
            source = str(Path(model).expanduser()) if local else str(model)
            return HFMaskedDiffusionLM.from_pretrained(source, device=device, dtype=dtype, local_files_only=local)
    elif _is_transformers_model(model) and is_masked_diffusion_model(model):
        return HFMaskedDiffusionLM(model, device=device, dtype=dtype)
    return model


def _is_diffusion_model(model: Any) -> bool:
    from engine.diffusion_lm import MaskedDiffusionLM

    return isinstance(model, MaskedDiffusionLM) and not _is_transformers_model(model)


def _generate_diffusion(prompts: list, lm: Any, opts: GenerationOptions, seeds: list[int | None]) -> list[GenerationResult]:
    """``generate_batch`` for a masked-diffusion model: one canvas per prompt (``engine.diffusion``)."""
    from engine.diffusion import diffusion_decode

    tokenizer = opts.tokenizer if opts.tokenizer is not None else getattr(lm, "tokenizer", None)
    if tokenizer is None:
        raise TypeError("pass tokenizer= (a TokenVocabulary, tokenizer or path) for this diffusion model")
    vocab = load_vocabulary(tokenizer, lm, opts.compiler)
    compiler = opts.compiler if opts.compiler is not None and opts.compiler.vocab == vocab else shared_compiler(vocab)
    t0 = time.perf_counter()
    compiled = _compile_constraint(compiler, vocab, opts)
    compile_s = time.perf_counter() - t0 if compiled is not None else 0.0
    results = []
    for prompt, seed in zip(prompts, seeds):
        prompt_ids = _encode_prompt(prompt, vocab, opts.chat_template)
        generator = torch.Generator().manual_seed(int(seed)) if seed is not None else None
        start = time.perf_counter()
        out = diffusion_decode(lm, vocab, prompt_ids, compiled, canvas_length=opts.canvas_length, steps=opts.steps,
                               block_length=opts.block_length, unmasking=opts.unmasking, mode=opts.diffusion_mode,
                               temperature=opts.temperature, generator=generator)
        result = _result(out.text, out.token_ids, out.finish_reason, opts.schema, prompt_ids, compile_s)
        result.first_token_s = time.perf_counter() - start
        results.append(result)
    return results


def load_model(
    model: Any, tokenizer: Any = None, *, device: str | torch.device | None = None,
    dtype: torch.dtype | str | None = None,
) -> tuple[LanguageModel, Any]:
    """The ``LanguageModel`` for ``model`` and where its tokenizer comes from.

    ``model`` may be a ``LanguageModel``, a loaded transformers model, or a path / hub id. The
    tokenizer source is ``tokenizer`` when given, else the model's path (a path model, or a
    loaded model whose ``name_or_path`` is a local folder). A masked-diffusion checkpoint (a
    ``*ForMaskedLM``, LLaDA or Dream) gives a ``HFMaskedDiffusionLM`` instead.
    """
    diffusion = _diffusion_model_of(model, device, dtype) if not isinstance(model, LanguageModel) else model
    if diffusion is not model:
        source = tokenizer if tokenizer is not None else diffusion.tokenizer
        if source is None:
            name = str(model) if isinstance(model, (str, os.PathLike)) else getattr(model, "name_or_path", "")
            source = name if name and Path(name).expanduser().is_dir() else None
        if source is None:
            raise TypeError("pass tokenizer= (a transformers tokenizer, TokenVocabulary or path) for this model")
        return diffusion, source
    if isinstance(model, LanguageModel) and not _is_transformers_model(model):
        if device is not None or dtype is not None:
            raise ValueError("device= and dtype= apply to a transformers model or a path, not to a LanguageModel")
        if tokenizer is None:
            raise TypeError("model is a LanguageModel: pass tokenizer= (a TokenVocabulary, tokenizer or path)")
        return model, tokenizer
    if isinstance(model, (str, os.PathLike)):
        path = Path(model).expanduser()
        local = path.exists()
        source = str(path) if local else str(model)
        lm = HFCausalLM.from_pretrained(source, device=device, dtype=dtype, local_files_only=local)
        return lm, tokenizer if tokenizer is not None else (str(path) if local else str(model))
    if _is_transformers_model(model):
        lm = HFCausalLM(model, device=device, dtype=dtype)
        if tokenizer is None:
            name = getattr(model, "name_or_path", "") or getattr(model.config, "_name_or_path", "")
            if name and Path(name).is_dir():
                tokenizer = name
            else:
                raise TypeError("pass tokenizer= (a transformers tokenizer, TokenVocabulary or path) for this model")
        return lm, tokenizer
    raise TypeError(
        f"model must be a transformers model, a path, or a LanguageModel (with next_logits); got {type(model).__name__}"
    )


def load_vocabulary(tokenizer: Any, lm: LanguageModel, compiler: Compiler | None = None) -> TokenVocabulary:
    """The ``TokenVocabulary`` for ``tokenizer``, widened to the model's logits width.

    EOS ids are the tokenizer's plus the model's ``generation_config.eos_token_id`` (any of
    them ends a row, and only at an accepting state).
    """
    width = lm.logits_width
    if compiler is not None:
        vocab = compiler.vocab
    elif isinstance(tokenizer, TokenVocabulary):
        vocab = tokenizer
    elif isinstance(tokenizer, (str, os.PathLike)):
        vocab = TokenVocabulary.from_pretrained(tokenizer, logits_width=width)
    elif tokenizer is not None and hasattr(tokenizer, "convert_ids_to_tokens"):
        eos = _model_eos_ids(lm)
        base = getattr(tokenizer, "eos_token_id", None)
        if base is not None:
            eos.add(int(base))
        vocab = TokenVocabulary.from_tokenizer(tokenizer, eos_token_ids=eos or None, logits_width=width)
    else:
        raise TypeError(
            f"tokenizer must be a TokenVocabulary, a transformers tokenizer or a path; got {type(tokenizer).__name__}"
        )
    if vocab.size > width:
        raise ValueError(
            f"the tokenizer has {vocab.size} tokens but the model scores only {width}: they do not belong together"
        )
    if vocab.logits_width != width:
        if compiler is not None:
            raise ValueError(
                f"compiler's vocabulary has logits_width {vocab.logits_width} but the model has {width}; "
                f"build it as TokenVocabulary.from_...(..., logits_width={width})"
            )
        vocab = dataclasses.replace(vocab, logits_width=width)
    extra = _model_eos_ids(lm) - set(vocab.eos_token_ids)
    extra = {e for e in extra if 0 <= e < vocab.size and not vocab.token_bytes[e]}
    if extra and compiler is None:
        vocab = dataclasses.replace(
            vocab, eos_token_ids=vocab.eos_token_ids | extra, special_token_ids=vocab.special_token_ids | extra
        )
    return vocab


# --- internals ------------------------------------------------------------------------------


def _is_transformers_model(obj: Any) -> bool:
    try:
        from transformers import PreTrainedModel
    except ImportError:  # pragma: no cover - transformers is a dependency
        return False
    return isinstance(obj, PreTrainedModel)


def _model_eos_ids(lm: Any) -> set[int]:
    model = getattr(lm, "model", None)
    config = getattr(model, "generation_config", None)
    value = getattr(config, "eos_token_id", None)
    if isinstance(value, int):
        return {value}
    if isinstance(value, (list, tuple)):
        return {int(v) for v in value if isinstance(v, int)}
    return set()


def _compile_timed(
    compiler: Compiler, vocab: TokenVocabulary, opts: GenerationOptions
) -> tuple[CompiledGrammar | None, float]:
    """The constraint compiled (None: unconstrained) and the seconds it took, closing tables
    included (``budget_closing`` needs them: compile work, not decoding work)."""
    t0 = time.perf_counter()
    compiled = _compile_constraint(compiler, vocab, opts)
    if compiled is None:
        return None, 0.0
    if compiled.accepts_nothing:  # from a Compiler(allow_empty_language=True)
        raise EmptyLanguageError("the constraint accepts no output at all: nothing can be generated")
    if opts.budget_closing:
        compiled.matcher().shortest_completion()
    return compiled, time.perf_counter() - t0


def _compile_constraint(compiler: Compiler, vocab: TokenVocabulary, opts: GenerationOptions) -> CompiledGrammar | None:
    if opts.schema is not None:
        whitespace = {} if opts.whitespace is None else {"whitespace": opts.whitespace}
        return compiler.compile_json_schema(opts.schema, **whitespace)
    if opts.regex is not None:
        return compiler.compile_regex(opts.regex)
    grammar = opts.grammar
    if isinstance(grammar, CompiledGrammar):
        if grammar.vocab != vocab:
            raise ValueError(
                "grammar was compiled for a different vocabulary (or logits width) than this model's; "
                "compile it with Compiler(vocab) for the model's tokenizer, or pass the GBNF text"
            )
        return grammar
    if isinstance(grammar, Grammar):
        return compiler.compile_grammar(grammar)
    if isinstance(grammar, str) and grammar in BUILTIN_GRAMMARS:
        return compiler.compile_lark(builtin_grammar(grammar))
    return None if grammar is None else compiler.compile_gbnf(grammar)


def _stop_strings(stop: Any) -> tuple[str, ...]:
    if stop is None:
        return ()
    if isinstance(stop, str):
        stop = [stop]
    stops = tuple(stop)
    if not all(isinstance(s, str) and s for s in stops):
        raise ValueError(f"stop must be a non-empty str or a list of them, got {stop!r}")
    return stops


#: the seeds ``torch.Generator.manual_seed`` takes
_SEED_RANGE = (-(2**63), 2**64 - 1)


def _check_seed(seed: Any) -> None:
    """One seed: an int that ``torch.Generator.manual_seed`` takes (``TypeError``/``ValueError``)."""
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise TypeError(f"seed must be an int, a list of ints or None, got {type(seed).__name__} {seed!r}")
    low, high = _SEED_RANGE
    if not low <= seed <= high:
        raise ValueError(f"seed {seed} is out of range: torch seeds are in [{low}, {high}]")


def _seeds(seed: Any, n: int) -> list[int | None]:
    if seed is None:
        return [None] * n
    if isinstance(seed, bool):
        raise TypeError("seed must be an int, a list of ints or None")
    if isinstance(seed, int):
        seeds = [seed + i for i in range(n)]
        _check_seed(seeds[-1])
        return seeds
    seeds = list(seed)
    if len(seeds) != n or not all(isinstance(s, int) and not isinstance(s, bool) for s in seeds):
        raise ValueError(f"seed must be an int or a list of {n} ints (one per prompt), got {seed!r}")
    return seeds


def _encode_prompt(prompt: Any, vocab: TokenVocabulary, chat_template: bool) -> list[int]:
    if not isinstance(prompt, str):
        try:
            ids = [int(t) for t in prompt]
        except TypeError as exc:
            raise TypeError(f"a prompt must be a str or a list of token ids, got {type(prompt).__name__}") from exc
        if not ids:
            raise ValueError("an empty list of prompt token ids; pass at least one token (e.g. BOS)")
        return ids
    if chat_template:
        tok = vocab.hf_tokenizer
        if tok is None or not getattr(tok, "chat_template", None):
            raise ValueError("chat_template=True but this tokenizer has no chat template; pass a plain prompt")
        messages = [{"role": "user", "content": prompt}]
        text = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        return list(tok.encode(text, add_special_tokens=False))
    ids = vocab.encode(prompt) if prompt else []
    bos = vocab.bos_token_id
    if bos is not None and bos not in vocab.eos_token_ids and _adds_bos(vocab):
        ids = [bos] + ids
    if not ids:
        ids = [bos if bos is not None else min(vocab.eos_token_ids)]
    return ids


def _adds_bos(vocab: TokenVocabulary) -> bool:
    """Whether the tokenizer puts BOS in front of a text (Llama: yes; GPT-2: no)."""
    tok = vocab.hf_tokenizer
    if tok is None:
        return False
    try:
        ids = tok.encode("a", add_special_tokens=True)
    except Exception:  # noqa: BLE001 - exotic tokenizers: assume no BOS
        return False
    return bool(ids) and ids[0] == vocab.bos_token_id


def _sampler_key(prompt_ids: list[int], compiled: CompiledGrammar | None, budget: int | None = None) -> Hashable:
    """What a learning sampler (ASAp) keys its state by: the prompt, the constraint's content and
    the token budget when budget-aware closing narrows the constraint (``budget``).

    ``compiled.key`` (IR + vocabulary fingerprint), not ``id(compiled)``: a plain ``generate``
    call compiles afresh, and a collected grammar hands its ``id()`` on to the next object. The
    budget belongs to the key because closing is part of the constraint ASAp learns: a prefix
    with no future under 12 tokens may well have one under 256.
    """
    key = (tuple(prompt_ids), None if compiled is None else compiled.key)
    return key if budget is None else key + (("budget", budget),)


def _parse_value(text: str, schema: Any) -> Any:
    if schema is None:
        return None
    if isinstance(schema, type) and hasattr(schema, "model_validate_json"):
        try:
            return schema.model_validate_json(text)
        except ValueError:
            return None
    try:
        return json.loads(text)
    except ValueError:
        return None


def _result(text: bytes, tokens, finish, schema, prompt_ids, compile_s, out=None) -> GenerationResult:
    decoded = text.decode("utf-8", errors="replace")
    return GenerationResult(
        text=decoded,
        token_ids=list(tokens),
        finish_reason=finish,
        value=_parse_value(decoded, schema),
        prompt_token_ids=list(prompt_ids),
        compile_s=compile_s,
        first_token_s=getattr(out, "first_token_s", None),
        per_token_s=list(getattr(out, "per_token_s", [])),
        mask_wait_s=list(getattr(out, "mask_wait_s", [])),
        forced_tokens=getattr(out, "forced_tokens", 0),
        budget_steered=getattr(out, "budget_steered", 0),
        log_weight=getattr(out, "log_weight", 0.0),
    )


def _run_sequence_sampler(sampler, lm, vocab, prompt_ids, matcher, generator, max_tokens, schema, compile_s):
    """One prompt through a decoder-level sampler; the returned sequence is drawn from its weights."""
    prompt = list(prompt_ids)
    t0 = time.perf_counter()
    outcome = sampler.run(
        lambda prefixes: lm.next_logits([prompt + list(p) for p in prefixes]),
        matcher, max_tokens=max_tokens, generator=generator,
    )
    elapsed = time.perf_counter() - t0
    eos = vocab.eos_token_ids
    if any(bool(c) for c in outcome.completed):
        tokens, finish = list(outcome.sample(generator)), "stop"
    else:  # no particle finished within the budget: report the highest-weight one, truncated
        best = max(range(len(outcome.tokens)), key=lambda i: float(outcome.log_weights[i]))
        tokens, finish = list(outcome.tokens[best]), "length"
    while tokens and tokens[-1] in eos:
        tokens.pop()
    result = _result(vocab.decode(tokens), tokens, finish, schema, prompt, compile_s)
    result.log_weight = float(outcome.log_ml)
    result.first_token_s = elapsed
    return result


def _progress_bar(enabled: bool, total: int):
    if not enabled:
        return None
    try:
        from tqdm import tqdm
    except ImportError:  # pragma: no cover - tqdm is an optional dependency
        return None
    return tqdm(total=total, unit="tok", file=sys.stderr, leave=False, disable=None)
