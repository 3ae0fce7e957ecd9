"""The README quickstart: a schema-valid JSON value from a tiny model, offline, in about two minutes.

``python -m engine.quickstart`` trains a quick tiny JSON model when ``--model`` (default
``models/tiny-json-quick``) holds none — ``engine.tiny`` for ``--minutes`` (1) on part of
MaskBench from ``../shared`` (or ``$CORRAL_SHARED_DIR``), without its evaluation — then compiles
a small schema, generates one value, prints it on stdout and checks it with ``jsonschema``.
Progress goes to stderr. Exit status 0 when the value validates. Nothing is downloaded.

A minute of training teaches the model little JSON; the constraint makes its output valid all
the same. ``--evaluate`` also measures the model on held-out schemas (``engine.tiny``'s
evaluation, several minutes). The model the README's examples and benchmarks use is the 8-minute
one: ``python -m engine.tiny ... --out models/tiny-json``, then ``--model models/tiny-json``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["SCHEMA", "QuickTraining", "ensure_model", "start_warm_up", "warm_up", "generate_value", "main"]

#: A schema with the usual parts: required properties, a bounded integer, an enum, an array.
SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 20},
        "age": {"type": "integer", "minimum": 0, "maximum": 130},
        "role": {"enum": ["admin", "user", "guest"]},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 10}, "maxItems": 3},
    },
    "required": ["name", "age", "role"],
    "additionalProperties": False,
}

Log = Callable[[str], None]


def _stderr(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def shared_dir() -> Path:
    """``$CORRAL_SHARED_DIR``, else ``../shared`` from the working directory."""
    return Path(os.environ.get("CORRAL_SHARED_DIR") or Path("..") / "shared")


@dataclass(frozen=True)
class QuickTraining:
    """The quickstart's training recipe: ``engine.tiny`` cut to what a first look needs.

    ``limit_files``: reading and tokenizing all of MaskBench takes ~10 s on two cores, more data
    than a minute of training gets through; ``eval_n=0``: the held-out evaluation takes minutes.
    """

    minutes: float = 1.0
    limit_files: int = 3000
    log_every: int = 10
    #: measured beyond the training budget on a fresh checkout: imports, the tokenizer, the data, saving
    overhead_s: float = 25.0

    def argv(self, vocab: Path, data: Path, out: Path) -> list[str]:
        """``python -m engine.tiny`` arguments for this recipe."""
        return ["--vocab", str(vocab), "--data", str(data), "--out", str(out), "--minutes", f"{self.minutes:g}",
                "--limit-files", str(self.limit_files), "--log-every", str(self.log_every), "--eval-n", "0"]


def ensure_model(model: Path, recipe: QuickTraining = QuickTraining(), log: Log = _stderr) -> None:
    """Train the tiny model into ``model`` unless a saved one is there already."""
    if (model / "config.json").is_file():
        return
    vocab, data = _shared("vocab", "ggml-vocab-gpt-2.gguf"), _shared("jsonschemabench", "maskbench")
    log(f"no model at {model}: training the tiny model (about {60 * recipe.minutes + recipe.overhead_s:.0f} s) ...")
    from engine import tiny

    status = tiny.main(recipe.argv(vocab, data, model), log=log)
    if status:
        raise SystemExit(status)


def start_warm_up(schema: Any) -> subprocess.Popen:
    """Compile ``schema`` in a second process while the model trains on the first core.

    On a fresh checkout the first compile pays for compiling corral's numba kernels (cached on
    disk after that) and for the vocabulary's trie, a minute or more on two cores: done beside
    training, the quickstart's own compile then finds them ready."""
    code = "import json, sys; from engine.quickstart import warm_up; warm_up(json.loads(sys.argv[1]))"
    return subprocess.Popen([sys.executable, "-c", code, json.dumps(schema)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def warm_up(schema: Any) -> None:
    """Compile ``schema`` for the quickstart's vocabulary and compute a first mask (fills the
    on-disk caches: numba kernels, the vocabulary's trie and tokenizer)."""
    from grammars import TokenVocabulary, allocate_token_bitmask, compile_json_schema

    vocab = TokenVocabulary.from_gguf(_shared("vocab", "ggml-vocab-gpt-2.gguf"))
    matcher = compile_json_schema(schema, vocab).matcher()
    matcher.fill_mask(allocate_token_bitmask(1, vocab.logits_width), 0)


def generate_value(model: Path, schema: Any, *, max_tokens: int, seed: int, log: Log = _stderr):
    """Load the model, compile ``schema``, generate one value (a ``GenerationResult``), saying each step.

    The prompt is the one ``engine.tiny`` trains on. One ``Compiler`` serves both steps: the
    explicit compile here is what ``generate`` then finds in its cache.
    """
    from engine.generate import generate
    from engine.tiny import PROMPT_TEMPLATE
    from grammars import Compiler

    log(f"loading the model from {model} ...")
    lm, vocab = _load(model)
    log("compiling the schema ...")
    t0 = time.perf_counter()
    compiler = Compiler(vocab)
    compiler.compile_json_schema(schema)
    log(f"compiled in {time.perf_counter() - t0:.1f} s; generating (at most {max_tokens} tokens) ...")
    prompt = PROMPT_TEMPLATE.format(schema=json.dumps(schema, separators=(",", ":"), ensure_ascii=False))
    return generate(prompt, schema=schema, model=lm, tokenizer=vocab, compiler=compiler, max_tokens=max_tokens,
                    seed=seed, temperature=0.7)


def main(argv: Sequence[str] | None = None) -> int:
    """Train if needed, generate, print the value, validate it; returns the exit status."""
    parser = argparse.ArgumentParser(prog="python -m engine.quickstart", description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, default=Path("models") / "tiny-json-quick", help="model folder")
    parser.add_argument("--minutes", type=float, default=QuickTraining.minutes,
                        help=f"training budget when the model is missing ({QuickTraining.minutes:g})")
    parser.add_argument("--schema", type=Path, help="a JSON Schema file (default: a small person schema)")
    parser.add_argument("--max-tokens", type=int, default=96, help="token budget (96)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--evaluate", action="store_true",
                        help="also measure the model on held-out schemas (engine.tiny's evaluation; minutes)")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch CPU threads (1: the model is small, and on a busy two-core machine two "
                        "threads trained three times fewer steps in the same minute)")
    args = parser.parse_args(argv)
    _quiet_setup(args.threads)
    schema = json.loads(args.schema.read_text(encoding="utf-8")) if args.schema else SCHEMA
    warming = None if (args.model / "config.json").is_file() else start_warm_up(schema)
    ensure_model(args.model, QuickTraining(minutes=args.minutes))
    if warming is not None and warming.poll() is None:
        _stderr("waiting for the first compile, started beside the training (numba kernels, once per checkout) ...")
        warming.wait()
    result = generate_value(args.model, schema, max_tokens=args.max_tokens, seed=args.seed)
    print(result.text, flush=True)
    valid = _report(result, schema)
    if args.evaluate:
        _evaluate(args.model)
    return 0 if valid else 1


def _quiet_setup(threads: int) -> None:
    """Torch's thread count for training and generating; transformers' progress bars off (the
    quickstart says what it is doing itself)."""
    import torch
    from transformers.utils import logging

    torch.set_num_threads(threads)
    logging.disable_progress_bar()


def _report(result, schema: Any) -> bool:
    """Validate the value with ``jsonschema``; one summary line on stderr. Returns validity."""
    import jsonschema

    try:
        jsonschema.validate(result.value, schema)
        valid = True
    except jsonschema.ValidationError as exc:
        valid = False
        _stderr(f"not valid: {exc.message}")
    per_token = f"{1e3 * result.mean_token_s:.1f} ms/token" if result.mean_token_s else "-"
    _stderr(f"finish_reason={result.finish_reason} tokens={len(result.token_ids)} valid={valid} "
            f"compile={1e3 * result.compile_s:.0f} ms {per_token}")
    return valid


def _evaluate(model: Path) -> None:
    """``engine.tiny``'s held-out evaluation of the saved model, logged."""
    from engine import tiny

    lm, vocab = _load(model)
    _, held = tiny.load_examples(_shared("jsonschemabench", "maskbench"))
    gbnf = shared_dir() / "gbnf" / "json.gbnf"
    _stderr(f"evaluating on held-out schemas ({len({ex.source for ex in held})} schemas; minutes) ...")
    tiny.held_out_report(lm.model, vocab, held, json_gbnf=gbnf.read_text(encoding="utf-8") if gbnf.is_file() else None,
                         log=_stderr)


def _load(model: Path):
    """The ``HFCausalLM`` in ``model`` and its vocabulary, widened to the model's logits."""
    from engine.generate import load_model, load_vocabulary

    lm, tokenizer = load_model(str(model))
    return lm, load_vocabulary(tokenizer, lm)


def _shared(*parts: str) -> Path:
    path = shared_dir().joinpath(*parts)
    if not path.exists():
        raise SystemExit(f"{path} not found: put the shared data at ../shared or set CORRAL_SHARED_DIR")
    return path


if __name__ == "__main__":
    sys.exit(main())
