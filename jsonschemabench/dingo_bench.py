"""DINGO benchmark: precompute and per-block cost of ``samplers.dingo_map``/``dingo_sample`` on MaskBench.

``python -m jsonschemabench dingo [--tokenizer PATH] [--data DIR] [--sample N] [--positions 128] [--blocks 3]``

DINGO (diffusion-LM decoding under a regular constraint, ``samplers.dingo``) runs over the
explicit token DFA of a constraint, so it applies to the schemas whose compiled grammar is one
regular language (``CompiledGrammar.is_regular``). For a sample of MaskBench files (``--sample``,
drawn with a fixed seed like ``maskbench --sample``) this compiles each schema with a fresh
``Compiler`` over the vocabulary (Llama 3's 128,256 tokens by default) and, for the regular ones,
measures

- **precompute**: ``as_dfa()`` plus ``samplers.dingo.prepare`` (one trie walk per reachable DFA
  state, token classes, the state x class table, distances to acceptance), cold;
- **DP per block**: ``dingo_map`` (Viterbi, the DINGO decoder) and ``dingo_sample`` (exact
  sampling) on ``--blocks`` blocks of ``--positions`` positions of random log-probabilities
  (log-softmax of 3 x standard normal logits, float32), with no position masked and with half the
  positions masked (chosen at random), ``remaining=0`` (the block is the whole output, as in
  DINGO's JSON-Mode-Eval setup) unless no block of that length can close, then with an unbounded
  budget. The first call of each kind per schema is a warm-up and not counted (it builds
  ``dingo_sample``'s set registry).

Prints one table (schemas tried, compiled, regular; precompute p50/p90/max; milliseconds per
block p50/p90 for each decoder and masking), then one line per regular schema with its lattice
size, on stdout; progress goes to stderr. ``--json PATH`` writes the raw numbers.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import torch

from grammars import Compiler, TokenVocabulary
from samplers import NoValidBlock, dingo_map, dingo_sample
from samplers.dingo import prepare

from . import outputs
from .maskbench import default_shared, list_cases, select_sample

__all__ = ["add_arguments", "dingo_bench", "format_table", "main"]


def _quantile(values: Sequence[float], q: float) -> float:
    """The ``q`` quantile (linear interpolation); NaN for no values."""
    return float(np.quantile(np.asarray(values, dtype=np.float64), q)) if len(values) else math.nan


def _random_log_probs(rng: np.random.Generator, positions: int, width: int) -> np.ndarray:
    logits = torch.from_numpy(rng.standard_normal((positions, width), dtype=np.float32)) * 3.0
    return torch.log_softmax(logits, dim=-1).numpy()


def dingo_bench(vocab: TokenVocabulary, files: Sequence[Path], *, positions: int = 128, blocks: int = 3,
                seed: int = 0, log: Callable[[str], None] = outputs.log) -> dict:
    """Compile each schema file, and for the regular ones time DINGO's precompute and blocks.

    Returns ``{"tried", "compiled", "regular", "rows": [...per regular schema...], "errors": {...}}``;
    each row has ``precompute_s`` and per-block times in ms under ``map``, ``sample``,
    ``map_masked``, ``sample_masked``.
    """
    rng = np.random.default_rng(seed)
    width = vocab.logits_width
    rows: list[dict] = []
    errors: dict[str, int] = {}
    compiled = 0
    for n, path in enumerate(files, 1):
        schema = json.loads(path.read_text())["schema"]
        try:
            grammar = Compiler(vocab).compile_json_schema(schema)
        except Exception as exc:  # noqa: BLE001 - a benchmark counts every failure kind
            errors[type(exc).__name__] = errors.get(type(exc).__name__, 0) + 1
            continue
        compiled += 1
        if not grammar.is_regular:
            continue
        t0 = time.perf_counter()
        dfa = grammar.as_dfa()
        tables = prepare(dfa)
        precompute = time.perf_counter() - t0
        start = tables.internal(dfa.start)
        closes = int(tables.dist[start]) <= positions
        remaining = 0 if closes else 1 << 40
        row = {
            "file": path.name, "precompute_s": precompute, "dfa_states": int(dfa.n_states),
            "states": tables.n_states, "classes": tables.n_classes, "live_tokens": tables.n_live_tokens,
            "pairs": int(tables.pair_src.size), "closes_in_block": closes,
            "map": [], "sample": [], "map_masked": [], "sample_masked": [],
        }
        for b in range(blocks + 1):
            lp = _random_log_probs(rng, positions, width)
            masked = rng.random(positions) < 0.5
            gen = torch.Generator().manual_seed(seed + b)
            for key, fn, kwargs in (
                ("map", dingo_map, {}),
                ("sample", dingo_sample, {"generator": gen}),
                ("map_masked", dingo_map, {"keep_masked": masked}),
                ("sample_masked", dingo_sample, {"keep_masked": masked, "generator": gen}),
            ):
                t = time.perf_counter()
                try:
                    fn(dfa, lp, remaining=remaining, **kwargs)
                except NoValidBlock:
                    row.setdefault("no_valid_block", 0)
                    row["no_valid_block"] += 1
                if b:  # the first round warms up
                    row[key].append((time.perf_counter() - t) * 1e3)
        rows.append(row)
        log(f"[dingo] {n}/{len(files)} {path.name}: {tables.n_states} states, {tables.n_classes} classes, "
            f"precompute {precompute:.2f} s, map {np.median(row['map']):.1f} ms, "
            f"sample {np.median(row['sample']):.1f} ms")
    return {"tried": len(files), "compiled": compiled, "regular": len(rows), "rows": rows, "errors": errors,
            "positions": positions, "blocks": blocks, "vocab": vocab.name, "logits_width": width}


def format_table(result: dict) -> str:
    """The summary table and one line per regular schema (Markdown)."""
    rows = result["rows"]
    pre = [r["precompute_s"] for r in rows]

    def ms(key: str) -> str:
        values = [v for r in rows for v in r[key]]
        return f"{_quantile(values, 0.5):.1f} / {_quantile(values, 0.9):.1f}"

    d = result["positions"]
    lines = [
        (f"DINGO on MaskBench, vocabulary {result['vocab']} ({result['logits_width']} logits), "
         f"{d}-position blocks, {result['blocks']} blocks per schema, random log-probs"),
        "",
        ("| schemas tried | compiled | regular | precompute s p50 / p90 / max "
         "| map ms/block p50 / p90 | sample ms/block p50 / p90 "
         "| map, 50% masked p50 / p90 | sample, 50% masked p50 / p90 |"),
        "|--:|--:|--:|--:|--:|--:|--:|--:|",
        (f"| {result['tried']} | {result['compiled']} | {result['regular']} "
         f"| {_quantile(pre, 0.5):.3f} / {_quantile(pre, 0.9):.3f} / {max(pre, default=math.nan):.3f} "
         f"| {ms('map')} | {ms('sample')} | {ms('map_masked')} | {ms('sample_masked')} |"),
        "",
        "| schema | DFA states | classes | live tokens | pairs | precompute s | map ms p50 | sample ms p50 |",
        "|---|--:|--:|--:|--:|--:|--:|--:|",
    ]
    for r in sorted(rows, key=lambda r: -r["precompute_s"]):
        lines.append(f"| {r['file']} | {r['dfa_states']} | {r['classes']} | {r['live_tokens']} | {r['pairs']} "
                     f"| {r['precompute_s']:.3f} | {_quantile(r['map'], 0.5):.1f} "
                     f"| {_quantile(r['sample'], 0.5):.1f} |")
    if result["errors"]:
        lines += ["", "compile errors: " + ", ".join(f"{k} {v}" for k, v in sorted(result["errors"].items()))]
    return "\n".join(lines)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Register the ``dingo`` subcommand's options on ``parser``."""
    parser.add_argument("--tokenizer", type=Path, default=None,
                        help="GGUF vocabulary (default: $CORRAL_SHARED_DIR or ../shared "
                        "vocab/ggml-vocab-llama-bpe.gguf)")
    parser.add_argument("--data", type=Path, default=None,
                        help="MaskBench folder (default: $CORRAL_SHARED_DIR or ../shared jsonschemabench/maskbench)")
    parser.add_argument("--sample", type=int, default=300,
                        help="MaskBench files drawn (seed 0; default %(default)s)")
    parser.add_argument("--only", default="", help="fnmatch pattern on file names")
    parser.add_argument("--positions", type=int, default=128, help="block length (default %(default)s)")
    parser.add_argument("--blocks", type=int, default=3, help="timed blocks per schema (default %(default)s)")
    parser.add_argument("--json", type=Path, default=None, help="write the raw numbers here")
    parser.set_defaults(run=main)


def main(args: argparse.Namespace) -> int:
    """Run the DINGO benchmark with parsed ``args``; returns the process exit status."""
    torch.set_num_threads(1)
    tokenizer = args.tokenizer or default_shared("vocab", "ggml-vocab-llama-bpe.gguf")
    data = args.data or default_shared("jsonschemabench", "maskbench")
    if not Path(tokenizer).exists():
        outputs.log(f"[dingo] vocabulary {tokenizer} not found (pass --tokenizer)")
        return 2
    vocab = TokenVocabulary.from_pretrained(tokenizer)
    files = select_sample(list_cases(data, args.only), args.sample)
    result = dingo_bench(vocab, files, positions=args.positions, blocks=args.blocks)
    result["machine"] = {"cpu_count": os.cpu_count(), "platform": platform.platform()}
    print(format_table(result))
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=1))
    return 0
