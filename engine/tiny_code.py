"""Train a tiny C++ code model on CPU, with fill-in-the-middle, for infilling demos and benchmarks.

Real code-model weights cannot be downloaded here, so the infilling benchmark uses a model the
project trains itself. Its corpus is C++ source already on the machine — the C++ standard
library's headers that ship with g++ (``/usr/include/c++/<version>``), comments stripped — and
never HumanEval-X, which the benchmark evaluates on. Chunks of whole top-level blocks become
training examples; half of them are turned into fill-in-the-middle examples in the
prefix-suffix-middle format (``<fim_prefix> before <fim_suffix> after <fim_middle> middle <eos>``),
so a tokenizer with FIM tokens (StarCoder's, ``ggml-vocab-starcoder.gguf``) gives a model that
``engine.infill`` prompts with the text on both sides of a hole. Architecture, training loop
and saving are ``engine.tiny``'s::

    python -m engine.tiny_code --vocab ../shared/vocab/ggml-vocab-starcoder.gguf \\
        --out models/tiny-cpp --minutes 6
"""

from __future__ import annotations

import argparse
import glob
import random
import re
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch

from engine.tiny import TinyConfig, build_model, load_tokenizer, save, train, _write_metrics

__all__ = ["cpp_sources", "cpp_chunks", "encode_code_examples", "main"]

_BLOCK_COMMENT = re.compile(r"/\*.*?\*/", re.S)
_LINE_COMMENT = re.compile(r"//[^\n]*")
_BLANK_LINES = re.compile(r"\n\s*\n+")


def cpp_sources(roots: Sequence[str] | None = None) -> list[Path]:
    """C++ source files to train on: the g++ standard library headers unless ``roots`` are given."""
    patterns = roots or ["/usr/include/c++/*"]
    files: list[Path] = []
    for pattern in patterns:
        for root in sorted(glob.glob(pattern)):
            path = Path(root)
            if path.is_file():
                files.append(path)
            elif path.is_dir():
                files.extend(p for p in sorted(path.rglob("*")) if p.is_file() and p.suffix in {"", ".h", ".tcc", ".hpp",
                                                                                              ".cpp", ".cc"})
    return files


def cpp_chunks(text: str, *, max_chars: int = 1200, min_chars: int = 80) -> list[str]:
    """Comment-free pieces of ``text`` made of whole top-level blocks (brace depth back at zero)."""
    code = _BLANK_LINES.sub("\n", _LINE_COMMENT.sub("", _BLOCK_COMMENT.sub("", text)))
    chunks, current, depth = [], [], 0
    size = 0
    for line in code.split("\n"):
        if not line.strip():
            continue
        current.append(line)
        size += len(line) + 1
        depth += line.count("{") - line.count("}")
        if depth <= 0 and size >= min_chars:
            depth = 0
            chunk = "\n".join(current) + "\n"
            if len(chunk) <= max_chars:
                chunks.append(chunk)
            current, size = [], 0
    return chunks


def encode_code_examples(chunks: Sequence[str], vocab, *, fim: tuple[int, int, int] | None, max_len: int,
                         fim_rate: float = 0.5, seed: int = 0) -> list[tuple[list[int], int]]:
    """Token ids and the length of the unsupervised prompt: a plain chunk is all completion; a FIM
    example supervises the middle and EOS only."""
    rng = random.Random(seed)
    eos = min(vocab.eos_token_ids)
    out = []
    for chunk in chunks:
        if fim is not None and rng.random() < fim_rate:
            a, b = sorted(rng.sample(range(len(chunk) + 1), 2))
            prompt = [fim[0]] + vocab.encode(chunk[:a]) + [fim[1]] + vocab.encode(chunk[b:]) + [fim[2]]
            ids = prompt + vocab.encode(chunk[a:b]) + [eos]
            start = len(prompt)
        else:
            ids = [eos] + vocab.encode(chunk) + [eos]  # EOS doubles as the document start
            start = 1
        if len(ids) <= max_len:
            out.append((ids, start))
    return out


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m engine.tiny_code", description=__doc__.split("\n\n")[0])
    p.add_argument("--vocab", required=True, help="tokenizer: a .gguf vocabulary (StarCoder's has FIM tokens)")
    p.add_argument("--out", required=True, help="output folder for the model and tokenizer")
    p.add_argument("--source", action="append", help="C++ files or folders (glob); default: the g++ headers")
    p.add_argument("--minutes", type=float, default=6.0, help="training wall-clock budget (6)")
    p.add_argument("--max-steps", type=int, help="stop after this many steps instead of the time budget")
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--hidden", type=int, default=128)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--max-len", type=int, default=384, help="longest training sequence in tokens (384)")
    p.add_argument("--batch-tokens", type=int, default=4096)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--negatives", type=int, default=2048, help="sampled-softmax negatives; -1: full softmax")
    p.add_argument("--fim-rate", type=float, default=0.5, help="fraction of fill-in-the-middle examples (0.5)")
    p.add_argument("--seed", type=int, default=0)
    return p


def main(argv: Sequence[str] | None = None, *, log: Callable[[str], None] | None = None) -> int:
    args = _parser().parse_args(argv)
    log = log or (lambda m: print(m, flush=True))
    t0 = time.perf_counter()
    tokenizer, vocab = load_tokenizer(args.vocab)
    files = cpp_sources(args.source)
    if not files:
        log("no C++ sources found (is g++ installed? pass --source)")
        return 2
    chunks = [c for f in files for c in cpp_chunks(f.read_text(encoding="utf-8", errors="replace"))]
    known = tokenizer.get_vocab()
    names = ("<fim_prefix>", "<fim_suffix>", "<fim_middle>")
    fim = tuple(known[n] for n in names) if all(n in known for n in names) else None
    encoded = encode_code_examples(chunks, vocab, fim=fim, max_len=args.max_len, fim_rate=args.fim_rate,
                                   seed=args.seed)
    log(f"data: {len(files)} files, {len(chunks)} chunks, {len(encoded)} examples "
        f"({'with' if fim else 'without'} fill-in-the-middle) ({time.perf_counter() - t0:.1f}s)")
    eos = min(vocab.eos_token_ids)
    config = TinyConfig(vocab_size=vocab.logits_width, n_layer=args.layers, hidden=args.hidden, n_head=args.heads,
                        max_positions=2048, bos_token_id=vocab.bos_token_id, eos_token_id=eos)
    model = build_model(config, seed=args.seed)
    stats = train(model, encoded, minutes=args.minutes, max_steps=args.max_steps, batch_tokens=args.batch_tokens,
                  lr=args.lr, pad_token_id=eos, seed=args.seed, log=log,
                  sampled_negatives=None if args.negatives < 0 else args.negatives)
    log(f"trained {stats.steps} steps, {stats.examples} examples in {stats.seconds:.0f}s")
    model.generation_config.eos_token_id = eos
    model.generation_config.pad_token_id = eos
    out = save(model, tokenizer, args.out)
    metrics: dict[str, Any] = {
        "config": asdict(config), "corpus_files": len(files), "examples": len(encoded), "fim": fim is not None,
        "train": {k: v for k, v in asdict(stats).items() if k != "losses"}
        | {"final_loss": sum(stats.losses[-50:]) / max(1, len(stats.losses[-50:]))},
        "total_seconds": time.perf_counter() - t0,
    }
    _write_metrics(out, metrics)
    log(f"saved {out}")
    return 0


if __name__ == "__main__":
    torch.set_num_threads(max(1, torch.get_num_threads()))
    sys.exit(main())
