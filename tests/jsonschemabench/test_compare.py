"""``python -m jsonschemabench compare``: two maskbench runs compared file for file."""

from __future__ import annotations

import json

import pytest

from jsonschemabench.__main__ import build_parser
from jsonschemabench.compare import compare_runs, comparison_markdown
from jsonschemabench.maskbench import read_rows


def _row(file, outcome="pass", tokens=10, ttfm=1000.0, tbm=(10.0,), engine="corral"):
    return {"file": file, "engine": engine, "outcome": outcome, "tokens": tokens, "ttfm_us": ttfm, "tbm_us": list(tbm)}


def _write(folder, rows, cut_line=False):
    folder.mkdir()
    text = "".join(json.dumps(r) + "\n" for r in rows)
    if cut_line:
        text += '{"file": "x.json", "engine": "cor'  # what an interrupted run leaves
    (folder / "results.jsonl").write_text(text)
    return folder


@pytest.fixture
def runs(tmp_path):
    old = [_row("a.json", tbm=[100.0] * 99 + [3000.0]), _row("b.json", ttfm=2000.0), _row("c.json"),
           _row("d.json", outcome="validation_error"), _row("e.json", tokens=12), _row("f.json"),
           _row("a.json", engine="llguidance", outcome="compile_error")]
    new = [_row("a.json", ttfm=500.0, tbm=[100.0] * 100), _row("b.json", ttfm=2000.0),
           _row("c.json", outcome="validation_error", tbm=[9000.0] * 50), _row("d.json"),
           _row("e.json", tokens=14), _row("f.json", outcome="invalidation_error"), _row("g.json")]
    return _write(tmp_path / "old", old, cut_line=True), _write(tmp_path / "new", new)


def test_read_rows_keeps_complete_lines_last_per_key(tmp_path):
    folder = _write(tmp_path / "run", [_row("a.json", tokens=1), _row("a.json", tokens=2), _row("b.json")],
                    cut_line=True)
    rows = read_rows(folder / "results.jsonl")
    assert set(rows) == {("a.json", "corral"), ("b.json", "corral")}
    assert rows[("a.json", "corral")]["tokens"] == 2
    assert read_rows(tmp_path / "missing.jsonl") == {}


def test_outcomes_tokens_ttfm_and_the_tail_of_files_passing_in_both(runs):
    old, new = (read_rows(folder / "results.jsonl") for folder in runs)
    c = compare_runs(old, new, "corral")
    assert (c.files, c.only_old, c.only_new) == (6, 0, 1)
    # worse first: a pass lost (c), then a pass lost to an accepted invalid instance (f); d got better
    assert c.changed == [("c.json", "pass", "validation_error"), ("f.json", "pass", "invalidation_error"),
                         ("d.json", "validation_error", "pass")]
    assert c.worse == c.changed[:2]
    assert c.tokens == [("e.json", 12, 14)]
    assert c.ttfm_ratio["median"] == pytest.approx(1.0) and c.ttfm_ratio["p10"] < 1.0  # a.json: 0.5
    # masks of a, b and e only: c's 9 ms masks (it fails in new) do not count
    assert c.tbm["old"]["over_2ms"] == 1 and c.tbm["new"]["over_2ms"] == 0
    assert c.tbm["old"]["p99.9"] == 3000.0 and c.tbm["new"]["p99.9"] == 100.0
    text = comparison_markdown(c)
    assert "outcomes changed: 3 (2 worse)" in text and "c.json: pass -> validation_error (worse)" in text
    assert "d.json: validation_error -> pass\n" in text


def test_command_exit_status(runs, tmp_path, capsys):
    old, new = runs
    args = build_parser().parse_args(["compare", str(old), str(new)])
    assert args.run(args) == 1  # passes were lost
    assert "### corral" in capsys.readouterr().out
    same = build_parser().parse_args(["compare", str(old), str(old)])
    assert same.run(same) == 0
    other = build_parser().parse_args(["compare", str(old), str(new), "--engine", "xgrammar"])
    assert other.run(other) == 2  # no rows of that engine
