"""Completability-check latency on real C++: HumanEval-X solutions' own lines written back into
their holes, token by token, with the checks an infilling decoder makes.

A model-driven run measures checks on whatever the model writes; a weak model writes little and
oddly. Here the fill is the canonical solution's cut lines (real code at real lengths), tokenized
by the C++ model's tokenizer. At every token the decoder's two kinds of check are timed, exactly
as ``engine.infill`` makes them: the true token (always completable) and one other token the
prefix allows (drawn at random; often refused), each as "extend the chart by the token,
ask the hole's ``SuffixOracle``, roll back". The hole's setup (the oracle parsing the text after
the hole, when the hole opens) is timed apart. ``--baseline K`` also times the one-shot check
(``HoleChart.check``: the text after the hole parsed again for every token) on the first K
tasks, for comparison, and counts any answer that differs.

``python -m jsonschemabench infill-checks --cpp-model models/tiny-cpp --baseline 4``
"""

from __future__ import annotations

import argparse
import gzip
import json
import random
import time
from pathlib import Path

from . import outputs
from .infill_bench import _shared, add_task_arguments, cut_lines
from .report import percentiles

__all__ = ["add_arguments", "main", "run_replay", "summarize_replay"]


def run_replay(args: argparse.Namespace, say=outputs.log) -> list[dict]:
    """One row per hole: setup seconds, check seconds (true and other tokens), disagreements."""
    from grammars import Compiler, TokenVocabulary, builtin_grammar
    from grammars.automata.holes import HoleChart
    from grammars.automata.suffix import SuffixOracle

    path = _shared(args, "humaneval-x", "humaneval_cpp.jsonl.gz")
    tasks = [json.loads(line) for line in gzip.open(path, "rt", encoding="utf-8")][: args.tasks]
    vocab = TokenVocabulary.from_pretrained(str(args.cpp_model))
    grammar = Compiler(vocab).compile_lark(builtin_grammar("cpp"))
    hole_grammar, limits = grammar.hole_grammar, grammar._runtime.limits
    rows = []
    for regions in args.regions:
        rng = random.Random(args.seed * 1000 + regions)
        for index, task in enumerate(tasks):
            cut = cut_lines(task["canonical_solution"], regions, rng)
            if cut is None:
                continue
            program = task["declaration"] + task["canonical_solution"]
            parts = [task["declaration"] + cut[0], *cut[1:]]
            fills, at = [], len(parts[0])
            for part in parts[1:]:
                end = program.index(part, at) if part else len(program)
                fills.append(program[at:end])
                at = end + len(part)
            baseline = index < args.baseline
            chart = HoleChart(hole_grammar, limits)
            chart.extend(parts[0].encode())
            for j, fill in enumerate(fills):
                rest = [p.encode() for p in parts[j + 1:]]
                holes = [(0, None)] * len(rest)
                oracle = SuffixOracle(hole_grammar, rest, holes, limits)
                t0 = time.perf_counter()
                oracle.completable(chart)
                row = {"task": task["task_id"], "regions": regions, "hole": j, "setup": time.perf_counter() - t0,
                       "true": [], "other": [], "baseline": [], "disagree": 0, "tokens": 0}
                for token in vocab.encode(fill):
                    candidates = [("true", token)]
                    other = _other_live_token(chart, vocab, token, rng)
                    if other is not None:
                        candidates.append(("other", other))
                    for kind, candidate in candidates:
                        data = vocab.token_bytes[candidate]
                        t1 = time.perf_counter()
                        mark = chart.length
                        ok = chart.extend(data) and oracle.completable(chart)
                        row[kind].append(time.perf_counter() - t1)
                        if baseline:
                            t2 = time.perf_counter()
                            expected = chart.alive and chart.check(rest, holes) is not None
                            row["baseline"].append(time.perf_counter() - t2)
                            row["disagree"] += ok != expected
                        chart.truncate(mark)
                        if kind == "true" and not ok:
                            row["disagree"] += 1  # the canonical text is in the language
                    chart.extend(vocab.token_bytes[token])
                    row["tokens"] += 1
                chart.extend(rest[0])
                rows.append(row)
            say(f"  replay {regions}-region {task['task_id']}: " + ", ".join(
                f"hole {r['hole']} setup {1000 * r['setup']:.0f} ms, {r['tokens']} tokens" for r in rows[-len(fills):]))
    return rows


def _other_live_token(chart, vocab, token: int, rng: random.Random, tries: int = 200) -> int | None:
    """A random token other than ``token`` that keeps the chart's prefix live (one the prefix
    mask allows: the chart is exact), found by trying random ids; None if none turns up."""
    n = len(vocab.token_bytes)
    mark = chart.length
    for _ in range(tries):
        candidate = rng.randrange(n)
        data = vocab.token_bytes[candidate]
        if candidate == token or not data:
            continue
        live = chart.extend(data)
        chart.truncate(mark)
        if live:
            return candidate
    return None


def _ms(values: list[float], q: str) -> str:
    p = percentiles(values)
    return "—" if p.get(q) is None else f"{1000 * p[q]:.2f}"


def summarize_replay(rows: list[dict]) -> str:
    lines = ["## Completability checks on canonical fills (C++, HumanEval-X)", "",
             "| regions | holes | tokens | checks | check p50 ms | check p99 ms | check max ms | true-token p50 ms | "
             "other-token p50 ms | hole setup p50 ms | hole setup p99 ms | one-shot check p50 ms | one-shot p99 ms | "
             "disagreements |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for regions in sorted({r["regions"] for r in rows}):
        group = [r for r in rows if r["regions"] == regions]
        true = [s for r in group for s in r["true"]]
        other = [s for r in group for s in r["other"]]
        checks = true + other
        setups = [r["setup"] for r in group]
        base = [s for r in group for s in r["baseline"]]
        lines.append(
            f"| {regions} | {len(group)} | {sum(r['tokens'] for r in group)} | {len(checks)} | {_ms(checks, 'p50')} | "
            f"{_ms(checks, 'p99')} | {_ms(checks, 'max')} | {_ms(true, 'p50')} | {_ms(other, 'p50')} | "
            f"{_ms(setups, 'p50')} | {_ms(setups, 'p99')} | {_ms(base, 'p50')} | {_ms(base, 'p99')} | "
            f"{sum(r['disagree'] for r in group)} |")
    lines.append("")
    return "\n".join(lines)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Register the ``infill-checks`` subcommand's options on ``parser`` (``--cpp-model``: where
    the tokenizer comes from, a model folder or a GGUF vocabulary)."""
    add_task_arguments(parser)
    parser.add_argument("--baseline", type=int, default=0, metavar="K",
                        help="also time the one-shot check on the first K tasks and compare its answers")
    parser.add_argument("--out", type=Path, default=Path("bench-results") / "infill-checks")
    parser.set_defaults(run=main)


def main(args: argparse.Namespace) -> int:
    """Run the replay; prints the table and writes rows and summary under ``--out``."""
    rows = run_replay(args)
    table = summarize_replay(rows)
    args.out.mkdir(parents=True, exist_ok=True)
    with open(args.out / "rows.jsonl", "w", encoding="utf-8") as sink:
        for row in rows:
            sink.write(json.dumps(row) + "\n")
    (args.out / "summary.md").write_text(table + "\n", encoding="utf-8")
    return outputs.show_run(args.out, ["rows.jsonl", "summary.md"])
