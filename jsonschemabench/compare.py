"""Two MaskBench runs of one engine compared file for file: outcomes, tokens, TTFM and the mask tail.

``python -m jsonschemabench compare OLD NEW [--engine corral]`` reads the ``results.jsonl`` of two
``maskbench`` output folders (the code before and after a change, run on the same files) and
prints what a change must answer for: every file whose outcome changed (worse first: a file that
passed and no longer does, or that now accepts an invalid instance), every file walked with a
different number of tokens (where a rejection moved), the per-file ratio of time to first mask
(new / old: median, p10, p90, which cancels the files' sizes), and TBM p99, p99.9 and the masks
over 2 ms over the files that pass in both runs (so a file that newly fails adds no masks).

Runs compared this way must see the same machine state: timings of two runs made at different
times differ by tens of percent on a shared machine. Run old and new at once, one worker each,
or interleave them. The exit status is 1 when an outcome got worse, so a script can stop on it.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .maskbench import read_rows
from .report import percentiles, tbm_samples

#: masks slower than this are counted (the tail the targets are about)
SLOW_MASK_US = 2000.0


@dataclass
class Comparison:
    """One engine's rows in two runs, compared (``changed``/``tokens``: (file, old, new))."""

    engine: str
    files: int  # in both runs
    only_old: int
    only_new: int
    changed: list[tuple[str, str, str]] = field(default_factory=list)
    tokens: list[tuple[str, int, int]] = field(default_factory=list)
    ttfm_ratio: dict[str, float] | None = None  # median, p10, p90 of new / old per file
    tbm: dict[str, dict[str, float]] = field(default_factory=dict)  # "old"/"new" -> p99, p99.9, over_2ms

    @property
    def worse(self) -> list[tuple[str, str, str]]:
        """The changes that are regressions: a pass lost, or an invalid instance newly accepted."""
        return [c for c in self.changed
                if (c[1] == "pass") or (c[2] == "invalidation_error" and c[1] != "invalidation_error")]


def compare_runs(old: dict[tuple[str, str], dict], new: dict[tuple[str, str], dict], engine: str) -> Comparison:
    """Compare ``engine``'s rows of two runs (``read_rows`` of each ``results.jsonl``)."""
    a = {file: row for (file, eng), row in old.items() if eng == engine}
    b = {file: row for (file, eng), row in new.items() if eng == engine}
    both = sorted(a.keys() & b.keys())
    out = Comparison(engine, len(both), len(a.keys() - b.keys()), len(b.keys() - a.keys()))
    for file in both:
        x, y = a[file], b[file]
        if x.get("outcome") != y.get("outcome"):
            out.changed.append((file, str(x.get("outcome")), str(y.get("outcome"))))
        elif x.get("tokens") != y.get("tokens"):
            out.tokens.append((file, int(x.get("tokens") or 0), int(y.get("tokens") or 0)))
    worse = set(out.worse)  # read before sorting: a list being sorted looks empty
    out.changed.sort(key=lambda c: (c not in worse, c[0]))
    ratios = np.array([b[f]["ttfm_us"] / a[f]["ttfm_us"] for f in both
                       if a[f].get("ttfm_us") and b[f].get("ttfm_us")], dtype=np.float64)
    if ratios.size:
        out.ttfm_ratio = {name: float(np.percentile(ratios, q)) for name, q in (("median", 50), ("p10", 10),
                                                                                  ("p90", 90))}
    passing = [f for f in both if a[f].get("outcome") == "pass" and b[f].get("outcome") == "pass"]
    for name, rows in (("old", a), ("new", b)):
        masks = tbm_samples(rows[f] for f in passing)
        if masks.size:
            tail = percentiles(masks)
            out.tbm[name] = {"p99": tail["p99"], "p99.9": tail["p99.9"],
                             "over_2ms": float((masks > SLOW_MASK_US).sum())}
    return out


def comparison_markdown(c: Comparison, old_label: str = "old", new_label: str = "new") -> str:
    """The comparison as the Markdown ``compare`` prints."""
    lines = [f"### {c.engine}: {new_label} against {old_label}", "",
             f"{c.files} files in both runs ({c.only_old} only in {old_label}, {c.only_new} only in {new_label}).", ""]
    worse = c.worse
    lines.append(f"- outcomes changed: {len(c.changed)} ({len(worse)} worse)")
    lines += [f"  - {file}: {a} -> {b}{' (worse)' if (file, a, b) in worse else ''}" for file, a, b in c.changed]
    lines.append(f"- token counts changed (same outcome): {len(c.tokens)}")
    lines += [f"  - {file}: {a} -> {b}" for file, a, b in c.tokens]
    if c.ttfm_ratio:
        r = c.ttfm_ratio
        lines.append(f"- TTFM per file, {new_label} / {old_label}: median {r['median']:.3f}, "
                     f"p10 {r['p10']:.3f}, p90 {r['p90']:.3f}")
    if c.tbm:
        lines += ["", f"| masks of files passing in both | {old_label} | {new_label} |", "|--|--:|--:|"]
        for key, title in (("p99", "TBM p99 (µs)"), ("p99.9", "TBM p99.9 (µs)"), ("over_2ms", "masks over 2 ms")):
            cells = [f"{c.tbm[side][key]:,.0f}" if side in c.tbm else "-" for side in ("old", "new")]
            lines.append(f"| {title} | {cells[0]} | {cells[1]} |")
    return "\n".join(lines) + "\n"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Register the ``compare`` subcommand's options on ``parser``."""
    parser.add_argument("old", type=Path, help="output folder of the run before the change")
    parser.add_argument("new", type=Path, help="output folder of the run after it")
    parser.add_argument("--engine", default="corral", help="the engine whose rows to compare (default corral)")
    parser.set_defaults(run=main)


def main(args: argparse.Namespace) -> int:
    """Print the comparison; exit status 1 when an outcome got worse, 2 when a run has no rows."""
    runs = []
    for folder in (args.old, args.new):
        rows = read_rows(folder / "results.jsonl")
        if not any(engine == args.engine for _, engine in rows):
            print(f"{folder}: no {args.engine} rows in results.jsonl")
            return 2
        runs.append(rows)
    comparison = compare_runs(runs[0], runs[1], args.engine)
    print(comparison_markdown(comparison, str(args.old), str(args.new)), end="")
    return 1 if comparison.worse else 0
