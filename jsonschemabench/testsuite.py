"""JSON Schema Test Suite: how exactly each engine's constraint matches each keyword's semantics.

``python -m jsonschemabench testsuite --suite ../shared/json-schema-test-suite/tests/draft2020-12``
takes every keyword file of the suite folder (``*.json`` directly in it; ``optional/`` is not
read) and every test group in it (a schema and its tests), and on each engine:

1. compiles the group's schema; a refusal (``EngineRefused``), a timeout or a crash fails every
   test of the group;
2. for each test, serializes the instance with ``json.dumps(data, ensure_ascii=False)`` and
   separators ``", "`` / ``": "`` (``--separators spaced``, the default: MaskBench's
   serialization, the same text for every engine; every engine runs with flexible whitespace,
   so a space is never a legitimate reason to reject) or ``","`` / ``":"``
   (``--separators compact``), tokenizes it canonically and walks it token by token
   (``maskbench.walk_instance``);
3. a test **passes** when a valid instance is accepted (every token in the mask, EOS allowed at
   the end) or an invalid one is rejected (some token outside the mask, or no EOS at the end).
   The mask decides, as in generation; where the engine's own "accepting" flag disagrees with
   EOS being in the mask, the test row records ``accept_disagree``.

Why xgrammar's count depends on both choices (measured with xgrammar 0.2.8, draft 2020-12):
with spaced separators it passes 869 of 1,299; ``enum``/``const`` with object or array values
match only the compact text (6 valid instances such as ``{"a": false}`` are rejected despite
``any_whitespace=True``), so compact separators give 875; and in ``unevaluatedProperties``
group 33 (a recursive ``$ref``) its mask leaves out the token ``}}`` that ``accept_token()``
takes, on 3 valid instances, so a harness that walks with ``accept_token()`` alone and asks
``is_completed()`` counts those (and accepts 1 more invalid one): 877, the figure quoted for
this suite. This runner judges by the mask, which is what constrains generation.
llguidance passes 583 either way.

Schemas with remote ``$ref`` (``http://localhost:1234/...``, the suite's ``remotes/``) are given
as they are to the peers: engines that cannot fetch them refuse them or mis-handle them, and fail
those tests. corral runs in the suite's own mode: its ``registry`` option gets every file of
``remotes/`` under ``http://localhost:1234/<path>`` (``--remotes``; the suite's test server), and
``format_assertion=False``, because the main draft 2019-09/2020-12 files test ``format`` as an
annotation (``--format-assertion`` enforces it instead, as corral does by default), and
``property_order="any"`` (``--property-order``): the suite's valid objects come in any member
order, and corral's default ``"schema"`` order is a generation policy that rejects some of them;
and ``max_combinations=1024`` (``--max-combinations``; corral's default is 256), which one group
of nested ``oneOf``s under ``unevaluatedProperties`` needs.
The suite's draft 2020-12 main files hold 46 keyword files, 383 groups and 1,299 tests.

Each (group, engine) runs in a worker process, as in ``maskbench`` (``--timeout`` per group,
default 60 s; crashes are recorded, never fatal), or with ``--ray [ADDRESS]`` on a Ray cluster's
actors (``ray_pool``), with the same limits and rows. Outputs (``--out``, default
``runs/testsuite-<timestamp>``): ``results.jsonl`` (one line per group × engine, every test's
verdict), ``summary.json`` (passed/total per file and engine, totals, versions and options) and
``summary.md`` (the table, also printed).
"""

from __future__ import annotations

import argparse
import json
from datetime import datetime
from pathlib import Path
from typing import Any, Callable, Sequence

from . import outputs
from .maskbench import (
    Executor,
    Task,
    WorkerConfig,
    add_common_arguments,
    default_shared,
    run_meta,
    run_with_progress,
    start_run,
    walk_instance,
)

__all__ = ["DEFAULT_ENGINES", "list_keyword_files", "load_groups", "run_group", "run_testsuite",
           "add_arguments", "main"]

DEFAULT_ENGINES = ("corral", "llguidance", "xgrammar")
SEPARATORS = {"spaced": (", ", ": "), "compact": (",", ":")}


def list_keyword_files(suite_dir: Path) -> list[Path]:
    """The suite's keyword files (``*.json`` directly in ``suite_dir``, sorted; not ``optional/``)."""
    if not suite_dir.is_dir():
        raise FileNotFoundError(f"test suite folder not found: {suite_dir} (pass --suite DIR)")
    return sorted((p for p in suite_dir.glob("*.json") if p.is_file()), key=lambda p: p.name)


def load_groups(path: Path) -> list[dict]:
    """The test groups of one keyword file: ``[{"description", "schema", "tests": [...]}, ...]``."""
    groups = json.loads(path.read_text(encoding="utf-8"))
    if not isinstance(groups, list):
        raise ValueError(f"{path}: expected a list of test groups")
    return groups


def run_group(engine: Any, tokenizer: Any, payload: dict, progress: Callable[[dict], None]) -> dict:
    """Compile one group's schema on ``engine`` and judge each of its tests (runs in a worker)."""
    from .peers import EngineRefused

    group = load_groups(Path(payload["path"]))[payload["group"]]
    tests = group.get("tests") or []
    separators = SEPARATORS[payload.get("separators", "spaced")]
    token_lists = [list(tokenizer.encode(json.dumps(test["data"], ensure_ascii=False, separators=separators)))
                   for test in tests]
    engine.reset_caches()
    try:
        handle = _compile(engine, group["schema"], payload.get("corral_options") or {})
    except EngineRefused as exc:
        error = f"{exc.kind or type(exc).__name__}: {exc}"
        return {"outcome": "compile_error", "error": error[:500], "keyword": getattr(exc, "keyword", None),
                "tests": [{"description": t.get("description", ""), "valid": bool(t.get("valid")),
                           "passed": False, "verdict": "compile_error"} for t in tests]}
    verdicts = []
    for test, ids in zip(tests, token_lists):
        verdict, pos, counters = walk_instance(engine, handle, ids, [])
        valid = bool(test.get("valid"))
        verdicts.append({"description": test.get("description", ""), "valid": valid,
                         "passed": (verdict == "accepted") == valid, "verdict": verdict,
                         **({"position": pos, "of": len(ids)} if verdict == "rejected_token" else {}),
                         **({"accept_disagree": True} if counters["accept_disagree"] else {})})
    return {"outcome": "ok", "error": None, "tests": verdicts}


REMOTES_URI = "http://localhost:1234/"


def load_remotes(remotes_dir: Path) -> dict[str, Any]:
    """The suite's ``remotes/`` as ``{uri: schema}``, each file at ``http://localhost:1234/<path>``."""
    return {REMOTES_URI + p.relative_to(remotes_dir).as_posix(): json.loads(p.read_text(encoding="utf-8"))
            for p in sorted(remotes_dir.rglob("*.json"))}


_REMOTES_CACHE: dict[str, dict] = {}


def _compile(engine: Any, schema: Any, corral_options: dict) -> Any:
    """``compile_schema`` with the suite's options for corral, its ``remotes`` folder loaded (once
    per worker) as the ``registry``."""
    from .peers import compile_schema

    options = dict(corral_options)
    remotes = options.pop("remotes", None)
    if remotes:
        if remotes not in _REMOTES_CACHE:
            _REMOTES_CACHE[remotes] = load_remotes(Path(remotes))
        options["registry"] = _REMOTES_CACHE[remotes]
    return compile_schema(engine, schema, options)


def run_testsuite(
    files: Sequence[Path],
    engines: Sequence[str],
    out_dir: Path,
    *,
    config: WorkerConfig,
    workers: int = 2,
    timeout_s: float = 60.0,
    separators: str = "spaced",
    progress: bool = True,
    meta: dict | None = None,
    corral_options: dict | None = None,
    executor: Executor | None = None,
) -> dict:
    """Run every group of every file on every engine; write results.jsonl, summary.json/.md.

    ``executor``: the local pool (default) or ``ray_pool.run_tasks``; rows and files are the same.
    """
    if separators not in SEPARATORS:
        raise ValueError(f"separators must be one of {', '.join(SEPARATORS)}")
    from . import report

    out_dir.mkdir(parents=True, exist_ok=True)
    tasks = []
    sizes: dict[tuple[str, int], int] = {}
    for path in files:
        for index, group in enumerate(load_groups(path)):
            sizes[(path.name, index)] = len(group.get("tests") or [])
            for engine in engines:
                tasks.append(Task((path.name, index, group.get("description", "")), engine,
                                  "jsonschemabench.testsuite:run_group", {"path": str(path), "group": index,
                                                                         "separators": separators,
                                                                         "corral_options": corral_options or {}}))
    rows: list[dict] = []
    engine_info: dict[str, dict] = {}
    with (out_dir / "results.jsonl").open("w", encoding="utf-8") as sink:
        def on_row(task: Task, record: dict, info: dict | None) -> dict:
            file_name, index, description = task.key
            if info is not None:
                engine_info.setdefault(task.engine, info)
            row = {"file": file_name, "group": index, "description": description, "engine": task.engine,
                   "n_tests": sizes[(file_name, index)], **record}
            row.setdefault("error", None)
            row.setdefault("tests", [])
            rows.append(row)
            sink.write(json.dumps(row, ensure_ascii=False) + "\n")
            sink.flush()
            return row

        skipped = run_with_progress(tasks, config, on_row, desc="testsuite", workers=workers,
                                    timeout_s=timeout_s, progress=progress, executor=executor)
    order = [e for e in engines if e not in skipped]
    summary = report.summarize_testsuite(rows, order, engine_info)
    meta = dict(meta or {})
    summary["meta"] = {**meta, "skipped": {**meta.get("skipped", {}), **skipped}, "timeout_s": timeout_s,
                       "workers": workers, "keyword_files": len(files), "groups": len(sizes),
                       "tests": sum(sizes.values()), "corral_options": {k: v for k, v in (corral_options or {}).items()},
                       "serialization": f"json.dumps(data, ensure_ascii=False, separators={SEPARATORS[separators]!r})"}
    (out_dir / "summary.json").write_text(json.dumps(summary, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    (out_dir / "summary.md").write_text(report.testsuite_markdown(summary), encoding="utf-8")
    return summary


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Register the ``testsuite`` subcommand's options on ``parser``."""
    parser.add_argument("--suite", type=Path, default=None,
                        help="a draft folder of the suite (default: "
                        "../shared/json-schema-test-suite/tests/draft2020-12)")
    add_common_arguments(parser, DEFAULT_ENGINES)
    parser.add_argument("--only", default="", metavar="GLOB", help="only keyword files whose name matches GLOB")
    parser.add_argument("--timeout", type=float, default=60.0, metavar="SECONDS",
                        help="limit per test group and engine (default 60)")
    parser.add_argument("--separators", choices=sorted(SEPARATORS), default="spaced",
                        help="instance text: 'spaced' (', ' and ': ', MaskBench's; default) or 'compact'")
    parser.add_argument("--remotes", type=Path, default=None, metavar="DIR",
                        help="the suite's remotes/ folder, given to corral as its registry "
                        "(default: remotes/ next to the suite's tests/ folder)")
    parser.add_argument("--format-assertion", action="store_true",
                        help="corral enforces 'format' (default: an annotation, as the suite's main files expect)")
    parser.add_argument("--property-order", choices=("any", "schema", "required_first"), default="any",
                        help="corral's property_order (default 'any': every member order, exactly, as validators "
                        "judge; 'schema' is corral's generation default and rejects valid texts in other orders)")
    parser.add_argument("--max-combinations", type=int, default=1024, metavar="N",
                        help="corral's max_combinations (default 1024 here, 256 in corral: the suite's schemas are "
                        "small, and one group needs about 600 leaves)")
    parser.set_defaults(run=main)


def main(args: argparse.Namespace) -> int:
    """Run the Test Suite with parsed ``args``; returns the process exit status."""
    import fnmatch

    config, engines, skipped, pool = start_run(args)
    suite = args.suite or default_shared("json-schema-test-suite", "tests", "draft2020-12")
    files = [p for p in list_keyword_files(suite) if not args.only or fnmatch.fnmatch(p.name, args.only)]
    if not files:
        outputs.log("no keyword files selected")
        return 1
    out = args.out or Path("runs") / f"testsuite-{datetime.now():%Y%m%d-%H%M%S}"
    meta = run_meta(args, config, pool) | {"suite": str(suite), "skipped": skipped}
    outputs.log(f"testsuite: {len(files)} keyword files x {len(engines)} engines, {pool.workers} workers"
                + ("" if pool.where == "local" else f" on a {pool.where}") + f" -> {out}")
    remotes = args.remotes or suite.resolve().parent.parent / "remotes"
    corral_options: dict = {"format_assertion": bool(args.format_assertion), "property_order": args.property_order,
                            "max_combinations": args.max_combinations}
    if remotes.is_dir():
        corral_options["remotes"] = str(remotes)
    else:
        outputs.log(f"no remotes folder at {remotes}: remote $refs stay unresolved")
    run_testsuite(files, engines, out, config=config, workers=pool.workers, timeout_s=args.timeout,
                  separators=args.separators, progress=not args.no_progress, meta=meta,
                  corral_options=corral_options, executor=pool.run)
    return outputs.show_run(out, ("results.jsonl", "summary.json", "summary.md"))
