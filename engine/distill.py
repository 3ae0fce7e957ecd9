"""Distil a draft model for speculative decoding: a reduced output vocabulary and the target's outputs.

A draft pays only when its step costs a small fraction of the target's and the target accepts
most of what it proposes. With a 50k-token vocabulary and a small model, the output layer is most
of a draft step, and a draft trained on the same corpus as the target still disagrees with it
wherever the target's own outputs differ from the corpus (a small target repeats itself inside
strings; the corpus does not). This module fixes both, on CPU, in minutes:

1. **Reduced output vocabulary** (FR-Spec, Zhao et al. 2025): the draft's output layer keeps the
   ``size`` tokens most frequent in the training completions (EOS always), written to
   ``output_vocab.json`` beside the weights. ``engine.speculative.load_draft_lm`` (and
   ``generate(draft_model=PATH)``) then loads the draft with ``HFCausalLM(output_ids=...)``: its
   distribution is the softmax over that subset, the ``q`` verification uses, so decoding stays
   exact; only tokens outside the subset can never be drafted.
2. **Distillation on the target's outputs** (DistillSpec, Zhou et al. 2024): the target generates
   under each training schema's grammar (greedy, or sampled at temperature 1 for a ``--sampled``
   fraction of the schemas: the contexts the draft meets in service), and the draft is trained
   to match the target's next-token distribution over the subset (soft labels: the
   target's logits on those sequences) on those outputs and, mixed in, on the corpus completions.

Command line (the draft the speculative benchmark uses)::

    python -m engine.distill --target models/tiny-json --draft models/tiny-json-draft \\
        --vocab ../shared/vocab/ggml-vocab-gpt-2.gguf --data ../shared/jsonschemabench/maskbench \\
        --out models/tiny-json-draft-distilled --output-vocab 4096 --generate-minutes 15 --minutes 12 --threads 1

Held-out schemas (``engine.tiny``'s split) are never generated on or trained on.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from engine.lm import OUTPUT_VOCAB_FILE
from engine.tiny import column_logits, pad_rows

__all__ = ["distillation_loss", "frequent_tokens", "main", "target_outputs", "write_output_vocab"]


def frequent_tokens(encoded: Iterable[tuple[Sequence[int], int]], size: int, *,
                    always: Iterable[int] = ()) -> list[int]:
    """The ``size`` token ids most frequent in the completions of ``encoded`` (``(ids, prompt_len)``
    rows), ties by id, plus ``always`` (EOS); sorted."""
    if size < 1:
        raise ValueError(f"the output vocabulary needs at least one token, got size {size}")
    counts: Counter[int] = Counter()
    for ids, prompt_len in encoded:
        counts.update(int(t) for t in ids[prompt_len:])
    ranked = sorted(counts, key=lambda t: (-counts[t], t))
    return sorted(set(ranked[:size]) | {int(t) for t in always})


def write_output_vocab(folder: str | Path, ids: Sequence[int], **about: Any) -> Path:
    """Write ``folder/output_vocab.json``: ``{"ids": [...], ...about}`` (what ``read_output_vocab`` reads)."""
    path = Path(folder) / OUTPUT_VOCAB_FILE
    path.write_text(json.dumps({"ids": [int(t) for t in ids], **about}) + "\n", encoding="utf-8")
    return path


def target_outputs(target_lm: Any, vocab: Any, examples: Sequence[Any], *, minutes: float, max_tokens: int = 96,
                   limit: int | None = None, sampled: float = 0.0, seed: int = 0,
                   log: Callable[[str], None] | None = print) -> list[tuple[list[int], int]]:
    """The target's constrained outputs on the prompts of ``examples`` (one per schema, in random
    order) until ``minutes`` pass (or ``limit`` outputs): ``(prompt + output [+ EOS], prompt_len)``
    rows. Each output is greedy, or with probability ``sampled`` sampled at temperature 1 (the
    contexts a draft meets when the target samples). A schema that fails to compile or to decode
    is skipped (counted in the log)."""
    from engine.generate import generate
    from engine.tiny import encode_examples
    from grammars import Compiler

    by_schema: dict[str, Any] = {}
    for ex in examples:
        by_schema.setdefault(ex.source, ex)
    chosen = list(by_schema.values())
    rng = random.Random(seed)
    rng.shuffle(chosen)
    compiler = Compiler(vocab)
    eos = min(vocab.eos_token_ids)
    rows: list[tuple[list[int], int]] = []
    skipped = 0
    start = time.perf_counter()
    for ex in chosen:
        if time.perf_counter() - start >= minutes * 60.0 or (limit is not None and len(rows) >= limit):
            break
        (prompt_and_instance, prompt_len), = encode_examples([ex], vocab, max_len=10**9)
        prompt = prompt_and_instance[:prompt_len]
        temperature = 1.0 if rng.random() < sampled else 0.0
        try:
            out = generate(prompt, schema=ex.schema, model=target_lm, tokenizer=vocab, compiler=compiler,
                           max_tokens=max_tokens, temperature=temperature, seed=rng.randrange(2**31),
                           budget_closing=False)
        except Exception:  # noqa: BLE001 - a schema the compiler refuses or a limit: skip it, keep going
            skipped += 1
            continue
        rows.append((prompt + list(out.token_ids) + ([eos] if out.finish_reason == "stop" else []), prompt_len))
        if log is not None and len(rows) % 100 == 0:
            log(f"target outputs: {len(rows)} sequences ({skipped} schemas skipped), "
                f"{time.perf_counter() - start:.0f}s")
    if log is not None:
        log(f"target outputs: {len(rows)} sequences, {skipped} schemas skipped, {time.perf_counter() - start:.0f}s")
    return rows


def distillation_loss(teacher: Any, output_ids: Sequence[int]) -> Callable[..., tuple[torch.Tensor, int]]:
    """An ``engine.tiny.train`` loss: cross-entropy of the student's softmax over ``output_ids``
    against the teacher's softmax over the same ids, at every completion position (the KL to the
    teacher's distribution restricted to the draft's output vocabulary, up to a constant)."""
    ids = torch.tensor(sorted({int(t) for t in output_ids}), dtype=torch.long)
    teacher.eval()

    def loss(model, rows, *, candidates=None, pad_token_id: int = 0, bf16: bool = False) -> tuple[torch.Tensor, int]:
        device = next(model.parameters()).device
        batch, attention, completion = pad_rows(rows, pad_token_id, device)
        predicts = completion[:, 1:]  # the positions whose next token is a completion token
        columns = ids.to(device)
        with torch.no_grad():
            hidden = teacher.base_model(input_ids=batch, attention_mask=attention).last_hidden_state[:, :-1][predicts]
            soft = torch.softmax(column_logits(teacher.get_output_embeddings(), hidden, columns).float(), dim=-1)
        hidden = model.base_model(input_ids=batch, attention_mask=attention).last_hidden_state[:, :-1][predicts]
        logits = column_logits(model.get_output_embeddings(), hidden, columns).float()
        return F.cross_entropy(logits, soft), int(soft.shape[0])

    return loss


# --- command line ---------------------------------------------------------------------------


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m engine.distill",
                                description="Distil a draft model for speculative decoding from a target model.")
    p.add_argument("--target", required=True, help="the target causal LM (folder)")
    p.add_argument("--draft", required=True, help="the draft causal LM to start from (folder; same tokenizer)")
    p.add_argument("--vocab", required=True, help="tokenizer: a .gguf vocabulary from ../shared/vocab or a folder")
    p.add_argument("--data", required=True, help="MaskBench folder (../shared/jsonschemabench/maskbench)")
    p.add_argument("--out", required=True, help="output folder for the distilled draft")
    p.add_argument("--output-vocab", type=int, default=4096,
                   help="tokens in the draft's output layer, the most frequent in the completions (4096; 0 keeps all)")
    p.add_argument("--generate-minutes", type=float, default=12.0, help="time for the target's outputs (12)")
    p.add_argument("--max-outputs", type=int, help="stop generating after this many target outputs")
    p.add_argument("--sampled", type=float, default=0.0,
                   help="fraction of the target outputs sampled at temperature 1, the rest greedy (0: all greedy; "
                        "0.5 gave the same acceptance under sampling as 0 for the tiny pair)")
    p.add_argument("--max-tokens", type=int, default=96, help="token budget of each target output (96)")
    p.add_argument("--minutes", type=float, default=10.0, help="training wall-clock budget (10)")
    p.add_argument("--max-steps", type=int, help="stop training after this many steps instead of the time budget")
    p.add_argument("--limit-files", type=int, help="read only the first N MaskBench files (quick runs, tests)")
    p.add_argument("--corpus-mix", type=float, default=1.0,
                   help="corpus completions mixed in per target output (1.0)")
    p.add_argument("--lr", type=float, default=1e-3, help="peak learning rate (1e-3)")
    p.add_argument("--batch-tokens", type=int, default=4096, help="tokens per batch, padding included (4096)")
    p.add_argument("--threads", type=int, help="torch threads (default: torch's choice)")
    p.add_argument("--seed", type=int, default=0)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    from transformers import AutoModelForCausalLM

    from engine.lm import HFCausalLM
    from engine.tiny import encode_examples, load_examples, load_tokenizer, save, train

    if args.threads:
        torch.set_num_threads(args.threads)
    tokenizer, vocab = load_tokenizer(args.vocab)
    teacher = AutoModelForCausalLM.from_pretrained(args.target, local_files_only=True)
    student = AutoModelForCausalLM.from_pretrained(args.draft, local_files_only=True)
    if student.get_output_embeddings().weight.shape[0] != teacher.get_output_embeddings().weight.shape[0]:
        raise SystemExit("the draft and the target must share a tokenizer (their output layers differ in width)")
    train_examples, _ = load_examples(args.data, limit_files=args.limit_files)
    corpus = encode_examples(train_examples, vocab)
    eos = sorted(vocab.eos_token_ids)
    width = student.get_output_embeddings().weight.shape[0]
    output_ids = frequent_tokens(corpus, args.output_vocab, always=eos) if args.output_vocab else list(range(width))
    kept = set(output_ids)
    covered = sum(t in kept for ids, n in corpus for t in ids[n:]) / max(1, sum(len(i) - n for i, n in corpus))
    print(f"output vocabulary: {len(output_ids)} tokens, {covered:.2%} of the corpus completion tokens", flush=True)
    outputs = target_outputs(HFCausalLM(teacher), vocab, train_examples, minutes=args.generate_minutes,
                             max_tokens=args.max_tokens, limit=args.max_outputs, sampled=args.sampled, seed=args.seed)
    rng = random.Random(args.seed)
    mixed = outputs + rng.sample(corpus, min(len(corpus), int(len(outputs) * args.corpus_mix)))
    stats = train(student, mixed, minutes=args.minutes, max_steps=args.max_steps, batch_tokens=args.batch_tokens,
                  lr=args.lr, seed=args.seed, sampled_negatives=None, loss_fn=distillation_loss(teacher, output_ids))
    metrics = {"target": str(args.target), "draft": str(args.draft), "output_vocab": len(output_ids),
               "sampled": args.sampled,
               "corpus_coverage": covered, "target_outputs": len(outputs), "training_rows": len(mixed),
               "steps": stats.steps, "seconds": stats.seconds,
               "final_loss": sum(stats.losses[-20:]) / max(1, len(stats.losses[-20:]))}
    out = save(student, tokenizer, args.out, metrics)
    if args.output_vocab:
        write_output_vocab(out, output_ids, source="most frequent completion tokens of the training split")
    print(json.dumps(metrics, indent=2), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
