"""Train a tiny masked-diffusion LM on CPU, for diffusion decoding demos, tests and benchmarks.

Real diffusion-LM weights (LLaDA, Dream) cannot be downloaded here, so the project trains its
own: a small bidirectional transformer built from a config (2–4 layers, hidden 128;
``ModernBertForMaskedLM`` by default — rotary positions, pre-norm — or ``BertForMaskedLM`` with
``--arch bert``) over a real tokenizer from ``../shared/vocab`` plus one appended mask token
``<|mask|>`` (unless the tokenizer has a mask token already), trained with the masked-diffusion
objective of MDLM and LLaDA (``DiffusionObjective``):

* each training sequence is a *prompt* (never masked) and a *canvas* of ``--canvas`` tokens: the
  completion followed by EOS up to the canvas' end, so the model learns to put EOS padding last;
* per sequence ``t ~ U[eps, 1)``; each canvas token is replaced by the mask token independently
  with probability ``t``; the loss is the cross-entropy on the masked positions, each weighted by
  ``1/t``, summed and divided by the canvas length (the negative ELBO per canvas token);
* by default each batch draws its canvas length between the longest completion it holds (plus
  one EOS) and ``--canvas``, so the model also fills canvases shorter than the longest one
  (``--fixed-canvas`` always uses ``--canvas``).

Corpora: ``--corpus json`` — MaskBench's valid instances prompted with their schema exactly as
``engine.tiny`` builds them (``Schema: {...}\\nJSON: ``); ``--corpus cpp`` — chunks of the g++
standard library headers as ``engine.tiny_code`` cuts them (never HumanEval-X), with EOS as a
one-token header. Data loading, batching, the sampled softmax, the learning-rate schedule and
saving are ``engine.tiny``'s::

    python -m engine.tiny_diffusion --vocab ../shared/vocab/ggml-vocab-gpt-2.gguf \\
        --data ../shared/jsonschemabench/maskbench --corpus json --out models/tiny-diffusion-json --minutes 6
    python -m engine.tiny_diffusion --vocab ../shared/vocab/ggml-vocab-starcoder.gguf \\
        --corpus cpp --out models/tiny-diffusion-cpp --minutes 5 --threads 1

The C++ model is what ``python -m jsonschemabench diffusion --task cpp`` decodes HumanEval-X
bodies with (StarCoder's code tokenizer: fewer tokens per line of C++ than GPT-2's); five
single-thread minutes on a loaded machine gave 226 steps and a held-out masked cross-entropy of
1.18 — after a HumanEval-X declaration that model writes ``_`` and EOS (no body), so under the
C++ grammar the witness closes the function.

How far a run gets (2 layers, hidden 128, GPT-2 vocabulary, MaskBench schemas up to 600
characters; measured while this was written): ``--arch bert`` never left the stage where every
masked position gets the same, unigram-like distribution — not in 270 CPU steps, nor in 7,000
steps (2.5 minutes) on an H100 — so greedy unmasking fills the canvas with EOS; ModernBERT left it
on the H100 (training loss 0.31, held-out loss 1.44 after 7,000 steps; greedy unmasking wrote
JSON-like objects, 2 of 16 parsing) — see ``metrics.json`` of a run for its own numbers. Six CPU
minutes buy a few hundred steps: expect an undertrained model there; train on a GPU
(``--device cuda``, ``--negatives -1``) for a useful one.

The folder holds the model and tokenizer (``save_pretrained``; the mask id in both the config's
``mask_token_id`` and the tokenizer's mask token) and ``metrics.json``; load it with
``engine.HFMaskedDiffusionLM.from_pretrained(folder)``.
"""

from __future__ import annotations

import argparse
import copy
import math
import random
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from engine.lm import resolve_device
from engine.tiny import (
    _head_logits,
    _held_out,
    _write_metrics,
    encode_examples,
    load_examples,
    load_tokenizer,
    save,
    train,
)

__all__ = [
    "MASK_TOKEN",
    "DiffusionConfig",
    "DiffusionObjective",
    "add_mask_token",
    "build_diffusion_model",
    "encode_json_canvases",
    "encode_code_canvases",
    "evaluate_loss",
    "main",
]

MASK_TOKEN = "<|mask|>"


@dataclass(frozen=True)
class DiffusionConfig:
    """Architecture of the tiny diffusion model. ``vocab_size`` covers the tokenizer and its mask token."""

    vocab_size: int
    mask_token_id: int
    arch: str = "modernbert"  # or "bert" (see the module docstring)
    n_layer: int = 2
    hidden: int = 128
    n_head: int = 4
    max_positions: int = 1024
    eos_token_id: int | None = None
    bos_token_id: int | None = None


def add_mask_token(tokenizer):
    """``tokenizer`` itself when it has a mask token, else a copy with ``<|mask|>`` appended as its mask token.

    A copy, because the tokenizer behind a ``TokenVocabulary`` is shared by everyone using it.
    """
    if tokenizer.mask_token_id is not None:
        return tokenizer
    tokenizer = copy.deepcopy(tokenizer)
    tokenizer.add_special_tokens({"mask_token": MASK_TOKEN})
    return tokenizer


def build_diffusion_model(config: DiffusionConfig, *, seed: int = 0):
    """A randomly initialised ``BertForMaskedLM`` or ``ModernBertForMaskedLM`` (bidirectional, tied
    embeddings, no dropout; ModernBERT: rotary positions, pre-norm, global attention in every layer).

    ``config.mask_token_id`` is stored on the transformers config, where ``HFMaskedDiffusionLM``
    finds it. No embedding row is a frozen padding row: batches pad with the attention mask.
    """
    import transformers

    if config.arch not in _DIFFUSION_ARCHS:
        raise ValueError(f"arch must be one of {sorted(_DIFFUSION_ARCHS)}, got {config.arch!r}")
    if not 0 <= config.mask_token_id < config.vocab_size:
        raise ValueError(f"mask_token_id {config.mask_token_id} is outside the vocabulary [0, {config.vocab_size})")
    config_class, model_class, sizes = _DIFFUSION_ARCHS[config.arch]
    torch.manual_seed(seed)
    hf_config = getattr(transformers, config_class)(
        vocab_size=config.vocab_size, pad_token_id=None, bos_token_id=config.bos_token_id,
        eos_token_id=config.eos_token_id, tie_word_embeddings=True, **sizes(config),
    )
    hf_config.mask_token_id = config.mask_token_id
    return getattr(transformers, model_class)(hf_config)


def _bert_sizes(c: DiffusionConfig) -> dict[str, Any]:
    return {"hidden_size": c.hidden, "num_hidden_layers": c.n_layer, "num_attention_heads": c.n_head,
            "intermediate_size": 4 * c.hidden, "max_position_embeddings": c.max_positions, "type_vocab_size": 1,
            "hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0}


def _modernbert_sizes(c: DiffusionConfig) -> dict[str, Any]:
    return {"hidden_size": c.hidden, "num_hidden_layers": c.n_layer, "num_attention_heads": c.n_head,
            "intermediate_size": 2 * c.hidden, "max_position_embeddings": c.max_positions,
            "layer_types": ["full_attention"] * c.n_layer, "cls_token_id": None, "sep_token_id": None}


#: arch -> (transformers config class, model class, DiffusionConfig's sizes in that config's names)
_DIFFUSION_ARCHS = {
    "bert": ("BertConfig", "BertForMaskedLM", _bert_sizes),
    "modernbert": ("ModernBertConfig", "ModernBertForMaskedLM", _modernbert_sizes),
}


# --- data -----------------------------------------------------------------------------------


def _to_canvas(prompt: list[int], completion: list[int], eos: int, canvas_len: int) -> tuple[list[int], int] | None:
    """``(prompt + completion + EOS…, len(prompt))`` with the canvas padded to ``canvas_len``, or None
    when the completion and at least one EOS do not fit."""
    if len(completion) + 1 > canvas_len:
        return None
    return prompt + completion + [eos] * (canvas_len - len(completion)), len(prompt)


def encode_json_canvases(examples, vocab, *, canvas_len: int = 128, max_len: int = 512) -> list[tuple[list[int], int]]:
    """Prompt ids and EOS-padded canvas per MaskBench example, as ``(ids, prompt_len)``.

    Prompts are ``engine.tiny.encode_examples``'s (what ``engine.generate`` feeds); examples whose
    completion plus one EOS exceeds ``canvas_len``, or whose prompt plus canvas exceeds ``max_len``,
    are dropped.
    """
    eos = min(vocab.eos_token_ids)
    out = []
    for ids, prompt_len in encode_examples(examples, vocab, max_len=max_len):
        if prompt_len + canvas_len > max_len:
            continue
        row = _to_canvas(ids[:prompt_len], ids[prompt_len:-1], eos, canvas_len)  # ids end in one EOS
        if row is not None:
            out.append(row)
    return out


def encode_code_canvases(chunks: Sequence[str], vocab, *, canvas_len: int = 128) -> list[tuple[list[int], int]]:
    """One EOS as the header (the document start, as in ``engine.tiny_code``) and the chunk as the canvas."""
    eos = min(vocab.eos_token_ids)
    out = []
    for chunk in chunks:
        row = _to_canvas([eos], vocab.encode(chunk), eos, canvas_len)
        if row is not None:
            out.append(row)
    return out


# --- the objective --------------------------------------------------------------------------


def _mlm_head(model):
    """``(transform, decoder)``: the layers between the body's hidden states and the logits."""
    predictions = getattr(getattr(model, "cls", None), "predictions", None)
    if predictions is not None:  # BertForMaskedLM
        return predictions.transform, predictions.decoder
    if hasattr(model, "head") and hasattr(model, "decoder"):  # ModernBertForMaskedLM
        return model.head, model.decoder
    raise TypeError(f"DiffusionObjective trains BertForMaskedLM and ModernBertForMaskedLM models, got {type(model).__name__}")


@dataclass
class DiffusionObjective:
    """The MDLM/LLaDA masked-diffusion loss, as a ``loss_fn`` for ``engine.tiny.train``.

    Called with a batch of ``(ids, prompt_len)`` rows whose canvases (``ids[prompt_len:]``) are
    padded with ``eos_token_id`` to one length. Draws per row ``t ~ U[eps, 1)`` (stratified over
    the batch, MDLM's low-discrepancy sampler, which lowers the variance of the 1/t weights), masks
    each canvas token with probability ``t`` and returns ``(sum over masked positions of CE / t) / (rows ×
    canvas length)`` and the number of masked positions. Prompts are never masked. With
    ``variable_canvas`` the batch's canvas is cut to a length drawn uniformly between the longest
    completion plus one EOS and the full canvas (only EOS padding is cut). ``generator`` makes the
    draws reproducible (a fixed evaluation batch); ``masked_ce`` records each call's plain mean
    cross-entropy on the masked positions (the more readable number).
    """

    mask_token_id: int
    eos_token_id: int
    variable_canvas: bool = True
    eps: float = 1e-3
    generator: torch.Generator | None = None
    masked_ce: list[float] = field(default_factory=list)

    def __call__(self, model, rows, *, candidates=None, pad_token_id: int | None = None,
                 bf16: bool = False) -> tuple[torch.Tensor, int]:
        device = next(model.parameters()).device
        transform, decoder = _mlm_head(model)
        canvas_len = min(len(ids) - p for ids, p in rows)
        if self.variable_canvas:
            need = max(self._completion_len(ids[p:]) + 1 for ids, p in rows)
            need = min(need, canvas_len)
            canvas_len = need + int(torch.randint(canvas_len - need + 1, (1,), generator=self.generator))
        prompt_max = max(p for _, p in rows)
        width = prompt_max + canvas_len
        pad = self.eos_token_id if pad_token_id is None else pad_token_id
        ids = torch.full((len(rows), width), pad, dtype=torch.long)
        attention = torch.zeros((len(rows), width), dtype=torch.long)
        canvas = torch.zeros((len(rows), width), dtype=torch.bool)
        for r, (tokens, p) in enumerate(rows):
            ids[r, : p + canvas_len] = torch.tensor(tokens[: p + canvas_len])
            attention[r, : p + canvas_len] = 1
            canvas[r, p : p + canvas_len] = True
        # low-discrepancy times (MDLM): one uniform draw, the rows spread evenly over (0, 1] from it
        u = (torch.rand(1, generator=self.generator) + torch.arange(len(rows)) / len(rows)) % 1.0
        t = self.eps + (1 - self.eps) * u
        masked = canvas & (torch.rand(ids.shape, generator=self.generator) < t[:, None])
        targets = ids[masked]
        weights = (1.0 / t)[:, None].expand(ids.shape)[masked]
        noisy = ids.masked_fill(masked, self.mask_token_id)
        noisy, attention, masked = noisy.to(device), attention.to(device), masked.to(device)
        targets, weights = targets.to(device), weights.to(device)
        hidden = model.base_model(input_ids=noisy, attention_mask=attention).last_hidden_state
        if not int(masked.sum()):
            self.masked_ce.append(float("nan"))
            return hidden.sum() * 0.0, 0
        states = transform(hidden[masked])
        logits, columns = _head_logits(decoder, states, targets, candidates, bf16)
        ce = F.cross_entropy(logits.float(), columns, reduction="none")
        self.masked_ce.append(float(ce.detach().mean()))
        return (ce * weights).sum() / (len(rows) * canvas_len), int(targets.numel())

    def _completion_len(self, canvas: Sequence[int]) -> int:
        n = len(canvas)
        while n and canvas[n - 1] == self.eos_token_id:
            n -= 1
        return n


def evaluate_loss(model, encoded, objective: DiffusionObjective, *, batch_size: int = 16, seed: int = 0) -> dict:
    """Mean objective and masked cross-entropy over ``encoded``: full canvases, full softmax, draws fixed by
    ``seed``, no gradients."""
    if not encoded:
        return {"n": 0}
    probe = DiffusionObjective(objective.mask_token_id, objective.eos_token_id, variable_canvas=False,
                               eps=objective.eps, generator=torch.Generator().manual_seed(seed))
    losses = []
    was_training = model.training
    model.eval()
    with torch.no_grad():
        for start in range(0, len(encoded), batch_size):
            loss, _ = probe(model, encoded[start : start + batch_size])
            losses.append(float(loss))
    model.train(was_training)
    ce = [x for x in probe.masked_ce if math.isfinite(x)]
    return {"n": len(encoded), "loss": sum(losses) / len(losses), "masked_ce": sum(ce) / max(1, len(ce))}


# --- command line ---------------------------------------------------------------------------


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m engine.tiny_diffusion", description=__doc__.split("\n\n")[0])
    p.add_argument("--vocab", required=True, help="tokenizer: a .gguf vocabulary from ../shared/vocab or a folder")
    p.add_argument("--corpus", choices=("json", "cpp"), default="json", help="training corpus (json)")
    p.add_argument("--data", help="MaskBench folder (../shared/jsonschemabench/maskbench); needed for --corpus json")
    p.add_argument("--source", action="append", help="C++ files or folders (glob) for --corpus cpp; default: g++ headers")
    p.add_argument("--out", required=True, help="output folder for the model, tokenizer and metrics.json")
    p.add_argument("--minutes", type=float, default=6.0, help="training wall-clock budget (6)")
    p.add_argument("--max-steps", type=int, help="stop after this many steps instead of the time budget")
    p.add_argument("--arch", choices=sorted(_DIFFUSION_ARCHS), default="modernbert",
                   help="architecture (modernbert; bert stalls at the unigram stage, see the module docstring)")
    p.add_argument("--layers", type=int, default=2, help="transformer layers, 2-4 (2)")
    p.add_argument("--hidden", type=int, default=128, help="hidden size (128)")
    p.add_argument("--heads", type=int, default=4, help="attention heads (4)")
    p.add_argument("--canvas", type=int, default=128, help="canvas length in tokens: completion + EOS padding (128)")
    p.add_argument("--fixed-canvas", action="store_true", help="always train on the full canvas length")
    p.add_argument("--max-len", type=int, default=512, help="longest prompt + canvas in tokens (512)")
    p.add_argument("--batch-tokens", type=int, default=4096, help="tokens per batch, padding included (4096)")
    p.add_argument("--lr", type=float, default=3e-3, help="peak learning rate (3e-3)")
    p.add_argument("--negatives", type=int, default=2048,
                   help="sampled-softmax negatives per step; -1 = exact full softmax (2048)")
    p.add_argument("--max-schema-chars", type=int, default=600, help="skip longer schemas as compact JSON (600)")
    p.add_argument("--max-chunk-chars", type=int, default=480, help="longest C++ chunk in characters (480)")
    p.add_argument("--limit-files", type=int, help="read only the first N MaskBench files (quick runs, tests)")
    p.add_argument("--eval-n", type=int, default=256, help="held-out sequences to score after training; 0 skips (256)")
    p.add_argument("--log-every", type=int, default=50, help="log the mean loss every N steps (50)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, help="torch CPU threads (default: torch's choice)")
    p.add_argument("--device", default="cpu", help="where to train: cpu (default) or e.g. cuda")
    return p


def _load_corpus(args, vocab, log) -> tuple[list[tuple[list[int], int]], list[tuple[list[int], int]], dict]:
    """(train, held-out) encoded canvases and a description for ``metrics.json``."""
    if args.corpus == "json":
        if not args.data:
            raise SystemExit("--corpus json needs --data (the MaskBench folder)")
        train_examples, held_examples = load_examples(args.data, limit_files=args.limit_files,
                                                      max_schema_chars=args.max_schema_chars)
        train_set, held = (encode_json_canvases(exs, vocab, canvas_len=args.canvas, max_len=args.max_len)
                           for exs in (train_examples, held_examples))
        info = {"corpus": "json", "train_instances": len(train_examples), "held_out_instances": len(held_examples)}
    else:
        from engine.tiny_code import cpp_chunks, cpp_sources

        files = cpp_sources(args.source)
        if not files:
            raise SystemExit("no C++ sources found (is g++ installed? pass --source)")
        parts: dict[bool, list[str]] = {False: [], True: []}
        for f in files:
            text = f.read_text(encoding="utf-8", errors="replace")
            held_out = len(files) > 1 and _held_out(f.name, 0.05)  # one file: all of it trains
            parts[held_out].extend(cpp_chunks(text, max_chars=args.max_chunk_chars, min_chars=40))
        train_set = encode_code_canvases(parts[False], vocab, canvas_len=args.canvas)
        held = encode_code_canvases(parts[True], vocab, canvas_len=args.canvas)
        info = {"corpus": "cpp", "files": len(files), "train_chunks": len(parts[False]), "held_out_chunks": len(parts[True])}
    info |= {"train_sequences": len(train_set), "held_out_sequences": len(held)}
    return train_set, held, info


def main(argv: Sequence[str] | None = None, *, log: Callable[[str], None] | None = None) -> int:
    """Train, save, score held-out sequences (unless ``--eval-n 0``); returns an exit code."""
    args = _parser().parse_args(argv)
    log = log or (lambda m: print(m, flush=True))
    device = resolve_device(args.device)
    if args.threads:
        torch.set_num_threads(args.threads)
    t0 = time.perf_counter()
    tokenizer, vocab = load_tokenizer(args.vocab)
    tokenizer = add_mask_token(tokenizer)
    mask_id = int(tokenizer.mask_token_id)
    eos = min(vocab.eos_token_ids)
    train_set, held, info = _load_corpus(args, vocab, log)
    if not train_set:
        log("no training sequences fit the canvas; raise --canvas or --max-len")
        return 2
    log(f"data: {info} ({time.perf_counter() - t0:.1f}s)")
    config = DiffusionConfig(
        vocab_size=max(len(tokenizer), vocab.logits_width, mask_id + 1), mask_token_id=mask_id, arch=args.arch,
        n_layer=args.layers,
        hidden=args.hidden, n_head=args.heads, max_positions=max(args.max_len, 512) + 512,
        eos_token_id=eos, bos_token_id=vocab.bos_token_id,
    )
    model = build_diffusion_model(config, seed=args.seed).to(device)
    n_params = sum(p.numel() for p in model.parameters())
    log(f"model: {args.arch}, {args.layers} layers, hidden {args.hidden}, {n_params / 1e6:.1f}M parameters, "
        f"vocabulary {config.vocab_size} (mask id {mask_id}), canvas {args.canvas}")
    objective = DiffusionObjective(mask_id, eos, variable_canvas=not args.fixed_canvas)
    stats = train(
        model, train_set, minutes=args.minutes, max_steps=args.max_steps, batch_tokens=args.batch_tokens,
        lr=args.lr, pad_token_id=eos, seed=args.seed, log_every=args.log_every, log=log,
        sampled_negatives=None if args.negatives < 0 else args.negatives, loss_fn=objective,
    )
    tail = stats.losses[-50:]
    ce_tail = [x for x in objective.masked_ce[-50:] if math.isfinite(x)]
    final = {"final_loss": sum(tail) / max(1, len(tail)), "final_masked_ce": sum(ce_tail) / max(1, len(ce_tail))}
    log(f"trained {stats.steps} steps, {stats.examples} sequences, {stats.supervised_tokens} masked tokens in "
        f"{stats.seconds:.0f}s; last 50 steps: loss {final['final_loss']:.3f}, masked CE {final['final_masked_ce']:.3f}")
    out = save(model, tokenizer, args.out)
    metrics: dict[str, Any] = {
        "config": asdict(config), "parameters": n_params, "canvas": args.canvas,
        "variable_canvas": not args.fixed_canvas, "data": info,
        "train": {k: v for k, v in asdict(stats).items() if k != "losses"} | final,
    }
    if args.eval_n > 0 and held:
        sample = random.Random(args.seed).sample(held, min(args.eval_n, len(held)))
        metrics["held_out"] = evaluate_loss(model, sample, objective, seed=args.seed)
        log(f"held-out: {metrics['held_out']}")
    metrics["total_seconds"] = time.perf_counter() - t0
    _write_metrics(Path(out), metrics)
    log(f"saved {out} (metrics in {Path(out) / 'metrics.json'})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
