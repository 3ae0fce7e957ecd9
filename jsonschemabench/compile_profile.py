"""Where compile time goes: per-phase times of corral's JSON Schema compile and first mask.

``python -m jsonschemabench compile-profile [--sample N] [--slowest K]`` compiles each MaskBench
schema with a fresh ``Compiler`` over one shared vocabulary (the maskbench protocol: no compiled
grammar or token walk carried across files) and times the phases of ``Compiler.compile_json_schema``
and the first mask one by one:

* ``front_end`` — the schema read and turned into the grammar IR (``parse_json_schema``);
* ``lowering`` — the IR lowered to the terminal CFG (``lower_grammar``), without the DFAs it asks for;
* ``automata`` — the byte DFAs of its terminals (NFA construction, subset construction,
  minimisation: ``compile_regular``, called from the lowering);
* ``assemble`` — the vocabulary-bound runtime (parser tables, walk caches);
* ``first_mask`` — ``matcher()`` and its first ``fill_mask`` (the token walks of the start state).

The sum is the time to first mask that ``maskbench`` measures as one number (its ``ttfm``). The
report gives the phase shares over all files, the file at the median total, and the ``--slowest``
files, as ``summary.md`` and ``rows.jsonl`` under ``--out``.
"""

from __future__ import annotations

import argparse
import json
import signal
import statistics
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from . import outputs
from .maskbench import default_shared, list_cases, select_sample
from .timing import gc_paused

PHASES = ("front_end", "lowering", "automata", "assemble", "first_mask")

WARMUP_SCHEMA = {"type": "object", "properties": {"name": {"type": "string", "pattern": "^[a-z]+$"},
                                                  "n": {"type": "integer", "minimum": 0}, "x": {"type": "number"},
                                                  "tags": {"type": "array", "items": {"enum": ["a", "b"]}}},
                 "required": ["name"]}


@dataclass
class PhaseTimes:
    """One file's phase times in seconds (``error``: why it did not compile, and in which phase)."""

    file: str
    front_end: float = 0.0
    lowering: float = 0.0
    automata: float = 0.0
    assemble: float = 0.0
    first_mask: float = 0.0
    n_terminals: int = 0
    n_productions: int = 0
    error: str | None = None
    phases_done: list[str] = field(default_factory=list)

    @property
    def total(self) -> float:
        return self.front_end + self.lowering + self.automata + self.assemble + self.first_mask


class _Timeout(Exception):
    pass


def profile_schema(vocab: Any, schema: Any, name: str, *, timeout_s: float = 60.0,
                   whitespace: str = "flexible", property_order: str = "any") -> PhaseTimes:
    """The phase times of compiling ``schema`` with a fresh ``Compiler`` and filling its first mask.

    The phases are the steps of ``Compiler.compile_json_schema`` run one at a time (same
    functions, same order, the garbage collector paused as maskbench pauses it), so their sum is
    what one compile-and-first-mask costs. ``whitespace`` and ``property_order`` as maskbench
    compiles (``"flexible"``: the instances are formatted by their authors; ``"any"``: they list
    members in any order).
    """
    from grammars import Compiler, allocate_token_bitmask
    from grammars.automata.cfg import lower_grammar
    from grammars.frontends.json_schema import JsonSchemaOptions, load_schema, parse_json_schema

    times = PhaseTimes(name)
    compiler = Compiler(vocab, allow_empty_language=True)
    automata = [0.0]

    def timed_dfa(expr):
        start = time.perf_counter()
        try:
            return compiler._compile_dfa(expr)
        finally:
            automata[0] += time.perf_counter() - start

    def on_alarm(signum, frame):
        raise _Timeout()

    previous = signal.signal(signal.SIGALRM, on_alarm)
    phase = "front_end"
    with gc_paused():  # as maskbench times a compile: a collection in it is not the compiler's cost
        try:
            signal.setitimer(signal.ITIMER_REAL, timeout_s)  # inside: an alarm that fires at once is caught too
            start = time.perf_counter()
            options = JsonSchemaOptions(whitespace=whitespace, property_order=property_order)
            grammar = parse_json_schema(load_schema(schema), options, limits=compiler.limits)
            times.front_end = time.perf_counter() - start
            times.phases_done.append(phase)
            phase = "lowering"
            start = time.perf_counter()
            cfg = lower_grammar(grammar, compiler.limits, timed_dfa, allow_empty=True)
            times.automata = automata[0]
            times.lowering = time.perf_counter() - start - automata[0]
            times.phases_done += ["lowering", "automata"]
            phase = "assemble"
            start = time.perf_counter()
            compiled = compiler._assemble(grammar, cfg)
            times.assemble = time.perf_counter() - start
            times.phases_done.append(phase)
            times.n_terminals, times.n_productions = compiled.n_terminals, compiled.n_productions
            phase = "first_mask"
            start = time.perf_counter()
            compiled.matcher().fill_mask(allocate_token_bitmask(1, vocab.logits_width), 0)
            times.first_mask = time.perf_counter() - start
            times.phases_done.append(phase)
        except _Timeout:
            times.error = f"timeout after {timeout_s:g} s in {phase}"
        except Exception as exc:  # noqa: BLE001 - an unsupported schema is a row, not the end of the run
            times.error = f"{type(exc).__name__} in {phase}: {str(exc).splitlines()[0][:200] if str(exc) else ''}"
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, previous)
    return times


def summarize(rows: list[PhaseTimes], slowest: int) -> dict[str, Any]:
    """Phase shares over the compiled files, the median file and the ``slowest`` files."""
    done = sorted((r for r in rows if r.error is None), key=lambda r: r.total)
    if not done:
        return {"files": len(rows), "compiled": 0}
    sums = {p: sum(getattr(r, p) for r in done) for p in PHASES}
    grand = sum(sums.values()) or 1.0
    totals = [r.total for r in done]
    return {
        "files": len(rows), "compiled": len(done), "errors": len(rows) - len(done),
        "total_p50_ms": 1e3 * statistics.median(totals),
        "total_p99_ms": 1e3 * totals[min(len(totals) - 1, int(0.99 * len(totals)))],
        "total_max_ms": 1e3 * totals[-1],
        "share": {p: sums[p] / grand for p in PHASES},
        "phase_p50_ms": {p: 1e3 * statistics.median(getattr(r, p) for r in done) for p in PHASES},
        "median_file": asdict(done[(len(done) - 1) // 2]),
        "slowest": [asdict(r) for r in reversed(done[-slowest:])],
    }


def markdown(summary: dict[str, Any]) -> str:
    if not summary.get("compiled"):
        return "no file compiled\n"

    def row(r: dict) -> str:
        total = sum(r[p] for p in PHASES)
        cells = " | ".join(f"{1e3 * r[p]:.1f}" for p in PHASES)
        return f"| {r['file']} | {1e3 * total:.1f} | {cells} | {r['n_terminals']} | {r['n_productions']} |"

    head = "| file | total ms | " + " | ".join(f"{p} ms" for p in PHASES) + " | terminals | productions |"
    rule = "|" + "--|" * (len(PHASES) + 4)
    lines = [
        f"{summary['compiled']} of {summary['files']} files compiled ({summary['errors']} errors); "
        f"compile + first mask p50 {summary['total_p50_ms']:.1f} ms, p99 {summary['total_p99_ms']:.1f} ms, "
        f"max {summary['total_max_ms']:.0f} ms",
        "",
        "| phase | share of all time | p50 ms |",
        "|--|--|--|",
        *(f"| {p} | {100 * summary['share'][p]:.1f}% | {summary['phase_p50_ms'][p]:.2f} |" for p in PHASES),
        "",
        f"The median file, then the {len(summary['slowest'])} slowest:",
        "",
        head, rule, row(summary["median_file"]), *(row(r) for r in summary["slowest"]),
    ]
    return "\n".join(lines) + "\n"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--data", type=Path, default=None, help="MaskBench folder (default: ../shared/jsonschemabench/maskbench)")
    parser.add_argument("--tokenizer", type=Path, default=None,
                        help="a .gguf vocabulary or tokenizer folder (default: ../shared/vocab/ggml-vocab-llama-bpe.gguf)")
    parser.add_argument("--sample", type=int, default=None, metavar="N", help="N files drawn with seed 0 (default: all)")
    parser.add_argument("--only", default="", help="fnmatch pattern on file names")
    parser.add_argument("--slowest", type=int, default=20, metavar="K", help="how many slowest files to list (20)")
    parser.add_argument("--timeout", dest="timeout_s", type=float, default=60.0, metavar="S",
                        help="seconds per file before it is recorded as a timeout (60)")
    parser.add_argument("--property-order", choices=("any", "schema", "required_first"), default="any",
                        help="corral's property_order (default 'any', as maskbench)")
    parser.add_argument("--out", type=Path, default=None, help="output folder (default: runs/compile-profile-<timestamp>)")
    parser.set_defaults(run=main)


def main(args: argparse.Namespace) -> int:
    from grammars import TokenVocabulary

    data = args.data or default_shared("jsonschemabench", "maskbench")
    tokenizer = args.tokenizer or default_shared("vocab", "ggml-vocab-llama-bpe.gguf")
    files = select_sample(list_cases(data, args.only), args.sample)
    out = args.out or Path("runs") / f"compile-profile-{time.strftime('%Y%m%d-%H%M%S')}"
    out.mkdir(parents=True, exist_ok=True)
    vocab = TokenVocabulary.from_pretrained(tokenizer)
    # imports, numba's compiled walks and the per-process automata memos are paid before the first
    # file, as a long-running maskbench worker has paid them
    profile_schema(vocab, WARMUP_SCHEMA, "warm-up", timeout_s=args.timeout_s, property_order=args.property_order)
    rows: list[PhaseTimes] = []
    with open(out / "rows.jsonl", "w", encoding="utf-8") as sink:
        for i, path in enumerate(files, 1):
            schema = json.loads(path.read_text(encoding="utf-8"))["schema"]
            times = profile_schema(vocab, schema, path.name, timeout_s=args.timeout_s,
                                   property_order=args.property_order)
            rows.append(times)
            sink.write(json.dumps({**asdict(times), "total": times.total}) + "\n")
            if i % 50 == 0 or i == len(files):
                outputs.log(f"compile-profile: {i}/{len(files)} files")
    summary = summarize(rows, args.slowest)
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
    table = markdown(summary)
    (out / "summary.md").write_text(table, encoding="utf-8")
    print(table)
    return 0
