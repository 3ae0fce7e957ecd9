"""The end-to-end runner: per-schema records with a small random model, validation verdicts,
the summary's coverage / compliance / truncation / throughput arithmetic, the worker run with
its outputs and time limit, and the command line.

The model is a random two-layer GPT-2 over the real GPT-2 vocabulary (hidden size 32, built on
the fly like the engine tests' ``tiny_gpt2``): its outputs are noise, so every valid output is
the constraint's doing. Tests that need ``../shared`` skip without it.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from jsonschemabench import e2e, outputs
from jsonschemabench.__main__ import build_parser
from shared_data import vocab_file

SCHEMAS = {
    "Synthetic_easy---person.json": {
        "type": "object",
        "properties": {"name": {"type": "string", "maxLength": 8}, "age": {"type": "integer", "minimum": 0}},
        "required": ["name", "age"],
    },
    "Synthetic_easy---list.json": {"type": "array", "items": {"enum": ["a", "b", 3]}, "minItems": 2},
    "Synthetic_hard---nested.json": {
        "type": "object",
        "properties": {"a": {"type": "object", "properties": {"b": {"type": "array", "items": {"type": "number"}}},
                             "required": ["b"]}},
        "required": ["a"],
    },
    "Synthetic_hard---refused.json": {"type": "string", "pattern": "(?<=a)b"},
}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    from grammars import TokenVocabulary

    vocab = TokenVocabulary.from_pretrained(vocab_file("gpt-2"))
    torch.manual_seed(0)
    config = GPT2Config(vocab_size=vocab.logits_width, n_embd=32, n_layer=2, n_head=2, n_positions=512,
                        bos_token_id=50256, eos_token_id=50256)
    model = GPT2LMHeadModel(config).eval()
    model.generation_config.eos_token_id = 50256
    folder = tmp_path_factory.mktemp("tiny-e2e")
    model.save_pretrained(folder)
    vocab.hf_tokenizer.save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("maskbench")
    for name, schema in SCHEMAS.items():
        (folder / name).write_text(json.dumps({"schema": schema, "tests": []}), encoding="utf-8")
    return folder


@pytest.fixture(scope="module")
def setup(model_dir):
    setup = e2e.load_setup(e2e.E2EConfig(model=str(model_dir), max_tokens=40, temperature=1.0, seed=3))
    engine = e2e.E2EEngine(setup)
    return engine, setup


def run(setup, data_dir, name):
    engine, state = setup
    return e2e.run_schema(engine, state, {"path": str(data_dir / name)}, lambda _: None)


@pytest.mark.parametrize("name", [n for n in SCHEMAS if "refused" not in n])
def test_outputs_of_compiled_schemas_validate(setup, data_dir, name):
    record = run(setup, data_dir, name)
    assert record["outcome"] == "ok"
    assert record["validity"] == "valid", record["text"]
    assert record["finish_reason"] == "stop" and not record["truncated"] and record["closable"]
    constrained = record["constrained"]
    assert constrained["tokens"] >= 2 and constrained["ttft_s"] > 0 and constrained["tpot_s"] > 0
    assert 0 < constrained["forward_s"] <= constrained["decode_s"]
    assert record["unconstrained"]["tokens"] == constrained["tokens"]  # same length, EOS banned
    assert record["compile_s"] > 0 and record["min_close_tokens"] <= 40


def test_refused_schema_is_a_compile_error(setup, data_dir):
    record = run(setup, data_dir, "Synthetic_hard---refused.json")
    assert record["outcome"] == "compile_error" and "pattern" in record["error"]
    assert record["keyword"] == "pattern"


def test_a_budget_too_small_to_close_is_not_a_truncation(model_dir, data_dir):
    state = e2e.load_setup(e2e.E2EConfig(model=str(model_dir), max_tokens=4, temperature=1.0))
    record = e2e.run_schema(None, state, {"path": str(data_dir / "Synthetic_hard---nested.json")}, lambda _: None)
    assert record["min_close_tokens"] > 4 and not record["closable"]
    assert record["finish_reason"] == "length" and not record["truncated"]


def test_prompt_is_left_truncated_to_the_context(setup):
    _, state = setup
    ids = e2e.prompt_ids(state, {"description": "x " * 2000})
    assert len(ids) == state.context - state.config.max_tokens
    assert state.vocab.decode(ids).endswith(b"\nJSON: ")


def test_validate_verdicts():
    schema = {"type": "object", "properties": {"d": {"type": "string", "format": "date"}}, "required": ["d"]}
    assert e2e.validate('{"d": "2024-02-29"}', schema) == ("valid", None)
    assert e2e.validate('{"d": "2023-02-29"}', schema)[0] == "invalid"  # the format checker is on
    assert e2e.validate('{"d": ', schema)[0] == "unparsable"
    assert e2e.validate("1", {"type": "string", "pattern": "(?<=a)b["})[0] == "unverifiable"


def _row(file, outcome="ok", validity="valid", finish="stop", closable=True, tokens=10, c_time=1.0, u_time=0.9):
    row = {"file": file, "split": file.split("---")[0], "outcome": outcome, "compile_s": 0.01}
    if outcome == "compile_error":
        return row | {"error": "UnsupportedSchemaError: no"}
    if outcome == "ok":
        row |= {"validity": validity, "finish_reason": finish, "closable": closable,
                "truncated": finish == "length" and closable, "forced_tokens": 1, "budget_steered": 0,
                "constrained": {"tokens": tokens, "decode_s": c_time, "forward_s": 0.8 * c_time, "ttft_s": 0.1,
                                "tpot_s": (c_time - 0.1) / (tokens - 1), "steps": tokens},
                "unconstrained": {"tokens": tokens, "decode_s": u_time, "forward_s": 0.8 * u_time, "ttft_s": 0.1,
                                  "tpot_s": (u_time - 0.1) / (tokens - 1), "steps": tokens}}
    return row


def test_summary_arithmetic():
    rows = [
        _row("A---1"), _row("A---2"), _row("B---3", validity="invalid", finish="length", closable=True),
        _row("B---4", validity="unparsable", finish="length", closable=False),
        _row("B---5", outcome="compile_error"), _row("C---6", outcome="timeout"),
    ]
    s = e2e.summarize(rows, e2e.E2EConfig(model="m"))
    assert s["schemas"] == 6 and s["compiled"] == 5  # the timeout came after compiling
    assert s["valid"] == 2 and s["compliance"] == pytest.approx(2 / 5)
    assert s["empirical_coverage"] == pytest.approx(2 / 6) and s["declared_coverage"] == pytest.approx(5 / 6)
    assert s["truncated"] == 1 and s["finished_by_length"] == 2 and s["not_closable"] == 1
    assert s["throughput"]["ratio"] == pytest.approx(0.9)  # equal tokens: time_u / time_c
    assert s["splits"]["B"] == {"schemas": 3, "compiled": 2, "valid": 0}
    table = e2e.render_markdown(s)
    assert "**0.900**" in table and "| B | 3 | 2 | 0 |" in table


def test_worker_run_writes_outputs_and_enforces_the_time_limit(model_dir, data_dir, tmp_path, matplotlib_present,
                                                               monkeypatch, capsys):
    files = sorted(data_dir.glob("*.json"))
    config = e2e.E2EConfig(model=str(model_dir), max_tokens=24, temperature=1.0)
    summary = e2e.run_e2e(files, config, tmp_path / "run", progress=False, timeout_s=120)
    rows = [json.loads(line) for line in (tmp_path / "run" / "results.jsonl").read_text().splitlines()]
    assert [r["file"] for r in rows] == [f.name for f in files]
    assert summary["compiled"] == 3 and summary["outcomes"]["compile_error"] == 1
    assert summary["compliance"] == 1.0 and summary["truncated"] == 0
    assert (tmp_path / "run" / "summary.md").read_text().startswith("### End-to-end JSONSchemaBench")
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["schemas"] == 4
    assert (tmp_path / "run" / "e2e.png").read_bytes().startswith(b"\x89PNG")
    assert summary["meta"]["skipped_outputs"] == {}

    monkeypatch.setitem(sys.modules, "matplotlib", None)  # the second run, without matplotlib, says so
    timed = e2e.run_e2e(files[:1], config, tmp_path / "timed", progress=False, timeout_s=0.001)
    assert timed["outcomes"]["timeout"] == 1
    reason = outputs.not_installed("matplotlib")
    assert f"e2e: plot skipped: {reason}" in capsys.readouterr().err
    assert not (tmp_path / "timed" / "e2e.png").exists() and timed["meta"]["skipped_outputs"] == {"e2e.png": reason}
    assert f"- e2e.png: not written ({reason})" in (tmp_path / "timed" / "summary.md").read_text()


def test_command_line(tmp_path, data_dir, model_dir, capsys):
    args = build_parser().parse_args(["e2e", "--model", str(tmp_path / "none"), "--data", str(data_dir),
                                      "--sample", "2", "--split", "Synthetic_easy", "--max-tokens", "16"])
    assert args.run is e2e.main and args.sample == 2 and args.max_tokens == 16
    assert args.run(args) == 2  # no model there: a clear message, not a traceback
    only = build_parser().parse_args(["e2e", "--model", str(model_dir), "--data", str(data_dir), "--only",
                                      "*list.json,*refused.json", "--max-tokens", "16", "--no-unconstrained",
                                      "--no-progress", "--out", str(tmp_path / "only")])
    assert only.run(only) == 0
    summary = json.loads((tmp_path / "only" / "summary.json").read_text())
    assert summary["schemas"] == 2 and summary["compiled"] == 1 and summary["throughput"]["paired_schemas"] == 0
    assert "End-to-end JSONSchemaBench" in capsys.readouterr().out
