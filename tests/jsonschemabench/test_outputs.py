"""Optional outputs: written when the ``bench`` extra's package imports, else said and recorded.

Every runner's plot and progress bar goes through ``jsonschemabench.outputs``; these tests run
both branches whatever is installed (see the conftest's ``matplotlib_present`` and
``matplotlib_missing``). The runners' own use of it is checked in their tests.
"""

from __future__ import annotations

import sys
import types

from jsonschemabench import outputs
from jsonschemabench.maskbench import _progress_bar

REASON = 'matplotlib is not installed (pip install -e ".[bench]")'


def draw_one_panel(plt):
    fig, ax = plt.subplots(1, 1)
    ax.set_title("one panel")
    return fig


def test_write_plot_writes_a_png_and_its_folder(tmp_path, matplotlib_present, capsys):
    path = tmp_path / "new" / "plot.png"
    assert outputs.write_plot(draw_one_panel, path, "runner") == {}
    assert path.read_bytes().startswith(b"\x89PNG\r\n\x1a\n")
    assert "skipped" not in capsys.readouterr().err


def test_write_plot_without_matplotlib_says_so_and_returns_the_reason(tmp_path, matplotlib_missing, capsys):
    path = tmp_path / "plot.png"
    assert outputs.write_plot(draw_one_panel, path, "runner") == {"plot.png": REASON}
    assert capsys.readouterr().err == f"runner: plot skipped: {REASON}\n"
    assert not path.exists()


def test_optional_module_is_silent_only_when_the_module_imports(monkeypatch, capsys):
    probe = types.ModuleType("bench_extra_probe")
    monkeypatch.setitem(sys.modules, "bench_extra_probe", probe)
    said = []
    assert outputs.optional_module("bench_extra_probe", "runner", "output", said.append) is probe
    monkeypatch.setitem(sys.modules, "bench_extra_probe", None)  # as when it is not installed
    assert outputs.optional_module("bench_extra_probe", "runner", "output", said.append) is None
    assert said == ['runner: output skipped: bench_extra_probe is not installed (pip install -e ".[bench]")']
    assert capsys.readouterr().err == ""  # ``say`` replaced the default stderr line


def test_progress_bar_without_tqdm_is_said(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "tqdm", None)
    assert _progress_bar(3, "testsuite") is None
    assert "testsuite: progress bar skipped: tqdm is not installed" in capsys.readouterr().err


def test_samplers_plot_both_ways(tmp_path, monkeypatch, matplotlib_present):
    from jsonschemabench.samplers_bench import plot

    quality = [{"task": "json", "method": "masked (exact GCD)", "n": n, "kl": 0.1 / n} for n in (10, 30)]
    assert plot(quality, tmp_path / "kl.png") == {}
    assert (tmp_path / "kl.png").read_bytes().startswith(b"\x89PNG")
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    assert plot(quality, tmp_path / "again.png") == {"again.png": REASON}
    assert not (tmp_path / "again.png").exists()
