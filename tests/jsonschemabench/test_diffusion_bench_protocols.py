"""The diffusion benchmark's settings (JSON-Mode-Eval's and a semi-autoregressive one), its tables,
and short runs of both tasks with a random tiny ModernBERT over the GPT-2 vocabulary: every
constrained JSON output validates, every constrained C++ output is in the C++ grammar together
with its declaration."""

from __future__ import annotations

import shutil

import pytest
from shared_data import shared_path, vocab_file

from jsonschemabench import diffusion_bench as bench
from jsonschemabench.__main__ import build_parser


def _args(*argv: str):
    return build_parser().parse_args(["diffusion", *argv])


def test_the_json_mode_eval_protocol_runs_one_block_and_semi_autoregressive():
    assert bench.settings(_args("--protocol", "json-mode-eval")) == [
        bench.Setting("one block", 128, 64, None), bench.Setting("semi-AR", 128, 64, 32)]
    assert bench.settings(_args("--protocol", "json-mode-eval", "--block-length", "16"))[1].block == 16
    assert bench.settings(_args("--canvas", "32", "--steps", "8", "--block", "8")) == [
        bench.Setting("custom", 32, 8, 8)]
    assert _args("--task", "cpp").tasks == 6


def _row(setting: str, mode: str, file: str, seconds: float, **fields) -> dict:
    return {"file": file, "setting": setting, "mode": mode, "regular": False, "parsed": True, "valid": True,
            "model_calls": 10, "tokens_per_step": 2.0, "positions_per_call": 3.0, "constraint_s": 0.0,
            "seconds": seconds, "witness_bytes": 0} | fields


def test_the_summary_has_a_table_per_setting_and_pairs_overheads_by_sample():
    args = _args("--protocol", "json-mode-eval")
    rows = [_row("one block", "none", "a", 1.0), _row("one block", "none", "b", 3.0),
            _row("one block", "infill", "a", 2.0, constraint_s=0.5, witness_bytes=4, reopened=3),
            _row("one block", "infill", "b", 5.0, valid=False, tokens_per_step=1.0),
            _row("semi-AR", "none", "a", 1.0), _row("semi-AR", "infill", "a", 1.5, overflow=2),
            {"file": "b", "setting": "semi-AR", "mode": "infill", "regular": False, "error": "ValueError: x"}]
    text = bench.summarize(rows, args)
    assert "**one block: canvas 128, 64 steps, one block**" in text
    assert "**semi-AR: canvas 128, 64 steps, blocks of 32**" in text
    assert "| infill | 2 | 100.0% | 50.0% | 10.0 | 1.50 | 3.00 | 25.0 | 3.50 | 1 | 3 | 0 | 0 |" in text
    assert "| infill | 2 | 100.0% | 100.0% | 10.0 | 2.00 | 3.00 | 0.0 | 1.50 | 0 | 0 | 1 | 1 |" in text
    assert "infill +1.50" in text and "infill +0.50" in text
    assert "| greedy |" not in text  # only the modes that ran


@pytest.fixture(scope="module")
def random_diffusion_lm():
    from engine import HFMaskedDiffusionLM
    from engine.tiny_diffusion import (
        DiffusionConfig,
        add_mask_token,
        build_diffusion_model,
    )
    from grammars import TokenVocabulary

    tokenizer = add_mask_token(TokenVocabulary.from_pretrained(vocab_file("gpt-2")).hf_tokenizer)
    model = build_diffusion_model(DiffusionConfig(vocab_size=len(tokenizer), mask_token_id=tokenizer.mask_token_id,
                                                  n_layer=1, hidden=16, n_head=2, max_positions=1024,
                                                  eos_token_id=50256)).eval()
    return HFMaskedDiffusionLM(model, tokenizer)


def test_a_json_run_validates_every_constrained_output(random_diffusion_lm):
    args = _args("--data", str(shared_path("jsonschemabench", "maskbench")), "--schemas", "1",
                 "--canvas", "16", "--steps", "4", "--block-length", "8")
    rows = bench.run(args, say=lambda _: None, lm=random_diffusion_lm)
    assert [r["mode"] for r in rows] == list(bench.MODES)
    for row in rows:
        assert "error" not in row, row
        assert row["setting"] == "custom" and row["model_calls"] >= 2  # two blocks, one call each at least
        if row["mode"] in ("auto", "infill"):
            assert row["parsed"] and row["valid"], row


@pytest.mark.skipif(shutil.which("g++") is None, reason="g++ not installed")
def test_a_cpp_run_writes_bodies_the_grammar_accepts_after_their_declaration(random_diffusion_lm):
    args = _args("--task", "cpp", "--humaneval", str(shared_path("humaneval-x", "humaneval_cpp.jsonl.gz")),
                 "--tasks", "1", "--canvas", "8", "--steps", "4")
    rows = bench.run(args, say=lambda _: None, lm=random_diffusion_lm)
    assert [r["mode"] for r in rows] == list(bench.CPP_MODES)
    infill = rows[-1]
    assert "error" not in infill and infill["parsed"], infill  # membership is what the constraint guarantees
    assert infill["file"] == "CPP/0"
