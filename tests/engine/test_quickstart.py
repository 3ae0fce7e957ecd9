"""``python -m engine.quickstart``: trains (quickly, without evaluating) only when the model is
missing, says what it does on stderr, and prints on stdout a value that validates — here with
random or barely trained models: the constraint does the work."""

from __future__ import annotations

import json

import jsonschema
import pytest

from engine import quickstart


@pytest.fixture
def shared_env(monkeypatch, gpt2_vocab_path, maskbench_dir):
    monkeypatch.setenv("CORRAL_SHARED_DIR", str(gpt2_vocab_path.parent.parent))


def test_generates_a_valid_value_with_an_existing_model(tiny_model_dir, monkeypatch, capsys):
    monkeypatch.setattr(quickstart, "start_warm_up", lambda schema: pytest.fail("warm-up without training"))
    assert quickstart.main(["--model", str(tiny_model_dir), "--max-tokens", "64"]) == 0
    out = capsys.readouterr()
    value = json.loads(out.out)  # stdout holds the value alone
    jsonschema.validate(value, quickstart.SCHEMA)
    assert "valid=True" in out.err
    assert_in_order(out.err, "loading the model", "compiling the schema", "generating")
    assert "training" not in out.err  # the model was there


def assert_in_order(text: str, *phrases: str) -> None:
    places = [text.find(p) for p in phrases]
    assert -1 not in places and places == sorted(places), (phrases, text)


def test_own_schema_file(tiny_model_dir, tmp_path, capsys):
    schema = tmp_path / "s.json"
    schema.write_text(json.dumps({"type": "array", "items": {"type": "boolean"}, "minItems": 2}))
    assert quickstart.main(["--model", str(tiny_model_dir), "--schema", str(schema), "--max-tokens", "40"]) == 0
    assert len(json.loads(capsys.readouterr().out)) >= 2


def test_trains_a_quick_model_then_prints_a_valid_value(tmp_path, shared_env, monkeypatch, capsys):
    """The fresh-checkout path end to end, with a training budget of about a second; the first
    compile runs in a second process beside the training and succeeds."""
    model = tmp_path / "m"
    started, real = [], quickstart.start_warm_up
    monkeypatch.setattr(quickstart, "start_warm_up", lambda schema: started.append(real(schema)) or started[-1])
    assert quickstart.main(["--model", str(model), "--minutes", "0.02", "--max-tokens", "64"]) == 0
    [warming] = started
    assert warming.wait(timeout=300) == 0
    out = capsys.readouterr()
    jsonschema.validate(json.loads(out.out), quickstart.SCHEMA)
    assert_in_order(out.err, "training the tiny model (about", "trained", "compiling the schema", "generating")
    metrics = json.loads((model / "metrics.json").read_text())
    assert metrics["train"]["steps"] >= 1 and "unconstrained" not in metrics  # no evaluation by default


def test_evaluate_runs_the_held_out_evaluation_on_the_saved_model(tiny_model_dir, shared_env, monkeypatch, capsys):
    from engine import tiny

    held = [tiny.Example({"type": "integer"}, 1, "held.json")]
    calls = []
    monkeypatch.setattr(tiny, "load_examples", lambda data: ([], held))
    monkeypatch.setattr(tiny, "held_out_report", lambda model, vocab, examples, **kw: calls.append((model, examples, kw)))
    assert quickstart.main(["--model", str(tiny_model_dir), "--max-tokens", "64", "--evaluate"]) == 0
    [(model, examples, kw)] = calls
    assert model.name_or_path == str(tiny_model_dir) and examples == held
    assert "root" in kw["json_gbnf"]  # constrained by the shared json.gbnf as well
    assert "evaluating on held-out schemas" in capsys.readouterr().err


def test_trains_only_when_the_model_is_missing(tmp_path, monkeypatch, shared_env):
    from engine import tiny

    calls = []
    monkeypatch.setattr(tiny, "main", lambda argv, log: calls.append(list(argv)) or 0)
    recipe = quickstart.QuickTraining(minutes=0.5)
    quickstart.ensure_model(tmp_path / "m", recipe, log=lambda _: None)
    [argv] = calls
    assert argv[argv.index("--out") + 1] == str(tmp_path / "m")
    assert argv[argv.index("--minutes") + 1] == "0.5"
    assert argv[argv.index("--eval-n") + 1] == "0"  # the held-out evaluation takes minutes: not here
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text("{}")
    quickstart.ensure_model(tmp_path / "m", recipe)
    assert len(calls) == 1  # a saved model is used as it is


def test_the_recipe_is_what_engine_tiny_accepts(tmp_path):
    from engine import tiny

    argv = quickstart.QuickTraining().argv(tmp_path / "v.gguf", tmp_path / "data", tmp_path / "out")
    args = tiny._parser().parse_args(argv)
    assert args.eval_n == 0 and args.minutes * 60 + quickstart.QuickTraining().overhead_s <= 90


def test_missing_shared_data_is_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.setenv("CORRAL_SHARED_DIR", str(tmp_path / "nowhere"))
    with pytest.raises(SystemExit, match="CORRAL_SHARED_DIR"):
        quickstart.ensure_model(tmp_path / "m", log=lambda _: None)
