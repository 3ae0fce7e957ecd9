"""``engine.tiny``: build, train a few steps, save and reload a tiny JSON model (seconds)."""

from __future__ import annotations

import json
import math

import pytest
import torch
from transformers import AutoModelForCausalLM

from engine import HFCausalLM
from engine.tiny import (
    TinyConfig,
    build_model,
    encode_examples,
    load_examples,
    main,
    save,
    train,
)


@pytest.fixture(scope="module")
def examples(maskbench_dir):
    train_set, held = load_examples(maskbench_dir, limit_files=60, held_out_fraction=0.2)
    return train_set, held


def test_examples_are_prompted_with_their_schema(examples):
    train_set, held = examples
    assert train_set and held
    assert not {e.source for e in train_set} & {e.source for e in held}  # split by schema file
    ex = train_set[0]
    assert ex.prompt.startswith("Schema: {") and ex.prompt.endswith("\nJSON: ")
    assert json.loads(ex.completion) == ex.instance


def test_encoding_matches_what_generate_feeds(examples, gpt2_vocab):
    encoded = encode_examples(examples[0][:5], gpt2_vocab, max_len=512)
    ids, prompt_len = encoded[0]
    assert ids[:prompt_len] == gpt2_vocab.encode(examples[0][0].prompt)  # GPT-2 adds no BOS
    assert ids[-1] in gpt2_vocab.eos_token_ids


@pytest.mark.parametrize("arch", ["gpt2", "llama"])
def test_train_save_reload_round_trip(tmp_path, examples, gpt2_vocab, arch):
    config = TinyConfig(vocab_size=gpt2_vocab.logits_width, arch=arch, n_layer=2, hidden=16, n_head=2,
                        max_positions=600, eos_token_id=50256, bos_token_id=50256)
    model = build_model(config, seed=0)
    assert model.get_input_embeddings().weight.shape[0] == gpt2_vocab.logits_width  # covers the logits width
    hf = model.config  # TinyConfig's sizes under each architecture's own names
    assert (hf.hidden_size, hf.num_hidden_layers, hf.num_attention_heads) == (16, 2, 2)
    assert hf.tie_word_embeddings and hf.eos_token_id == 50256
    encoded = encode_examples(examples[0][:16], gpt2_vocab, max_len=384)
    negatives = None if arch == "llama" else 2048  # exact full softmax / sampled softmax
    stats = train(model, encoded, max_steps=3, batch_tokens=1024, pad_token_id=50256, log=None,
                  sampled_negatives=negatives)
    assert stats.steps == 3 and stats.supervised_tokens > 0 and all(math.isfinite(x) for x in stats.losses)
    out = save(model, gpt2_vocab.hf_tokenizer, tmp_path / arch, {"note": "test"})
    reloaded = AutoModelForCausalLM.from_pretrained(out)
    prefix = [[11, 22, 33, 44]]
    a = HFCausalLM(model).next_logits(prefix)
    b = HFCausalLM(reloaded).next_logits(prefix)
    # equal up to float rounding: the reloaded weights sit at another memory alignment, which can
    # change the order a one-row matmul accumulates in
    assert torch.allclose(a, b, rtol=0, atol=1e-6)
    assert json.loads((out / "metrics.json").read_text())["note"] == "test"


def test_training_lowers_the_loss(examples, gpt2_vocab):
    model = build_model(TinyConfig(vocab_size=gpt2_vocab.logits_width, n_layer=1, hidden=16, n_head=2,
                                   max_positions=600), seed=0)
    encoded = encode_examples(examples[0][:4], gpt2_vocab, max_len=384)
    stats = train(model, encoded, max_steps=12, batch_tokens=4096, lr=1e-2, warmup_steps=1,
                  pad_token_id=50256, log=None)
    assert stats.losses[-1] < stats.losses[0]


def test_sampled_softmax_columns():
    from engine.tiny import _SampledSoftmax

    encoded = [([1, 2, 3, 7, 9], 3), ([4, 5, 9, 8], 2)]  # targets: 7, 9 and 9, 8
    sampler = _SampledSoftmax.build(encoded, width=100, negatives=10, device="cpu")
    assert sampler.targets.tolist() == [7, 8, 9]
    columns, correction = sampler.sample()
    assert columns[:3].tolist() == [7, 8, 9] and len(set(columns.tolist())) == 13
    assert not set(columns[3:].tolist()) & {7, 8, 9}
    assert correction[:3].tolist() == [0.0, 0.0, 0.0]
    assert correction[3:].allclose(torch.full((10,), math.log(97 / 10)))
    assert sampler.index[9].item() == 2 and sampler.index[0].item() == -1
    assert _SampledSoftmax.build(encoded, width=100, negatives=None, device="cpu") is None
    assert _SampledSoftmax.build(encoded, width=12, negatives=10, device="cpu") is None  # nothing to save


def test_command_line_end_to_end(tmp_path, gpt2_vocab_path, maskbench_dir):
    out = tmp_path / "tiny"
    code = main(["--vocab", str(gpt2_vocab_path), "--data", str(maskbench_dir), "--out", str(out),
                 "--max-steps", "1", "--layers", "1", "--hidden", "16", "--heads", "2", "--limit-files", "40",
                 "--eval-n", "2", "--eval-max-tokens", "8", "--batch-tokens", "1024"])
    assert code == 0
    metrics = json.loads((out / "metrics.json").read_text())
    assert set(metrics["unconstrained"]) >= {"n", "parse_rate", "schema_valid_rate", "stopped_rate"}
    assert metrics["train"]["steps"] == 1
    assert (out / "config.json").is_file() and (out / "tokenizer_config.json").is_file()


def test_eval_n_0_skips_the_evaluation_and_log_gets_the_progress(tmp_path, gpt2_vocab_path, maskbench_dir):
    lines: list[str] = []
    code = main(["--vocab", str(gpt2_vocab_path), "--data", str(maskbench_dir), "--out", str(tmp_path / "t"),
                 "--max-steps", "2", "--layers", "1", "--hidden", "16", "--heads", "2", "--limit-files", "40",
                 "--batch-tokens", "1024", "--eval-n", "0", "--log-every", "1"], log=lines.append)
    assert code == 0
    metrics = json.loads((tmp_path / "t" / "metrics.json").read_text())
    assert "unconstrained" not in metrics and metrics["train"]["steps"] == 2
    assert [line.split()[0] for line in lines] == ["data:", "model:", "step", "step", "trained", "saved"]


def test_bad_arch():
    with pytest.raises(ValueError, match="arch"):
        build_model(TinyConfig(vocab_size=10, arch="rnn"))
    with pytest.raises(ValueError, match="no training examples"):
        train(build_model(TinyConfig(vocab_size=10, n_layer=1, hidden=8, n_head=2)), [], max_steps=1)
