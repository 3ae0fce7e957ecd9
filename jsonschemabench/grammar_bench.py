"""Grammar benchmark: compile time and per-token mask time of every engine on GBNF grammars and regexes.

``python -m jsonschemabench grammars --tokenizer PATH`` takes every ``*.gbnf`` in a folder
(default ``../shared/gbnf``) and the regular expressions in ``samples.REGEXES``, and for each
engine (corral, llguidance, xgrammar):

1. compiles the grammar, makes a matcher and fills its first mask, timed together
   ("compile+1st mask"; the first repetition is *cold*, the median is over ``--repeat``; the
   engine's caches are reset, untimed, before each repetition, so none reuses a compiled grammar);
2. walks each sample string of ``samples.py``: the string is tokenized once, canonically, and
   at every step the mask is filled (timed), the next token is looked up in it — a valid token
   missing from the mask counts as **rejected valid**, which must be 0 — and the token is
   consumed. After the last token the mask is filled once more and must allow EOS ("EOS ok").
   Correctness columns count the first repetition; timings pool all of them ("masks").

Timing is single-threaded (``RAYON_NUM_THREADS=1``, one torch/OpenMP thread, xgrammar compiling
with one thread and its cache off), with ``time.perf_counter_ns`` and the garbage collector paused.
Before its first workload every engine compiles and masks a trivial regex, so one-time
vocabulary set-up is not charged to the first grammar. An engine that refuses a grammar gets
``error: ...`` in its row; an engine that is not installed is skipped with a message.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import statistics
import sys
import time
import traceback
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Iterable, Sequence

import numpy as np

from . import outputs, report
from .samples import GBNF_SAMPLES, REGEX_SAMPLES, REGEXES
from .timing import gc_paused

__all__ = [
    "Result",
    "Workload",
    "add_arguments",
    "bench_workload",
    "load_workloads",
    "main",
    "render_markdown",
]

DEFAULT_ENGINES = ("corral", "llguidance", "xgrammar")
THREAD_ENV = ("RAYON_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")


def default_gbnf_dir() -> Path:
    """``$CORRAL_SHARED_DIR/gbnf`` when that is set, else ``../shared/gbnf`` from the working directory."""
    shared = os.environ.get("CORRAL_SHARED_DIR")
    return Path(shared) / "gbnf" if shared else Path("..") / "shared" / "gbnf"


@dataclass(frozen=True)
class Workload:
    """One grammar (GBNF text or regex pattern) and the strings of its language to walk."""

    name: str
    kind: str  # "gbnf" | "regex"
    text: str
    samples: tuple[str, ...]


@dataclass
class Result:
    """Measurements of one engine on one workload; times in nanoseconds."""

    engine: str
    workload: str
    error: str | None = None
    compile_ns: list[int] = field(default_factory=list)
    mask_ns: list[int] = field(default_factory=list)
    tokens: int = 0
    rejected_valid: int = 0
    eos_ok: int = 0
    walks: int = 0
    failures: list[str] = field(default_factory=list)

    @property
    def masks(self) -> int:
        return len(self.mask_ns)

    def summary(self) -> dict:
        """Derived figures: compile ms (cold, median) and mask µs (p50, p99, max)."""
        out: dict = {"engine": self.engine, "grammar": self.workload, "error": self.error}
        if self.compile_ns:
            out["compile_cold_ms"] = self.compile_ns[0] / 1e6
            out["compile_median_ms"] = statistics.median(self.compile_ns) / 1e6
        if self.mask_ns:
            us = np.asarray(self.mask_ns, dtype=np.float64) / 1e3
            out["mask_p50_us"] = float(np.percentile(us, 50))
            out["mask_p99_us"] = float(np.percentile(us, 99))
            out["mask_max_us"] = float(us.max())
        out.update(masks=self.masks, tokens=self.tokens, rejected_valid=self.rejected_valid,
                   eos_ok=self.eos_ok, walks=self.walks, failures=self.failures)
        return out


def load_workloads(gbnf_dir: Path, only: Sequence[str] = ()) -> list[Workload]:
    """Every ``*.gbnf`` in ``gbnf_dir`` (sorted) then every regex, optionally filtered by name.

    Names are the file stem for GBNF (``json``) and ``regex:<name>`` for regexes; ``only`` keeps
    workloads whose name or bare regex name is listed.
    """
    if not gbnf_dir.is_dir():
        raise FileNotFoundError(
            f"GBNF folder not found: {gbnf_dir} (pass --grammars DIR or set CORRAL_SHARED_DIR)"
        )
    workloads = [
        Workload(path.stem, "gbnf", path.read_text(encoding="utf-8"), tuple(GBNF_SAMPLES.get(path.stem, ())))
        for path in sorted(gbnf_dir.glob("*.gbnf"))
    ]
    workloads += [
        Workload(f"regex:{name}", "regex", pattern, tuple(REGEX_SAMPLES.get(name, ())))
        for name, pattern in REGEXES.items()
    ]
    if only:
        wanted = set(only)
        workloads = [w for w in workloads if w.name in wanted or w.name.removeprefix("regex:") in wanted]
    return workloads


def _describe(tokenizer, ids: Sequence[int], pos: int) -> str:
    def text(tokens: Sequence[int]) -> str:
        if tokenizer is None:
            return str(list(tokens))
        try:
            return tokenizer.hf.decode(list(tokens))
        except Exception:  # decoding is for the message only
            return str(list(tokens))

    before = text(ids[max(0, pos - 8):pos])
    return f"token {pos} {ids[pos]} {text(ids[pos:pos + 1])!r} after ...{before!r}"


def bench_workload(engine, workload: Workload, token_lists: Sequence[Sequence[int]], *,
                   repeat: int, tokenizer=None) -> Result:
    """Compile ``workload`` ``repeat`` times on ``engine`` and walk every token list each time."""
    from .peers import EngineRefused

    result = Result(engine.name, workload.name)
    clock = time.perf_counter_ns
    for rep in range(repeat):
        check = rep == 0  # correctness is counted on the first repetition; timings on all
        engine.reset_caches()  # untimed: every repetition compiles from scratch
        start = clock()
        try:
            compiled = engine.compile(workload.kind, workload.text)
            engine.fill_mask(engine.matcher(compiled))
        except EngineRefused as exc:
            result.error = f"{exc.kind}: {exc}" if exc.kind else str(exc)
            return result
        result.compile_ns.append(clock() - start)

        for sample_index, ids in enumerate(token_lists):
            matcher = engine.matcher(compiled)
            result.walks += check
            completed = True
            for pos, token in enumerate(ids):
                start = clock()
                mask = engine.fill_mask(matcher)
                result.mask_ns.append(clock() - start)
                result.tokens += check
                in_mask = engine.allowed(mask, token)
                advanced = engine.advance(matcher, token)
                if check and not in_mask:
                    result.rejected_valid += 1
                if check and not (in_mask and advanced) and len(result.failures) < 5:
                    what = "not in mask" if not in_mask else "in mask, but advance rejected it"
                    stop = "" if advanced else "; walk stopped"
                    result.failures.append(f"sample {sample_index}: {_describe(tokenizer, ids, pos)} {what}{stop}")
                if not advanced:
                    completed = False
                    break
            if not completed:
                continue
            start = clock()
            mask = engine.fill_mask(matcher)
            result.mask_ns.append(clock() - start)
            if not check:
                continue
            if any(engine.allowed(mask, eos) for eos in engine.eos_token_ids):
                result.eos_ok += 1
            elif len(result.failures) < 5:
                result.failures.append(f"sample {sample_index}: EOS not allowed at the end")
    return result


def _fmt(value: float | None, digits: int) -> str:
    return "—" if value is None else f"{value:,.{digits}f}"


def render_markdown(results: Iterable[Result], header: Sequence[str] = ()) -> str:
    """The results as a markdown table (one row per engine and workload), preceded by ``header`` lines."""
    lines = list(header)
    if lines:
        lines.append("")
    lines += [
        "| engine | grammar | compile+1st mask ms (cold) | (median) | mask p50 µs | p99 µs | max µs "
        "| masks | rejected valid | EOS ok |",
        "|---|---|--:|--:|--:|--:|--:|--:|--:|--:|",
    ]
    notes = []
    for result in results:
        s = result.summary()
        if result.error:
            lines.append(f"| {result.engine} | {result.workload} | error: {result.error.replace('|', chr(92) + '|')} "
                         "| | | | | | | |")
            continue
        lines.append(
            f"| {result.engine} | {result.workload} | {_fmt(s.get('compile_cold_ms'), 2)} "
            f"| {_fmt(s.get('compile_median_ms'), 2)} | {_fmt(s.get('mask_p50_us'), 1)} "
            f"| {_fmt(s.get('mask_p99_us'), 1)} | {_fmt(s.get('mask_max_us'), 1)} | {result.masks} "
            f"| {result.rejected_valid} | {result.eos_ok}/{result.walks} |"
        )
        notes += [f"- {result.engine} / {result.workload}: {f}" for f in result.failures]
    if notes:
        lines += ["", "Failures (first few per row):", ""] + notes
    return "\n".join(lines) + "\n"


def _single_thread() -> None:
    for name in THREAD_ENV:
        os.environ[name] = "1"
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    if "torch" in sys.modules or _importable("torch"):
        import torch

        torch.set_num_threads(1)


def _importable(module: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(module) is not None


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Register the ``grammars`` subcommand's options on ``parser``."""
    parser.add_argument("--tokenizer", required=True, type=Path,
                        help="a .gguf vocabulary (e.g. ../shared/vocab/ggml-vocab-llama-bpe.gguf) "
                        "or a tokenizer folder")
    parser.add_argument("--grammars", type=Path, default=None,
                        help="folder of *.gbnf grammars (default: $CORRAL_SHARED_DIR/gbnf or ../shared/gbnf)")
    parser.add_argument("--repeat", type=int, default=3, help="compilations and walks per workload (default 3)")
    parser.add_argument("--engines", default=",".join(DEFAULT_ENGINES),
                        help="comma-separated engines, in column order (default: %(default)s)")
    parser.add_argument("--only", default="",
                        help="comma-separated workload names to run (e.g. json,c,regex:date); default all")
    parser.add_argument("--out", type=Path, default=None,
                        help="also write the results here: .json for raw data, anything else for markdown")
    parser.set_defaults(run=main)


def main(args: argparse.Namespace) -> int:
    """Run the grammar benchmark with parsed ``args``; returns the process exit status."""
    from .peers import ENGINES, EngineUnavailable, load_tokenizer, warm_up

    if args.repeat < 1:
        raise SystemExit("--repeat must be at least 1")
    names = [n.strip() for n in args.engines.split(",") if n.strip()]
    unknown = [n for n in names if n not in ENGINES]
    if unknown:
        raise SystemExit(f"unknown engine(s) {', '.join(unknown)}; choose from {', '.join(ENGINES)}")
    _single_thread()
    workloads = load_workloads(args.grammars or default_gbnf_dir(), [n for n in args.only.split(",") if n])

    outputs.log(f"loading tokenizer {args.tokenizer} ...")
    tokenizer = load_tokenizer(args.tokenizer, use_corral="corral" in names)
    for note in tokenizer.notes:
        outputs.log(note)
    token_lists = {w.name: [tokenizer.encode(s) for s in w.samples] for w in workloads}

    engines = []
    skipped = []
    for name in names:
        try:
            engine = ENGINES[name](tokenizer)
            warm_up(engine, "regex", "a")
        except EngineUnavailable as exc:
            skipped.append(f"{name}: skipped — {exc}")
            outputs.log(skipped[-1])
            continue
        engines.append(engine)
    if not engines:
        outputs.log("no engine available")
        return 1

    results = []
    with gc_paused():
        for workload in workloads:
            for engine in engines:
                outputs.log(f"{engine.name:<11} {workload.name} ...")
                try:
                    result = bench_workload(engine, workload, token_lists[workload.name],
                                            repeat=args.repeat, tokenizer=tokenizer)
                except Exception as exc:  # an engine bug must not end the whole benchmark
                    traceback.print_exc(file=sys.stderr)
                    result = Result(engine.name, workload.name, error=f"crashed: {type(exc).__name__}: {exc}")
                results.append(result)
                gc.collect()

    vocab_width = len(tokenizer.hf)
    header = [
        f"Grammar benchmark — tokenizer `{tokenizer.name}` ({vocab_width:,} tokens, samples encoded by "
        f"{tokenizer.encoder_name}); repeat {args.repeat}; single thread; {report.cpu_name()}; "
        f"Python {platform.python_version()}.",
        "Engines: " + ", ".join(f"{e.name} {e.version}" for e in engines) + ".",
    ] + [f"Skipped: {s}." for s in skipped]
    table = render_markdown(results, header)
    print(table)
    if args.out:
        if args.out.suffix == ".json":
            payload = {
                "tokenizer": str(args.tokenizer), "vocab_width": vocab_width, "repeat": args.repeat,
                "engines": {e.name: e.version for e in engines}, "skipped": skipped,
                "cpu": report.cpu_name(), "python": platform.python_version(),
                "results": [r.summary() | {"raw": asdict(r)} for r in results],
            }
            args.out.write_text(json.dumps(payload, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
        else:
            args.out.write_text(table, encoding="utf-8")
    return 0
