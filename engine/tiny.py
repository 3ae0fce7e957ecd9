"""Build and train a tiny causal LM that writes JSON, on CPU, in minutes.

The model serves demos, tests and quality benchmarks where real weights cannot be downloaded.
It has a *real* tokenizer (a vocabulary from ``../shared/vocab``), an embedding table covering
the tokenizer's full logits width, and 2–4 transformer layers with a small hidden size. It is
trained on MaskBench's valid instances, each prompted with its schema::

    Schema: {"type":"object","properties":{...}}\\nJSON: {"name":"Ada"}<eos>

Command line (the model the README's examples and benchmarks use; ``python -m engine.quickstart``
trains a quicker one)::

    python -m engine.tiny --vocab ../shared/vocab/ggml-vocab-gpt-2.gguf \\
        --data ../shared/jsonschemabench/maskbench --out models/tiny-json --minutes 8

It trains for ``--minutes`` of wall-clock time, then measures on held-out schemas (files whose
name hashes into the held-out split) how often *unconstrained* sampling produces JSON that
parses and that validates against its schema — and the same with the JSON grammar enforced by
corral — prints it, and writes ``<out>/metrics.json`` next to the saved model and tokenizer.
The evaluation takes minutes of its own; ``--eval-n 0`` skips it (``engine.quickstart`` does,
unless asked to ``--evaluate``).

Training cost is dominated by the output layer (tens of thousands of logits per position), so
the loss is computed only on the instance tokens and EOS (the completion), with a sampled
softmax over the tokens that occur as targets plus random negatives (see ``train``), and the
output matmul runs under bfloat16 autocast on CPUs with native bfloat16. Measured on the shared
two-core machine this was written on (other jobs running): 2 layers, hidden 128, schemas up to
600 characters, 8 minutes — 456 to 508 steps, 12k to 14k examples (about 3 epochs); held-out
unconstrained samples parsed as JSON 4% and 11% of the time in two runs; with corral's JSON
grammar, every time (``metrics.json`` of the run has its own numbers).
"""

from __future__ import annotations

import argparse
import hashlib
import json
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

__all__ = [
    "TinyConfig",
    "Example",
    "build_model",
    "load_tokenizer",
    "load_examples",
    "encode_examples",
    "pad_rows",
    "column_logits",
    "train",
    "evaluate_validity",
    "held_out_report",
    "save",
    "main",
]

PROMPT_TEMPLATE = "Schema: {schema}\nJSON: "


@dataclass(frozen=True)
class TinyConfig:
    """Architecture of the tiny model. ``vocab_size`` must be the tokenizer's full logits width."""

    vocab_size: int
    arch: str = "gpt2"  # "gpt2" or "llama"
    n_layer: int = 2
    hidden: int = 128
    n_head: int = 4
    max_positions: int = 640
    bos_token_id: int | None = None
    eos_token_id: int | None = None


@dataclass(frozen=True)
class Example:
    """One training or evaluation case: the schema (compact JSON text) and one valid instance."""

    schema: Any
    instance: Any
    source: str

    @property
    def prompt(self) -> str:
        return PROMPT_TEMPLATE.format(schema=_compact(self.schema))

    @property
    def completion(self) -> str:
        return _compact(self.instance)


def _compact(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


# --- model and tokenizer --------------------------------------------------------------------


def build_model(config: TinyConfig, *, seed: int = 0):
    """A randomly initialised ``GPT2LMHeadModel`` or ``LlamaForCausalLM`` with tied embeddings."""
    import transformers

    if config.arch not in _ARCHS:
        raise ValueError(f"arch must be 'gpt2' or 'llama', got {config.arch!r}")
    config_class, model_class, sizes = _ARCHS[config.arch]
    torch.manual_seed(seed)
    hf_config = getattr(transformers, config_class)(
        vocab_size=config.vocab_size, bos_token_id=config.bos_token_id, eos_token_id=config.eos_token_id,
        tie_word_embeddings=True, **sizes(config),
    )
    return getattr(transformers, model_class)(hf_config)


def _gpt2_sizes(c: TinyConfig) -> dict[str, int]:
    return {"n_embd": c.hidden, "n_layer": c.n_layer, "n_head": c.n_head, "n_positions": c.max_positions}


def _llama_sizes(c: TinyConfig) -> dict[str, int]:
    return {"hidden_size": c.hidden, "intermediate_size": c.hidden * 3, "num_hidden_layers": c.n_layer,
            "num_attention_heads": c.n_head, "num_key_value_heads": c.n_head, "max_position_embeddings": c.max_positions}


#: arch -> (transformers config class, model class, TinyConfig's sizes in that config's names)
_ARCHS = {
    "gpt2": ("GPT2Config", "GPT2LMHeadModel", _gpt2_sizes),
    "llama": ("LlamaConfig", "LlamaForCausalLM", _llama_sizes),
}


def load_tokenizer(vocab_path: str | Path):
    """The transformers tokenizer and the ``TokenVocabulary`` for a ``.gguf`` vocabulary or tokenizer folder."""
    from grammars import TokenVocabulary

    vocab = TokenVocabulary.from_pretrained(vocab_path)
    tokenizer = vocab.hf_tokenizer
    if tokenizer is None:
        raise ValueError(f"{vocab_path}: no transformers tokenizer behind this vocabulary; pass a .gguf or a folder")
    return tokenizer, vocab


# --- data -----------------------------------------------------------------------------------


def _held_out(name: str, fraction: float) -> bool:
    digest = hashlib.sha256(name.encode("utf-8")).digest()
    return int.from_bytes(digest[:4], "big") / 2**32 < fraction


def load_examples(
    data_dir: str | Path,
    *,
    held_out_fraction: float = 0.05,
    max_schema_chars: int = 600,
    max_instance_chars: int = 600,
    limit_files: int | None = None,
) -> tuple[list[Example], list[Example]]:
    """(train, held_out) examples from MaskBench files: every valid test instance of each schema.

    Files are split by a hash of their name (stable across runs); schemas and instances longer
    than the character limits are skipped so a prompt and its completion fit the context.
    """
    folder = Path(data_dir)
    files = sorted(folder.glob("*.json"))
    if not files:
        raise FileNotFoundError(f"no MaskBench *.json files in {folder}")
    if limit_files is not None:
        files = files[:limit_files]
    train_set: list[Example] = []
    held: list[Example] = []
    for path in files:
        try:
            case = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        schema = case.get("schema")
        if schema is None or len(_compact(schema)) > max_schema_chars:
            continue
        target = held if _held_out(path.name, held_out_fraction) else train_set
        for test in case.get("tests", []):
            if test.get("valid") and len(_compact(test.get("data"))) <= max_instance_chars:
                target.append(Example(schema, test["data"], path.name))
    return train_set, held


def _adds_bos(tokenizer, bos: int | None) -> bool:
    if bos is None:
        return False
    ids = tokenizer.encode("a", add_special_tokens=True)
    return bool(ids) and ids[0] == bos


def encode_examples(examples: Sequence[Example], vocab, *, max_len: int = 512) -> list[tuple[list[int], int]]:
    """Token ids (prompt + completion + EOS) and the prompt length, for examples that fit ``max_len``.

    The prompt is encoded exactly as ``engine.generate`` encodes prompts (BOS prepended only for
    tokenizers that add one), so the model sees at inference what it saw in training.
    """
    eos = min(vocab.eos_token_ids)
    bos = vocab.bos_token_id
    tokenizer = vocab.hf_tokenizer
    prepend = bos is not None and bos not in vocab.eos_token_ids and tokenizer is not None and _adds_bos(tokenizer, bos)
    out = []
    for ex in examples:
        prompt = ([bos] if prepend else []) + vocab.encode(ex.prompt)
        completion = vocab.encode(ex.completion) + [eos]
        if len(prompt) + len(completion) <= max_len:
            out.append((prompt + completion, len(prompt)))
    return out


# --- training -------------------------------------------------------------------------------


@dataclass
class TrainStats:
    """What ``train`` did: steps, examples and supervised tokens seen, seconds, the loss curve."""

    steps: int = 0
    examples: int = 0
    supervised_tokens: int = 0
    seconds: float = 0.0
    losses: list[float] = field(default_factory=list)


def _batches(encoded, batch_tokens: int, rng: random.Random):
    """Length-bucketed batches of about ``batch_tokens`` tokens, in random order, forever."""
    while True:
        order = sorted(range(len(encoded)), key=lambda i: (len(encoded[i][0]), rng.random()))
        batches, current, longest = [], [], 0
        for i in order:
            longest = max(longest, len(encoded[i][0]))
            if current and longest * (len(current) + 1) > batch_tokens:
                batches.append(current)
                current, longest = [], len(encoded[i][0])
            current.append(i)
        if current:
            batches.append(current)
        rng.shuffle(batches)
        yield from batches


def train(
    model,
    encoded: list[tuple[list[int], int]],
    *,
    minutes: float = 8.0,
    max_steps: int | None = None,
    batch_tokens: int = 4096,
    lr: float = 3e-3,
    warmup_steps: int = 30,
    pad_token_id: int = 0,
    seed: int = 0,
    bf16: bool | None = None,
    sampled_negatives: int | None = 2048,
    log_every: int = 50,
    log=print,
    loss_fn: Callable[..., tuple[torch.Tensor, int]] | None = None,
) -> TrainStats:
    """Train on the completion tokens until ``minutes`` pass (or ``max_steps``).

    The learning rate warms up linearly, then follows a cosine over the *time* budget (or the
    step budget when ``max_steps`` is given), so a run of any length ends annealed.

    The output layer is most of the cost (about 50k logits per supervised position), so by
    default the softmax is *sampled* (Jean et al., 2015): it runs over every token that occurs
    as a training target (about 9k for MaskBench with GPT-2) plus ``sampled_negatives`` tokens
    drawn uniformly from the rest at each step, whose logits get the importance correction
    ``log(rest / sampled_negatives)``. The rest of the vocabulary is still pushed down, so the
    full softmax used at inference stays calibrated. ``sampled_negatives=None`` trains with the
    exact full softmax.

    ``loss_fn`` replaces the causal next-token loss for other objectives (``engine.tiny_diffusion``
    trains masked diffusion with it): it is called per batch as ``loss_fn(model, rows,
    candidates=..., pad_token_id=..., bf16=...)``, ``rows`` the batch's ``(ids, prompt_len)``
    pairs and ``candidates`` the sampled-softmax columns (``None`` for a full softmax), and
    returns the loss to minimise and the number of supervised tokens.
    """
    if not encoded:
        raise ValueError("no training examples fit the context; raise max_len or the character limits")
    torch.manual_seed(seed)
    rng = random.Random(seed)
    if bf16 is None:
        bf16 = _cpu_bf16_fast()
    device = next(model.parameters()).device
    width = model.get_output_embeddings().weight.shape[0]
    candidates = _SampledSoftmax.build(encoded, width, sampled_negatives, device)
    loss_fn = loss_fn or _causal_loss
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01, betas=(0.9, 0.98))
    stats = TrainStats()
    budget = minutes * 60.0
    start = time.perf_counter()
    model.train()
    for batch in _batches(encoded, batch_tokens, rng):
        elapsed = time.perf_counter() - start
        # a time budget still trains one step: a saved model that never trained tells nothing
        if (max_steps is not None and stats.steps >= max_steps) or (max_steps is None and elapsed >= budget and stats.steps):
            break
        progress = stats.steps / max_steps if max_steps else elapsed / budget
        scale = min(1.0, (stats.steps + 1) / warmup_steps) * 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))
        for group in optimizer.param_groups:
            group["lr"] = lr * max(scale, 0.02)
        rows = [encoded[i] for i in batch]
        loss, supervised_tokens = loss_fn(model, rows, candidates=candidates, pad_token_id=pad_token_id, bf16=bf16)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        stats.steps += 1
        stats.examples += len(rows)
        stats.supervised_tokens += int(supervised_tokens)
        stats.losses.append(float(loss.detach()))
        if log is not None and log_every and stats.steps % log_every == 0:
            recent = stats.losses[-log_every:]
            log(f"step {stats.steps:5d}  {elapsed:6.0f}s  loss {sum(recent) / len(recent):.3f}  "
                f"examples {stats.examples}")
    stats.seconds = time.perf_counter() - start
    model.eval()
    return stats


def pad_rows(rows, pad_token_id: int, device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(ids, prompt_len)`` rows as a right-padded batch: token ids, the attention mask, and the
    completion mask (``True`` at the completion tokens and EOS, the positions a loss supervises)."""
    longest = max(len(ids) for ids, _ in rows)
    ids = torch.full((len(rows), longest), pad_token_id, dtype=torch.long)
    attention = torch.zeros((len(rows), longest), dtype=torch.long)
    completion = torch.zeros((len(rows), longest), dtype=torch.bool)
    for r, (tokens, prompt_len) in enumerate(rows):
        ids[r, : len(tokens)] = torch.tensor(tokens)
        attention[r, : len(tokens)] = 1
        completion[r, prompt_len : len(tokens)] = True
    return ids.to(device), attention.to(device), completion.to(device)


def _causal_loss(model, rows, *, candidates, pad_token_id: int, bf16: bool) -> tuple[torch.Tensor, int]:
    """Next-token cross-entropy on the completion tokens and EOS of ``rows`` (``train``'s default loss)."""
    device = next(model.parameters()).device
    body = model.base_model
    head = model.get_output_embeddings()
    ids, attention, supervised = pad_rows(rows, pad_token_id, device)
    hidden = body(input_ids=ids, attention_mask=attention).last_hidden_state
    positions = supervised[:, 1:]
    states = hidden[:, :-1][positions]
    targets = ids[:, 1:][positions]
    logits, targets = _head_logits(head, states, targets, candidates, bf16)
    return F.cross_entropy(logits.float(), targets), int(targets.numel())


def column_logits(head, states: torch.Tensor, columns: torch.Tensor) -> torch.Tensor:
    """The logits of output layer ``head`` (a ``Linear``, bias allowed) for ``states``, at the token
    ``columns`` only: a sampled softmax, or a reduced output vocabulary."""
    bias = getattr(head, "bias", None)
    logits = states @ head.weight[columns].T
    return logits if bias is None else logits + bias[columns]


def _head_logits(head, states, targets, candidates, bf16: bool):
    """Logits of ``head`` (a ``Linear``, bias allowed) for ``states``, over the sampled-softmax columns of
    ``candidates`` when given (``targets`` then renumbered to those columns); bfloat16 autocast if ``bf16``."""
    with torch.autocast(device_type=states.device.type, dtype=torch.bfloat16, enabled=bf16):
        if candidates is None:
            logits = head(states)
        else:
            columns, correction = candidates.sample()
            logits = column_logits(head, states, columns)
            if correction is not None:
                logits = logits + correction
            targets = candidates.index[targets]
    return logits, targets


@dataclass
class _SampledSoftmax:
    """The columns of a sampled softmax: all target tokens, plus uniform negatives from the rest."""

    targets: torch.Tensor  # every token that occurs as a target, sorted
    rest: torch.Tensor  # every other token
    index: torch.Tensor  # token id -> column of ``targets`` (-1 elsewhere)
    negatives: int

    @classmethod
    def build(cls, encoded, width: int, negatives: int | None, device) -> _SampledSoftmax | None:
        if negatives is None:
            return None
        seen = sorted({t for ids, prompt_len in encoded for t in ids[prompt_len:]})
        targets = torch.tensor(seen, dtype=torch.long, device=device)
        keep = torch.ones(width, dtype=torch.bool, device=device)
        keep[targets] = False
        rest = torch.nonzero(keep).flatten()
        if len(seen) + negatives >= width:
            return None  # sampling would not save anything
        index = torch.full((width,), -1, dtype=torch.long, device=device)
        index[targets] = torch.arange(len(seen), device=device)
        return cls(targets, rest, index, int(negatives))

    def sample(self) -> tuple[torch.Tensor, torch.Tensor | None]:
        if self.negatives == 0 or self.rest.numel() == 0:
            return self.targets, None
        pick = self.rest[torch.randperm(self.rest.numel(), device=self.rest.device)[: self.negatives]]
        correction = torch.zeros(self.targets.numel() + pick.numel(), device=pick.device)
        correction[self.targets.numel():] = math.log(self.rest.numel() / pick.numel())
        return torch.cat([self.targets, pick]), correction


def _cpu_bf16_fast() -> bool:
    """Whether this CPU has native bfloat16 matmuls (AVX512-BF16 / AMX); otherwise bf16 is slower."""
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    return "avx512_bf16" in flags or "amx_bf16" in flags


# --- evaluation -----------------------------------------------------------------------------


def evaluate_validity(
    model,
    vocab,
    examples: Sequence[Example],
    *,
    n: int = 100,
    max_tokens: int = 256,
    temperature: float = 1.0,
    batch_size: int = 16,
    seed: int = 0,
    grammar: str | None = None,
) -> dict:
    """Sample one completion per held-out schema and score it.

    Returns ``{"n", "parse_rate", "schema_valid_rate", "stopped_rate"}``: the fraction of
    completions that parse as JSON, that validate against their schema (``jsonschema``), and that
    ended with EOS. ``grammar`` (GBNF text, e.g. ``json.gbnf``) constrains the sampling.
    """
    import jsonschema

    from engine.generate import generate_batch
    from engine.lm import HFCausalLM

    by_schema: dict[str, Example] = {}
    for ex in examples:
        by_schema.setdefault(ex.source, ex)
    chosen = list(by_schema.values())[:n]
    lm = HFCausalLM(model)
    parsed = valid = stopped = 0
    for start in range(0, len(chosen), batch_size):
        batch = chosen[start : start + batch_size]
        results = generate_batch(
            [ex.prompt for ex in batch], model=lm, tokenizer=vocab, grammar=grammar,
            max_tokens=max_tokens, temperature=temperature, seed=seed + start,
        )
        for ex, result in zip(batch, results):
            stopped += result.finish_reason == "stop"
            try:
                value = json.loads(result.text)
            except ValueError:
                continue
            parsed += 1
            valid += _validates(jsonschema, value, ex.schema)
    total = max(1, len(chosen))
    return {
        "n": len(chosen),
        "parse_rate": parsed / total,
        "schema_valid_rate": valid / total,
        "stopped_rate": stopped / total,
        "temperature": temperature,
        "max_tokens": max_tokens,
    }


def _validates(jsonschema, value: Any, schema: Any) -> bool:
    """``jsonschema`` validity; schemas the validator itself cannot process count as not valid."""
    try:
        jsonschema.validate(value, schema)
    except jsonschema.ValidationError:
        return False
    except Exception:  # noqa: BLE001 - SchemaError, unresolvable $ref, a pattern Python cannot compile
        return False
    return True


def save(model, tokenizer, out_dir: str | Path, metrics: dict | None = None) -> Path:
    """``save_pretrained`` the model and tokenizer into ``out_dir`` (and ``metrics.json``)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    if metrics is not None:
        _write_metrics(out, metrics)
    return out


def _write_metrics(out: Path, metrics: dict) -> None:
    (out / "metrics.json").write_text(json.dumps(metrics, indent=2) + "\n", encoding="utf-8")


# --- command line ---------------------------------------------------------------------------


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m engine.tiny",
        description="Train a tiny JSON-writing causal LM on CPU and save it with its tokenizer.",
    )
    p.add_argument("--vocab", required=True, help="tokenizer: a .gguf vocabulary from ../shared/vocab or a folder")
    p.add_argument("--data", required=True, help="MaskBench folder (../shared/jsonschemabench/maskbench)")
    p.add_argument("--out", required=True, help="output folder for the model, tokenizer and metrics.json")
    p.add_argument("--minutes", type=float, default=8.0, help="training wall-clock budget (8)")
    p.add_argument("--max-steps", type=int, help="stop after this many steps instead of the time budget")
    p.add_argument("--arch", choices=("gpt2", "llama"), default="gpt2", help="architecture (gpt2)")
    p.add_argument("--layers", type=int, default=2, help="transformer layers, 2-4 (2)")
    p.add_argument("--hidden", type=int, default=128, help="hidden size (128)")
    p.add_argument("--heads", type=int, default=4, help="attention heads (4)")
    p.add_argument("--max-len", type=int, default=512, help="longest training sequence in tokens (512)")
    p.add_argument("--batch-tokens", type=int, default=4096, help="tokens per batch, padding included (4096)")
    p.add_argument("--lr", type=float, default=3e-3, help="peak learning rate (3e-3)")
    p.add_argument("--negatives", type=int, default=2048,
                   help="sampled-softmax negatives per step; 0 = targets only, -1 = exact full softmax (2048)")
    p.add_argument("--eval-n", type=int, default=100, help="held-out schemas to evaluate; 0 skips the evaluation (100)")
    p.add_argument("--eval-max-tokens", type=int, default=256, help="token budget per evaluation sample (256)")
    p.add_argument("--json-gbnf", help="GBNF JSON grammar for the constrained comparison "
                   "(default: gbnf/json.gbnf next to the data's parent folder)")
    p.add_argument("--max-schema-chars", type=int, default=600,
                   help="skip schemas longer than this as compact JSON (600); shorter prompts train faster")
    p.add_argument("--limit-files", type=int, help="read only the first N MaskBench files (quick runs, tests)")
    p.add_argument("--log-every", type=int, default=50, help="log the mean loss every N steps (50)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int,
                   help="torch CPU threads (default: torch's choice; on a busy machine 1 is often fastest)")
    return p


def main(argv: Sequence[str] | None = None, *, log: Callable[[str], None] | None = None) -> int:
    """Train, save, evaluate on held-out schemas (unless ``--eval-n 0``); returns an exit code.

    ``log`` receives the progress lines (default: stdout, flushed, so a watcher sees each step).
    """
    args = _parser().parse_args(argv)
    log = log or _print
    if args.threads:
        torch.set_num_threads(args.threads)
    t0 = time.perf_counter()
    tokenizer, vocab = load_tokenizer(args.vocab)
    train_examples, held_examples = load_examples(
        args.data, limit_files=args.limit_files, max_schema_chars=args.max_schema_chars
    )
    encoded = encode_examples(train_examples, vocab, max_len=args.max_len)
    log(f"data: {len(train_examples)} train / {len(held_examples)} held-out instances; "
        f"{len(encoded)} fit {args.max_len} tokens ({time.perf_counter() - t0:.1f}s)")
    eos = min(vocab.eos_token_ids)
    config = TinyConfig(
        vocab_size=vocab.logits_width, arch=args.arch, n_layer=args.layers, hidden=args.hidden,
        n_head=args.heads, max_positions=max(args.max_len, args.eval_max_tokens) + 1024,
        bos_token_id=vocab.bos_token_id, eos_token_id=eos,
    )
    model = build_model(config, seed=args.seed)
    n_params = sum(p.numel() for p in model.parameters())
    log(f"model: {args.arch}, {args.layers} layers, hidden {args.hidden}, {n_params / 1e6:.1f}M parameters, "
        f"vocabulary {vocab.logits_width}")
    stats = train(
        model, encoded, minutes=args.minutes, max_steps=args.max_steps, batch_tokens=args.batch_tokens,
        lr=args.lr, pad_token_id=eos, seed=args.seed, log_every=args.log_every, log=log,
        sampled_negatives=None if args.negatives < 0 else args.negatives,
    )
    log(f"trained {stats.steps} steps, {stats.examples} examples, {stats.supervised_tokens} supervised tokens "
        f"in {stats.seconds:.0f}s")
    model.generation_config.eos_token_id = eos
    model.generation_config.pad_token_id = eos
    out = save(model, tokenizer, args.out)
    metrics: dict[str, Any] = {
        "config": asdict(config),
        "parameters": n_params,
        "train": {k: v for k, v in asdict(stats).items() if k != "losses"}
        | {"final_loss": sum(stats.losses[-50:]) / max(1, len(stats.losses[-50:]))},
        "held_out_schemas": len({ex.source for ex in held_examples}),
    }
    if args.eval_n > 0:
        metrics |= held_out_report(model, vocab, held_examples, n=args.eval_n, max_tokens=args.eval_max_tokens,
                                   seed=args.seed, json_gbnf=_json_gbnf(args), log=log)
    metrics["total_seconds"] = time.perf_counter() - t0
    _write_metrics(out, metrics)
    log(f"saved {out} (metrics in {out / 'metrics.json'})")
    return 0


def held_out_report(
    model, vocab, held: Sequence[Example], *, n: int = 100, max_tokens: int = 256, seed: int = 0,
    json_gbnf: str | None = None, log: Callable[[str], None] = print,
) -> dict[str, dict]:
    """``evaluate_validity`` unconstrained and, given ``json_gbnf`` (GBNF text), under the JSON grammar:
    ``{"unconstrained": ..., "json_grammar": ...}`` as ``metrics.json`` holds them, each logged."""
    runs = [("unconstrained", "unconstrained", None)]
    if json_gbnf is not None:
        runs.append(("json_grammar", "constrained by json.gbnf", json_gbnf))
    report = {}
    for key, label, grammar in runs:
        t0 = time.perf_counter()
        scores = report[key] = evaluate_validity(model, vocab, held, n=n, max_tokens=max_tokens, seed=seed,
                                                 grammar=grammar)
        log(f"{label}: parses {scores['parse_rate']:.1%}, schema-valid {scores['schema_valid_rate']:.1%} "
            f"(n={scores['n']}, {time.perf_counter() - t0:.0f}s)")
    return report


def _json_gbnf(args: argparse.Namespace) -> str | None:
    """``--json-gbnf``, else ``gbnf/json.gbnf`` next to the data's parent folder, when it exists."""
    path = Path(args.json_gbnf) if args.json_gbnf else Path(args.data).resolve().parents[1] / "gbnf" / "json.gbnf"
    return path.read_text(encoding="utf-8") if path.is_file() else None


def _print(message: str) -> None:
    print(message, flush=True)


if __name__ == "__main__":
    sys.exit(main())
