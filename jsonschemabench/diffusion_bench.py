"""Constrained decoding with a masked-diffusion LM: validity and cost per decoding mode.

Two tasks (``--task``):

* ``json``: for each schema of a deterministic MaskBench sample (files whose schema compiles), the
  tiny diffusion model (``python -m engine.tiny_diffusion --corpus json``) fills a canvas after
  the prompt it was trained on (``Schema: {...}\\nJSON: ``). Parse % is ``json.loads``,
  schema-valid % is ``jsonschema``.
* ``cpp``: for each of the first ``--tasks`` HumanEval-X C++ tasks, the declaration (includes and
  the function's signature up to its opening brace) is the prompt and the canvas writes the body
  under the built-in ``"cpp"`` grammar, which reads the declaration first (``output_prefix``).
  The model is a tiny C++ one (``--corpus cpp``: the g++ headers, never HumanEval-X). Parse % is
  membership of declaration + output in the C++ grammar, valid % is ``g++ -fsyntax-only`` on it
  (which also checks names and types).

Modes of ``engine.diffusion``: ``none`` (unconstrained), ``greedy`` (per-position masks where the
left context is decided), ``auto`` (DINGO for regular constraints, grammar infilling otherwise;
the C++ grammar is context-free, so the C++ task runs ``infill`` only) and ``infill``.

Settings: ``--canvas``/``--steps``/``--block-length`` give one; ``--protocol json-mode-eval``
gives JSON-Mode-Eval's (canvas 128, 64 steps, one block) and a semi-autoregressive one (the
same with blocks of ``--block-length``, 32 by default).

Reported per setting and mode: parse %, valid %, model calls per sample, tokens per step
(``DiffusionResult.tokens_per_step``: positions committed by model calls, per model call — EOS
padding and witness fills excluded — averaged over samples), canvas positions decided per model
call (the same plus EOS padding and witness-closed positions), constraint milliseconds per
step, seconds per sample, the samples a witness closed, the commits the witness masked again to
fit its fills in their positions (``reopened``, summed), the outputs longer than the canvas
(``overflow``; always 0 unless given positions leave no room) and the overhead in seconds over
unconstrained decoding.

``python -m jsonschemabench diffusion --protocol json-mode-eval --schemas 6``
``python -m jsonschemabench diffusion --task cpp --tasks 6 --canvas 128 --steps 64``
"""

from __future__ import annotations

import argparse
import gzip
import json
import random
import shutil
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from . import outputs

__all__ = ["Setting", "Protocol", "PROTOCOLS", "add_arguments", "main", "settings", "summarize"]

MODES = ("none", "greedy", "auto", "infill")
CPP_MODES = ("none", "greedy", "infill")  # auto is infill for a context-free grammar
_SHARED = Path(__file__).resolve().parents[2] / "shared"


@dataclass(frozen=True)
class Setting:
    """One decoding configuration: canvas positions, model steps, block length (None: one block)."""

    name: str
    canvas: int
    steps: int
    block: int | None = None

    def describe(self) -> str:
        return f"{self.name}: canvas {self.canvas}, {self.steps} steps, " + (
            "one block" if self.block is None else f"blocks of {self.block}")


@dataclass(frozen=True)
class Protocol:
    """A published evaluation setup: its canvas and step budget, run in one block and semi-autoregressively."""

    canvas: int
    steps: int

    def settings(self, block: int) -> list[Setting]:
        return [Setting("one block", self.canvas, self.steps, None), Setting("semi-AR", self.canvas, self.steps, block)]


PROTOCOLS = {"json-mode-eval": Protocol(canvas=128, steps=64)}


def settings(args: argparse.Namespace) -> list[Setting]:
    """The settings ``args`` ask for: a protocol's (its semi-autoregressive one in blocks of
    ``--block-length``, 32 unless given), or the one of ``--canvas/--steps/--block-length``."""
    if args.protocol is None:
        return [Setting("custom", args.canvas, args.steps, args.block)]
    return PROTOCOLS[args.protocol].settings(args.block or 32)


@dataclass
class _Sample:
    """One prompt to decode: its id, model prompt, the constraint, what the constraint reads first
    and how to score a text."""

    name: str
    prompt_ids: list[int]
    grammar: Any
    output_prefix: list[int]
    score: Callable[[bytes], tuple[bool, bool]]  # text -> (parsed, valid)


def _json_samples(args: argparse.Namespace, vocab, compiler, longest_canvas: int) -> Iterator[_Sample]:
    import jsonschema

    from engine.tiny import PROMPT_TEMPLATE

    files = sorted(Path(args.data).glob("*.json"))
    random.Random(args.seed).shuffle(files)
    done = 0
    for path in files:
        if done >= args.schemas:
            return
        schema = json.loads(path.read_text(encoding="utf-8"))["schema"]
        try:
            grammar = compiler.compile_json_schema(schema)
        except Exception:  # the sample is of schemas that compile
            continue
        prompt = PROMPT_TEMPLATE.format(schema=json.dumps(schema, separators=(",", ":"), ensure_ascii=False))
        prompt_ids = vocab.encode(prompt)
        if len(prompt_ids) + longest_canvas > 1024:
            continue
        done += 1
        validator = jsonschema.Draft202012Validator(schema)

        def score(text: bytes, validator=validator) -> tuple[bool, bool]:
            try:
                value = json.loads(text.decode("utf-8"))
            except (ValueError, RecursionError):
                return False, False
            return True, bool(validator.is_valid(value))

        yield _Sample(path.name, prompt_ids, grammar, [], score)


def _cpp_samples(args: argparse.Namespace, vocab, compiler) -> Iterator[_Sample]:
    from grammars import builtin_grammar

    from .infill_bench import _gxx_ok

    grammar = compiler.compile_lark(builtin_grammar("cpp"))
    with gzip.open(args.humaneval, "rt", encoding="utf-8") as lines:
        tasks = [json.loads(line) for line in lines][: args.tasks]
    eos = min(vocab.eos_token_ids)
    for task in tasks:
        declaration = task["declaration"]
        ids = vocab.encode(declaration)

        def score(text: bytes, declaration=declaration) -> tuple[bool, bool]:
            program = declaration + text.decode("utf-8", "replace")
            member = bool(grammar.completable([program]))
            return member, _gxx_ok(program)

        # the model was trained on documents after one EOS (engine.tiny_diffusion --corpus cpp)
        yield _Sample(task["task_id"], [eos] + ids, grammar, ids, score)


def run(args: argparse.Namespace, say=outputs.log, lm=None) -> list[dict]:
    """Rows of one decoded canvas each (sample × setting × mode); ``lm``: a loaded model instead of ``--model``."""
    from engine import HFMaskedDiffusionLM
    from engine.diffusion import diffusion_decode
    from engine.generate import load_vocabulary
    from grammars import shared_compiler

    if lm is None:
        lm = HFMaskedDiffusionLM.from_pretrained(str(args.model))
    vocab = load_vocabulary(lm.tokenizer, lm)
    compiler = shared_compiler(vocab)
    plan = settings(args)
    if args.task == "cpp":
        samples, modes = _cpp_samples(args, vocab, compiler), CPP_MODES
    else:
        samples, modes = _json_samples(args, vocab, compiler, max(s.canvas for s in plan)), MODES
    rows: list[dict] = []
    for sample in samples:
        for setting in plan:
            for mode in modes:
                rows.append(_decode_row(diffusion_decode, lm, vocab, sample, setting, mode, args))
            say(f"  {sample.name} [{setting.name}]: " + ", ".join(
                f"{r['mode']} valid={r.get('valid')}" for r in rows[-len(modes):]))
    return rows


def _decode_row(decode, lm, vocab, sample: _Sample, setting: Setting, mode: str, args) -> dict:
    row: dict[str, Any] = {"file": sample.name, "setting": setting.name, "mode": mode,
                           "regular": bool(sample.grammar.is_regular)}
    t0 = time.perf_counter()
    try:
        out = decode(lm, vocab, sample.prompt_ids, None if mode == "none" else sample.grammar,
                     canvas_length=setting.canvas, steps=setting.steps, block_length=setting.block,
                     unmasking=args.unmasking, mode=mode, output_prefix=sample.output_prefix)
    except Exception as error:  # a failed sample is a row, not a crash of the benchmark
        return row | {"error": f"{type(error).__name__}: {error}"}
    seconds = time.perf_counter() - t0
    parsed, valid = sample.score(out.text)
    return row | {"parsed": parsed, "valid": valid, "model_calls": out.model_calls,
                  "committed": sum(out.committed_per_step), "tokens_per_step": out.tokens_per_step,
                  "positions_per_call": out.positions_per_call, "padded": out.padded,
                  "witness_positions": out.witness_positions, "witness_bytes": out.witness_bytes,
                  "reopened": out.reopened, "overflow": out.overflow,
                  "constraint_s": out.constraint_seconds, "seconds": seconds, "checks": out.checks,
                  "refused": out.refused, "text": out.text.decode("utf-8", "replace")}


def summarize(rows: list[dict], args: argparse.Namespace) -> str:
    """One markdown table per setting, rows per mode, and the overhead over unconstrained decoding."""
    names = {"json": ("parses", "schema-valid"), "cpp": ("C++ grammar", "g++ -fsyntax-only")}[args.task]
    modes = [m for m in MODES if any(r["mode"] == m for r in rows)]
    lines = [(f"task {args.task}, unmasking {args.unmasking}; {len({r['file'] for r in rows})} samples "
              f"({len({r['file'] for r in rows if r.get('regular')})} regular constraints)")]
    for setting in settings(args):
        at = [r for r in rows if r["setting"] == setting.name]
        lines += ["", f"**{setting.describe()}**", "",
                  (f"| mode | n | {names[0]} | {names[1]} | model calls / sample | tokens / step | positions / call "
                   "| constraint ms / step | s / sample | witness-closed | reopened | over the canvas | errors |"),
                  "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
        base = {r["file"]: r["seconds"] for r in at if r["mode"] == "none" and "error" not in r}
        overheads = []
        for mode in modes:
            sel = [r for r in at if r["mode"] == mode]
            ok = [r for r in sel if "error" not in r]
            n = max(1, len(ok))
            calls = sum(r["model_calls"] for r in ok)
            lines.append(
                f"| {mode} | {len(sel)} | {100 * sum(r['parsed'] for r in ok) / n:.1f}% | "
                f"{100 * sum(bool(r['valid']) for r in ok) / n:.1f}% | {calls / n:.1f} | "
                f"{sum(r['tokens_per_step'] for r in ok) / n:.2f} | {sum(r['positions_per_call'] for r in ok) / n:.2f} | "
                f"{1000 * sum(r['constraint_s'] for r in ok) / max(1, calls):.1f} | "
                f"{sum(r['seconds'] for r in ok) / n:.2f} | {sum(r['witness_bytes'] > 0 for r in ok)} | "
                f"{sum(r.get('reopened', 0) for r in ok)} | {sum(r.get('overflow', 0) > 0 for r in ok)} | "
                f"{len(sel) - len(ok)} |")
            if mode != "none" and base:
                paired = [r["seconds"] - base[r["file"]] for r in ok if r["file"] in base]
                overheads.append(f"{mode} {sum(paired) / max(1, len(paired)):+.2f}")
        if overheads:
            lines += ["", "Overhead over unconstrained (mean seconds per sample): " + ", ".join(overheads)]
    return "\n".join(lines) + "\n"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Register the ``diffusion`` subcommand's options on ``parser``."""
    parser.add_argument("--task", choices=("json", "cpp"), default="json",
                        help="MaskBench schemas (json) or HumanEval-X C++ bodies (cpp); default: %(default)s")
    parser.add_argument("--model", type=Path, default=None,
                        help="masked-diffusion model folder (python -m engine.tiny_diffusion); default: "
                             "models/tiny-diffusion-json, or models/tiny-diffusion-cpp for --task cpp")
    parser.add_argument("--data", type=Path, default=_SHARED / "jsonschemabench" / "maskbench")
    parser.add_argument("--humaneval", type=Path, default=_SHARED / "humaneval-x" / "humaneval_cpp.jsonl.gz",
                        help="HumanEval-X C++ tasks for --task cpp")
    parser.add_argument("--schemas", type=int, default=20, help="MaskBench schemas (--task json)")
    parser.add_argument("--tasks", type=int, default=6, help="the first N HumanEval-X tasks (--task cpp)")
    parser.add_argument("--protocol", choices=sorted(PROTOCOLS), default=None,
                        help="preset settings: json-mode-eval = canvas 128, 64 steps, one block, and the same "
                             "semi-autoregressive (blocks of --block-length, 32 unless given)")
    parser.add_argument("--canvas", type=int, default=128)
    parser.add_argument("--steps", type=int, default=64)
    parser.add_argument("--block-length", "--block", dest="block", type=int, default=None,
                        help="semi-autoregressive block length (default: one block)")
    parser.add_argument("--unmasking", default="threshold", choices=("confidence", "threshold", "entropy"))
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=Path("bench-results") / "diffusion")
    parser.set_defaults(run=main)


def main(args: argparse.Namespace) -> int:
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    if args.model is None:
        args.model = Path("models") / ("tiny-diffusion-cpp" if args.task == "cpp" else "tiny-diffusion-json")
    if args.task == "cpp" and shutil.which("g++") is None:
        outputs.log("g++ not found: --task cpp checks outputs with g++ -fsyntax-only")
        return 2
    rows = run(args)
    args.out.mkdir(parents=True, exist_ok=True)
    with open(args.out / "rows.jsonl", "w", encoding="utf-8") as sink:
        for row in rows:
            sink.write(json.dumps(row) + "\n")
    (args.out / "summary.md").write_text(summarize(rows, args), encoding="utf-8")
    return outputs.show_run(args.out, ["rows.jsonl", "summary.md"])
