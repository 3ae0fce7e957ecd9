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
    """``main`` returns argparse's codes instead of exiting, so in-process callers get them."""
    code, _, err = run(capsys, "compile", "--regex", "a")  # --tokenizer missing
    assert code == 2 and "--tokenizer" in err
    code, out, _ = run(capsys, "generate", "--help")
    assert code == 0 and "--max-tokens" in out
    for argv in ([], ["frobnicate"], ["generate", "--model", "m", "--prompt", "x", "--max-tokens", "many"],
                 ["generate", "--model", "m", "--prompt", "x", "--temperature", "hot"],
                 ["generate", "--model", "m", "--prompt", "x", "--regex", "a", "--gbnf", "g.gbnf"]):
        code, _, err = run(capsys, *argv)
        assert code == 2 and "usage:" in err and "Traceback" not in err, argv


def one_error_line(err: str) -> str:
    """The single ``corral: error:`` line of a user error (and no traceback anywhere)."""
    assert "Traceback" not in err, err
    lines = [line for line in err.splitlines() if line.startswith("corral: error:")]
    assert len(lines) == 1, err
    return lines[0]


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


# --- user errors: exit 2 and one line, never a traceback ---------------------------------------


def test_generate_refuses_stop_with_a_schema_like_the_api(capsys, tmp_path):
    """``--stop`` with ``--schema`` used to exit 0 with truncated JSON: the CLI bypassed the API's
    check. It is refused before any model loads (the model folder here does not even exist)."""
    schema = tmp_path / "s.json"
    schema.write_text(json.dumps({"type": "object"}))
    code, out, err = run(capsys, "generate", "--model", tmp_path / "nowhere", "--schema", schema, "--prompt", "x",
                         "--stop", "}")
    assert code == 2 and not out
    line = one_error_line(err)
    assert "--stop" in line and "--schema" in line


@pytest.mark.parametrize(
    ("options", "words"),
    [
        (["--device", "banana"], ["unknown device", "banana"]),
        (["--device", "cuda:99"], ["cuda:99", "not available"]),
        (["--device", "meta"], ["meta", "not available"]),
        (["--dtype", "banana"], ["unknown dtype", "banana"]),
        (["--dtype", "int64"], ["int64", "not a floating"]),
        (["--temperature", "nan"], ["temperature", "finite"]),
        (["--temperature", "-1"], ["temperature"]),
        (["--top-p", "2"], ["top_p"]),
        (["--top-k", "-1"], ["top_k"]),
        (["--seed", str(2**70)], ["seed", "out of range"]),
        (["--max-tokens", "0"], ["--max-tokens"]),
        (["--sampler", "beam"], ["unknown sampler", "beam"]),
        (["--regex", "a", "--whitespace", "compact"], ["--whitespace", "--schema"]),
        (["--regex", "[a-"], ["regex [a-", "GrammarSyntaxError"]),
        (["--lark", "missing.lark"], ["missing.lark"]),
    ],
    ids=lambda x: " ".join(x) if isinstance(x, list) and x and x[0].startswith("--") else None,
)
def test_bad_generate_options_exit_2_before_loading_the_model(capsys, tmp_path, options, words):
    code, _, err = run(capsys, "generate", "--model", tmp_path / "nowhere", "--prompt", "x", *options)
    assert code == 2
    line = one_error_line(err)
    assert all(word in line for word in words), line
    assert "nowhere" not in line  # the options were refused first


def test_cuda_without_cuda_is_a_usage_error(capsys, tmp_path, monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    code, _, err = run(capsys, "generate", "--model", tmp_path / "nowhere", "--prompt", "x", "--device", "cuda")
    assert code == 2
    line = one_error_line(err)
    assert "'cuda' is not available" in line and "cpu" in line


def test_models_and_tokenizers_that_do_not_load_exit_2(capsys, tmp_path, tiny_model_dir):
    empty = tmp_path / "empty"
    empty.mkdir()
    garbage = tmp_path / "garbage.gguf"
    garbage.write_bytes(b"not a gguf file")
    not_json = tmp_path / "model.txt"
    not_json.write_text("hello")
    cases = [
        (["generate", "--model", empty, "--prompt", "x"], ["cannot load model", "empty"]),
        (["generate", "--model", not_json, "--prompt", "x"], ["cannot load model", "model.txt"]),
        (["generate", "--model", tiny_model_dir, "--tokenizer", garbage, "--prompt", "x"],
         ["cannot load tokenizer", "garbage.gguf"]),
        (["generate", "--model", tiny_model_dir, "--tokenizer", empty, "--prompt", "x"], ["cannot load tokenizer"]),
        (["generate", "--model", tiny_model_dir, "--tokenizer", tmp_path / "none", "--prompt", "x"],
         ["tokenizer not found"]),
        (["compile", "--tokenizer", garbage, "--regex", "a"], ["cannot load tokenizer", "garbage.gguf"]),
        (["compile", "--tokenizer", empty, "--regex", "a"], ["cannot load tokenizer", "empty"]),
        (["check", "--tokenizer", not_json, "--regex", "a", "--text", "a"], ["cannot load tokenizer"]),
        (["check", "--tokenizer", tiny_model_dir, "--regex", "a", "--text-file", tmp_path], ["cannot read text file"]),
        (["compile", "--tokenizer", tiny_model_dir, "--schema", tmp_path], ["cannot read schema file"]),
    ]
    for argv, words in cases:
        code, _, err = run(capsys, *argv)
        assert code == 2, argv
        line = one_error_line(err)
        assert all(word in line for word in words), (argv, line)


def test_generate_errors_found_after_loading_exit_2(capsys, tiny_model_dir):
    code, _, err = run(capsys, "generate", "--model", tiny_model_dir, "--prompt", "x", "--chat-template")
    assert code == 2 and "--chat-template" in one_error_line(err)
    code, _, err = run(capsys, "generate", "--model", tiny_model_dir, "--prompt", "x", "--sampler", "smc",
                       "--stop", "a")
    assert code == 2 and "--stop" in one_error_line(err)


def test_generate_schema_closes_within_the_budget(capsys, tmp_path, tiny_model_dir):
    pytest.importorskip("grammars.frontends.json_schema")
    schema = tmp_path / "s.json"
    schema.write_text(json.dumps({"type": "object", "properties": {"a": {"type": "string"}}, "required": ["a"]}))
    for sampler in ("masked", "asap"):
        code, out, err = run(capsys, "generate", "--model", tiny_model_dir, "--schema", schema, "--prompt", "x",
                             "--max-tokens", "12", "--seed", "0", "--sampler", sampler, "--json")
        assert code == 0, err
        result = json.loads(out)
        assert result["finish_reason"] == "stop" and "a" in json.loads(result["text"])
