"""Constrained decoding with a masked-diffusion LM on MaskBench schemas: validity and cost per mode.

For each schema of a deterministic sample (files whose schema compiles), the tiny diffusion
model (``python -m engine.tiny_diffusion``) fills a canvas after the prompt it was trained on
(``Schema: {...}\\nJSON: ``), once per decoding mode of ``engine.diffusion``: ``none``
(unconstrained), ``greedy`` (per-position masks where the left context is decided), ``auto``
(DINGO for regular schemas, grammar infilling otherwise) and ``infill`` (grammar infilling for
every schema). Reported per mode: parse %, schema-valid % (``jsonschema``), model calls per
sample, tokens committed per step, constraint milliseconds per step, and the overhead in
seconds over unconstrained decoding.

``python -m jsonschemabench diffusion --model models/tiny-diffusion-json --schemas 20``
"""

from __future__ import annotations

import argparse
import json
import random
import time
from pathlib import Path

from . import outputs

__all__ = ["add_arguments", "main"]

MODES = ("none", "greedy", "auto", "infill")


def run(args: argparse.Namespace, say=outputs.log) -> list[dict]:
    import jsonschema

    from engine import HFMaskedDiffusionLM
    from engine.diffusion import diffusion_decode
    from engine.generate import load_vocabulary
    from engine.tiny import PROMPT_TEMPLATE
    from grammars import shared_compiler

    lm = HFMaskedDiffusionLM.from_pretrained(str(args.model))
    vocab = load_vocabulary(lm.tokenizer, lm)
    compiler = shared_compiler(vocab)
    files = sorted(Path(args.data).glob("*.json"))
    random.Random(args.seed).shuffle(files)
    rows: list[dict] = []
    done = 0
    for path in files:
        if done >= args.schemas:
            break
        case = json.loads(path.read_text(encoding="utf-8"))
        schema = case["schema"]
        try:
            grammar = compiler.compile_json_schema(schema)
        except Exception:
            continue
        prompt = PROMPT_TEMPLATE.format(schema=json.dumps(schema, separators=(",", ":"), ensure_ascii=False))
        prompt_ids = vocab.encode(prompt)
        if len(prompt_ids) + args.canvas > 1024:
            continue
        done += 1
        validator = jsonschema.Draft202012Validator(schema)
        for mode in MODES:
            t0 = time.perf_counter()
            try:
                out = diffusion_decode(lm, vocab, prompt_ids, grammar if mode != "none" else None,
                                       canvas_length=args.canvas, steps=args.steps, block_length=args.block,
                                       unmasking=args.unmasking, mode=mode)
            except Exception as error:  # a failed sample is a row, not a crash of the benchmark
                rows.append({"file": path.name, "mode": mode, "regular": grammar.is_regular,
                             "error": f"{type(error).__name__}: {error}"})
                continue
            seconds = time.perf_counter() - t0
            try:
                value = json.loads(out.text.decode("utf-8"))
                parsed, valid = True, validator.is_valid(value)
            except (ValueError, RecursionError):
                parsed, valid = False, False
            rows.append({"file": path.name, "mode": mode, "regular": grammar.is_regular, "parsed": parsed,
                         "valid": valid, "model_calls": out.model_calls, "tokens_per_step": out.tokens_per_step,
                         "constraint_s": out.constraint_seconds, "seconds": seconds, "witness_bytes": out.witness_bytes,
                         "checks": out.checks})
        say(f"  {path.name}: " + ", ".join(f"{r['mode']} valid={r.get('valid')}" for r in rows[-len(MODES):]))
    return rows


def summarize(rows: list[dict], args: argparse.Namespace) -> str:
    lines = [f"canvas {args.canvas}, steps {args.steps}, block {args.block or args.canvas}, unmasking {args.unmasking}; "
             f"{len({r['file'] for r in rows})} schemas ({len({r['file'] for r in rows if r.get('regular')})} regular)", "",
             "| mode | n | parses | schema-valid | model calls / sample | tokens / step | constraint ms / step | s / sample | witness-closed | errors |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    base = {r["file"]: r["seconds"] for r in rows if r["mode"] == "none" and "error" not in r}
    for mode in MODES:
        sel = [r for r in rows if r["mode"] == mode]
        ok = [r for r in sel if "error" not in r]
        n = max(1, len(ok))
        steps = sum(r["model_calls"] for r in ok)
        lines.append(
            f"| {mode} | {len(sel)} | {100 * sum(r['parsed'] for r in ok) / n:.1f}% | "
            f"{100 * sum(bool(r['valid']) for r in ok) / n:.1f}% | {steps / n:.1f} | "
            f"{sum(r['tokens_per_step'] for r in ok) / n:.2f} | {1000 * sum(r['constraint_s'] for r in ok) / max(1, steps):.1f} | "
            f"{sum(r['seconds'] for r in ok) / n:.2f} | {sum(r['witness_bytes'] > 0 for r in ok)} | {len(sel) - len(ok)} |")
    if base:
        lines += ["", "Overhead over unconstrained (mean seconds per sample): " + ", ".join(
            f"{mode} {sum(r['seconds'] - base.get(r['file'], 0) for r in rows if r['mode'] == mode and 'error' not in r) / max(1, len([r for r in rows if r['mode'] == mode and 'error' not in r])):+.2f}"
            for mode in MODES[1:])]
    return "\n".join(lines) + "\n"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Register the ``diffusion`` subcommand's options on ``parser``."""
    parser.add_argument("--model", type=Path, default=Path("models/tiny-diffusion-json"),
                        help="masked-diffusion model folder (python -m engine.tiny_diffusion); default: %(default)s")
    parser.add_argument("--data", type=Path, default=Path(__file__).resolve().parents[2] / "shared" / "jsonschemabench" / "maskbench")
    parser.add_argument("--schemas", type=int, default=20)
    parser.add_argument("--canvas", type=int, default=128)
    parser.add_argument("--steps", type=int, default=64)
    parser.add_argument("--block", type=int, default=None, help="block length (default: one block)")
    parser.add_argument("--unmasking", default="threshold", choices=("confidence", "threshold", "entropy"))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=Path("bench-results") / "diffusion")
    parser.set_defaults(run=main)


def main(args: argparse.Namespace) -> int:
    rows = run(args)
    args.out.mkdir(parents=True, exist_ok=True)
    with open(args.out / "rows.jsonl", "w", encoding="utf-8") as sink:
        for row in rows:
            sink.write(json.dumps(row) + "\n")
    (args.out / "summary.md").write_text(summarize(rows, args), encoding="utf-8")
    return outputs.show_run(args.out, ["rows.jsonl", "summary.md"])
