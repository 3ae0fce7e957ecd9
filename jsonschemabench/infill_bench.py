"""Multi-region infilling: syntactic and functional correctness, checks per token, check latency.

Two parts, each unconstrained vs constrained (``engine.infill``):

* **C++ (HumanEval-X)**: the program ``declaration + canonical_solution``; 1, 2 or 3 regions of
  whole lines of the solution are cut out (random spans, as HumanEval-MRI cuts them) and filled
  by a C++ model (``python -m engine.tiny_code`` trains one on the g++ headers, never on
  HumanEval-X) under the built-in ``"cpp"`` grammar. Measured: membership in the C++ grammar
  (what the constraint guarantees), ``g++ -fsyntax-only`` validity (which also checks names and
  types: an undeclared identifier fails it, however well-formed),
  functional correctness (the task's tests compiled and run), checks per generated token,
  completability-check latency p50/p99, holes the witness had to close.
* **JSON (MaskBench)**: valid instances with 1–3 holes cut out (random character spans), filled
  under their schemas: parse rate, schema validity, latency.

``python -m jsonschemabench infill --cpp-model models/tiny-cpp --json-model models/tiny-cpp``
"""

from __future__ import annotations

import argparse
import functools
import gzip
import json
import random
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

from . import outputs
from .report import percentiles

__all__ = ["add_arguments", "add_task_arguments", "cut_lines", "cut_spans", "main", "tree_sitter_ok"]


def _shared(args: argparse.Namespace, *parts: str) -> Path:
    return Path(args.shared).joinpath(*parts)


def cut_lines(solution: str, regions: int, rng: random.Random) -> list[str] | None:
    """``solution`` as ``regions + 1`` fixed texts around ``regions`` cut spans of whole lines
    (non-empty, not adjacent); None when the solution has too few lines."""
    lines = solution.splitlines(keepends=True)
    body = [i for i, line in enumerate(lines) if line.strip()]
    if len(body) < 2 * regions:
        return None
    for _ in range(100):
        starts = sorted(rng.sample(body, regions))
        spans, ok = [], True
        for k, start in enumerate(starts):
            limit = starts[k + 1] - 1 if k + 1 < regions else len(lines)
            if limit <= start:
                ok = False
                break
            end = rng.randint(start + 1, min(limit, start + 4))
            spans.append((start, end))
        if ok:
            parts, at = [], 0
            for start, end in spans:
                parts.append("".join(lines[at:start]))
                at = end
            parts.append("".join(lines[at:]))
            return parts
    return None


def cut_spans(text: str, holes: int, rng: random.Random) -> list[str]:
    """``text`` with ``holes`` random character spans removed (each 1–12 characters)."""
    cuts = sorted(rng.sample(range(len(text) + 1), min(len(text) + 1, 2 * holes)))
    parts, at = [], 0
    for a, b in zip(cuts[::2], cuts[1::2]):
        b = min(b, a + 12)
        parts.append(text[at:a])
        at = b
    parts.append(text[at:])
    return parts


def _gxx_ok(program: str, *, run: bool = False, timeout: float = 20.0) -> bool:
    """``g++ -fsyntax-only`` accepts ``program``; with ``run``, it compiles and exits 0."""
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "main.cpp"
        src.write_text(program, encoding="utf-8")
        if not run:
            cmd = ["g++", "-std=c++17", "-fsyntax-only", str(src)]
            return subprocess.run(cmd, capture_output=True, timeout=timeout).returncode == 0
        exe = Path(tmp) / "main"
        if subprocess.run(["g++", "-std=c++17", "-O0", "-o", str(exe), str(src)], capture_output=True,
                          timeout=timeout * 3).returncode != 0:
            return False
        try:
            return subprocess.run([str(exe)], capture_output=True, timeout=timeout).returncode == 0
        except subprocess.TimeoutExpired:
            return False


@functools.lru_cache(maxsize=1)
def _tree_sitter_parser():
    import tree_sitter
    import tree_sitter_cpp

    return tree_sitter.Parser(tree_sitter.Language(tree_sitter_cpp.language()))


def tree_sitter_ok(program: str) -> bool | None:
    """Syntax alone, by an independent C++ parser (tree-sitter-cpp: no ERROR or MISSING node).
    ``g++ -fsyntax-only`` also resolves names and types; this does not. None when not installed."""
    try:
        parser = _tree_sitter_parser()
    except ImportError:
        return None
    return not parser.parse(program.encode("utf-8")).root_node.has_error


def _fill(args: argparse.Namespace, parts: list[str], lm, vocab, compiler, grammar, constrained: bool):
    """One infilling run: ``(result, seconds, None)``, or ``(None, seconds, error text)`` — a
    failed run is a row of the benchmark, not its crash."""
    from engine import infill

    t = time.perf_counter()
    try:
        result = infill(parts, model=lm, tokenizer=vocab, compiler=compiler, grammar=grammar if constrained else None,
                        constrained=constrained, max_tokens_per_hole=args.max_tokens_per_hole, seed=args.seed,
                        temperature=args.temperature)
    except Exception as error:
        return None, time.perf_counter() - t, f"{type(error).__name__}: {error}"
    return result, time.perf_counter() - t, None


def run_cpp(args: argparse.Namespace, say=outputs.log) -> list[dict]:
    from engine.generate import load_model, load_vocabulary
    from grammars import Compiler, builtin_grammar

    path = _shared(args, "humaneval-x", "humaneval_cpp.jsonl.gz")
    tasks = [json.loads(line) for line in gzip.open(path, "rt", encoding="utf-8")][: args.tasks]
    lm, tok = load_model(str(args.cpp_model))
    vocab = load_vocabulary(tok, lm)
    compiler = Compiler(vocab)
    t0 = time.perf_counter()
    grammar = compiler.compile_lark(builtin_grammar("cpp"))
    say(f"C++ grammar compiled in {time.perf_counter() - t0:.2f}s; {len(tasks)} tasks, regions {args.regions}")
    rows = []
    for regions in args.regions:
        rng = random.Random(args.seed * 1000 + regions)
        for task in tasks:
            cut = cut_lines(task["canonical_solution"], regions, rng)
            if cut is None:
                continue
            parts = [task["declaration"] + cut[0], *cut[1:]]
            for constrained in (False, True):
                result, seconds, error = _fill(args, parts, lm, vocab, compiler, grammar, constrained)
                if error is not None:
                    rows.append({"task": task["task_id"], "regions": regions, "constrained": constrained,
                                 "error": error})
                    continue
                in_grammar = grammar.completable([result.text])
                syntax = _gxx_ok(result.text)
                parses = tree_sitter_ok(result.text)
                functional = syntax and _gxx_ok(result.text + task["test"], run=True)
                tokens = sum(h.tokens for h in result.holes)
                rows.append({
                    "task": task["task_id"], "regions": regions, "constrained": constrained, "grammar_ok": in_grammar,
                    "tree_sitter_ok": parses, "syntax_ok": syntax, "fills": result.fills,
                    "functional_ok": functional, "tokens": tokens, "checks": result.checks,
                    "check_seconds": result.check_seconds, "setup_seconds": result.setup_seconds,
                    "witness_holes": sum(h.closed_by_witness for h in result.holes), "seconds": seconds,
                })
            say(f"  {regions}-region {task['task_id']}: "
                + ", ".join(f"{'con' if r['constrained'] else 'unc'} syntax={r.get('syntax_ok')}" for r in rows[-2:]))
    return rows


def run_json(args: argparse.Namespace, say=outputs.log) -> list[dict]:
    import jsonschema

    from engine.generate import load_model, load_vocabulary
    from grammars import Compiler

    folder = _shared(args, "jsonschemabench", "maskbench")
    files = sorted(folder.glob("*.json"))
    rng = random.Random(args.seed)
    rng.shuffle(files)
    lm, tok = load_model(str(args.json_model))
    vocab = load_vocabulary(tok, lm)
    compiler = Compiler(vocab)
    rows = []
    for path in files:
        if len(rows) >= 2 * args.json_cases:
            break
        case = json.loads(path.read_text(encoding="utf-8"))
        valid = [t["data"] for t in case["tests"] if t["valid"]]
        if not valid:
            continue
        try:
            grammar = compiler.compile_json_schema(case["schema"])
        except Exception:
            continue  # the MaskBench benchmark reports compile coverage; here we need a grammar
        text = json.dumps(valid[0], ensure_ascii=False, separators=(",", ":"))
        if not grammar.completable([text]):
            continue  # outside what the compiled schema admits
        parts = cut_spans(text, rng.randint(1, 3), rng)
        for constrained in (False, True):
            result, seconds, error = _fill(args, parts, lm, vocab, compiler, grammar, constrained)
            if error is not None:
                rows.append({"file": path.name, "constrained": constrained, "error": error})
                continue
            try:
                value = json.loads(result.text)
                parsed = True
                valid_ok = jsonschema.Draft202012Validator(case["schema"]).is_valid(value)
            except (ValueError, RecursionError):
                parsed, valid_ok = False, False
            except Exception:  # the oracle failed on a schema it cannot handle
                parsed, valid_ok = True, None
            rows.append({"file": path.name, "holes": len(parts) - 1, "constrained": constrained, "parsed": parsed,
                         "schema_valid": valid_ok, "tokens": sum(h.tokens for h in result.holes),
                         "checks": result.checks, "check_seconds": result.check_seconds,
                         "setup_seconds": result.setup_seconds, "witness_holes": sum(h.closed_by_witness for h in result.holes), "seconds": seconds})
    return rows


def _rate(rows: list[dict], key: str) -> str:
    done = [r for r in rows if r.get(key) is not None]
    if not done:
        return "—"
    return f"{100 * sum(bool(r[key]) for r in done) / len(done):.1f}% ({sum(bool(r[key]) for r in done)}/{len(done)})"


def _ms(values: list[float], q: str) -> str:
    p = percentiles(values)
    return "—" if p.get(q) is None else f"{1000 * p[q]:.2f}"


def summarize(cpp: list[dict], js: list[dict]) -> str:
    lines = []
    if cpp:
        lines += ["## C++ (HumanEval-X, multi-region infilling)", "",
                  "| regions | decoding | n | in the C++ grammar | tree-sitter-cpp parses | g++ -fsyntax-only | functional | tokens/task | checks/token | check p50 ms | check p99 ms | hole setup p50 ms | hole setup p99 ms | witness holes | errors |",
                  "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
        for regions in sorted({r["regions"] for r in cpp}):
            for constrained in (False, True):
                rows = [r for r in cpp if r["regions"] == regions and r["constrained"] == constrained]
                ok = [r for r in rows if "error" not in r]
                checks = [s for r in ok for s in r["check_seconds"]]
                setups = [s for r in ok for s in r.get("setup_seconds", ())] if constrained else []
                tokens = sum(r["tokens"] for r in ok)
                lines.append(
                    f"| {regions} | {'constrained' if constrained else 'unconstrained'} | {len(rows)} | "
                    f"{_rate(ok, 'grammar_ok')} | {_rate(ok, 'tree_sitter_ok')} | {_rate(ok, 'syntax_ok')} | {_rate(ok, 'functional_ok')} | {tokens / max(1, len(ok)):.1f} | "
                    f"{sum(r['checks'] for r in ok) / max(1, tokens):.2f} | {_ms(checks, 'p50')} | {_ms(checks, 'p99')} | "
                    f"{_ms(setups, 'p50')} | {_ms(setups, 'p99')} | "
                    f"{sum(r['witness_holes'] for r in ok)} | {len(rows) - len(ok)} |")
        lines.append("")
    if js:
        lines += ["## JSON (MaskBench instances with 1-3 holes)", "",
                  "| decoding | n | parses | schema-valid | checks/token | check p50 ms | check p99 ms | hole setup p50 ms | hole setup p99 ms | s/instance | witness holes | errors |",
                  "|---|---|---|---|---|---|---|---|---|---|---|---|"]
        for constrained in (False, True):
            rows = [r for r in js if r["constrained"] == constrained]
            ok = [r for r in rows if "error" not in r]
            checks = [s for r in ok for s in r["check_seconds"]]
            setups = [s for r in ok for s in r.get("setup_seconds", ())] if constrained else []
            tokens = sum(r["tokens"] for r in ok)
            lines.append(
                f"| {'constrained' if constrained else 'unconstrained'} | {len(rows)} | {_rate(ok, 'parsed')} | "
                f"{_rate(ok, 'schema_valid')} | {sum(r['checks'] for r in ok) / max(1, tokens):.2f} | "
                f"{_ms(checks, 'p50')} | {_ms(checks, 'p99')} | {_ms(setups, 'p50')} | {_ms(setups, 'p99')} | "
                f"{sum(r['seconds'] for r in ok) / max(1, len(ok)):.2f} | {sum(r['witness_holes'] for r in ok)} | "
                f"{len(rows) - len(ok)} |")
        lines.append("")
    return "\n".join(lines)


def add_task_arguments(parser: argparse.ArgumentParser) -> None:
    """The options that choose the HumanEval-X programs and their cuts (shared with ``infill-checks``)."""
    parser.add_argument("--cpp-model", type=Path, default=Path("models/tiny-cpp"),
                        help="C++ model folder (python -m engine.tiny_code); default: %(default)s")
    parser.add_argument("--shared", type=Path, default=Path(__file__).resolve().parents[2] / "shared",
                        help="the shared data folder (default: ../shared)")
    parser.add_argument("--tasks", type=int, default=164, help="HumanEval-X tasks (default: all 164)")
    parser.add_argument("--regions", type=lambda s: [int(x) for x in s.split(",")], default=[1, 2, 3],
                        help="numbers of cut regions (default 1,2,3)")
    parser.add_argument("--seed", type=int, default=0)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Register the ``infill`` subcommand's options on ``parser``."""
    add_task_arguments(parser)
    parser.add_argument("--json-model", type=Path, default=None,
                        help="model for the JSON part (default: the C++ model; any causal LM folder)")
    parser.add_argument("--json-cases", type=int, default=50, help="MaskBench instances (default 50)")
    parser.add_argument("--skip-cpp", action="store_true")
    parser.add_argument("--skip-json", action="store_true")
    parser.add_argument("--max-tokens-per-hole", type=int, default=48)
    parser.add_argument("--temperature", type=float, default=0.7)
    parser.add_argument("--out", type=Path, default=Path("bench-results") / "infill")
    parser.set_defaults(run=main)


def main(args: argparse.Namespace) -> int:
    """Run the infilling benchmark; prints the tables and writes rows and summary under ``--out``."""
    if not args.skip_cpp and shutil.which("g++") is None:
        outputs.log("g++ not found: the C++ part needs it (or pass --skip-cpp)")
        return 2
    if args.json_model is None:
        args.json_model = args.cpp_model
    cpp = [] if args.skip_cpp else run_cpp(args)
    js = [] if args.skip_json else run_json(args)
    table = summarize(cpp, js)
    args.out.mkdir(parents=True, exist_ok=True)
    with open(args.out / "rows.jsonl", "w", encoding="utf-8") as sink:
        sink.writelines(json.dumps(row) + "\n" for row in cpp + js)
    (args.out / "summary.md").write_text(table + "\n", encoding="utf-8")
    return outputs.show_run(args.out, ["rows.jsonl", "summary.md"])
