"""One loader for both kinds of model: masked-diffusion checkpoints are told apart by their config
(``*ForMaskedLM``, LLaDA, Dream) and get ``HFMaskedDiffusionLM``; everything else stays causal."""

from __future__ import annotations

import re

import pytest

from engine.diffusion_lm import HFMaskedDiffusionLM, is_masked_diffusion_checkpoint, is_masked_diffusion_config
from engine.generate import generate, load_model
from engine.lm import HFCausalLM
from engine.tiny_diffusion import DiffusionConfig, add_mask_token, build_diffusion_model


@pytest.fixture(scope="module")
def diffusion_dir(tmp_path_factory, gpt2_vocab):
    tokenizer = add_mask_token(gpt2_vocab.hf_tokenizer)
    model = build_diffusion_model(DiffusionConfig(vocab_size=len(tokenizer), mask_token_id=tokenizer.mask_token_id,
                                                  n_layer=1, hidden=16, n_head=2, max_positions=128,
                                                  eos_token_id=50256))
    folder = tmp_path_factory.mktemp("tiny-diffusion-kind")
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


@pytest.mark.parametrize("config, expected", [
    ({"architectures": ["ModernBertForMaskedLM"]}, True),
    ({"architectures": ["BertForMaskedLM"], "model_type": "bert"}, True),
    ({"architectures": ["LLaDAModelLM"], "model_type": "llada"}, True),
    ({"architectures": ["DreamModel"], "model_type": "Dream"}, True),
    ({"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2"}, False),
    ({"model_type": "bert"}, False),  # a bare encoder has no per-token head: not a diffusion LM
    ({}, False),
])
def test_configs_are_told_apart(config, expected):
    assert is_masked_diffusion_config(config) is expected


def test_folders_are_told_apart(diffusion_dir, tiny_model_dir, tmp_path):
    assert is_masked_diffusion_checkpoint(diffusion_dir)
    assert not is_masked_diffusion_checkpoint(tiny_model_dir)
    assert not is_masked_diffusion_checkpoint(tmp_path)  # no config.json
    (tmp_path / "config.json").write_text("{not json", encoding="utf-8")
    assert not is_masked_diffusion_checkpoint(tmp_path)


def test_load_model_gives_each_kind_its_adapter(diffusion_dir, tiny_model_dir):
    lm, tokenizer_source = load_model(str(diffusion_dir))
    assert isinstance(lm, HFMaskedDiffusionLM) and lm.mask_token_id == 50257
    assert tokenizer_source is not None
    causal, _ = load_model(str(tiny_model_dir))
    assert isinstance(causal, HFCausalLM)
    loaded = HFMaskedDiffusionLM.from_pretrained(diffusion_dir, local_files_only=True).model
    wrapped, _ = load_model(loaded)  # a loaded transformers masked LM: its name_or_path folder has the tokenizer
    assert isinstance(wrapped, HFMaskedDiffusionLM)


def test_generate_with_a_diffusion_folder_decodes_a_canvas(diffusion_dir):
    result = generate("Word:", model=str(diffusion_dir), regex="[a-z]{3,5}", canvas_length=6, steps=3, seed=0)
    assert re.fullmatch("[a-z]{3,5}", result.text)
