"""The infilling benchmarks' pieces: the syntax-only C++ check and the check replay."""

from __future__ import annotations

import argparse

import pytest
from shared_data import SHARED_DIR, shared_path

from jsonschemabench.infill_bench import tree_sitter_ok
from jsonschemabench.infill_replay import run_replay, summarize_replay


def test_tree_sitter_judges_syntax_only():
    pytest.importorskip("tree_sitter_cpp")
    assert tree_sitter_ok("#include <vector>\nint f(int x) { return x + 1; }\n")
    assert tree_sitter_ok("int f(int x) { return y; }")  # an undeclared name is not a syntax error
    assert not tree_sitter_ok("int f(int x) { return x + ; }")
    assert not tree_sitter_ok("int f(int x) { return x;")


def test_the_replay_times_checks_that_agree_with_the_one_shot_answer():
    shared_path("humaneval-x", "humaneval_cpp.jsonl.gz")
    args = argparse.Namespace(shared=SHARED_DIR, tasks=2, regions=[1, 2], seed=0, baseline=1,
                              cpp_model=shared_path("vocab", "ggml-vocab-starcoder.gguf"))
    rows = run_replay(args, say=lambda line: None)
    assert {r["regions"] for r in rows} == {1, 2}
    for row in rows:
        assert row["disagree"] == 0, row["task"]  # true tokens completable; oracle == one-shot check
        assert len(row["true"]) == row["tokens"] > 0
        assert row["setup"] >= 0 and all(t > 0 for t in row["true"] + row["other"])
    assert any(r["baseline"] for r in rows) and any(r["other"] for r in rows)
    table = summarize_replay(rows)
    assert table.count("\n| 1 |") == 1 and table.count("\n| 2 |") == 1
