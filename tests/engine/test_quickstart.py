"""``python -m engine.quickstart``: trains only when the model is missing, then prints a value
that validates (here with the random tiny model: the constraint does the work)."""

from __future__ import annotations

import json

import pytest

from engine import quickstart


def test_generates_a_valid_value_with_an_existing_model(tiny_model_dir, capsys):
    assert quickstart.main(["--model", str(tiny_model_dir), "--max-tokens", "64"]) == 0
    out = capsys.readouterr()
    value = json.loads(out.out.strip().splitlines()[-1])
    assert {"name", "age", "role"} <= set(value) and value["role"] in ("admin", "user", "guest")
    assert "valid=True" in out.err


def test_own_schema_file(tiny_model_dir, tmp_path, capsys):
    schema = tmp_path / "s.json"
    schema.write_text(json.dumps({"type": "array", "items": {"type": "boolean"}, "minItems": 2}))
    assert quickstart.main(["--model", str(tiny_model_dir), "--schema", str(schema), "--max-tokens", "40"]) == 0
    assert len(json.loads(capsys.readouterr().out.strip().splitlines()[-1])) >= 2


def test_trains_only_when_the_model_is_missing(tmp_path, monkeypatch, gpt2_vocab_path, maskbench_dir):
    from engine import tiny

    calls = []
    monkeypatch.setattr(tiny, "main", lambda argv: calls.append(list(argv)) or 0)
    monkeypatch.setenv("CORRAL_SHARED_DIR", str(gpt2_vocab_path.parent.parent))
    quickstart.ensure_model(tmp_path / "m", minutes=0.5, log=lambda _: None)
    assert calls and calls[0][calls[0].index("--out") + 1] == str(tmp_path / "m")
    assert calls[0][calls[0].index("--minutes") + 1] == "0.5"
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text("{}")
    quickstart.ensure_model(tmp_path / "m", minutes=0.5)
    assert len(calls) == 1  # a saved model is used as it is


def test_missing_shared_data_is_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.setenv("CORRAL_SHARED_DIR", str(tmp_path / "nowhere"))
    with pytest.raises(SystemExit, match="CORRAL_SHARED_DIR"):
        quickstart.ensure_model(tmp_path / "m", minutes=1, log=lambda _: None)
