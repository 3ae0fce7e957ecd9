"""Fixtures for the engine tests: tiny models built on the fly, vocabularies, scripted LMs.

Everything is session-scoped and small (hidden size 32, two layers), so the engine tests run
in seconds on a CPU. Models use the GPT-2 vocabulary (50,257 tokens) from ``../shared/vocab``;
tests that need it skip when the shared data is absent. Scripted tests use ``byte_vocab``.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from shared_data import shared_path, vocab_file


@pytest.fixture(scope="session")
def gpt2_vocab_path() -> Path:
    return vocab_file("gpt-2")


@pytest.fixture(scope="session")
def gpt2_vocab(gpt2_vocab_path):
    from grammars import TokenVocabulary

    return TokenVocabulary.from_pretrained(gpt2_vocab_path)


@pytest.fixture(scope="session")
def maskbench_dir() -> Path:
    return shared_path("jsonschemabench", "maskbench")


@pytest.fixture(scope="session")
def gpt2_compiler(gpt2_vocab):
    from grammars import Compiler

    return Compiler(gpt2_vocab)


@pytest.fixture(scope="session")
def json_gbnf_path() -> Path:
    return shared_path("gbnf", "json.gbnf")


@pytest.fixture(scope="session")
def json_gbnf(json_gbnf_path) -> str:
    return json_gbnf_path.read_text(encoding="utf-8")


def _tiny_gpt2(vocab_size: int, seed: int = 0):
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(seed)
    config = GPT2Config(vocab_size=vocab_size, n_embd=32, n_layer=2, n_head=2, n_positions=512,
                        bos_token_id=50256, eos_token_id=50256)
    return GPT2LMHeadModel(config).eval()


@pytest.fixture(scope="session")
def tiny_gpt2(gpt2_vocab):
    """A random GPT-2 architecture model over the real GPT-2 vocabulary."""
    return _tiny_gpt2(gpt2_vocab.logits_width)


@pytest.fixture(scope="session")
def tiny_llama(gpt2_vocab):
    """A random Llama architecture model (RoPE, GQA) over the GPT-2 vocabulary."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(1)
    config = LlamaConfig(vocab_size=gpt2_vocab.logits_width, hidden_size=32, intermediate_size=64,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=512, bos_token_id=50256, eos_token_id=50256)
    return LlamaForCausalLM(config).eval()


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory, tiny_gpt2, gpt2_vocab):
    """``tiny_gpt2`` saved with its tokenizer, for path-based loading (generate, CLI)."""
    folder = tmp_path_factory.mktemp("tiny-gpt2")
    tiny_gpt2.generation_config.eos_token_id = 50256
    tiny_gpt2.save_pretrained(folder)
    gpt2_vocab.hf_tokenizer.save_pretrained(folder)
    return folder


@pytest.fixture(autouse=True)
def _one_torch_thread():
    """Run each engine test with one intra-op thread, then restore the setting.

    The models here are tiny, so threads buy nothing, and on a busy two-core machine torch's
    thread pool spins: the same forward passes measured ~30x slower with two threads than with
    one while other jobs ran.
    """
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
