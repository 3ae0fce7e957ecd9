"""The ``corral`` command line, called through ``main(argv)`` (and once as a subprocess).

Exit codes: 0 ok, 1 rejected / incomplete, 2 usage or input errors naming the file or keyword.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest

from engine.cli import main


def run(capsys, *argv) -> tuple[int, str, str]:
    code = main([str(a) for a in argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


# --- compile ----------------------------------------------------------------------------------


def test_compile_reports_sizes(capsys, gpt2_vocab_path, json_gbnf_path):
    code, out, _ = run(capsys, "compile", "--tokenizer", gpt2_vocab_path, "--gbnf", json_gbnf_path, "--json")
    assert code == 0
    report = json.loads(out)
    assert report["terminals"] > 0 and report["first_mask_allowed"] > 0 and report["compile_s"] >= 0
    code, out, _ = run(capsys, "compile", "--tokenizer", gpt2_vocab_path, "--regex", "abc[0-9]")
    assert code == 0 and "first_mask_allowed" in out and "regular" in out


def test_compile_schema_file(capsys, tmp_path, gpt2_vocab_path):
    pytest.importorskip("grammars.frontends.json_schema")
    schema = tmp_path / "s.json"
    schema.write_text(json.dumps({"type": "object", "properties": {"a": {"type": "integer"}}}))
    code, out, _ = run(capsys, "compile", "--tokenizer", gpt2_vocab_path, "--schema", schema, "--json")
    assert code == 0 and json.loads(out)["constraint"] == "schema"


def test_unsupported_schema_keyword_is_a_usage_error(capsys, tmp_path, gpt2_vocab_path):
    pytest.importorskip("grammars.frontends.json_schema")
    schema = tmp_path / "s.json"
    schema.write_text(json.dumps({"type": "array", "items": {"type": "integer"}, "uniqueItems": True}))
    code, _, err = run(capsys, "compile", "--tokenizer", gpt2_vocab_path, "--schema", schema)
    assert code == 2 and "s.json" in err and "uniqueItems" in err


# --- check ------------------------------------------------------------------------------------


def test_check_accepts_rejects_and_reports_incomplete(capsys, gpt2_vocab_path, json_gbnf_path):
    code, out, _ = run(capsys, "check", "--tokenizer", gpt2_vocab_path, "--gbnf", json_gbnf_path,
                       "--text", '{"a": [1, 2]}')
    assert code == 0 and out.startswith("accepted")
    code, out, _ = run(capsys, "check", "--tokenizer", gpt2_vocab_path, "--regex", "[0-9]+-[a-z]+",
                       "--text", "123-ab7", "--json")
    verdict = json.loads(out)
    assert code == 1 and verdict["reason"] == "rejected" and verdict["byte_offset"] == 6
    code, out, _ = run(capsys, "check", "--tokenizer", gpt2_vocab_path, "--gbnf", json_gbnf_path,
                       "--text", '{"a": [1,')
    assert code == 1 and "incomplete" in out


def test_check_text_file(capsys, tmp_path, gpt2_vocab_path):
    text = tmp_path / "t.txt"
    text.write_text("hello")
    code, _, _ = run(capsys, "check", "--tokenizer", gpt2_vocab_path, "--regex", "h[a-z]+", "--text-file", text)
    assert code == 0


# --- errors -----------------------------------------------------------------------------------


def test_input_errors_exit_2_naming_the_problem(capsys, tmp_path, gpt2_vocab_path):
    code, _, err = run(capsys, "check", "--tokenizer", gpt2_vocab_path, "--gbnf", tmp_path / "missing.gbnf",
                       "--text", "x")
    assert code == 2 and "missing.gbnf" in err
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    code, _, err = run(capsys, "compile", "--tokenizer", gpt2_vocab_path, "--schema", bad)
    assert code == 2 and "bad.json" in err and "line 1" in err
    grammar = tmp_path / "g.gbnf"
    grammar.write_text("root ::= (")
    code, _, err = run(capsys, "compile", "--tokenizer", gpt2_vocab_path, "--gbnf", grammar)
    assert code == 2 and "g.gbnf" in err
    code, _, err = run(capsys, "compile", "--tokenizer", tmp_path / "nope.gguf", "--regex", "a")
    assert code == 2 and "nope.gguf" in err
    code, _, err = run(capsys, "compile", "--tokenizer", gpt2_vocab_path, "--regex", "a", "--whitespace", "compact")
    assert code == 2 and "--schema" in err


def test_argparse_usage_errors_exit_2(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["compile", "--regex", "a"])  # --tokenizer missing
    assert exc.value.code == 2
    with pytest.raises(SystemExit) as exc:
        main(["generate", "--help"])
    assert exc.value.code == 0
    assert "--max-tokens" in capsys.readouterr().out


# --- generate ---------------------------------------------------------------------------------


def test_generate_with_a_model_folder(capsys, tiny_model_dir):
    code, out, err = run(capsys, "generate", "--model", tiny_model_dir, "--regex", "[a-z]{2,6}@x\\.org",
                         "--prompt", "Email: ", "--seed", "3", "--max-tokens", "20")
    assert code == 0, err
    assert re.fullmatch(r"[a-z]{2,6}@x\.org", out.strip("\n"))
    code, out, _ = run(capsys, "generate", "--model", tiny_model_dir, "--regex", "[0-9]{3}", "--prompt", "n",
                       "--seed", "3", "--json")
    result = json.loads(out)
    assert code == 0 and re.fullmatch("[0-9]{3}", result["text"]) and result["finish_reason"] == "stop"


def test_generate_incomplete_constraint_exits_1(capsys, tiny_model_dir):
    code, _, err = run(capsys, "generate", "--model", tiny_model_dir, "--regex", "[a-z]{30}", "--prompt", "x",
                       "--max-tokens", "2")
    assert code == 1 and "--max-tokens" in err


def test_generate_missing_model_folder(capsys, tmp_path):
    code, _, err = run(capsys, "generate", "--model", tmp_path / "nowhere", "--prompt", "x")
    assert code == 2 and "nowhere" in err


def test_module_entry_point_runs():
    proc = subprocess.run([sys.executable, "-m", "engine.cli", "--help"], capture_output=True, text=True,
                          timeout=120, check=False)
    assert proc.returncode == 0 and "generate" in proc.stdout and "bench" in proc.stdout
