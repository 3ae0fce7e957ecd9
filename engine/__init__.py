"""corral.engine — HOW TO RUN A MODEL: language-model adapters, the decoding loop and ``generate()``.

::

    from engine import generate
    result = generate("Name and age as JSON: ", schema=Person, model="models/tiny-json", seed=0)
    result.value, result.finish_reason

* ``generate`` / ``generate_batch`` — prompt + constraint (``schema=``, ``regex=``, ``grammar=``)
  + model -> ``GenerationResult`` (text, token ids, parsed value, finish reason, timings); every
  setting is a field of ``GenerationOptions``, passed by name or as ``options=``.
* ``infill`` — fill the holes of ``x1 □ x2 □ … □ xn`` with a causal or fill-in-the-middle model,
  every token checked for completability (``engine.infill``).
* ``LanguageModel`` — the two-member seam decoders need (``logits_width``, ``next_logits``);
  ``HFCausalLM`` adapts any transformers causal LM (KV cache reuse, crop on rollback);
  ``ScriptedLM`` is the mock for tests.
* ``MaskedDiffusionLM`` — the seam diffusion decoders need (``canvas_logits``: logits for every
  position of partly masked canvases); ``HFMaskedDiffusionLM`` adapts BERT-style masked LMs and
  LLaDA/Dream checkpoints; ``ScriptedDiffusionLM`` is its mock.
* ``decode`` — the autoregressive loop (mask, apply, sample, advance; EOS only when accepting;
  forced-token fast-forward; budget-aware closing via ``ClosingPlanner``; stop strings).
  ``engine.diffusion`` decodes canvases for a ``MaskedDiffusionLM`` (``generate`` dispatches on
  the model), ``speculative_decode`` drafts with ``DraftModel`` / ``PromptLookup`` /
  ``ForcedTokens`` / ``DraftTree`` (token trees, one verification pass) / ``JacobiDraft`` /
  ``DiffusionDraft`` (a masked-diffusion model drafting a block in one pass) and verifies
  losslessly (``generate(..., draft_model=...)``).
* ``CorralLogitsProcessor`` — a transformers ``LogitsProcessor`` shim for ``model.generate``;
  the engine loop above is the primary path. ``CorralCanvasProcessor`` (``engine.diffusion_hook``)
  does the same for DiffusionGemma's block-diffusion ``generate``: every canvas it emits is valid.
* ``python -m engine.cli`` / ``corral`` — ``generate``, ``compile``, ``check``, ``bench``;
  ``python -m engine.tiny`` trains the tiny JSON model used by demos and tests; ``engine.tiny_code``
  a C++ model with fill-in-the-middle; ``engine.tiny_diffusion`` a masked-diffusion model.

Imports ``samplers`` and ``grammars``; never ``jsonschemabench``.
"""

from engine.closing import ClosingPlanner, Completion
from engine.decoding import DecodeOptions, SequenceOutput, decode
from engine.diffusion_lm import HFMaskedDiffusionLM, MaskedDiffusionLM, ScriptedDiffusionLM
from engine.generate import (
    GenerationOptions,
    GenerationResult,
    SequenceSampler,
    generate,
    generate_batch,
    resolve_sampler,
)
from engine.infill import FIMTokens, HoleReport, InfillResult, UncompletableError, infill
from engine.lm import HFCausalLM, LanguageModel, ScriptedLM
from engine.speculative import DraftModel, ForcedTokens, GoodputController, PromptLookup, speculative_decode
from engine.diffusion_draft import DiffusionDraft
from engine.jacobi import JacobiDraft
from engine.spec_tree import DraftTree

__all__ = [
    "generate",
    "generate_batch",
    "infill",
    "InfillResult",
    "HoleReport",
    "FIMTokens",
    "UncompletableError",
    "GenerationOptions",
    "GenerationResult",
    "LanguageModel",
    "HFCausalLM",
    "ScriptedLM",
    "MaskedDiffusionLM",
    "HFMaskedDiffusionLM",
    "ScriptedDiffusionLM",
    "decode",
    "DecodeOptions",
    "SequenceOutput",
    "ClosingPlanner",
    "Completion",
    "SequenceSampler",
    "resolve_sampler",
    "CorralLogitsProcessor",
    "CorralCanvasProcessor",
    "CanvasHookError",
    "speculative_decode",
    "DraftModel",
    "PromptLookup",
    "ForcedTokens",
    "GoodputController",
    "DiffusionDraft",
    "DraftTree",
    "JacobiDraft",
]


def __getattr__(name: str):
    # CorralLogitsProcessor subclasses transformers.LogitsProcessor: import transformers only
    # when it is asked for, so ``from engine import generate`` stays light.
    if name == "CorralLogitsProcessor":
        from engine.hf import CorralLogitsProcessor

        return CorralLogitsProcessor
    if name in ("CorralCanvasProcessor", "CanvasHookError"):
        from engine import diffusion_hook

        return getattr(diffusion_hook, name)
    raise AttributeError(f"module 'engine' has no attribute {name!r}")
