"""End-to-end JSONSchemaBench: constrained generation with a real model on MaskBench schemas.

``python -m jsonschemabench e2e --model DIR --data DIR [--split NAME] [--sample N] [--max-tokens N]``
generates one JSON value per schema with ``engine.generate`` and checks it the way
JSONSchemaBench does:

* **declared coverage** — the schema compiles (``compile_error`` otherwise);
* **empirical coverage** — the output validates with ``jsonschema`` (format checker on), over
  all schemas; **compliance** — the same over compiled schemas only (must be 100%);
* **truncated** — ``finish_reason == "length"`` although the shortest completion from the start
  state (``Matcher.shortest_completion``, EOS included) fitted ``--max-tokens`` (must be 0);
* **compile time** (compilation plus the closing tables), **TTFT** (decode start to the first
  sampled token, prefill included) and **TPOT** ((decode time - TTFT) / (tokens - 1));
* **throughput ratio** — the same prompt is then generated *unconstrained* for exactly as many
  tokens (EOS banned), and the ratio is constrained ÷ unconstrained tokens per second, pooled
  (Σ tokens / Σ seconds on each side). Model time (``next_logits``) is measured on both sides,
  so the overhead per token (masks, sampling, closing) is reported separately.

The prompt is the one ``engine.tiny`` trains on (``Schema: <compact schema>\\nJSON: ``), left-
truncated to fit the model's context with ``--max-tokens``. Decoding is greedy by default
(``--temperature 0``); with a temperature, row ``i`` draws with seed ``--seed + i``.

Schemas run one at a time in a worker process (``workers.run_tasks``: a schema past
``--timeout`` seconds is killed and recorded as ``timeout``, a dead worker as ``crash``, and the
worker is replaced), single-threaded; with ``--ray [ADDRESS]``, on one Ray actor per CPU of the
cluster (``ray_pool``: each loads the model once), with the same limits and rows. Exceptions are
recorded per schema (``error``), never end the run. Outputs (``--out``, default ``runs/e2e-<timestamp>``): ``results.jsonl`` (one line per
schema), ``summary.json``, ``summary.md`` (also printed) and ``e2e.png`` (needs matplotlib, the
``bench`` extra: without it the run says so and lists it under ``skipped_outputs``).
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import sys
import time
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from .maskbench import (
    Executor,
    Task,
    WorkerConfig,
    add_ray_argument,
    default_shared,
    list_cases,
    run_with_progress,
    select_sample,
    split_of,
    worker_pool,
)
from . import outputs, report

__all__ = [
    "E2EConfig",
    "load_setup",
    "E2EEngine",
    "run_schema",
    "summarize",
    "render_markdown",
    "plot",
    "run_e2e",
    "add_arguments",
    "main",
]

PROMPT_TEMPLATE = "Schema: {schema}\nJSON: "  # engine.tiny's training prompt
OUTCOMES = ("ok", "compile_error", "error", "timeout", "crash")
#: what a run writes to its folder, in the order the closing line lists them
OUTPUTS = ("results.jsonl", "summary.json", "summary.md", "e2e.png")


@dataclass(frozen=True)
class E2EConfig:
    """What every schema is generated with (picklable: it travels to the worker)."""

    model: str
    max_tokens: int = 128
    temperature: float = 0.0
    seed: int = 0
    unconstrained: bool = True
    whitespace: str | None = None


# --- worker side --------------------------------------------------------------------------------


class _TimedLM:
    """A ``LanguageModel`` that adds up the seconds spent in ``next_logits`` (model time)."""

    def __init__(self, lm):
        self.lm = lm
        self.model = getattr(lm, "model", None)
        self.seconds = 0.0

    @property
    def logits_width(self) -> int:
        return self.lm.logits_width

    @property
    def device(self):
        return self.lm.device

    def next_logits(self, prefixes):
        start = time.perf_counter()
        try:
            return self.lm.next_logits(prefixes)
        finally:
            self.seconds += time.perf_counter() - start


@dataclass
class _Setup:
    config: E2EConfig
    lm: _TimedLM
    vocab: Any
    compiler: Any
    context: int
    add_bos: bool


def load_setup(config: E2EConfig) -> _Setup:
    """Load the model, its vocabulary and one ``Compiler`` (shared by every schema of a worker)."""
    import torch

    from engine import HFCausalLM
    from engine.generate import load_vocabulary
    from grammars import Compiler

    torch.set_num_threads(1)
    hf = HFCausalLM.from_pretrained(config.model, local_files_only=True)
    vocab = load_vocabulary(config.model, hf)
    model_config = hf.model.config
    context = int(getattr(model_config, "n_positions", None) or getattr(model_config, "max_position_embeddings", 1024))
    tok = vocab.hf_tokenizer
    bos = vocab.bos_token_id
    add_bos = bool(tok is not None and bos is not None and bos not in vocab.eos_token_ids
                   and tok.encode("a", add_special_tokens=True)[:1] == [bos])
    return _Setup(config, _TimedLM(hf), vocab, Compiler(vocab), context, add_bos)


class E2EEngine:
    """The worker's "engine": generation settings and a warm-up, as ``run_tasks`` expects."""

    name = "corral"

    def __init__(self, setup: _Setup):
        import engine

        self.setup = setup
        self.version = getattr(engine, "__version__", "0.1.0")
        self.options = {"max_tokens": setup.config.max_tokens, "temperature": setup.config.temperature,
                        "model": Path(setup.config.model).name}
        _generate(setup, {"type": "integer"}, prompt_ids(setup, {"type": "integer"}), constrained=True)


def prompt_ids(setup: _Setup, schema: Any) -> list[int]:
    """The training prompt's tokens, left-truncated so prompt + ``max_tokens`` fit the context."""
    text = PROMPT_TEMPLATE.format(schema=json.dumps(schema, separators=(",", ":"), ensure_ascii=False))
    ids = ([setup.vocab.bos_token_id] if setup.add_bos else []) + setup.vocab.encode(text)
    room = max(1, setup.context - setup.config.max_tokens)
    return ids[-room:]


def _generate(setup: _Setup, schema: Any, ids: list[int], *, constrained: bool, max_tokens: int | None = None):
    from engine import generate

    cfg = setup.config
    setup.lm.lm.reset()  # no KV cache carried over: both sides pay their own prefill
    setup.lm.seconds = 0.0
    options = {"whitespace": cfg.whitespace} if constrained and cfg.whitespace else {}
    result = generate(
        ids, schema=schema if constrained else None, model=setup.lm, tokenizer=setup.vocab,
        compiler=setup.compiler, max_tokens=max_tokens or cfg.max_tokens,
        temperature=cfg.temperature, seed=cfg.seed if cfg.temperature > 0 else None,
        ignore_eos=not constrained, **options,
    )
    return result, setup.lm.seconds


def _timings(result, forward_s: float) -> dict:
    decode_s = float(sum(result.per_token_s))
    n = len(result.token_ids)
    ttft = result.first_token_s
    return {
        "tokens": n,
        "decode_s": decode_s,
        "forward_s": forward_s,
        "ttft_s": ttft,
        "tpot_s": (decode_s - ttft) / (n - 1) if ttft is not None and n >= 2 else None,
        "steps": len(result.per_token_s),
    }


def validate(value_text: str, schema: Any) -> tuple[str, str | None]:
    """``("valid" | "invalid" | "unparsable" | "unverifiable", message)`` for an output text.

    ``unverifiable``: ``jsonschema`` itself cannot process the schema (bad regex for Python,
    unresolvable ``$ref``); such outputs are counted apart, never as valid.
    """
    import jsonschema

    try:
        value = json.loads(value_text)
    except ValueError as exc:
        return "unparsable", str(exc)[:200]
    try:
        cls = jsonschema.validators.validator_for(schema)
        cls.check_schema(schema)
        validator = cls(schema, format_checker=cls.FORMAT_CHECKER)
        error = jsonschema.exceptions.best_match(validator.iter_errors(value))
    except Exception as exc:  # noqa: BLE001 - SchemaError, RefResolutionError, re.error, ...
        return "unverifiable", f"{type(exc).__name__}: {exc}"[:200]
    return ("valid", None) if error is None else ("invalid", error.message[:200])


def run_schema(engine: E2EEngine, setup: _Setup, payload: dict, progress: Callable[[dict], None]) -> dict:
    """One MaskBench file: compile, generate constrained, validate, then the unconstrained baseline."""
    from grammars import ConstraintError

    schema = json.loads(Path(payload["path"]).read_text(encoding="utf-8"))["schema"]
    cfg = setup.config
    ids = prompt_ids(setup, schema)
    record: dict[str, Any] = {"prompt_tokens": len(ids)}
    start = time.perf_counter()
    try:
        options = {"whitespace": cfg.whitespace} if cfg.whitespace else {}
        grammar = setup.compiler.compile_json_schema(schema, **options)
        closing = grammar.matcher().shortest_completion()
    except ConstraintError as exc:  # refusals (unsupported keywords) and limits
        return record | {"outcome": "compile_error", "error": f"{type(exc).__name__}: {exc}"[:500],
                         "keyword": getattr(exc, "keyword", None), "compile_s": time.perf_counter() - start}
    record["compile_s"] = time.perf_counter() - start
    record["min_close_tokens"] = None if closing is None else len(closing) + 1
    progress({"compile_s": record["compile_s"]})
    setup.lm.lm.reset()
    setup.lm.next_logits([ids])  # untimed: warm the allocator for this prompt length, for both sides
    result, forward_s = _generate(setup, schema, ids, constrained=True)
    verdict, message = validate(result.text, schema)
    closable = closing is not None and len(closing) + 1 <= cfg.max_tokens
    record |= {
        "outcome": "ok",
        "text": result.text,
        "finish_reason": result.finish_reason,
        "validity": verdict,
        "validation_error": message,
        "truncated": result.finish_reason == "length" and closable,
        "closable": closable,
        "forced_tokens": result.forced_tokens,
        "budget_steered": result.budget_steered,
        "constrained": _timings(result, forward_s),
    }
    n = len(result.token_ids)
    if cfg.unconstrained and n:
        progress({k: record[k] for k in ("validity", "finish_reason", "constrained")})
        free, free_forward = _generate(setup, schema, ids, constrained=False, max_tokens=n)
        record["unconstrained"] = _timings(free, free_forward)
    return record


# --- summary, table, plot -----------------------------------------------------------------------


def _ms(values: Sequence[float | None]) -> dict:
    return report.percentiles([1e3 * v for v in values if v is not None])


def summarize(rows: Sequence[Mapping], config: E2EConfig) -> dict:
    """Counts, rates and timing percentiles (ms) over the rows of results.jsonl."""
    n = len(rows)
    ok = [r for r in rows if r.get("outcome") == "ok"]
    # compiled: compilation finished (a timeout or error later in the schema still counts, as a failure)
    compiled = [r for r in rows if r.get("compile_s") is not None and r.get("outcome") != "compile_error"]
    compiled_ids = {id(r) for r in compiled}
    valid = sum(r.get("validity") == "valid" for r in ok)
    unverifiable = sum(r.get("validity") == "unverifiable" for r in ok)
    paired = [r for r in ok if r.get("unconstrained") and r["constrained"]["tokens"]]
    c_tokens = sum(r["constrained"]["tokens"] for r in paired)
    c_time = sum(r["constrained"]["decode_s"] for r in paired)
    u_tokens = sum(r["unconstrained"]["tokens"] for r in paired)
    u_time = sum(r["unconstrained"]["decode_s"] for r in paired)
    c_fwd = sum(r["constrained"]["forward_s"] for r in paired)
    u_fwd = sum(r["unconstrained"]["forward_s"] for r in paired)
    per_schema = [(r["constrained"]["tokens"] / r["constrained"]["decode_s"])
                  / (r["unconstrained"]["tokens"] / r["unconstrained"]["decode_s"])
                  for r in paired if r["constrained"]["decode_s"] > 0 and r["unconstrained"]["decode_s"] > 0]
    counts = {o: sum(r.get("outcome") == o for r in rows) for o in OUTCOMES}
    n_compiled = len(compiled)
    splits: dict[str, dict] = {}
    for r in rows:
        s = splits.setdefault(r.get("split", "?"), {"schemas": 0, "compiled": 0, "valid": 0})
        s["schemas"] += 1
        s["compiled"] += id(r) in compiled_ids
        s["valid"] += r.get("validity") == "valid"
    return {
        "config": config.__dict__,
        "schemas": n,
        "outcomes": counts,
        "compiled": n_compiled,
        "declared_coverage": n_compiled / n if n else None,
        "valid": valid,
        "empirical_coverage": valid / n if n else None,
        "compliance": valid / n_compiled if n_compiled else None,
        "generated": len(ok),
        "invalid": sum(r.get("validity") in ("invalid", "unparsable") for r in ok),
        "unverifiable": unverifiable,
        "compliance_verifiable": valid / (len(ok) - unverifiable) if len(ok) > unverifiable else None,
        "closable": sum(bool(r.get("closable")) for r in ok),
        "valid_closable": sum(bool(r.get("closable")) and r.get("validity") == "valid" for r in ok),
        "truncated": sum(bool(r.get("truncated")) for r in ok),
        "finished_by_length": sum(r.get("finish_reason") == "length" for r in ok),
        "not_closable": sum(not r.get("closable") for r in ok),
        "budget_steered_schemas": sum(r.get("budget_steered", 0) > 0 for r in ok),
        "forced_tokens": sum(r.get("forced_tokens", 0) for r in ok),
        "constrained_tokens": sum(r["constrained"]["tokens"] for r in ok),
        "compile_ms": _ms([r.get("compile_s") for r in compiled]),
        "ttft_ms": _ms([r["constrained"]["ttft_s"] for r in ok]),
        "tpot_ms": _ms([r["constrained"]["tpot_s"] for r in ok]),
        "unconstrained_ttft_ms": _ms([r["unconstrained"]["ttft_s"] for r in paired]),
        "unconstrained_tpot_ms": _ms([r["unconstrained"]["tpot_s"] for r in paired]),
        "throughput": {
            "paired_schemas": len(paired),
            "constrained_tok_s": c_tokens / c_time if c_time else None,
            "unconstrained_tok_s": u_tokens / u_time if u_time else None,
            "ratio": (c_tokens / c_time) / (u_tokens / u_time) if c_time and u_time and u_tokens else None,
            "ratio_per_schema": report.percentiles(per_schema),
            "constrained_forward_ms_per_token": 1e3 * c_fwd / c_tokens if c_tokens else None,
            "constrained_other_ms_per_token": 1e3 * (c_time - c_fwd) / c_tokens if c_tokens else None,
            "unconstrained_forward_ms_per_token": 1e3 * u_fwd / u_tokens if u_tokens else None,
            "unconstrained_other_ms_per_token": 1e3 * (u_time - u_fwd) / u_tokens if u_tokens else None,
        },
        "splits": splits,
        "errors_top": _top_errors(rows),
    }


def _top_errors(rows: Sequence[Mapping], limit: int = 8) -> dict[str, int]:
    from collections import Counter

    heads = Counter(f"{r['outcome']}: {((r.get('error') or '').splitlines() or [''])[0][:90]}"
                    for r in rows if r.get("outcome") in ("error", "timeout", "crash", "compile_error"))
    return dict(heads.most_common(limit))


def _pct(x: float | None) -> str:
    return "—" if x is None else f"{100 * x:.1f}%"


def _num(x: float | None, digits: int = 1) -> str:
    return "—" if x is None else f"{x:,.{digits}f}"


def render_markdown(summary: Mapping, title: str = "End-to-end JSONSchemaBench") -> str:
    """The summary as one markdown table (plus per-split coverage and the commonest failures)."""
    t = summary["throughput"]
    cfg = summary["config"]
    meta = summary.get("meta") or {}
    lines = [f"### {title}", ""]
    lines.append(f"{summary['schemas']} MaskBench schemas; model `{Path(str(cfg['model'])).name}`; "
                 f"max_tokens {cfg['max_tokens']}; temperature {cfg['temperature']:g}"
                 + (f"; {meta['cpu']}" if meta.get("cpu") else "") + "; one thread.")
    lines += ["", "| metric | value |", "|:--|--:|"]

    def row(label: str, value: str) -> None:
        lines.append(f"| {label} | {value} |")

    n, c = summary["schemas"], summary["compiled"]
    row("declared coverage (compiled)", f"{c}/{n} ({_pct(summary['declared_coverage'])})")
    row("empirical coverage (output validates)", f"{summary['valid']}/{n} ({_pct(summary['empirical_coverage'])})")
    row("compliance (valid among compiled)", f"{summary['valid']}/{c} ({_pct(summary['compliance'])})")
    row("valid among generations whose closing fitted max_tokens",
        f"{summary['valid_closable']}/{summary['closable']}")
    row("invalid or unparsable outputs", str(summary["invalid"]))
    row("unverifiable (jsonschema cannot check the schema)", str(summary["unverifiable"]))
    row("truncated while closing fitted max_tokens", str(summary["truncated"]))
    row("finished by length (closing did not fit)", f"{summary['finished_by_length']} ({summary['not_closable']})")
    row("errors / timeouts / crashes", " / ".join(str(summary["outcomes"][k]) for k in ("error", "timeout", "crash")))
    for key, label in (("compile_ms", "compile ms"), ("ttft_ms", "TTFT ms"), ("tpot_ms", "TPOT ms"),
                       ("unconstrained_tpot_ms", "unconstrained TPOT ms")):
        p = summary[key]
        row(f"{label} p50 / p90 / p99 / max", " / ".join(_num(p[k], 2) for k in ("p50", "p90", "p99", "max")))
    row("constrained tokens (forced)", f"{summary['constrained_tokens']:,} ({summary['forced_tokens']:,})")
    row("throughput constrained / unconstrained tok/s",
        f"{_num(t['constrained_tok_s'])} / {_num(t['unconstrained_tok_s'])}")
    row("**throughput ratio** (constrained ÷ unconstrained)", f"**{_num(t['ratio'], 3)}**")
    ratio = t["ratio_per_schema"]
    row("per-schema ratio p25 / p50 / p75", " / ".join(_num(ratio[k], 3) for k in ("p25", "p50", "p75")))
    row("model ms/token constrained / unconstrained", f"{_num(t['constrained_forward_ms_per_token'], 2)} / "
        f"{_num(t['unconstrained_forward_ms_per_token'], 2)}")
    row("other ms/token (masks, sampling, closing) constrained / unconstrained",
        f"{_num(t['constrained_other_ms_per_token'], 2)} / {_num(t['unconstrained_other_ms_per_token'], 2)}")
    lines += ["", "| split | schemas | compiled | valid |", "|:--|--:|--:|--:|"]
    for name, s in sorted(summary["splits"].items()):
        lines.append(f"| {name} | {s['schemas']} | {s['compiled']} | {s['valid']} |")
    if summary["errors_top"]:
        lines += [""] + [f"- {count}× {head}" for head, count in summary["errors_top"].items()]
    notes = report.skip_notes(meta)
    if notes:
        lines += [""] + notes
    return "\n".join(lines) + "\n"


def plot(rows: Sequence[Mapping], path: Path) -> dict[str, str]:
    """Write three log-scale tail plots: TPOT and TTFT (constrained vs unconstrained) and compile time.

    Returns what ``outputs.write_plot`` returns: ``{}``, or the file and why it was not written.
    """
    ok = [r for r in rows if r.get("outcome") == "ok"]
    series = [
        ("Time per output token (TPOT)", {side: [r[side]["tpot_s"] for r in ok if r.get(side)]
                                          for side in ("constrained", "unconstrained")}),
        ("Time to first token (TTFT)", {side: [r[side]["ttft_s"] for r in ok if r.get(side)]
                                        for side in ("constrained", "unconstrained")}),
        ("Compile time", {"corral": [r["compile_s"] for r in rows if r.get("compile_s") is not None]}),
    ]

    def draw(plt):
        fig, axes = plt.subplots(1, 3, figsize=(16, 4.8))
        for ax, (title, data) in zip(axes, series):
            for label, values in data.items():
                sample = 1e3 * np.asarray([v for v in values if v is not None], dtype=np.float64)
                x, y = report._survival(sample)
                if x.size:
                    ax.step(x, y, where="post", label=f"{label} (n={sample.size:,})")
            report.style_survival_axis(ax, title, "ms")
        return fig

    return outputs.write_plot(draw, path, "e2e")


# --- the run ------------------------------------------------------------------------------------


def run_e2e(files: Sequence[Path], config: E2EConfig, out_dir: Path, *, timeout_s: float = 120.0,
            progress: bool = True, meta: dict | None = None, mem_limit_bytes: int | None = None,
            workers: int = 1, executor: Executor | None = None) -> dict:
    """Generate for every file on ``workers`` workers (one locally; under Ray, ``executor`` =
    ``ray_pool.run_tasks``, one per CPU); write ``OUTPUTS`` (the plot only with matplotlib)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    tasks = [Task(path.name, "jsonschemabench.e2e:E2EEngine", "jsonschemabench.e2e:run_schema",
                  {"path": str(path)}) for path in files]
    worker = WorkerConfig(tokenizer_loader="jsonschemabench.e2e:load_setup", tokenizer_arg=config,
                          mem_limit_bytes=mem_limit_bytes, warm_up=False)
    rows: list[dict] = []
    with (out_dir / "results.jsonl").open("w", encoding="utf-8") as sink:
        def on_row(task: Task, record: dict, info: dict | None) -> dict:
            row = {"file": task.key, "split": split_of(task.key), **record}
            row.setdefault("error", None)
            sink.write(json.dumps(row, ensure_ascii=False) + "\n")
            sink.flush()
            rows.append(row)
            return row

        def notable(task: Task, row: dict) -> str | None:
            if row["outcome"] in ("timeout", "crash", "error") or row.get("truncated") \
                    or row.get("validity") in ("invalid", "unparsable"):
                return f"{task.key}: {row['outcome']} {row.get('validity') or ''} {row.get('error') or ''}"
            return None

        skipped = run_with_progress(tasks, worker, on_row, desc="e2e", workers=workers, timeout_s=timeout_s,
                                    progress=progress, notable=notable, executor=executor)
    if skipped:
        raise RuntimeError(f"the e2e worker could not start: {next(iter(skipped.values()))}")
    for row in rows:  # a crash inside generate comes back from the pool as "crash" with a traceback
        if row["outcome"] == "crash" and row.get("traceback"):
            row["outcome"] = "error"
    not_plotted = plot(rows, out_dir / "e2e.png")
    summary = summarize(rows, config)
    summary["meta"] = dict(meta or {}) | {"timeout_s": timeout_s, "files": len(files), "skipped_outputs": not_plotted}
    (out_dir / "summary.json").write_text(json.dumps(summary, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    (out_dir / "summary.md").write_text(render_markdown(summary), encoding="utf-8")
    return summary


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Register the ``e2e`` subcommand's options on ``parser``."""
    parser.add_argument("--model", type=Path, required=True,
                        help="model folder saved with save_pretrained (e.g. models/tiny-json from python -m engine.tiny)")
    parser.add_argument("--data", type=Path, default=None,
                        help="folder of MaskBench *.json files (default: ../shared/jsonschemabench/maskbench)")
    parser.add_argument("--split", default="", help="only these splits, comma-separated (e.g. Github_easy,Kubernetes)")
    parser.add_argument("--sample", type=int, default=None, metavar="N",
                        help="a deterministic sample of N files (seeded, sorted)")
    parser.add_argument("--only", default="", metavar="GLOBS",
                        help="only files whose name matches one of these comma-separated globs")
    parser.add_argument("--max-tokens", type=int, default=128, help="token budget per generation, EOS included (128)")
    parser.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    parser.add_argument("--seed", type=int, default=0, help="sample seed, and sampling seed when temperature > 0")
    parser.add_argument("--whitespace", choices=("compact", "flexible"), default=None,
                        help="JSON whitespace policy (default: the compiler's, compact)")
    parser.add_argument("--no-unconstrained", action="store_true", help="skip the unconstrained baseline")
    parser.add_argument("--timeout", type=float, default=120.0, metavar="SECONDS",
                        help="limit per schema, compilation and both generations included (120)")
    add_ray_argument(parser)
    parser.add_argument("--out", type=Path, default=None, help="output folder (default: runs/e2e-<timestamp>)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    parser.set_defaults(run=main)


def main(args: argparse.Namespace) -> int:
    """Run the end-to-end benchmark with parsed ``args``; returns the process exit status."""
    if not (args.model / "config.json").is_file():
        outputs.log(f"no model at {args.model} (train one with: python -m engine.tiny --out {args.model} ...)")
        return 2
    if args.max_tokens < 1:
        outputs.log("--max-tokens must be at least 1")
        return 2
    data = args.data or default_shared("jsonschemabench", "maskbench")
    try:
        files = list_cases(data)
    except FileNotFoundError as exc:
        outputs.log(str(exc))
        return 2
    splits = {s.strip() for s in args.split.split(",") if s.strip()}
    if splits:
        files = [p for p in files if split_of(p.name) in splits]
    globs = [g.strip() for g in args.only.split(",") if g.strip()]
    if globs:
        files = [p for p in files if any(fnmatch.fnmatch(p.name, g) for g in globs)]
    files = select_sample(files, args.sample, args.seed)
    if not files:
        outputs.log("no MaskBench files selected")
        return 1
    config = E2EConfig(model=str(args.model.resolve()), max_tokens=args.max_tokens, temperature=args.temperature,
                       seed=args.seed, unconstrained=not args.no_unconstrained, whitespace=args.whitespace)
    out = args.out or Path("runs") / f"e2e-{datetime.now():%Y%m%d-%H%M%S}"
    meta = {"command": " ".join(sys.argv), "data": str(data), "sample": args.sample, "split": args.split,
            "only": args.only,
            "cpu": report.cpu_name(), "started": datetime.now().isoformat(timespec="seconds")}
    pool = worker_pool(args, default_workers=1, default_mem_limit=False)
    where = ""
    if pool.where != "local":
        meta["pool"] = pool.where
        where = f", {pool.workers} workers on a {pool.where}"
    outputs.log(f"e2e: {len(files)} schemas, max_tokens {args.max_tokens}, timeout {args.timeout:g} s{where} -> {out}")
    summary = run_e2e(files, config, out, timeout_s=args.timeout, progress=not args.no_progress, meta=meta,
                      workers=pool.workers, executor=pool.run)
    return outputs.show_run(out, OUTPUTS, summary["meta"]["skipped_outputs"])
