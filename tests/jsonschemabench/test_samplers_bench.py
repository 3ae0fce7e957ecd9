"""The samplers benchmark with a real (random, tiny) transformers model saved and reloaded from disk.

The trained model of ``python -m engine.tiny`` is build output; these tests build a two-layer
GPT-2 over the real GPT-2 vocabulary on the fly, save it with ``save_pretrained`` and load it
through the benchmark's own ``load_model``, so the ``--model`` path is exercised end to end.
"""

from __future__ import annotations

import pytest
import torch

from shared_data import shared_path, vocab_file


@pytest.fixture(scope="module")
def saved_model(tmp_path_factory):
    from engine.tiny import TinyConfig, build_model, load_tokenizer, save

    tokenizer, vocab = load_tokenizer(vocab_file("gpt-2"))
    eos = min(vocab.eos_token_ids)
    model = build_model(TinyConfig(vocab_size=vocab.logits_width, n_layer=2, hidden=32, n_head=2,
                                   bos_token_id=eos, eos_token_id=eos), seed=0)
    return save(model.eval(), tokenizer, tmp_path_factory.mktemp("tiny") / "model")


@pytest.fixture(scope="module")
def loaded(saved_model):
    from jsonschemabench.samplers_bench import load_model

    return load_model(saved_model)


def test_prompted_lm_memoises_and_conditions_on_the_prompt(loaded):
    from jsonschemabench.samplers_bench import PromptedLM

    vocab, lm = loaded
    prompt = vocab.encode("Schema: {}\nJSON: ")
    prompted = PromptedLM(lm, prompt)
    prefix = vocab.encode('{"a"')
    first = prompted(prefix)
    again = prompted(list(prefix))
    assert prompted.forward_calls == 1
    assert again is first
    direct = lm.next_logits([prompt + prefix])[0].float()
    torch.testing.assert_close(first, direct)
    unprompted = lm.next_logits([prefix])[0].float()
    assert not torch.allclose(first, unprompted)  # the prompt is really in the context


def test_run_cost_model_counts_checks_on_schema_and_json_workloads(loaded, monkeypatch):
    from jsonschemabench.samplers_bench import render_markdown, run_cost_model

    shared_path("jsonschemabench", "maskbench")  # skips without the shared data
    vocab, lm = loaded
    rows = run_cost_model(vocab, lm, schemas=1, max_tokens=6, log=lambda msg: None)
    kinds = [r["workload"].split(":", 1)[0] for r in rows]
    assert kinds == ["schema", "json.gbnf"]
    for r in rows:
        assert 1 <= r["tokens"] <= 6
        assert r["awrs_checks"] >= 1.0  # every drawn token is checked at least once
        assert 0.0 <= r["allowed_mass_mean"] <= 1.0
        assert r["model_ms"] > 0 and r["masked_ms"] > 0
    report = render_markdown([], rows, {"machine": "test", "when": "now", "model": lm.name})
    assert "| schema:" in report and "| json.gbnf:" in report
    assert "checks per token" in report


def test_model_tasks_have_small_enumerable_languages_with_a_real_vocabulary(loaded):
    """The sizes quoted in ``MODEL_TASKS``' comment, which keep exact enumeration affordable."""
    from grammars import Compiler
    from jsonschemabench.samplers_bench import MODEL_TASKS
    from samplers.enumerate import exact_target

    vocab, _ = loaded
    uniform = torch.zeros(vocab.logits_width)
    sizes = {}
    for task in MODEL_TASKS:
        if task.name == "sygus":
            continue  # 2,380 prefixes: the slowest, same machinery
        grammar = Compiler(vocab).compile_gbnf(task.gbnf)
        target, z = exact_target(lambda prefix: uniform, grammar.matcher(), vocab.logits_width,
                                 max_tokens=task.max_tokens)
        sizes[task.name] = len(target)
        assert 0.0 < z < 1.0
    assert sizes == {"json": 424, "json_array": 272}
