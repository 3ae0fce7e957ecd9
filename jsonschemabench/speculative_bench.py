"""Constrained speculative decoding on held-out MaskBench schemas: tokens per target call, acceptance, speedup.

For each schema held out from the tiny models' training (``engine.tiny.load_examples``' split;
``--files all`` takes every file), prompted as ``engine.tiny`` trains (``Schema: {...}\\nJSON: ``),
the target model generates under the schema's grammar once with constrained autoregressive
decoding (``engine.generate``, the baseline; budget-aware closing off, as on the speculative
path) and once per speculative configuration (``engine.speculative.speculative_decode``):

* ``draft-model`` — the draft model drafting under the mask (``DraftModel``), fixed ``--k`` and
  ``auto`` (``GoodputController``: k per round from measured acceptance and costs, up to
  ``--max-k``);
* ``draft-unmasked`` — the draft model drafting without the mask, with the drafts trimmed at their
  first invalid token before verification (``filter``) and without (``no-filter``: the invalid
  token goes to the target, which rejects it);
* ``prompt_lookup`` — n-gram copy from prompt + output, ``filter``/``no-filter`` and ``auto``;
* ``forced`` — only the grammar's forced runs;
* ``draft-tree`` — the draft model proposing a token tree (``engine.spec_tree.DraftTree``:
  ``--tree-width`` children where its top probability is below ``--branch-below``, at most
  ``--tree-nodes`` nodes, ``k`` levels), verified in one target pass with a tree attention mask;
* ``jacobi`` — no draft model: the target's own fixed-point guesses and n-gram pool
  (``engine.jacobi.JacobiDraft``, lookahead decoding), as a tree of the same bounds;
* ``diffusion`` — with ``--diffusion-draft PATH``, a masked-diffusion model drafting a block in
  one pass (``engine.diffusion_draft.DiffusionDraft``): the most probable valid path through its
  per-position distributions, by DINGO when the schema's grammar is regular (its token DFA built
  untimed first), by a search over forked matchers otherwise; fixed ``--k`` and ``auto``.

The cost of a token-tree node is reported under the table, twice: replayed without a model
(``tree_node_cost``: trees built along the baseline outputs and checked on forked matchers, best
of 3 passes — the figure to compare with a grammar engine's per-node cost) and as measured in
the tree runs (the decoder's check, ``tree_check_s`` per node, and for ``jacobi`` the source's
own drafting per node: pool lookups and its own matcher walk), in µs.

Reported per configuration: tokens committed per target call (accepted drafts + the corrected
or bonus token; the baseline's figure is tokens per model call, forced runs fast-forwarded),
acceptance (accepted ÷ verified source drafts, forced tokens aside; unfiltered, the invalid
tokens count as verified), wall-clock seconds and speedup over the baseline (pooled seconds per
generated token, the baseline's ÷ the configuration's, same schemas, same seeds: Σ baseline
seconds ÷ Σ seconds when the outputs are the same, as greedy ones are), mean k, schema-valid outputs and, when greedy
(``--temperature 0``, the default), whether the output equals the baseline's token for token
(it must: the decoder is lossless). Both models reset their KV cache before every generation;
``--repeats N`` runs each generation N times and keeps the fastest (a shared machine's noise).
Outputs (``--out``, default ``runs/speculative-<timestamp>``): ``rows.jsonl`` (one line per
schema and configuration), ``summary.json`` and ``summary.md`` (also printed).

Mask wait per step: ``engine.generate_batch`` runs speculative rows one after another (there is
no batched verification), so the time a batched verifier would wait for masks is measured by
replay: for ``--batches`` rows (the baseline outputs, cycled) each step fills the mask of every
row at the next ``n + 1`` positions (``n``: the mean verified drafts per call of the best
configuration), against one mask per row for autoregressive decoding. Single-threaded CPU times.

The draft model is loaded by ``engine.speculative.load_draft_lm``: a folder made by
``engine.distill`` drafts from its reduced output vocabulary.

``python -m jsonschemabench speculative --target models/tiny-json --draft models/tiny-json-draft-distilled --schemas 20``
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from . import outputs, report
from .e2e import PROMPT_TEMPLATE, validate
from .maskbench import default_shared
from .timing import gc_paused

__all__ = ["CONFIGS", "Config", "add_arguments", "main", "mask_wait", "render_markdown", "run", "summarize",
           "tree_node_cost"]

#: what a run writes to its folder
OUTPUTS = ("rows.jsonl", "summary.json", "summary.md")
BASELINE = "constrained AR"


@dataclass(frozen=True)
class Config:
    """One speculative configuration: the draft source, ``k`` (an int or ``"auto"``), filtering."""

    source: str  # "draft-model", "draft-unmasked", "draft-tree", "prompt_lookup", "jacobi", "diffusion" or "forced"
    k: int | str
    filter_drafts: bool = True

    @property
    def label(self) -> str:
        return f"{self.source} k={self.k}" + ("" if self.filter_drafts else " no-filter")


def configs(k: int, with_draft: bool, with_diffusion: bool = False) -> list[Config]:
    """The configurations of a run (the draft-model ones only with a draft model, the diffusion
    ones only with a diffusion drafter)."""
    out = []
    if with_draft:
        out += [Config("draft-model", k), Config("draft-model", "auto"),
                Config("draft-unmasked", k), Config("draft-unmasked", k, False)]
    out += [Config("prompt_lookup", k), Config("prompt_lookup", k, False), Config("prompt_lookup", "auto"),
            Config("forced", k)]
    if with_draft:
        out.append(Config("draft-tree", k))
    out.append(Config("jacobi", k))
    if with_diffusion:
        out += [Config("diffusion", k), Config("diffusion", "auto")]
    return out


CONFIGS = configs(4, True)


# --- schemas and models -------------------------------------------------------------------------


def held_out_schemas(data: Path, count: int, seed: int, *, held_out_only: bool = True,
                     compiler: Any = None, say: Callable[[str], None] = outputs.log) -> list[tuple[str, Any]]:
    """``(file name, schema)`` for ``count`` schemas (a seeded shuffle of the split's files) that
    ``compiler`` compiles; ``held_out_only``: the files ``engine.tiny`` holds out of training."""
    from engine.tiny import load_examples

    train, held = load_examples(data)
    pool = held if held_out_only else train + held
    by_file: dict[str, Any] = {}
    for example in pool:
        by_file.setdefault(example.source, example.schema)
    names = sorted(by_file)
    random.Random(seed).shuffle(names)
    chosen = []
    for name in names:
        if len(chosen) >= count:
            break
        try:
            if compiler is not None:
                compiler.compile_json_schema(by_file[name])
        except Exception as exc:  # noqa: BLE001 - unsupported or malformed: not part of this measurement
            say(f"speculative: skipping {name}: {type(exc).__name__}")
            continue
        chosen.append((name, by_file[name]))
    return chosen


def prompt_ids(vocab: Any, schema: Any) -> list[int]:
    """The prompt the tiny models train on, as token ids (BOS first when the tokenizer adds one)."""
    text = PROMPT_TEMPLATE.format(schema=json.dumps(schema, separators=(",", ":"), ensure_ascii=False))
    tok, bos = vocab.hf_tokenizer, vocab.bos_token_id
    adds_bos = tok is not None and bos is not None and tok.encode("a", add_special_tokens=True)[:1] == [bos]
    return ([bos] if adds_bos else []) + vocab.encode(text)


@dataclass(frozen=True)
class TreeShape:
    """The bounds of the tree configurations' trees."""

    width: int = 2
    branch_below: float = 0.6
    max_nodes: int = 16


def _source(config: Config, draft_lm: Any, stop_below: float, tree: TreeShape = TreeShape(),
            diffusion: Any = None, grammar: Any = None) -> Any:
    from engine.jacobi import JacobiDraft
    from engine.spec_tree import DraftTree
    from engine.speculative import DraftModel, ForcedTokens, PromptLookup

    if config.source == "diffusion":
        return diffusion.with_grammar(grammar)
    if config.source == "draft-tree":
        return DraftTree(draft_lm, width=tree.width, branch_below=tree.branch_below, max_nodes=tree.max_nodes)
    if config.source == "jacobi":
        return JacobiDraft(width=tree.width, max_nodes=tree.max_nodes)
    if config.source == "draft-model":
        return DraftModel(draft_lm, stop_below=stop_below)
    if config.source == "draft-unmasked":
        return DraftModel(draft_lm, constrained=False, stop_below=stop_below)
    if config.source == "prompt_lookup":
        return PromptLookup()
    return ForcedTokens()


# --- one schema ---------------------------------------------------------------------------------


def run_schema(name: str, schema: Any, *, target: Any, draft: Any, vocab: Any, compiler: Any,
               configs: Sequence[Config], max_tokens: int, max_k: int, temperature: float, seed: int,
               stop_below: float = 0.0, repeats: int = 1, tree: TreeShape = TreeShape(),
               diffusion: Any = None) -> list[dict]:
    """The baseline and every configuration on one schema: one row each. With ``repeats`` > 1
    each generation runs that many times (same seed, so the same output) and keeps the fastest:
    on a shared machine the minimum is the least disturbed time."""
    import torch

    from engine import generate
    from engine.speculative import speculative_decode
    from samplers import SamplingParams

    ids = prompt_ids(vocab, schema)
    grammar = compiler.compile_json_schema(schema)
    if diffusion is not None and grammar.is_regular:  # DINGO's token DFA: built once per grammar, untimed
        from samplers.dingo import prepare

        prepare(grammar.as_dfa())
    sampled = temperature > 0
    base_s = float("inf")
    for _ in range(repeats):
        target.reset()
        t0 = time.perf_counter()
        base = generate(ids, schema=schema, model=target, tokenizer=vocab, compiler=compiler, max_tokens=max_tokens,
                        temperature=temperature, seed=seed if sampled else None, budget_closing=False)
        base_s = min(base_s, time.perf_counter() - t0)
    verdict, _ = validate(base.text, schema)
    rows = [{"file": name, "config": BASELINE, "source": None, "k": 0, "filter": None, "tokens": len(base.token_ids),
             "target_calls": len(base.per_token_s), "seconds": base_s, "finish_reason": base.finish_reason,
             "validity": verdict, "forced": base.forced_tokens, "token_ids": base.token_ids}]
    params = SamplingParams(temperature=temperature)
    for config in configs:
        if (config.source.startswith("draft") and draft is None) or (config.source == "diffusion" and diffusion is None):
            continue
        seconds = float("inf")
        for _ in range(repeats):
            target.reset()
            if draft is not None:
                draft.reset()
            generator = torch.Generator().manual_seed(seed) if sampled else None
            t0 = time.perf_counter()
            source = _source(config, draft, stop_below, tree, diffusion, grammar)
            out = speculative_decode(target, source, vocab, ids, grammar.matcher(),
                                     k=config.k, max_k=max_k, max_tokens=max_tokens, params=params,
                                     generator=generator, filter_drafts=config.filter_drafts)
            seconds = min(seconds, time.perf_counter() - t0)
        text = out.text.decode("utf-8", errors="replace")
        verdict, _ = validate(text, schema)
        rows.append({
            "file": name, "config": config.label, "source": config.source, "k": config.k,
            "filter": config.filter_drafts, "tokens": len(out.token_ids), "target_calls": out.target_calls,
            "committed": sum(out.accepted_per_call), "drafted": out.drafted, "accepted": out.accepted,
            "forced": out.forced_tokens, "invalid_tokens": out.invalid_tokens, "trimmed": out.trimmed,
            "k_mean": sum(out.k_per_call) / len(out.k_per_call) if out.k_per_call else 0.0,
            "seconds": seconds, "draft_s": out.draft_s, "verify_s": out.verify_s,
            "tree_nodes": out.tree_nodes, "tree_check_s": out.tree_check_s,
            "finish_reason": out.finish_reason, "validity": verdict,
            "same_as_baseline": out.token_ids == base.token_ids if not sampled else None,
            **({"dingo_drafts": source.dingo_drafts, "searched_drafts": source.searched_drafts}
               if config.source == "diffusion" else {}),
        })
    return rows


# --- mask wait per step -------------------------------------------------------------------------


def mask_wait(paths: Sequence[tuple[Any, Sequence[int]]], batch: int, positions: int, *, max_steps: int = 64,
              clock: Callable[[], float] = time.perf_counter) -> float | None:
    """Mean seconds per step to fill the masks of ``batch`` rows at ``positions`` positions each.

    ``paths``: ``(compiled grammar, token ids)`` per output, cycled to ``batch`` rows. Each step
    every unfinished row fills its mask at its state and at the next ``positions − 1`` states
    along its tokens (on a fork, as verification walks the drafts), then advances one position
    (``positions`` tokens would be the best case; one keeps every row busy longer). ``None``
    without any path of at least one token.
    """
    from grammars import allocate_token_bitmask

    usable = [(g, list(t)) for g, t in paths if t]
    if not usable or batch < 1 or positions < 1:
        return None
    rows = [(usable[i % len(usable)][0].matcher(), usable[i % len(usable)][1]) for i in range(batch)]
    width = usable[0][0].vocab.logits_width
    words = allocate_token_bitmask(batch * positions, width)
    total, steps = 0.0, 0
    for step in range(max_steps):
        alive = [(m, t) for m, t in rows if step < len(t)]
        if not alive:
            break
        t0 = clock()
        slot = 0
        for matcher, tokens in alive:
            fork = matcher.fork() if positions > 1 else matcher
            for j in range(positions):
                fork.fill_mask(words, slot)
                slot += 1
                nxt = step + j
                if j + 1 < positions and nxt < len(tokens) and fork.allows(tokens[nxt]):
                    fork.advance(tokens[nxt])
        total += clock() - t0
        steps += 1
        for matcher, tokens in alive:
            matcher.advance(tokens[step])
    return total / steps if steps else None



@dataclass
class _ReplayTree:
    """A draft source proposing a token tree along a known output: at each of ``depth`` levels
    the output's next token, with ``width − 1`` siblings taken from further along the output
    (often invalid there: the check prunes them)."""

    tokens: Sequence[int]
    at: int = 0
    width: int = 2

    def propose_tree(self, context, matcher, k, params, generator, vocab):
        from engine.spec_tree import TokenTree

        tree, parent = TokenTree(), -1
        for d in range(min(k, len(self.tokens) - self.at)):
            token = self.tokens[self.at + d]
            node = tree.add(token, parent)
            for s in range(1, self.width):
                sibling = self.tokens[(self.at + d + 2 * s) % len(self.tokens)]
                if sibling != token:
                    tree.add(sibling, parent)
            parent = node
        return tree


def tree_node_cost(paths: Sequence[tuple[Any, Sequence[int]]], *, depth: int = 4, width: int = 2,
                   repeats: int = 3, max_steps: int = 64) -> tuple[float, int] | None:
    """Seconds per node to build a token tree and check it (``engine.spec_tree.draft_tree``: a
    matcher fork and one ``try_advance`` per node), replayed along outputs, and the nodes timed.

    ``paths``: ``(compiled grammar, token ids)``. At each of the first ``max_steps`` positions a
    tree of ``depth`` levels follows the output with ``width − 1`` siblings per level
    (``_ReplayTree``); the time is the source's building plus the check, per proposed node, the
    best of ``repeats`` passes (a shared machine's noise), each with the garbage collector paused
    (``timing.gc_paused``: the benchmark's heap, not the node, pays for a collection). No model
    runs. ``None`` without nodes.
    """
    from engine.spec_tree import draft_tree
    from samplers import SamplingParams

    greedy = SamplingParams(temperature=0)
    best, nodes = None, 0
    for _ in range(repeats):
        seconds, count = 0.0, 0
        with gc_paused():
            for grammar, tokens in paths:
                matcher = grammar.matcher()
                tokens = list(tokens)
                for at in range(min(max_steps, len(tokens))):
                    source = _ReplayTree(tokens, at, width)
                    drafted = draft_tree(source, [0], matcher, depth, depth + 64, greedy, None, grammar.vocab)
                    seconds += drafted.seconds + drafted.check_s
                    count += drafted.proposed
                    if not matcher.try_advance((tokens[at],)):
                        break
        if count and (best is None or seconds / count < best):
            best, nodes = seconds / count, count
    return None if best is None else (best, nodes)

# --- summary ------------------------------------------------------------------------------------


def _ratio(a: float, b: float) -> float | None:
    return a / b if b else None


def summarize(rows: Sequence[Mapping], mask_rows: Sequence[Mapping] = (), meta: Mapping | None = None) -> dict:
    """Per configuration, pooled over the schemas every configuration ran on."""
    files = {r["file"] for r in rows if r["config"] == BASELINE}
    base_s = sum(r["seconds"] for r in rows if r["config"] == BASELINE)
    base_rate = _ratio(base_s, sum(r["tokens"] for r in rows if r["config"] == BASELINE))
    per_config: list[dict] = []
    for label in dict.fromkeys(r["config"] for r in rows):
        sel = [r for r in rows if r["config"] == label and r["file"] in files]
        calls = sum(r["target_calls"] for r in sel)
        seconds = sum(r["seconds"] for r in sel)
        entry: dict[str, Any] = {
            "config": label, "n": len(sel), "tokens": sum(r["tokens"] for r in sel), "target_calls": calls,
            "seconds": seconds,
            "valid": sum(r["validity"] == "valid" for r in sel),
            "stopped": sum(r["finish_reason"] == "stop" for r in sel),
        }
        # seconds per generated token, the baseline's over this one's: the seconds ratio when the
        # outputs are the same (greedy); sampled outputs differ in length from run to run
        rate = _ratio(seconds, entry["tokens"])
        entry["speedup"] = 1.0 if label == BASELINE else _ratio(base_rate, rate) if base_rate and rate else None
        if label == BASELINE:
            entry["tokens_per_call"] = _ratio(entry["tokens"] + entry["stopped"], calls)  # EOS is a sampled token
        else:
            source_drafted = sum(r["drafted"] - r["forced"] for r in sel)
            entry |= {
                "tokens_per_call": _ratio(sum(r["committed"] for r in sel), calls),
                "drafted": sum(r["drafted"] for r in sel), "accepted": sum(r["accepted"] for r in sel),
                "acceptance": _ratio(sum(r["accepted"] - r["forced"] for r in sel), source_drafted),
                "invalid_tokens": sum(r["invalid_tokens"] for r in sel),
                "k_mean": _ratio(sum(r["k_mean"] * r["target_calls"] for r in sel), calls),
                "same_as_baseline": None if any(r["same_as_baseline"] is None for r in sel)
                else sum(bool(r["same_as_baseline"]) for r in sel),
                "draft_s": sum(r["draft_s"] for r in sel), "verify_s": sum(r["verify_s"] for r in sel),
                "tree_nodes": sum(r.get("tree_nodes", 0) for r in sel),
                "tree_check_s": sum(r.get("tree_check_s", 0.0) for r in sel),
            }
        per_config.append(entry)
    return {"configs": per_config, "mask_wait": list(mask_rows), "schemas": len(files), "meta": dict(meta or {})}


def _f(x: float | None, fmt: str) -> str:
    return "–" if x is None else format(x, fmt)


def render_markdown(summary: Mapping) -> str:
    """The tables ``main`` prints."""
    lines = [f"{summary['schemas']} held-out schemas; {summary['meta'].get('setting', '')}", "",
             ("| configuration | tokens / target call | acceptance | invalid drafts | mean k | seconds | "
              "speedup vs constrained AR | schema-valid | same as AR |"),
             "|---|---|---|---|---|---|---|---|---|"]
    for c in summary["configs"]:
        same = c.get("same_as_baseline")
        same_text = "–" if c["config"] == BASELINE or same is None else f"{same}/{c['n']}"
        lines.append(
            f"| {c['config']} | {_f(c.get('tokens_per_call'), '.2f')} | {_f(c.get('acceptance'), '.1%')} | "
            f"{c.get('invalid_tokens', '–')} | {_f(c.get('k_mean'), '.2f')} | {c['seconds']:.2f} | "
            f"{_f(c['speedup'], '.2f')}× | {c['valid']}/{c['n']} | "
            f"{same_text} |")
    by = {c["config"]: c for c in summary["configs"]}
    pairs = [(label, label + " no-filter") for label in by if label + " no-filter" in by]
    if pairs:
        lines += ["", "Filtering (drafts trimmed at their first invalid token) vs not: " + "; ".join(
            f"{a}: {_f(by[a].get('acceptance'), '.1%')} vs {_f(by[b].get('acceptance'), '.1%')} acceptance, "
            f"{by[a]['target_calls']} vs {by[b]['target_calls']} target calls scoring "
            f"{by[a].get('drafted', 0)} vs {by[b].get('drafted', 0)} draft positions, "
            f"{by[a]['seconds']:.2f} s vs {by[b]['seconds']:.2f} s" for a, b in pairs)]
    replay = summary.get("tree_node")
    if replay:
        lines += ["", (f"Token-tree node, replayed along the baseline outputs (no model): "
                       f"{replay['us']:.2f} µs to build and check ({replay['nodes']} nodes, depth "
                       f"{replay['depth']}, width {replay['width']}, best of {replay['repeats']})")]
    trees = [c for c in summary["configs"] if c.get("tree_nodes")]
    if trees:
        lines += ["", "Cost per tree node in the runs above (µs): " + "; ".join(
            f"{c['config']}: check {1e6 * c['tree_check_s'] / c['tree_nodes']:.1f}"
            + (f", drafting {1e6 * c['draft_s'] / c['tree_nodes']:.1f}" if c["config"].startswith("jacobi") else "")
            + f" ({c['tree_nodes']} nodes)" for c in trees)]
    if summary["mask_wait"]:
        lines += ["", "Mask wait per step (CPU, replayed; see the module docstring):", "",
                  "| batch | AR: 1 mask / row (ms) | speculative: n+1 masks / row (ms) | n |", "|---|---|---|---|"]
        for m in summary["mask_wait"]:
            lines.append(f"| {m['batch']} | {_f(m['ar_ms'], '.2f')} | {_f(m['spec_ms'], '.2f')} | {m['positions'] - 1} |")
    return "\n".join(lines) + "\n"


# --- command line -------------------------------------------------------------------------------


def run(args: argparse.Namespace, say: Callable[[str], None] = outputs.log) -> dict:
    """Load the models, run every schema, write ``OUTPUTS`` under ``args.out``; the summary."""
    import torch

    from engine import HFCausalLM
    from engine.generate import load_vocabulary
    from engine.speculative import load_draft_lm
    from grammars import Compiler

    if args.threads:
        torch.set_num_threads(args.threads)
    target = HFCausalLM.from_pretrained(str(args.target), local_files_only=True)
    vocab = load_vocabulary(str(args.target), target)
    draft = load_draft_lm(args.draft, local_files_only=True) if args.draft else None
    if draft is not None and draft.logits_width != target.logits_width:
        raise ValueError(f"the draft model scores {draft.logits_width} tokens, the target {target.logits_width}")
    diffusion = None
    if args.diffusion_draft:
        from engine.diffusion_draft import DiffusionDraft

        diffusion = DiffusionDraft.from_pretrained(str(args.diffusion_draft), block=args.diffusion_block)
    compiler = Compiler(vocab)
    data = args.data or default_shared("jsonschemabench", "maskbench")
    schemas = held_out_schemas(data, args.schemas, args.seed, held_out_only=args.files == "held-out",
                               compiler=compiler, say=say)
    chosen = configs(args.k, draft is not None, diffusion is not None)
    args.out.mkdir(parents=True, exist_ok=True)
    say(f"speculative: {len(schemas)} schemas x ({len(chosen)} configurations + baseline), "
        f"max_tokens {args.max_tokens} -> {args.out}")
    if schemas:  # untimed warm-up: first forward passes, allocator, compiled grammar
        run_schema(*schemas[0], target=target, draft=draft, vocab=vocab, compiler=compiler, configs=chosen[:2],
                   max_tokens=8, max_k=args.max_k, temperature=args.temperature, seed=args.seed)
    rows: list[dict] = []
    with open(args.out / "rows.jsonl", "w", encoding="utf-8") as sink:
        for i, (name, schema) in enumerate(schemas):
            got = run_schema(name, schema, target=target, draft=draft, vocab=vocab, compiler=compiler, configs=chosen,
                             max_tokens=args.max_tokens, max_k=args.max_k, temperature=args.temperature,
                             seed=args.seed + i, stop_below=args.stop_below, repeats=args.repeats,
                             tree=TreeShape(args.tree_width, args.branch_below, args.tree_nodes), diffusion=diffusion)
            sink.writelines(json.dumps(row) + "\n" for row in got)
            rows += got
            base = got[0]
            say(f"  [{i + 1}/{len(schemas)}] {name}: {base['tokens']} tokens, AR {base['seconds']:.2f} s; "
                + ", ".join(f"{r['config']} {r['seconds']:.2f} s" for r in got[1:]))
    summary = summarize(rows, meta={"command": " ".join(sys.argv), "cpu": report.cpu_name(),
                                    "started": datetime.now().isoformat(timespec="seconds")})
    mask_rows = []
    if args.batches and schemas:
        best = max((c for c in summary["configs"] if c["config"] != BASELINE and c["target_calls"]),
                   key=lambda c: c["speedup"] or 0.0, default=None)
        n = round(best["drafted"] / best["target_calls"]) if best else 0
        base_rows = {r["file"]: r for r in rows if r["config"] == BASELINE}
        paths = [(compiler.compile_json_schema(schema), base_rows[name]["token_ids"]) for name, schema in schemas]
        for batch in args.batches:
            ar = mask_wait(paths, batch, 1)
            spec = mask_wait(paths, batch, n + 1)
            mask_rows.append({"batch": batch, "positions": n + 1, "ar_ms": None if ar is None else 1e3 * ar,
                              "spec_ms": None if spec is None else 1e3 * spec})
            say(f"  mask wait, batch {batch}: AR {mask_rows[-1]['ar_ms']} ms, speculative {mask_rows[-1]['spec_ms']} ms")
    summary["mask_wait"] = mask_rows
    if schemas:
        base_rows = {r["file"]: r for r in rows if r["config"] == BASELINE}
        paths = [(compiler.compile_json_schema(schema), base_rows[name]["token_ids"]) for name, schema in schemas]
        cost = tree_node_cost(paths, depth=args.k, width=max(2, args.tree_width))
        if cost is not None:
            summary["tree_node"] = {"us": 1e6 * cost[0], "nodes": cost[1], "depth": args.k,
                                    "width": max(2, args.tree_width), "repeats": 3}
            say(f"  token-tree node (replayed): {summary['tree_node']['us']:.2f} µs")
    summary["meta"]["setting"] = (f"target {args.target.name}, draft {args.draft.name if args.draft else '–'}, "
                                  + (f"diffusion drafter {args.diffusion_draft.name} (block {args.diffusion_block}), "
                                     if args.diffusion_draft else "")
                                  + f"k={args.k}, auto up to {args.max_k}, trees of width {args.tree_width} "
                                  f"(branching below {args.branch_below:g}) and {args.tree_nodes} nodes, "
                                  f"temperature {args.temperature:g}, "
                                  f"max_tokens {args.max_tokens}, threads {args.threads}, "
                                  f"fastest of {args.repeats} run(s)")
    (args.out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
    (args.out / "summary.md").write_text(render_markdown(summary), encoding="utf-8")
    return summary


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Register the ``speculative`` subcommand's options on ``parser``."""
    parser.add_argument("--target", type=Path, default=Path("models/tiny-json"),
                        help="target model folder (python -m engine.tiny); default: %(default)s")
    parser.add_argument("--draft", type=Path, default=Path("models/tiny-json-draft-distilled"),
                        help="draft model folder sharing the tokenizer (python -m engine.tiny --layers 1 --hidden 64 "
                             "--heads 2 --out DIR, then python -m engine.distill; an output_vocab.json beside it "
                             "restricts its output layer); default: %(default)s")
    parser.add_argument("--no-draft", action="store_true", help="skip the draft-model configurations")
    parser.add_argument("--diffusion-draft", type=Path, default=None,
                        help="a masked-diffusion checkpoint drafting for the target (e.g. models/tiny-diffusion-json; "
                             "same tokenizer plus a mask token); adds the diffusion configurations")
    parser.add_argument("--diffusion-block", type=int, default=32,
                        help="masked positions the diffusion drafter's pass sees (32; the first k are drafted)")
    parser.add_argument("--data", type=Path, default=None,
                        help="folder of MaskBench *.json files (default: ../shared/jsonschemabench/maskbench)")
    parser.add_argument("--files", choices=("held-out", "all"), default="held-out",
                        help="the files engine.tiny holds out of training (default), or all")
    parser.add_argument("--schemas", type=int, default=20, help="schemas to run (20)")
    parser.add_argument("--k", type=int, default=4, help="fixed speculation length (4)")
    parser.add_argument("--max-k", type=int, default=8, help="the most tokens 'auto' drafts (8)")
    parser.add_argument("--stop-below", type=float, default=0.0,
                        help="draft-model early stop: end a draft before a token with draft probability below this (0: off)")
    parser.add_argument("--tree-width", type=int, default=2, help="draft-tree / jacobi: most children of a node (2)")
    parser.add_argument("--branch-below", type=float, default=0.6,
                        help="draft-tree: branch where the draft's top probability is below this (0.6)")
    parser.add_argument("--tree-nodes", type=int, default=16, help="draft-tree / jacobi: most nodes of a tree (16)")
    parser.add_argument("--max-tokens", type=int, default=128, help="token budget per generation, EOS included (128)")
    parser.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    parser.add_argument("--seed", type=int, default=0, help="schema sample seed; schema i samples with seed + i")
    parser.add_argument("--batches", type=lambda s: [int(x) for x in s.split(",") if x], default=[1, 8, 32, 64],
                        help="batch sizes of the mask-wait replay, comma-separated (1,8,32,64; empty: skip)")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads (1)")
    parser.add_argument("--repeats", type=int, default=1,
                        help="runs of each generation, the fastest kept (1; 2-3 on a shared machine)")
    parser.add_argument("--out", type=Path, default=None, help="output folder (default: runs/speculative-<timestamp>)")
    parser.set_defaults(run=main)


def main(args: argparse.Namespace) -> int:
    """Run the speculative benchmark with parsed ``args``; returns the process exit status."""
    if not (args.target / "config.json").is_file():
        outputs.log(f"no model at {args.target} (train one with: python -m engine.tiny --out {args.target} ...)")
        return 2
    if args.no_draft:
        args.draft = None
    elif not (args.draft / "config.json").is_file():
        outputs.log(f"no draft model at {args.draft} (train one with: python -m engine.tiny --layers 1 --hidden 64 "
                    f"--heads 2 --minutes 4 --out DRAFT ..., then distil it from the target: python -m engine.distill "
                    f"--target {args.target} --draft DRAFT --out {args.draft} ...), or pass --no-draft")
        return 2
    if min(args.k, args.max_k, args.max_tokens, args.repeats, args.tree_width, args.tree_nodes) < 1:
        outputs.log("--k, --max-k, --max-tokens, --repeats, --tree-width and --tree-nodes must be at least 1")
        return 2
    args.out = args.out or Path("runs") / f"speculative-{datetime.now():%Y%m%d-%H%M%S}"
    run(args)
    return outputs.show_run(args.out, OUTPUTS)
