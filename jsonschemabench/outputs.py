"""What a runner tells its user besides its results: progress lines and the optional outputs.

Plots (matplotlib) and the progress bar (tqdm) come from the ``bench`` extra, which a test-only
install lacks. A run does not fail for want of them, but it does not drop them silently either:
it says which output it skipped and why (``maskbench: plot skipped: matplotlib is not installed
(pip install -e ".[bench]")``), and a runner with a summary records the reason there.
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path
from types import ModuleType
from typing import Any, Callable, Iterable

__all__ = ["BENCH_INSTALL", "log", "not_installed", "optional_module", "pyplot", "write_plot", "show_run"]

BENCH_INSTALL = 'pip install -e ".[bench]"'

Log = Callable[[str], None]


def log(message: str) -> None:
    """A runner's progress line, on stderr: stdout carries only the results table."""
    print(message, file=sys.stderr, flush=True)


def not_installed(module: str) -> str:
    """Why an output that needs ``module`` is missing, with the command that installs it."""
    return f"{module} is not installed ({BENCH_INSTALL})"


def optional_module(module: str, runner: str, output: str, say: Log = log) -> ModuleType | None:
    """``module`` imported, or ``None`` after saying ``<runner>: <output> skipped: <why>``."""
    try:
        return importlib.import_module(module)
    except ImportError:
        say(f"{runner}: {output} skipped: {not_installed(module)}")
        return None


def pyplot(runner: str, say: Log = log) -> ModuleType | None:
    """``matplotlib.pyplot`` on the Agg backend (files only, no display), or ``None`` without matplotlib."""
    matplotlib = optional_module("matplotlib", runner, "plot", say)
    if matplotlib is None:
        return None
    matplotlib.use("Agg")
    return importlib.import_module("matplotlib.pyplot")


def write_plot(draw: Callable[[ModuleType], Any], path: Path, runner: str, say: Log = log) -> dict[str, str]:
    """Draw a figure with ``draw(pyplot)`` and write it to ``path`` as PNG (creating the folder).

    Returns ``{}``, or ``{file name: reason}`` when matplotlib is missing: the entry the runner
    adds to its summary's ``skipped_outputs``.
    """
    plt = pyplot(runner, say)
    if plt is None:
        return {path.name: not_installed("matplotlib")}
    fig = draw(plt)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return {}


def show_run(out: Path, outputs: Iterable[str], skipped: Iterable[str] = ()) -> int:
    """Print the run's ``summary.md`` and list the files it wrote (not the skipped ones); exit status 0."""
    print((out / "summary.md").read_text(encoding="utf-8"))
    left_out = set(skipped)
    log(f"wrote {out}/" + ", ".join(name for name in outputs if name not in left_out))
    return 0
