"""Summaries, tables and plots for the MaskBench and Test Suite runners.

Percentiles follow MaskBench's ``maskbench_results.py``: the sample sorted ascending, ``pN`` is
the element at index ``min(n - 1, int(n * N / 100))`` (no interpolation), ``max`` the last one
and ``avg`` the mean. Plots are written as PNG through ``outputs.write_plot`` (matplotlib, the
``bench`` extra; without it the run says so and records the plot as not written).
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Iterable, Mapping, Sequence

import numpy as np

from . import outputs

__all__ = [
    "PERCENTILES",
    "PERCENTILE_KEYS",
    "percentiles",
    "tbm_samples",
    "summarize_maskbench",
    "maskbench_markdown",
    "plot_maskbench",
    "style_survival_axis",
    "skip_notes",
    "cpu_name",
    "summarize_testsuite",
    "testsuite_markdown",
    "format_us",
]

PERCENTILES = (25, 50, 75, 90, 95, 99, 99.9)
PERCENTILE_KEYS = ("avg",) + tuple(f"p{p:g}" for p in PERCENTILES) + ("max",)
MASKBENCH_OUTCOMES = ("pass", "compile_error", "validation_error", "invalidation_error", "timeout", "crash")


def percentiles(values: Iterable[float]) -> dict[str, float | None]:
    """``avg``, ``p25`` … ``p99.9`` and ``max`` of ``values`` (all ``None`` when empty)."""
    data = np.sort(np.asarray(values, dtype=np.float64) if isinstance(values, np.ndarray)
                   else np.fromiter(values, dtype=np.float64))
    n = data.size
    if n == 0:
        return {key: None for key in PERCENTILE_KEYS}
    out: dict[str, float | None] = {"avg": float(data.mean())}
    for p in PERCENTILES:
        out[f"p{p:g}"] = float(data[min(n - 1, int(n * p / 100))])
    out["max"] = float(data[-1])
    return out


def _ttfm_samples(rows: Iterable[Mapping], timeout_s: float) -> list[float]:
    """TTFM of every compiled schema, plus timeouts during compilation counted at the limit."""
    out = []
    for row in rows:
        ttfm = row.get("ttfm_us")
        if ttfm is not None:
            out.append(float(ttfm))
        elif row.get("outcome") == "timeout":
            out.append(timeout_s * 1e6)
    return out


def tbm_samples(rows: Iterable[Mapping]) -> np.ndarray:
    """Every mask time (µs) of ``rows``, one array."""
    parts = [np.asarray(row["tbm_us"], dtype=np.float64) for row in rows if row.get("tbm_us") is not None]
    return np.concatenate(parts) if parts else np.zeros(0)


def summarize_maskbench(records: Sequence[Mapping], engines: Sequence[str], engine_info: Mapping[str, Mapping],
                        *, timeout_s: float) -> dict:
    """Per-engine counts, percentiles, version and options from the rows of results.jsonl.

    Returns ``{"engines": {name: {...}}, "order": [...]}``; each engine has ``schemas``,
    ``passing``, ``compile_error``, ``validation_error``, ``invalidation_error``, ``timeout``,
    ``crash``, ``tests``, ``masks``, ``tbm_us`` and ``ttfm_us`` (percentile dicts), ``version``,
    ``options``, and the most frequent compile errors and keywords.
    """
    by_engine: dict[str, list[Mapping]] = {name: [] for name in engines}
    for row in records:
        if row["engine"] in by_engine:
            by_engine[row["engine"]].append(row)
    result: dict = {"order": list(engines), "engines": {}}
    for name in engines:
        rows = by_engine[name]
        counts = Counter(row["outcome"] for row in rows)
        tbm = tbm_samples(rows)
        info = engine_info.get(name, {})
        keywords = Counter(row["keyword"] for row in rows if row["outcome"] == "compile_error" and row.get("keyword"))
        errors = Counter(_error_head(row.get("error")) for row in rows if row["outcome"] == "compile_error")
        result["engines"][name] = {
            "version": info.get("version", "unknown"),
            "options": info.get("options", {}),
            "schemas": len(rows),
            "passing": counts["pass"],
            "compile_error": counts["compile_error"],
            "validation_error": counts["validation_error"],
            "invalidation_error": counts["invalidation_error"],
            "timeout": counts["timeout"],
            "crash": counts["crash"],
            "tests": sum(int(row.get("tests") or 0) for row in rows),
            "valid_instances_rejected": sum(int(row.get("valid_rejected") or 0) for row in rows),
            "invalid_instances_accepted": sum(int(row.get("invalid_accepted") or 0) for row in rows),
            "mask_advance_disagree": sum(int(row.get("mask_advance_disagree") or 0) for row in rows),
            "accept_disagree": sum(int(row.get("accept_disagree") or 0) for row in rows),
            "masks": int(tbm.size),
            "tbm_us": percentiles(tbm),
            "ttfm_us": percentiles(_ttfm_samples(rows, timeout_s)),
            "compile_error_keywords": dict(keywords.most_common(20)),
            "compile_errors_top": dict(errors.most_common(10)),
        }
    return result


def _error_head(error: str | None, limit: int = 90) -> str:
    if not error:
        return "(none)"
    return error.splitlines()[0][:limit]


def format_us(value: float | None) -> str:
    """A time in µs for a table: ``—`` when missing, one decimal under 100, else thousands-grouped."""
    if value is None:
        return "—"
    if value < 100:
        return f"{value:,.1f}"
    return f"{value:,.0f}"


def _md_escape(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def maskbench_markdown(summary: Mapping, title: str = "MaskBench") -> str:
    """The MaskBench README table: one column per engine, times in µs, then outcome counts."""
    order = [name for name in summary["order"] if name in summary["engines"]]
    engines = summary["engines"]
    header = "| metric | " + " | ".join(order) + " |"
    rule = "|:--|" + "--:|" * len(order)
    lines = [f"### {title}", ""]
    meta = summary.get("meta") or {}
    described = [f"{meta['files']} files" if "files" in meta else "",
                 f"timeout {meta['timeout_s']:g} s" if "timeout_s" in meta else "",
                 f"tokenizer `{Path(str(meta['tokenizer'])).name}`" if meta.get("tokenizer") else "",
                 meta.get("cpu", "")]
    described = [d for d in described if d]
    if described:
        lines += ["; ".join(described) + "; single-threaded engines; times in µs.", ""]
    lines += [header, rule]

    def row(label: str, cells: Iterable[str]) -> None:
        lines.append(f"| {label} | " + " | ".join(cells) + " |")

    row("version", (str(engines[n]["version"]) for n in order))
    for metric, label in (("tbm_us", "TBM"), ("ttfm_us", "TTFM")):
        for key in ("avg",) + tuple(f"p{p:g}" for p in PERCENTILES) + ("max",):
            row(f"{label} {key}", (format_us(engines[n][metric][key]) for n in order))
    row("masks", (f"{engines[n]['masks']:,}" for n in order))
    for key, label in (("schemas", "schemas"), ("passing", "passing"), ("compile_error", "compile error"),
                       ("crash", "crash"), ("timeout", "timeout"),
                       ("validation_error", "validation error (valid instance rejected)"),
                       ("invalidation_error", "invalidation error (invalid instance accepted)")):
        row(label, (f"{engines[n][key]:,}" for n in order))
    notes = []
    for name in order:
        options = engines[name].get("options") or {}
        if options.get("call"):
            notes.append(f"- {name} {engines[name]['version']}: `{_md_escape(str(options['call']))}`")
    notes += skip_notes(meta)
    if notes:
        lines += ["", *notes]
    return "\n".join(lines) + "\n"


def _survival(values: np.ndarray, points: int = 400) -> tuple[np.ndarray, np.ndarray]:
    """(thresholds, fraction of samples above each) on a log grid."""
    data = np.sort(values[values > 0])
    if data.size == 0:
        return np.array([]), np.array([])
    grid = np.logspace(np.log10(data[0]), np.log10(data[-1]), points)
    above = 1.0 - np.searchsorted(data, grid, side="right") / data.size
    keep = above > 0
    grid = np.concatenate(([data[0] * 0.999], grid[keep]))
    above = np.concatenate(([1.0], above[keep]))
    return grid, above


def plot_maskbench(records: Sequence[Mapping], engines: Sequence[str], path: Path, *,
                   timeout_s: float) -> dict[str, str]:
    """Write ``path``: per engine, the fraction of masks (TBM) and of schemas (TTFM) slower than t.

    Returns what ``outputs.write_plot`` returns: ``{}``, or the file and why it was not written.
    """
    def draw(plt):
        fig, axes = plt.subplots(1, 2, figsize=(13, 5))
        for name in engines:
            rows = [r for r in records if r["engine"] == name]
            tbm = tbm_samples(rows)
            ttfm = np.asarray(_ttfm_samples(rows, timeout_s), dtype=np.float64)
            for ax, values in ((axes[0], tbm), (axes[1], ttfm)):
                x, y = _survival(values)
                if x.size:
                    ax.step(x, y, where="post", label=f"{name} (n={values.size:,})")
        titles = ("Time between masks (TBM)", "Time to first mask (TTFM, compile + 1st mask)")
        for ax, title in zip(axes, titles):
            style_survival_axis(ax, title, "µs")
        return fig

    return outputs.write_plot(draw, path, "maskbench")


def style_survival_axis(ax, title: str, unit: str) -> None:
    """Log-log axes of a survival plot (fraction of samples slower than x), as every benchmark draws them."""
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel(unit)
    ax.set_ylabel("fraction slower than x")
    ax.set_title(title)
    ax.grid(True, which="both", alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=8)


def skip_notes(meta: Mapping) -> list[str]:
    """Markdown lines for the engines a run skipped and the outputs it did not write, with why."""
    engines = meta.get("skipped") or {}
    files = meta.get("skipped_outputs") or {}
    return ([f"- {name}: skipped ({_md_escape(reason)})" for name, reason in engines.items()]
            + [f"- {name}: not written ({_md_escape(reason)})" for name, reason in files.items()])


def summarize_testsuite(rows: Sequence[Mapping], engines: Sequence[str], engine_info: Mapping[str, Mapping]) -> dict:
    """Passed/total per keyword file and engine, from one row per (file, group, engine).

    Each row has ``file``, ``engine``, ``outcome`` (``ok``/``compile_error``/``timeout``/``crash``)
    and ``tests``: a list of ``{"valid", "passed"}``; a group whose compilation failed, timed out or
    crashed fails every one of its tests.
    """
    files = sorted({row["file"] for row in rows})
    per_file: dict[str, dict[str, dict[str, int]]] = {f: {} for f in files}
    totals = {name: {"passed": 0, "total": 0, "groups": 0, "compile_error_groups": 0, "timeout_groups": 0,
                     "crash_groups": 0, "valid_rejected": 0, "invalid_accepted": 0, "accept_disagree": 0}
              for name in engines}
    for row in rows:
        name = row["engine"]
        if name not in totals:
            continue
        tests = row.get("tests") or []
        total = int(row.get("n_tests", len(tests)))
        passed = sum(1 for t in tests if t.get("passed")) if row["outcome"] == "ok" else 0
        cell = per_file[row["file"]].setdefault(name, {"passed": 0, "total": 0})
        cell["passed"] += passed
        cell["total"] += total
        t = totals[name]
        t["passed"] += passed
        t["total"] += total
        t["groups"] += 1
        if row["outcome"] in ("compile_error", "timeout", "crash"):
            t[f"{row['outcome']}_groups"] += 1
        if row["outcome"] == "ok":
            t["valid_rejected"] += sum(1 for x in tests if x.get("valid") and not x.get("passed"))
            t["invalid_accepted"] += sum(1 for x in tests if not x.get("valid") and not x.get("passed"))
            t["accept_disagree"] += sum(1 for x in tests if x.get("accept_disagree"))
    return {
        "order": list(engines),
        "files": per_file,
        "totals": totals,
        "engines": {name: {"version": engine_info.get(name, {}).get("version", "unknown"),
                           "options": engine_info.get(name, {}).get("options", {})} for name in engines},
    }


def testsuite_markdown(summary: Mapping, title: str = "JSON Schema Test Suite") -> str:
    """One row per keyword file, one column per engine (passed/total), and a total row."""
    order = list(summary["order"])
    lines = [f"### {title}", ""]
    meta = summary.get("meta") or {}
    if meta.get("suite"):
        lines += [f"Suite `{meta['suite']}`; instances as `{meta.get('serialization', 'json.dumps')}`; "
                  f"an instance passes when a valid one is accepted to the end "
                  f"(EOS allowed) or an invalid one is rejected; a compile error fails the group's tests.", ""]
    lines += ["| keyword file | " + " | ".join(order) + " |", "|:--|" + "--:|" * len(order)]
    versions = " | ".join(str(summary["engines"].get(n, {}).get("version", "")) for n in order)
    lines.append(f"| *version* | {versions} |")
    for file_name, cells in summary["files"].items():
        shown = []
        for name in order:
            cell = cells.get(name)
            shown.append(f"{cell['passed']}/{cell['total']}" if cell else "—")
        lines.append(f"| {file_name} | " + " | ".join(shown) + " |")
    totals = summary["totals"]
    lines.append("| **total** | " + " | ".join(
        f"**{totals[n]['passed']}/{totals[n]['total']}**" for n in order) + " |")
    detail = []
    for name in order:
        t = totals[name]
        detail.append(f"- {name}: {t['groups']} groups; compile errors {t['compile_error_groups']}, "
                      f"timeouts {t['timeout_groups']}, crashes {t['crash_groups']}; in compiled groups "
                      f"{t['valid_rejected']} valid instances rejected, {t['invalid_accepted']} invalid accepted; "
                      f"accepting flag and EOS-in-mask disagree on {t['accept_disagree']}")
    detail += skip_notes(meta)
    return "\n".join(lines + [""] + detail) + "\n"


def cpu_name() -> str:
    """The CPU model, recorded next to every timing."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    import platform

    return platform.processor() or platform.machine()
