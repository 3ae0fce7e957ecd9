"""Wide objects: compile time and masks along one object with many required members, engines side by side.

``python -m jsonschemabench wide-objects [--members 16,64,256,587] [--engines corral,llguidance]
[--tokenizer PATH] [--json PATH]``

MaskBench's widest object (a Kubernetes schema's 587 required members) has no test instance
that reaches past its first mask, so its figures say nothing of the masks inside such an
object. This benchmark builds the object itself: ``N`` required members ``field_0 ..
field_{N-1}`` whose values cycle through an integer, a string of at most 32 characters, a
boolean and a three-value enum, compiled as MaskBench compiles (corral with flexible
whitespace and ``property_order="any"``; the peers as they are), then walks two instances token
by token, timing every mask as MaskBench does (``maskbench.walk_instance``):

- **properties order**: the members in the order ``properties`` lists them;
- **required order**: in the order of the ``required`` keyword, which lists them in reverse.

corral tracks subsets of the members seen for up to ``JsonSchemaOptions.any_order_limit`` of
them, then subsets of the required ones seen (up to ``objects.MAX_REPEATING_REQUIRED``), and
past that accepts the required members in either of these two orders (a documented narrowing):
both instances are valid JSON for the schema, and each engine's verdict on them is reported.

Prints one row per (members, engine, instance): compile + first mask (ms), masks walked, time
between masks p50/p99/max (µs), the verdict (``accepted``, or where the walk stopped). Progress
goes to stderr; ``--json PATH`` writes the rows.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from . import outputs
from .maskbench import (
    available_engines,
    default_shared,
    parse_engines,
    serialize_instance,
    walk_instance,
)
from .peers import (
    EngineRefused,
    EngineUnavailable,
    compile_schema,
    load_bench_tokenizer,
    load_engine,
    warm_up,
)
from .report import percentiles
from .timing import gc_paused

__all__ = ["add_arguments", "format_table", "main", "measure", "wide_instance", "wide_object"]

#: corral's options, as MaskBench passes them (its valid instances list members in any order)
CORRAL_OPTIONS = {"property_order": "any"}
#: the value schemas the members cycle through, and a value of each
VALUES: tuple[tuple[dict, Callable[[int], Any]], ...] = (
    ({"type": "integer"}, lambda i: i * 37 - 500),
    ({"type": "string", "maxLength": 32}, lambda i: f"value {i}"),
    ({"type": "boolean"}, lambda i: i % 3 == 0),
    ({"enum": ["alpha", "beta", "gamma"]}, lambda i: ("alpha", "beta", "gamma")[i % 3]),
)
ORDERS = ("properties", "required")


def wide_object(members: int) -> dict:
    """The schema: ``members`` required members, ``required`` listing them in reverse."""
    names = [f"field_{i}" for i in range(members)]
    return {
        "type": "object",
        "properties": {name: VALUES[i % len(VALUES)][0] for i, name in enumerate(names)},
        "required": names[::-1],
        "additionalProperties": False,
    }


def wide_instance(members: int, order: str) -> dict:
    """A valid instance, members in ``order`` (``"properties"`` or ``"required"``)."""
    if order not in ORDERS:
        raise ValueError(f"order must be one of {ORDERS}, got {order!r}")
    indices = range(members) if order == "properties" else range(members - 1, -1, -1)
    return {f"field_{i}": VALUES[i % len(VALUES)][1](i) for i in indices}


def measure(engine: Any, tokenizer: Any, members: int) -> list[dict]:
    """Compile ``wide_object(members)`` once on ``engine`` and walk each order's instance: one row
    per order (``error`` set and no masks when the engine refuses the schema)."""
    schema = wide_object(members)
    rows = []
    engine.reset_caches()
    with gc_paused():
        start = time.perf_counter_ns()
        try:
            handle = compile_schema(engine, schema, CORRAL_OPTIONS)
            engine.fill_mask(engine.matcher(handle))
        except EngineRefused as exc:
            return [{"members": members, "engine": engine.name, "order": order, "error": str(exc)[:200]}
                    for order in ORDERS]
        ttfm_ms = (time.perf_counter_ns() - start) / 1e6
        for order in ORDERS:
            ids = list(tokenizer.encode(serialize_instance(wide_instance(members, order))))
            tbm_ns: list[int] = []
            verdict, position, _ = walk_instance(engine, handle, ids, tbm_ns)
            tbm = percentiles(ns / 1e3 for ns in tbm_ns)  # MaskBench's percentiles
            rows.append({
                "members": members, "engine": engine.name, "order": order, "error": None,
                "ttfm_ms": ttfm_ms, "tokens": len(ids), "masks": len(tbm_ns),
                "verdict": verdict if verdict == "accepted" else f"{verdict} at token {position}",
                "tbm_p50_us": tbm["p50"], "tbm_p99_us": tbm["p99"], "tbm_max_us": tbm["max"],
            })
    return rows


def format_table(rows: Sequence[dict]) -> str:
    """The rows as a Markdown table."""
    header = ("| members | engine | instance order | compile + first mask ms | masks | TBM p50 µs | TBM p99 µs "
              "| TBM max µs | verdict |")
    lines = [header, "|--|--|--|--|--|--|--|--|--|"]
    for r in rows:
        if r.get("error"):
            lines.append(f"| {r['members']} | {r['engine']} | {r['order']} | refused: {r['error']} | | | | | |")
            continue
        lines.append(f"| {r['members']} | {r['engine']} | {r['order']} | {r['ttfm_ms']:.1f} | {r['masks']} "
                     f"| {r['tbm_p50_us']:.1f} | {r['tbm_p99_us']:.0f} | {r['tbm_max_us']:.0f} | {r['verdict']} |")
    return "\n".join(lines)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--tokenizer", default=str(default_shared("vocab", "ggml-vocab-llama-bpe.gguf")),
                        help="a .gguf vocabulary or tokenizer folder (default: Llama 3's)")
    parser.add_argument("--members", default="16,64,256,587",
                        help="comma-separated member counts (default 16,64,256,587: 587 is MaskBench's widest object)")
    parser.add_argument("--engines", default="corral,llguidance", help="comma-separated engines, in column order")
    parser.add_argument("--json", type=Path, default=None, help="also write the rows to this file")
    parser.set_defaults(run=main)


def main(args: argparse.Namespace) -> int:
    try:
        counts = [int(part) for part in args.members.split(",") if part.strip()]
    except ValueError:
        raise SystemExit(f"wide-objects: --members must be comma-separated integers, got {args.members!r}") from None
    if not counts or min(counts) < 1:
        raise SystemExit("wide-objects: --members needs at least one count, each at least 1")
    tokenizer = load_bench_tokenizer(args.tokenizer)
    rows: list[dict] = []
    names, _ = available_engines(parse_engines(args.engines))  # says which are skipped and why
    for name in names:
        try:
            engine = load_engine(name, tokenizer)
        except EngineUnavailable as exc:
            outputs.log(f"wide-objects: {name} skipped ({exc})")
            continue
        warm_up(engine, "json_schema", {"type": "integer"})
        for members in counts:
            outputs.log(f"wide-objects: {name}, {members} members")
            rows.extend(measure(engine, tokenizer, members))
    print(format_table(rows))
    if args.json is not None:
        args.json.write_text(json.dumps(rows, indent=1))
    return 0
