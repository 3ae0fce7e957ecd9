"""Sampler benchmark: distance to the grammar-conditioned model (masked, ASAp, SMC) and AWRS's cost.

``python -m jsonschemabench samplers [--quick] [--out DIR] [--model DIR | --tokenizer PATH] [--lm MODULE:FACTORY]``

**Part 1 — quality on GAD-style tasks** (grammar-aligned decoding, Park et al. 2024). Two small
finite grammars built here — ``sygus``, a SyGuS-like bit-vector expression ``(bvand x #x1)``, and
``json``, a two-field JSON object — over tiny vocabularies with multi-character tokens, and a
scripted model (``samplers.enumerate.hashed_logits_fn``: pseudo-random logits per prefix, most
mass on tokens the grammar forbids, which is what makes masking distort). Exact enumeration gives
the target ``Q(y) ∝ P(y)·1[y ∈ L]``. For each sample budget ``n`` the table reports KL(· || Q) and
total variation of

- ``masked``: the exact GCD distribution (flat in ``n``) and the empirical distribution of ``n``
  masked samples;
- ``asap``: ASAp's exact proposal after ``n`` samples (from its trie) and the empirical distribution
  of those ``n`` samples;
- ``smc``: the weighted posterior of one SMC run with ``n`` particles (AWRS proposals), mean over
  seeds.

The ASAp row also gives the sampler's wall time per sample next to masked sampling's.

**Part 2 — AWRS cost on a real vocabulary** (Llama 3, 128,256 tokens) on GBNF grammars (and a few
MaskBench JSON Schemas when the JSON Schema front end compiles them). The model is a scripted
*agreement LM*: pseudo-random logits over the whole vocabulary, shifted so that the grammar-allowed
tokens carry exactly ``agreement`` of the probability (0.99, 0.9, 0.5), plus a push toward the
tokens of a reference document while the sample follows it (so documents look real and end). It
uses its own compiled grammar, so its masks warm no sampler's caches. AWRS drives the sequence;
at every step the masked sampler (own compiled grammar) and ASAp (own grammar, in a second pass
that it drives) are timed on the same state. Reported per token: ``allows`` checks (a full mask
decides all 128,256 tokens), full-mask fallbacks, and draw wall time (model time excluded).

**With a trained model** (``--model models/tiny-json``, from ``python -m engine.tiny``), both parts
use it instead of scripted logits: Part 1 runs ``MODEL_TASKS`` (the same sygus grammar and a
smaller JSON one, whose token languages under a 50K-token vocabulary stay enumerable), prompted
in the model's training format; Part 2 lets the model write JSON for held-out MaskBench schemas,
AWRS driving, and times masked sampling and the model's forward pass on the same states.

Or plug in any model with ``--lm package.module:factory``: ``factory()`` returns ``(vocab, model)``,
``model`` either ``next_logits(prefixes) -> [batch, width]`` (engine ``LanguageModel``) or a
per-prefix callable; Part 1 then compiles its grammars against that vocabulary (exact enumeration
over a real tokenizer's token language can be large; keep the grammars tiny).

Writes ``samplers.md`` (tables), ``samplers.json`` (raw numbers) and ``samplers_kl.png`` (needs
matplotlib, the ``bench`` extra: without it the run says so and lists it under ``skipped_outputs``)
to ``--out`` (default ``bench-results/samplers``, git-ignored).
"""

from __future__ import annotations

import argparse
import importlib
import json
import math
import os
import statistics
import time
import zlib
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable, Sequence

import numpy as np
import torch

from grammars import Compiler, TokenVocabulary, allocate_token_bitmask
from samplers import ASAp, AWRS, SMC, MaskedSampler
from samplers.enumerate import (
    batched,
    empirical,
    exact_asap,
    exact_masked,
    exact_target,
    kl_divergence,
    total_variation,
)
from samplers.kernels import bitmask_to_bool
from samplers.masked import masked_distribution

from engine.tiny import PROMPT_TEMPLATE

from . import outputs
from .report import skip_notes
from .samples import GBNF_SAMPLES

__all__ = ["GadTask", "GAD_TASKS", "MODEL_TASKS", "AgreementLM", "PromptedLM", "load_model", "run_quality", "run_cost",
           "run_cost_model", "add_arguments", "main"]

# --- Part 1: GAD-style quality -------------------------------------------------------------------


@dataclass(frozen=True)
class GadTask:
    """A small finite grammar (GBNF) with the tiny vocabulary it is decoded with."""

    name: str
    gbnf: str
    pieces: tuple[bytes, ...]
    max_tokens: int = 16
    seed: int = 0
    #: per-prefix share of probability on grammar-allowed tokens, drawn uniformly in this range
    agreement: tuple[float, float] = (0.3, 0.97)
    #: text a real model is conditioned on (the scripted model ignores it)
    prompt: str = ""


_SYGUS = r"""
root ::= "(" op " " arg " " arg ")"
op   ::= "bvand" | "bvor" | "bvxor"
arg  ::= "x" | "y" | "#x0" | "#x1"
"""

_JSON = r"""
root ::= "{\"name\": \"" name "\", \"ok\": " val "}"
name ::= "ann" | "bob" | "al"
val  ::= "true" | "false" | "null"
"""

GAD_TASKS: tuple[GadTask, ...] = (
    GadTask(
        "sygus",
        _SYGUS,
        (b"(", b")", b" ", b"bv", b"and", b"or", b"xor", b"bvand", b"bvor", b"x", b"y", b"#x", b"0", b"1",
         b"#x0", b"#x1", b" x", b" y", b" #x", b"b", b"v", b"a", b"n", b"d"),
        seed=3,
    ),
    GadTask(
        "json",
        _JSON,
        (b'{"name": "', b'{"', b'name": "', b"ann", b"a", b"nn", b"bob", b"b", b"ob", b"al", b"l",
         b'", "ok": ', b'", "', b'ok": ', b"true", b"tr", b"ue", b"false", b"fal", b"se", b"null", b"nu",
         b"ll", b"}"),
        seed=1,
    ),
)


_JSON_SMALL = r"""
root ::= "{\"ok\":" val "}"
val  ::= "true" | "false" | "null" | "0" | "1" | "\"yes\"" | "\"no\""
"""

_JSON_ARRAY = r"""
root ::= "[" v ("," v)? "]"
v    ::= "0" | "1" | "true" | "null"
"""

#: Tasks for a real model and its own tokenizer. Exact enumeration covers *every* tokenization of
#: every string of the language, which grows fast with a 50K-token vocabulary: with GPT-2's, sygus
#: has 832 token sequences (2,380 prefixes) and this compact JSON task 424 (1,158); the array task 272 (766); the two-field
#: JSON task above has too many. The prompt is the tiny model's training format. The tiny model
#: puts almost no probability on sygus (Z ~ 1e-29): it shows masking's distortion at its extreme.
MODEL_TASKS: tuple[GadTask, ...] = (
    GadTask("sygus", _SYGUS, (), max_tokens=24, seed=3, prompt=PROMPT_TEMPLATE.format(schema='{"type":"string"}')),
    GadTask("json", _JSON_SMALL, (), max_tokens=24, seed=1,
            prompt=PROMPT_TEMPLATE.format(schema='{"type":"object","required":["ok"]}')),
    GadTask("json_array", _JSON_ARRAY, (), max_tokens=24, seed=2,
            prompt=PROMPT_TEMPLATE.format(schema='{"type":"array","maxItems":2}')),
)


class PromptedLM:
    """A ``LanguageModel`` seen through a fixed prompt, one generated prefix at a time, memoised.

    Exact enumeration, ASAp's proposal and thousands of samples all query the same few thousand
    prefixes of a small finite language; the model is deterministic, so each prefix's logits are
    computed once (a 50K-wide float row each: a few hundred MB for the tasks above).
    """

    def __init__(self, lm, prompt_ids: Sequence[int]):
        self.lm = lm
        self.prompt_ids = list(prompt_ids)
        self.name = getattr(lm, "name", type(lm).__name__)
        self._memo: dict[tuple[int, ...], torch.Tensor] = {}
        self.forward_calls = 0
        self.forward_s = 0.0

    def __call__(self, prefix: Sequence[int]) -> torch.Tensor:
        key = tuple(int(t) for t in prefix)
        hit = self._memo.get(key)
        if hit is None:
            self.forward_calls += 1
            t0 = time.perf_counter()
            hit = self.lm.next_logits([self.prompt_ids + list(key)])[0].float().cpu()
            self.forward_s += time.perf_counter() - t0
            self._memo[key] = hit
        return hit


def load_model(model_dir: Path) -> tuple[TokenVocabulary, object]:
    """The vocabulary and an ``HFCausalLM`` for a ``save_pretrained`` folder (e.g. ``python -m engine.tiny``)."""
    from engine import HFCausalLM

    lm = HFCausalLM.from_pretrained(model_dir, local_files_only=True)
    lm.name = f"{Path(model_dir).name} ({type(lm.model).__name__})"
    vocab = TokenVocabulary.from_pretrained(model_dir, logits_width=lm.logits_width)
    return vocab, lm


def _vocab_for(task: GadTask) -> TokenVocabulary:
    pieces = list(task.pieces) + [b""]
    return TokenVocabulary.from_bytes(pieces, eos_token_ids=[len(pieces) - 1], name=f"gad-{task.name}")


def _per_prefix(model) -> Callable[[Sequence[int]], torch.Tensor]:
    if hasattr(model, "next_logits"):
        return lambda prefix: model.next_logits([list(prefix)])[0]
    return model


def run_quality(
    budgets: Sequence[int], smc_seeds: int, lm_factory: Callable | None = None, log=print,
    model: tuple[TokenVocabulary, object] | None = None,
) -> list[dict]:
    """Part 1: one row per (task, method, budget) with KL/TV to the exact target.

    ``model``: ``(vocab, LanguageModel)`` from ``load_model`` — the ``MODEL_TASKS`` run with it,
    prompted. ``lm_factory``: a ``--lm`` factory returning ``(vocab, model)``, run unprompted on
    ``GAD_TASKS``. Neither: the scripted agreement model on ``GAD_TASKS``' own tiny vocabularies.
    """
    rows: list[dict] = []
    for task in MODEL_TASKS if model is not None else GAD_TASKS:
        if model is not None:
            vocab, base = model
            lm = PromptedLM(base, vocab.encode(task.prompt))
            lm_name = f"{lm.name}, prompt {task.prompt!r}"
        elif lm_factory is None:
            vocab = _vocab_for(task)
            own = Compiler(vocab).compile_gbnf(task.gbnf)
            lm = AgreementLM(own, vocab.logits_width, task.agreement, [], seed=task.seed)
            lm_name = f"scripted agreement LM (agreement ~ U{task.agreement}, seed {task.seed})"
        else:
            vocab, factory_model = lm_factory()
            lm = _per_prefix(factory_model)
            lm_name = getattr(factory_model, "name", type(factory_model).__name__)
            task = replace(task, max_tokens=64)  # a real tokenizer may spell the strings with many more tokens
        grammar = Compiler(vocab).compile_gbnf(task.gbnf)
        width = vocab.logits_width
        target, z = exact_target(lm, grammar.matcher(), width, max_tokens=task.max_tokens)
        gcd = exact_masked(lm, grammar.matcher(), width, max_tokens=task.max_tokens)
        log(f"[quality] {task.name}: |L| = {len(target)} token sequences, Z = P(y in L) = {z:.4g}, "
            f"KL(GCD||Q) = {kl_divergence(gcd, target):.3f}")
        top = max(budgets)
        gen = torch.Generator().manual_seed(0)
        masked_sampler, asap = MaskedSampler(), ASAp()
        masked: list[tuple[int, ...]] = []
        asap_samples: list[tuple[int, ...]] = []
        asap_exact: dict[int, float] = {}
        clock = {"masked": [0.0, 0.0], "asap": [0.0, 0.0]}  # [draw seconds, total seconds]
        for n in range(top + 1):
            if n in budgets:
                asap_exact[n] = kl_divergence(
                    exact_asap(asap, "task", lm, grammar.matcher(), width, max_tokens=task.max_tokens), target
                )
            if n == top:
                break
            # interleaved, so that load on the machine hits both samplers alike
            for name, sampler, out in (("masked", masked_sampler, masked), ("asap", asap, asap_samples)):
                tokens, draw_s, total_s = _timed_decode(sampler, "task", lm, grammar, task.max_tokens, gen)
                clock[name][0] += draw_s
                clock[name][1] += total_s
                out.append(tuple(tokens))
        ms = {k: (1e3 * v[0] / top, 1e3 * v[1] / top) for k, v in clock.items()}
        base = {"task": task.name, "lm": lm_name, "sequences": len(target), "Z": z}
        if isinstance(lm, PromptedLM):  # memoised: sample times hold no model time; report a forward's
            base["forward_ms"] = 1e3 * lm.forward_s / max(1, lm.forward_calls)
            base["tokens_per_sample"] = statistics.fmean(len(y) for y in masked + asap_samples)
        for n in sorted(budgets):
            emp_m, emp_a = empirical(masked[:n]), empirical(asap_samples[:n])
            rows.append({**base, "method": "masked (exact GCD)", "n": n,
                         "kl": kl_divergence(gcd, target), "tv": total_variation(gcd, target)})
            rows.append({**base, "method": "masked (empirical)", "n": n,
                         "kl": kl_divergence(emp_m, target), "tv": total_variation(emp_m, target),
                         "draw_ms_per_sample": ms["masked"][0], "ms_per_sample": ms["masked"][1]})
            rows.append({**base, "method": "asap (exact proposal)", "n": n, "kl": asap_exact[n],
                         "tv": float("nan")})
            rows.append({**base, "method": "asap (empirical)", "n": n,
                         "kl": kl_divergence(emp_a, target), "tv": total_variation(emp_a, target),
                         "draw_ms_per_sample": ms["asap"][0], "ms_per_sample": ms["asap"][1]})
            kls, tvs = [], []
            for seed in range(smc_seeds):
                result = SMC(particles=n).run(batched(lm), grammar.matcher(), max_tokens=task.max_tokens,
                                              generator=torch.Generator().manual_seed(1000 + seed))
                post = result.posterior()
                kls.append(kl_divergence(post, target) if post else float("inf"))
                tvs.append(total_variation(post, target) if post else 1.0)
            rows.append({**base, "method": "smc (AWRS, n particles)", "n": n,
                         "kl": float(np.mean(kls)), "tv": float(np.mean(tvs))})
        log(f"[quality] {task.name}: ASAp exact KL {asap_exact[min(budgets)]:.3f} -> {asap_exact[top]:.4f} "
            f"after {top} samples; draw ms/sample masked {ms['masked'][0]:.2f}, asap {ms['asap'][0]:.2f} "
            f"(with the scripted model: {ms['masked'][1]:.2f}, {ms['asap'][1]:.2f})")
    return rows


def _timed_decode(sampler, key, lm, grammar, max_tokens, gen) -> tuple[list[int], float, float]:
    """``reference_decode`` with the sampler's own time (start, draws, finish) measured apart."""
    matcher = grammar.matcher()
    t_all = time.perf_counter()
    t0 = time.perf_counter()
    run = sampler.start(key)
    draw_s = time.perf_counter() - t0
    tokens: list[int] = []
    while not matcher.is_terminated() and len(tokens) < max_tokens:
        logits = lm(tokens)
        t0 = time.perf_counter()
        token = run.draw(logits, matcher, gen).token
        draw_s += time.perf_counter() - t0
        matcher.advance(token)
        tokens.append(token)
    t0 = time.perf_counter()
    run.finish(tokens, matcher.is_terminated())
    draw_s += time.perf_counter() - t0
    return tokens, draw_s, time.perf_counter() - t_all


# --- Part 2: AWRS cost on a real vocabulary ---------------------------------------------------


class AgreementLM:
    """A scripted model over a real vocabulary whose agreement with a grammar is a parameter.

    Logits are ``sigma``·N(0,1), seeded by a hash of the prefix, plus ``follow`` on the next token
    of ``reference`` while the prefix equals the reference's, then shifted on the grammar-allowed
    tokens so that they carry exactly ``agreement`` of the probability (``None``: no shift, a
    random model that ignores the grammar once off the reference) — a number, or a range
    ``(lo, hi)`` from which each prefix draws its own (so the expected future grammaticality
    differs between prefixes, which is what makes masking distort). Uses its own matcher of
    ``grammar``, advanced along the prefixes it is asked about (cheapest when they grow one token
    at a time).
    """

    def __init__(self, grammar, width: int, agreement: float | tuple[float, float] | None,
                 reference: Sequence[int], *, seed: int = 0, sigma: float = 2.0, follow: float = 8.0):
        bounds = agreement if isinstance(agreement, tuple) else (agreement, agreement)
        if agreement is not None and not 0.0 < bounds[0] <= bounds[1] < 1.0:
            raise ValueError("agreement must be in (0, 1), or None for no shift")
        self.grammar, self.width, self.agreement = grammar, width, agreement
        self.reference, self.seed, self.sigma, self.follow = list(reference), seed, sigma, follow
        self._matcher = grammar.matcher()
        self._prefix: list[int] = []
        self._words = allocate_token_bitmask(1, width)

    def _sync(self, prefix: Sequence[int]) -> None:
        if list(prefix[: len(self._prefix)]) != self._prefix or len(prefix) < len(self._prefix):
            self._matcher = self.grammar.matcher()
            self._prefix = []
        for t in prefix[len(self._prefix):]:
            self._matcher.advance(int(t))
            self._prefix.append(int(t))

    def __call__(self, prefix: Sequence[int]) -> torch.Tensor:
        self._sync(prefix)
        digest = zlib.crc32(np.asarray([self.seed, *prefix], dtype=np.int64).tobytes())
        gen = torch.Generator().manual_seed(digest)
        logits = self.sigma * torch.randn(self.width, generator=gen)
        agreement = self.agreement
        if isinstance(agreement, tuple):
            agreement = agreement[0] + (agreement[1] - agreement[0]) * float(torch.rand((), generator=gen))
        self._matcher.fill_mask(self._words, 0)
        allowed = bitmask_to_bool(torch.from_numpy(self._words[0]), self.width)
        k = len(prefix)
        if k < len(self.reference) and list(prefix) == self.reference[:k] and bool(allowed[self.reference[k]]):
            logits[self.reference[k]] += self.follow
        if agreement is None or allowed.all() or not allowed.any():
            return logits
        inside = torch.logsumexp(logits[allowed], 0)
        outside = torch.logsumexp(logits[~allowed], 0)
        shift = math.log(agreement) - math.log1p(-agreement) + float(outside - inside)
        return logits + shift * allowed.float()


@dataclass
class _Timer:
    ns: list[int] = field(default_factory=list)
    checks: int = 0
    fallbacks: int = 0

    def ms(self) -> tuple[float, float]:
        if not self.ns:
            return float("nan"), float("nan")
        return statistics.fmean(self.ns) / 1e6, statistics.median(self.ns) / 1e6


def _timed_step(logits: torch.Tensor, runs: dict, matchers: dict, timers: dict, gen) -> object:
    """One step timed for every sampler on the same state (each run with its own matcher), then the
    mask and renormalisation alone (``masked_distribution`` on ``matchers["maskonly"]``, no
    sampling); returns the draw of the first run, which drives the sequence."""
    driver = None
    for k, run in runs.items():
        t0 = time.perf_counter_ns()
        draw = run.draw(logits, matchers[k], gen)
        timers[k].ns.append(time.perf_counter_ns() - t0)
        timers[k].checks += draw.checks
        driver = draw if driver is None else driver
    t0 = time.perf_counter_ns()
    masked_distribution(logits, matchers["maskonly"])
    timers["maskonly"].ns.append(time.perf_counter_ns() - t0)
    return driver


def _workloads(vocab, schemas: int, log) -> list[tuple[str, Callable[[Compiler], object], list[list[int]]]]:
    """(name, compile(compiler), reference token lists ending with EOS) for Part 2."""
    eos = min(vocab.eos_token_ids)
    out = []
    shared = Path(os.environ.get("CORRAL_SHARED_DIR", Path(__file__).resolve().parent.parent.parent / "shared"))
    for name in ("json", "arithmetic"):
        path = shared / "gbnf" / f"{name}.gbnf"
        if not path.exists():
            log(f"[cost] skipping {name}: {path} not found (set CORRAL_SHARED_DIR)")
            continue
        text = path.read_text()
        refs = [vocab.encode(s) + [eos] for s in GBNF_SAMPLES[name]]
        out.append((f"gbnf:{name}", lambda c, text=text: c.compile_gbnf(text), refs))
    folder = shared / "jsonschemabench" / "maskbench"
    if schemas and folder.is_dir():
        for path in sorted(folder.glob("*.json"))[:: max(1, len(list(folder.glob("*.json"))) // (4 * schemas))]:
            if len([w for w in out if w[0].startswith("schema:")]) >= schemas:
                break
            doc = json.loads(path.read_text())
            tests = [t["data"] for t in doc.get("tests", []) if t.get("valid")]
            if not tests:
                continue
            try:
                Compiler(vocab).compile_json_schema(doc["schema"])
            except Exception as exc:  # the front end may not support it (or exist yet)
                log(f"[cost] skipping schema {path.stem}: {type(exc).__name__}: {str(exc)[:80]}")
                continue
            refs = [vocab.encode(json.dumps(t)) + [eos] for t in tests[:2]]
            out.append((f"schema:{path.stem}", lambda c, s=doc["schema"]: c.compile_json_schema(s), refs))
    return out


def run_cost(vocab: TokenVocabulary, agreements: Sequence[float], docs: int, max_tokens: int, schemas: int,
             log=print) -> list[dict]:
    """Part 2: per (workload, agreement), checks and draw times per token."""
    torch.set_num_threads(1)
    rows = []
    width = vocab.logits_width
    for name, compile_fn, refs in _workloads(vocab, schemas, log):
        for agreement in agreements:
            grammars = {k: compile_fn(Compiler(vocab)) for k in ("lm", "awrs", "auto", "masked", "masked2", "asap")}
            timers = {k: _Timer() for k in ("awrs", "auto", "masked", "masked2", "asap", "maskonly")}
            grammars["maskonly"] = compile_fn(Compiler(vocab))
            samplers = {"awrs": AWRS(), "auto": AWRS(estimator="auto"), "masked": MaskedSampler(),
                        "masked2": MaskedSampler()}
            asap = ASAp()
            tokens_total = 0
            for d in range(docs):
                ref = refs[d % len(refs)]
                lm = AgreementLM(grammars["lm"], width, agreement, ref, seed=d)
                gen = torch.Generator().manual_seed(d)
                # pass A: AWRS drives; masked and AWRS(auto) are timed on the same states
                matchers = {k: grammars[k].matcher() for k in ("awrs", "auto", "masked", "maskonly")}
                runs = {k: samplers[k].start() for k in ("awrs", "auto", "masked")}
                prefix: list[int] = []
                while len(prefix) < max_tokens and not matchers["awrs"].is_terminated():
                    token = _timed_step(lm(prefix), runs, matchers, timers, gen).token
                    for m in matchers.values():
                        m.advance(token)
                    prefix.append(token)
                tokens_total += len(prefix)
                # pass B: ASAp drives; masked timed on the same states (own grammar)
                lm = AgreementLM(grammars["lm"], width, agreement, ref, seed=d)
                m_asap, m_masked = grammars["asap"].matcher(), grammars["masked2"].matcher()
                run_a, run_m = asap.start(("bench", name)), samplers["masked2"].start()
                prefix = []
                while len(prefix) < max_tokens and not m_asap.is_terminated():
                    logits = lm(prefix)
                    t0 = time.perf_counter_ns()
                    token = run_a.draw(logits, m_asap, gen).token
                    timers["asap"].ns.append(time.perf_counter_ns() - t0)
                    t0 = time.perf_counter_ns()
                    run_m.draw(logits, m_masked, gen)
                    timers["masked2"].ns.append(time.perf_counter_ns() - t0)
                    m_asap.advance(token)
                    m_masked.advance(token)
                    prefix.append(token)
                run_a.finish(prefix, m_asap.is_terminated())
            timers["awrs"].fallbacks = samplers["awrs"].stats.mask_fallbacks
            timers["auto"].fallbacks = samplers["auto"].stats.mask_fallbacks
            n = max(1, len(timers["awrs"].ns))
            row = {"workload": name, "agreement": agreement, "tokens": tokens_total}
            for k, label in (("awrs", "awrs"), ("auto", "awrs_auto")):
                mean, median = timers[k].ms()
                row[f"{label}_checks"] = timers[k].checks / n
                row[f"{label}_fallbacks"] = timers[k].fallbacks / n
                row[f"{label}_ms"] = mean
                row[f"{label}_ms_median"] = median
            row["masked_checks"] = width
            row["masked_ms"], row["masked_ms_median"] = timers["masked"].ms()
            row["mask_only_ms"], row["mask_only_ms_median"] = timers["maskonly"].ms()
            row["asap_ms"], row["asap_ms_median"] = timers["asap"].ms()
            row["masked_ms_asap_pass"], row["masked_ms_median_asap_pass"] = timers["masked2"].ms()
            rows.append(row)
            log(f"[cost] {name} agreement={agreement}: {tokens_total} tokens, AWRS {row['awrs_checks']:.2f} "
                f"checks/token ({row['awrs_ms']:.2f} ms, {row['awrs_fallbacks']:.2f} fallbacks), auto "
                f"{row['awrs_auto_checks']:.2f} ({row['awrs_auto_ms']:.2f} ms), mask+renorm "
                f"{row['mask_only_ms']:.2f} ms, masked {row['masked_ms']:.2f} ms; "
                f"ASAp {row['asap_ms']:.2f} ms vs masked {row['masked_ms_asap_pass']:.2f} ms")
    return rows


def _held_out_schemas(vocab: TokenVocabulary, count: int, log) -> list[tuple[str, object, str]]:
    """``(name, schema, prompt)`` for the first ``count`` held-out MaskBench schemas corral compiles.

    Held out from the tiny model's training (``engine.tiny.load_examples``), so the model's
    agreement with the grammar is what it would be on an unseen schema.
    """
    from engine.tiny import load_examples

    folder = Path(os.environ.get("CORRAL_SHARED_DIR", Path("..") / "shared")) / "jsonschemabench" / "maskbench"
    if not folder.is_dir():
        log(f"[cost] {folder} not found (set CORRAL_SHARED_DIR): no schemas")
        return []
    _, held = load_examples(folder)
    out: list[tuple[str, object, str]] = []
    compiler = Compiler(vocab)
    for example in held:
        if len(out) >= count:
            break
        if any(name == example.source for name, _, _ in out):
            continue
        try:
            compiler.compile_json_schema(example.schema)
        except Exception as exc:  # unsupported or malformed: not part of this measurement
            log(f"[cost] skipping {example.source}: {type(exc).__name__}")
            continue
        out.append((example.source, example.schema, example.prompt))
    return out


def run_cost_model(vocab: TokenVocabulary, lm, schemas: int, max_tokens: int, seeds: int = 1,
                   log=print) -> list[dict]:
    """Part 2 with a real model: AWRS vs full masking while the model writes JSON for each schema.

    AWRS drives the sequence (sampling at temperature 1 from the model prompted with the schema);
    at every step the masked sampler and the mask alone (``masked_distribution``) are timed on
    the same state with their own compiled grammars, so neither warms the other's caches. The
    model's forward time is measured apart.
    """
    torch.set_num_threads(1)
    rows = []
    held = _held_out_schemas(vocab, schemas, log)
    workloads = [(f"schema:{name}", lambda c, s=schema: c.compile_json_schema(s), prompt) for name, schema, prompt in held]
    json_gbnf = Path(os.environ.get("CORRAL_SHARED_DIR", Path("..") / "shared")) / "gbnf" / "json.gbnf"
    if json_gbnf.exists():  # the same prompts under any-JSON: where the tiny model agrees with the grammar
        text = json_gbnf.read_text()
        workloads += [(f"json.gbnf:{name}", lambda c: c.compile_gbnf(text), prompt) for name, _, prompt in held]
    for name, compile_fn, prompt in workloads:
        prompt_ids = vocab.encode(prompt)
        kinds = ("awrs", "auto", "recursive", "unweighted", "unpruned", "masked", "maskonly")
        compiled = {k: compile_fn(Compiler(vocab)) for k in kinds}
        awrs, auto, recursive = AWRS(), AWRS(estimator="auto"), AWRS(estimator="recursive")
        unweighted = AWRS(weight=False)
        unpruned, masked = AWRS(prune=False), MaskedSampler()
        timers = {k: _Timer() for k in kinds + ("model",)}
        words = allocate_token_bitmask(1, vocab.logits_width)
        allowed_mass: list[float] = []
        step_checks: list[int] = []
        tokens_total = finished = 0
        for seed in range(seeds):
            gen = torch.Generator().manual_seed(seed)
            matchers = {k: g.matcher() for k, g in compiled.items()}
            runs = {"awrs": awrs.start(), "auto": auto.start(), "recursive": recursive.start(),
                    "unweighted": unweighted.start(),
                    "unpruned": unpruned.start(), "masked": masked.start()}
            prefix: list[int] = []
            while len(prefix) < max_tokens and not matchers["awrs"].is_terminated():
                t0 = time.perf_counter_ns()
                logits = lm.next_logits([prompt_ids + prefix])[0].float()
                timers["model"].ns.append(time.perf_counter_ns() - t0)
                draw = _timed_step(logits, runs, matchers, timers, gen)
                token = draw.token
                step_checks.append(draw.checks)
                matchers["maskonly"].fill_mask(words, 0)  # untimed: the model's mass on allowed tokens
                allowed = bitmask_to_bool(torch.from_numpy(words[0]), vocab.logits_width)
                allowed_mass.append(float(torch.softmax(logits, -1)[allowed].sum()))
                for m in matchers.values():
                    m.advance(token)
                prefix.append(token)
            tokens_total += len(prefix)
            finished += matchers["awrs"].is_terminated()
        n = max(1, len(timers["awrs"].ns))
        row = {"workload": name, "agreement": "model", "tokens": tokens_total, "finished": finished,
               "sequences": seeds, "awrs_checks": timers["awrs"].checks / n,
               "awrs_checks_median": statistics.median(step_checks) if step_checks else float("nan"),
               "awrs_fallbacks": awrs.stats.mask_fallbacks / n, "masked_checks": vocab.logits_width,
               "awrs_unpruned_checks": timers["unpruned"].checks / n,
               "awrs_auto_checks": timers["auto"].checks / n,
               "awrs_recursive_checks": timers["recursive"].checks / n,
               "awrs_unweighted_checks": timers["unweighted"].checks / n,
               "awrs_unpruned_fallbacks": unpruned.stats.mask_fallbacks / n,
               "allowed_mass_mean": statistics.fmean(allowed_mass) if allowed_mass else float("nan"),
               "allowed_mass_median": statistics.median(allowed_mass) if allowed_mass else float("nan")}
        for k, label in (("awrs", "awrs"), ("auto", "awrs_auto"), ("recursive", "awrs_recursive"),
                         ("unweighted", "awrs_unweighted"),
                         ("unpruned", "awrs_unpruned"), ("masked", "masked"),
                         ("maskonly", "mask_only"), ("model", "model")):
            row[f"{label}_ms"], row[f"{label}_ms_median"] = timers[k].ms()
        rows.append(row)
        log(f"[cost] {name}: {tokens_total} tokens ({finished}/{seeds} finished), allowed mass "
            f"{row['allowed_mass_median']:.3f} (median), AWRS {row['awrs_checks']:.2f} "
            f"checks/token ({row['awrs_ms']:.2f} ms), mask+renorm {row['mask_only_ms']:.2f} ms, masked "
            f"{row['masked_ms']:.2f} ms, model {row['model_ms']:.2f} ms")
    return rows


# --- reporting ---------------------------------------------------------------------------------


def _fmt(x: float, digits: int = 3) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "—"
    if math.isinf(x):
        return "inf"
    return f"{x:.{digits}f}" if abs(x) >= 10 ** (-digits) or x == 0 else f"{x:.1e}"


def render_markdown(quality: list[dict], cost: list[dict], meta: dict) -> str:
    model_cost = [r for r in cost if r["agreement"] == "model"]
    cost = [r for r in cost if r["agreement"] != "model"]
    lines = ["# Sampler benchmark", "", f"Machine: {meta['machine']}; torch threads 1; {meta['when']}.", ""]
    if quality:
        lines += ["## Part 1 — KL(· || Q) and TV to the grammar-conditioned model", ""]
        for task in dict.fromkeys(r["task"] for r in quality):
            rows = [r for r in quality if r["task"] == task]
            budgets = sorted(dict.fromkeys(r["n"] for r in rows))
            first = rows[0]
            lines += [f"### {task} — |L| = {first['sequences']} token sequences, Z = {first['Z']:.4g}, "
                      f"model {first['lm']}", ""]
            lines += ["| method | " + " | ".join(f"n={n}" for n in budgets) + " |",
                      "|---|" + "---|" * len(budgets)]
            for method in dict.fromkeys(r["method"] for r in rows):
                cells = []
                for n in budgets:
                    r = next(x for x in rows if x["method"] == method and x["n"] == n)
                    tv = "" if math.isnan(r["tv"]) else f" / {_fmt(r['tv'], 2)}"
                    cells.append(_fmt(r["kl"]) + tv)
                lines.append(f"| {method} | " + " | ".join(cells) + " |")
            m = next(r for r in rows if r["method"] == "masked (empirical)")
            a = next(r for r in rows if r["method"] == "asap (empirical)")
            draw_m, draw_a = m["draw_ms_per_sample"], a["draw_ms_per_sample"]
            lines += ["", f"Cells: KL in nats / TV. Sampler time per sample (draws + ASAp's update): masked "
                      f"{draw_m:.2f} ms, ASAp {draw_a:.2f} ms ({100 * (draw_a / draw_m - 1):+.0f}%)"]
            if "forward_ms" in first:  # a real model, memoised: add its measured forward time per token
                model_ms = first["forward_ms"] * first["tokens_per_sample"]
                lines[-1] += (f"; with the model ({first['forward_ms']:.2f} ms per forward, "
                              f"{first['tokens_per_sample']:.1f} tokens per sample): {draw_m + model_ms:.2f} vs "
                              f"{draw_a + model_ms:.2f} ms ({100 * ((draw_a + model_ms) / (draw_m + model_ms) - 1):+.0f}%).")
            else:
                lines[-1] += (f"; with the scripted model's time: {m['ms_per_sample']:.2f} vs {a['ms_per_sample']:.2f} "
                              f"ms ({100 * (a['ms_per_sample'] / m['ms_per_sample'] - 1):+.0f}%).")
            lines.append("")
    if cost:
        lines += ["## Part 2 — AWRS vs full masking, Llama 3 vocabulary (128,256 tokens)", "",
                  "Per token: `allows` checks (masking decides every token), full-mask fallbacks, draw time "
                  "in ms (mean / median; model time excluded). *mask+renorm*: `masked_distribution` alone "
                  "(fill_mask, apply, softmax) — the cost of full masking without `MaskedSampler`'s "
                  "`torch.multinomial`, which takes ~8 ms on 128K CPU logits. Agreement *random*: no "
                  "shift toward the grammar.", "",
                  "| workload | agreement | tokens | AWRS checks | AWRS fallbacks | AWRS ms | AWRS-auto checks "
                  "| AWRS-auto ms | mask+renorm ms | masked draw ms | ASAp ms | masked ms (ASAp pass) |",
                  "|---|---|---|---|---|---|---|---|---|---|---|---|"]
        for r in cost:
            agreement = r["agreement"] if r["agreement"] is not None else "random"
            lines.append(
                f"| {r['workload']} | {agreement} | {r['tokens']} | {r['awrs_checks']:.2f} | "
                f"{r['awrs_fallbacks']:.3f} | {r['awrs_ms']:.2f} / {r['awrs_ms_median']:.2f} | "
                f"{r['awrs_auto_checks']:.2f} | {r['awrs_auto_ms']:.2f} / {r['awrs_auto_ms_median']:.2f} | "
                f"{r['mask_only_ms']:.2f} / {r['mask_only_ms_median']:.2f} | "
                f"{r['masked_ms']:.2f} / {r['masked_ms_median']:.2f} | "
                f"{r['asap_ms']:.2f} / {r['asap_ms_median']:.2f} | "
                f"{r['masked_ms_asap_pass']:.2f} / {r['masked_ms_median_asap_pass']:.2f} |"
            )
        agreeing = [r["awrs_checks"] for r in cost if r["agreement"] is not None]
        if agreeing:
            lines += ["", f"Mean AWRS checks per token over the agreement rows: {statistics.fmean(agreeing):.2f} "
                      "(target ≤ 3).", ""]
    if model_cost:
        lines += _model_cost_lines(model_cost, meta)
    lines += skip_notes(meta)
    return "\n".join(lines)


def _model_cost_lines(rows: list[dict], meta: dict) -> list[str]:
    lines = [f"## Part 2 — AWRS vs full masking with {meta.get('model', 'the model')}", "",
             "The model writes JSON for held-out MaskBench schemas (prompted with the schema, temperature 1); "
             "AWRS drives; AWRS with `estimator=\"auto\"`, with `estimator=\"recursive\"`, without its weight estimate (`weight=False`), without "
             "pruning (`prune=False`), masked sampling and the mask alone are timed on the same states. Per token: `allows` checks (mean / median; masking decides every token), full-mask "
             "fallbacks, times in ms (mean / median). *Allowed mass*: the model's probability on grammar-allowed "
             "tokens (mean / median over steps); AWRS's checks grow as it falls.", "",
             "| constraint:schema | tokens | finished | allowed mass | AWRS checks | AWRS fallbacks | auto checks "
             "| recursive checks | unweighted checks | unpruned checks | unpruned fallbacks | AWRS ms | mask+renorm ms | masked draw ms "
             "| model forward ms |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(
            f"| {r['workload']} | {r['tokens']} | {r['finished']}/{r['sequences']} | "
            f"{r['allowed_mass_mean']:.3f} / {r['allowed_mass_median']:.3f} | {r['awrs_checks']:.2f} / {r['awrs_checks_median']:.0f} | {r['awrs_fallbacks']:.3f} | "
            f"{r['awrs_auto_checks']:.2f} | {r['awrs_recursive_checks']:.2f} | {r['awrs_unweighted_checks']:.2f} | {r['awrs_unpruned_checks']:.2f} | {r['awrs_unpruned_fallbacks']:.3f} | {r['awrs_ms']:.2f} / {r['awrs_ms_median']:.2f} | "
            f"{r['mask_only_ms']:.2f} / {r['mask_only_ms_median']:.2f} | "
            f"{r['masked_ms']:.2f} / {r['masked_ms_median']:.2f} | {r['model_ms']:.2f} / {r['model_ms_median']:.2f} |")
    lines.append("")
    for kind in dict.fromkeys(r["workload"].split(":", 1)[0] for r in rows):
        group = [r for r in rows if r["workload"].split(":", 1)[0] == kind]
        tokens = sum(r["tokens"] for r in group)
        per_token = {k: sum(r[k] * r["tokens"] for r in group) / max(1, tokens)
                     for k in ("awrs_checks", "awrs_auto_checks", "awrs_recursive_checks", "awrs_unweighted_checks", "awrs_unpruned_checks", "awrs_ms", "masked_ms", "mask_only_ms",
                               "model_ms", "allowed_mass_mean")}
        lines.append(f"- **{kind}**, {len(group)} prompts, {tokens} tokens: allowed mass {per_token['allowed_mass_mean']:.3f}, "
                     f"AWRS {per_token['awrs_checks']:.2f} checks per token (target ≤ 3; "
                     f"{per_token['awrs_auto_checks']:.2f} with estimator=auto, "
                     f"{per_token['awrs_recursive_checks']:.2f} with estimator=recursive, "
                     f"{per_token['awrs_unweighted_checks']:.2f} without the weight estimate, "
                     f"{per_token['awrs_unpruned_checks']:.2f} without pruning), {per_token['awrs_ms']:.2f} ms "
                     f"per draw against {per_token['masked_ms']:.2f} ms for masked sampling "
                     f"({per_token['mask_only_ms']:.2f} ms of it the mask and renormalisation); model forward "
                     f"{per_token['model_ms']:.2f} ms.")
    lines.append("")
    return lines


def plot(quality: list[dict], path: Path) -> dict[str, str]:
    """Write KL(· || Q) against the sample budget, one panel per task and one line per method.

    Returns what ``outputs.write_plot`` returns: ``{}``, or the file and why it was not written.
    """
    tasks = list(dict.fromkeys(r["task"] for r in quality))
    styles = {"masked (exact GCD)": ("k", "--"), "masked (empirical)": ("k", ":"),
              "asap (exact proposal)": ("tab:blue", "-"), "asap (empirical)": ("tab:blue", ":"),
              "smc (AWRS, n particles)": ("tab:red", "-")}

    def draw(plt):
        fig, axes = plt.subplots(1, len(tasks), figsize=(6 * len(tasks), 4.2), squeeze=False)
        for ax, task in zip(axes[0], tasks):
            for method, (color, style) in styles.items():
                rows = sorted((r for r in quality if r["task"] == task and r["method"] == method),
                              key=lambda r: r["n"])
                ax.plot([r["n"] for r in rows], [max(r["kl"], 1e-5) for r in rows], color=color, linestyle=style,
                        marker="o", markersize=3, label=method)
            ax.set_xscale("log")
            ax.set_yscale("log")
            ax.set_xlabel("samples (SMC: particles)")
            ax.set_ylabel("KL(· || Q) [nats]")
            ax.set_title(task)
            ax.grid(True, which="both", alpha=0.3)
        axes[0][0].legend(fontsize=8)
        return fig

    return outputs.write_plot(draw, path, "samplers")


# --- command line ------------------------------------------------------------------------------


def _load_factory(spec: str) -> Callable:
    module, _, attr = spec.partition(":")
    if not module or not attr:
        raise SystemExit(f"--lm expects package.module:factory, got {spec!r}")
    return getattr(importlib.import_module(module), attr)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Register the ``samplers`` subcommand's options on ``parser``."""
    parser.add_argument("--quick", action="store_true", help="small budgets (about a minute)")
    parser.add_argument("--out", type=Path, default=Path("bench-results") / "samplers",
                        help="output folder (default: %(default)s)")
    parser.add_argument("--tokenizer", type=Path, default=None,
                        help="vocabulary for Part 2 (default: $CORRAL_SHARED_DIR or ../shared "
                        "vocab/ggml-vocab-llama-bpe.gguf)")
    parser.add_argument("--model", type=Path, default=None,
                        help="a save_pretrained model folder (e.g. models/tiny-json from python -m engine.tiny): "
                        "Part 1 runs its prompted tasks with it, Part 2 lets it write JSON for MaskBench schemas")
    parser.add_argument("--lm", default=None, help="package.module:factory returning (vocab, model) for Part 1")
    parser.add_argument("--max-tokens", type=int, default=None,
                        help="Part 2 token budget per sequence (default 24 with --quick, else 64; 128 with --model)")
    parser.add_argument("--skip-quality", action="store_true", help="skip Part 1")
    parser.add_argument("--skip-cost", action="store_true", help="skip Part 2")
    parser.add_argument("--schemas", type=int, default=None,
                        help="MaskBench schemas in Part 2 (default 2; 12 with --model)")
    parser.set_defaults(run=main)


def main(args: argparse.Namespace) -> int:
    """Run the sampler benchmark with parsed ``args``; returns the process exit status."""
    torch.set_num_threads(1)
    budgets = (10, 30, 100) if args.quick else (10, 30, 100, 300, 1000)
    model = load_model(args.model) if args.model is not None else None
    quality = [] if args.skip_quality else run_quality(
        budgets, 3 if args.quick else 5, _load_factory(args.lm) if args.lm else None, outputs.log, model=model)
    cost: list[dict] = []
    if not args.skip_cost and model is not None:
        vocab, lm = model
        cost = run_cost_model(vocab, lm, schemas=args.schemas or (2 if args.quick else 12),
                              max_tokens=args.max_tokens or (48 if args.quick else 128), log=outputs.log)
    elif not args.skip_cost:
        path = args.tokenizer
        if path is None:
            shared = Path(os.environ.get("CORRAL_SHARED_DIR", Path("..") / "shared"))
            path = shared / "vocab" / "ggml-vocab-llama-bpe.gguf"
        if not Path(path).exists():
            outputs.log(f"[cost] vocabulary {path} not found: Part 2 skipped (pass --tokenizer)")
        else:
            vocab = TokenVocabulary.from_pretrained(path)
            cost = run_cost(vocab, (0.99, 0.9, 0.5, None), docs=1 if args.quick else 3,
                            max_tokens=args.max_tokens or (24 if args.quick else 64),
                            schemas=0 if args.quick else (args.schemas or 2), log=outputs.log)
    import platform

    meta = {"machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, "
                       f"Python {platform.python_version()}, torch {torch.__version__}",
            "when": time.strftime("%Y-%m-%d %H:%M")}
    if model is not None:
        meta["model"] = model[1].name
    args.out.mkdir(parents=True, exist_ok=True)
    if quality:
        meta["skipped_outputs"] = plot(quality, args.out / "samplers_kl.png")
    table = render_markdown(quality, cost, meta)
    (args.out / "samplers.md").write_text(table)
    (args.out / "samplers.json").write_text(json.dumps({"meta": meta, "quality": quality, "cost": cost}, indent=1,
                                                       default=float))
    print(table)
    return 0
