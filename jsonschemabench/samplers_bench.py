"""Sampler benchmark: distance to the grammar-conditioned model (masked, ASAp, SMC) and AWRS's cost.

``python -m jsonschemabench samplers [--quick] [--out DIR] [--tokenizer PATH] [--lm MODULE:FACTORY]``

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

Plug in a model with ``--lm package.module:factory``: ``factory()`` returns ``(vocab, model)``,
``model`` either ``next_logits(prefixes) -> [batch, width]`` (engine ``LanguageModel``) or a
per-prefix callable; Part 1 then compiles its grammars against that vocabulary (exact enumeration
over a real tokenizer's token language can be large; keep the grammars tiny).

Writes ``samplers.md`` (tables), ``samplers.json`` (raw numbers) and ``samplers_kl.png`` (needs
matplotlib, the ``bench`` extra) to ``--out`` (default ``bench-results/samplers``, git-ignored).
"""

from __future__ import annotations

import argparse
import importlib
import json
import math
import os
import statistics
import sys
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

from .samples import GBNF_SAMPLES

__all__ = ["GadTask", "GAD_TASKS", "AgreementLM", "run_quality", "run_cost", "add_arguments", "main"]

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


def _vocab_for(task: GadTask) -> TokenVocabulary:
    pieces = list(task.pieces) + [b""]
    return TokenVocabulary.from_bytes(pieces, eos_token_ids=[len(pieces) - 1], name=f"gad-{task.name}")


def _per_prefix(model) -> Callable[[Sequence[int]], torch.Tensor]:
    if hasattr(model, "next_logits"):
        return lambda prefix: model.next_logits([list(prefix)])[0]
    return model


def run_quality(
    budgets: Sequence[int], smc_seeds: int, lm_factory: Callable | None = None, log=print
) -> list[dict]:
    """Part 1: one row per (task, method, budget) with KL/TV to the exact target."""
    rows: list[dict] = []
    for task in GAD_TASKS:
        if lm_factory is None:
            vocab = _vocab_for(task)
            own = Compiler(vocab).compile_gbnf(task.gbnf)
            lm = AgreementLM(own, vocab.logits_width, task.agreement, [], seed=task.seed)
            lm_name = f"scripted agreement LM (agreement ~ U{task.agreement}, seed {task.seed})"
        else:
            vocab, model = lm_factory()
            lm = _per_prefix(model)
            lm_name = getattr(model, "name", type(model).__name__)
        grammar = Compiler(vocab).compile_gbnf(task.gbnf)
        width = vocab.logits_width
        if lm_factory is not None:  # a real tokenizer may spell the strings with many more tokens
            task = replace(task, max_tokens=64)
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
                    logits = lm(prefix)
                    token = None
                    for k in ("awrs", "auto", "masked"):
                        t0 = time.perf_counter_ns()
                        draw = runs[k].draw(logits, matchers[k], gen)
                        timers[k].ns.append(time.perf_counter_ns() - t0)
                        timers[k].checks += draw.checks
                        if k == "awrs":
                            token = draw.token
                    t0 = time.perf_counter_ns()  # the mask and the renormalised distribution, no sampling
                    masked_distribution(logits, matchers["maskonly"])
                    timers["maskonly"].ns.append(time.perf_counter_ns() - t0)
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


# --- reporting ---------------------------------------------------------------------------------


def _fmt(x: float, digits: int = 3) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "—"
    if math.isinf(x):
        return "inf"
    return f"{x:.{digits}f}" if abs(x) >= 10 ** (-digits) or x == 0 else f"{x:.1e}"


def render_markdown(quality: list[dict], cost: list[dict], meta: dict) -> str:
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
            lines += ["", f"Cells: KL in nats / TV. Sampler time per sample (draws + ASAp's update): masked "
                      f"{m['draw_ms_per_sample']:.2f} ms, ASAp {a['draw_ms_per_sample']:.2f} ms "
                      f"({100 * (a['draw_ms_per_sample'] / m['draw_ms_per_sample'] - 1):+.0f}%); with the scripted "
                      f"model's time: {m['ms_per_sample']:.2f} vs {a['ms_per_sample']:.2f} ms "
                      f"({100 * (a['ms_per_sample'] / m['ms_per_sample'] - 1):+.0f}%).", ""]
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
    return "\n".join(lines)


def plot(quality: list[dict], path: Path, log=print) -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        log("[plot] matplotlib not installed (pip install -e '.[bench]'): no PNG written")
        return False
    tasks = list(dict.fromkeys(r["task"] for r in quality))
    fig, axes = plt.subplots(1, len(tasks), figsize=(6 * len(tasks), 4.2), squeeze=False)
    styles = {"masked (exact GCD)": ("k", "--"), "masked (empirical)": ("k", ":"),
              "asap (exact proposal)": ("tab:blue", "-"), "asap (empirical)": ("tab:blue", ":"),
              "smc (AWRS, n particles)": ("tab:red", "-")}
    for ax, task in zip(axes[0], tasks):
        for method, (color, style) in styles.items():
            rows = sorted((r for r in quality if r["task"] == task and r["method"] == method), key=lambda r: r["n"])
            xs = [r["n"] for r in rows]
            ys = [max(r["kl"], 1e-5) for r in rows]
            ax.plot(xs, ys, color=color, linestyle=style, marker="o", markersize=3, label=method)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("samples (SMC: particles)")
        ax.set_ylabel("KL(· || Q) [nats]")
        ax.set_title(task)
        ax.grid(True, which="both", alpha=0.3)
    axes[0][0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


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
    parser.add_argument("--lm", default=None, help="package.module:factory returning (vocab, model) for Part 1")
    parser.add_argument("--skip-quality", action="store_true", help="skip Part 1")
    parser.add_argument("--skip-cost", action="store_true", help="skip Part 2")
    parser.add_argument("--schemas", type=int, default=2, help="MaskBench schemas in Part 2 (default 2)")
    parser.set_defaults(run=main)


def main(args: argparse.Namespace) -> int:
    """Run the sampler benchmark with parsed ``args``; returns the process exit status."""
    def log(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    torch.set_num_threads(1)
    budgets = (10, 30, 100) if args.quick else (10, 30, 100, 300, 1000)
    quality = [] if args.skip_quality else run_quality(
        budgets, 3 if args.quick else 5, _load_factory(args.lm) if args.lm else None, log)
    cost: list[dict] = []
    if not args.skip_cost:
        path = args.tokenizer
        if path is None:
            shared = Path(os.environ.get("CORRAL_SHARED_DIR", Path("..") / "shared"))
            path = shared / "vocab" / "ggml-vocab-llama-bpe.gguf"
        if not Path(path).exists():
            log(f"[cost] vocabulary {path} not found: Part 2 skipped (pass --tokenizer)")
        else:
            vocab = TokenVocabulary.from_pretrained(path)
            cost = run_cost(vocab, (0.99, 0.9, 0.5, None), docs=1 if args.quick else 3,
                            max_tokens=24 if args.quick else 64, schemas=0 if args.quick else args.schemas, log=log)
    import platform

    meta = {"machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, "
                       f"Python {platform.python_version()}, torch {torch.__version__}",
            "when": time.strftime("%Y-%m-%d %H:%M")}
    args.out.mkdir(parents=True, exist_ok=True)
    report = render_markdown(quality, cost, meta)
    (args.out / "samplers.md").write_text(report)
    (args.out / "samplers.json").write_text(json.dumps({"meta": meta, "quality": quality, "cost": cost}, indent=1,
                                                       default=float))
    if quality:
        plot(quality, args.out / "samplers_kl.png", log)
    print(report)
    return 0
