"""``engine.diffusion_lm`` (the masked-diffusion seam and its adapters) and ``engine.tiny_diffusion``
(the tiny masked-diffusion model the project trains): shapes, mask ids, the objective, a short
training run saved and reloaded. Small models, a few steps: seconds on a CPU."""

from __future__ import annotations

import json
import math

import pytest
import torch

from engine import HFMaskedDiffusionLM, MaskedDiffusionLM, ScriptedDiffusionLM
from engine.diffusion_lm import MissingMaskTokenError
from engine.tiny import load_examples, train
from engine.tiny_diffusion import (
    MASK_TOKEN,
    DiffusionConfig,
    DiffusionObjective,
    add_mask_token,
    build_diffusion_model,
    encode_code_canvases,
    encode_json_canvases,
    main,
)

EOS = 50256


@pytest.fixture(scope="module")
def masked_tokenizer(gpt2_vocab):
    return add_mask_token(gpt2_vocab.hf_tokenizer)


def _bert(vocab_size: int, *, hidden: int = 32, layers: int = 2, mask_token_id: int | None = None, seed: int = 0):
    from transformers import BertConfig, BertForMaskedLM

    torch.manual_seed(seed)
    config = BertConfig(vocab_size=vocab_size, hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=2,
                        intermediate_size=2 * hidden, max_position_embeddings=512)
    if mask_token_id is not None:
        config.mask_token_id = mask_token_id
    return BertForMaskedLM(config).eval()


@pytest.fixture(scope="module")
def json_canvases(maskbench_dir, gpt2_vocab):
    train_set, _ = load_examples(maskbench_dir, limit_files=30)
    return train_set, encode_json_canvases(train_set, gpt2_vocab, canvas_len=64, max_len=384)


# --- the seam and the mock ------------------------------------------------------------------


def _positional(width: int):
    """Logits that favour token ``position % width`` at each position, whatever the canvas holds."""

    def script(canvas):
        out = torch.zeros((len(canvas), width))
        out[torch.arange(len(canvas)), torch.arange(len(canvas)) % width] = 5.0
        return out

    return script


def test_scripted_model_keeps_the_protocol():
    lm = ScriptedDiffusionLM(8, 7, _positional(8))
    assert isinstance(lm, MaskedDiffusionLM)
    logits = lm.canvas_logits([[1, 7, 7], [2, 3, 7]])
    assert logits.shape == (2, 3, 8) and logits.dtype == torch.float32
    assert logits.argmax(-1).tolist() == [[0, 1, 2], [0, 1, 2]]
    assert (lm.calls, lm.rows, lm.canvases) == (1, 2, [(1, 7, 7), (2, 3, 7)])
    assert lm.mask_token_id == 7 and lm.logits_width == 8


@pytest.mark.parametrize(
    ("canvases", "message"),
    [([], "at least one canvas"), ([[]], "empty"), ([[1, 2], [1]], "one length"), ([[1, 9]], "outside")],
)
def test_canvases_are_checked(canvases, message):
    lm = ScriptedDiffusionLM(8, 7, _positional(8))
    with pytest.raises(ValueError, match=message):
        lm.canvas_logits(canvases)


def test_scripted_logits_of_the_wrong_shape_are_refused():
    with pytest.raises(ValueError, match="shape"):
        ScriptedDiffusionLM(8, 7, lambda canvas: torch.zeros(len(canvas), 5)).canvas_logits([[1, 2]])
    with pytest.raises(ValueError, match="outside"):
        ScriptedDiffusionLM(8, 8, _positional(8))


# --- Hugging Face adapter -------------------------------------------------------------------


def test_bert_over_the_gpt2_vocabulary(masked_tokenizer):
    mask = masked_tokenizer.mask_token_id
    assert mask == len(masked_tokenizer) - 1 == 50257  # appended after the GPT-2 vocabulary
    model = _bert(50304)  # a padded output layer, wider than the tokenizer
    lm = HFMaskedDiffusionLM(model, masked_tokenizer)
    assert isinstance(lm, MaskedDiffusionLM)
    assert lm.mask_token_id == mask and lm.logits_width == 50304
    canvases = [[31, 32, mask, mask, EOS], [40, 41, 42, mask, mask]]
    logits = lm.canvas_logits(canvases)
    assert logits.shape == (2, 5, 50304) and logits.dtype == torch.float32
    assert torch.isfinite(logits).all()
    # bidirectional: a token changes the logits of the positions before it
    other = lm.canvas_logits([[31, 32, mask, mask, 33]])
    assert not torch.allclose(logits[0, 2], other[0, 2])
    # one canvas alone gets the same logits as inside the batch
    assert torch.allclose(lm.canvas_logits(canvases[1:]), logits[1:], atol=1e-5)
    assert (lm.forward_calls, lm.tokens_fed) == (3, 20)


def test_the_mask_id_is_resolved_in_order(masked_tokenizer, gpt2_vocab):
    model = _bert(50258, hidden=16, layers=1, mask_token_id=50000)
    assert HFMaskedDiffusionLM(model, masked_tokenizer, 123).mask_token_id == 123  # the argument first
    assert HFMaskedDiffusionLM(model, masked_tokenizer).mask_token_id == 50257  # then the tokenizer
    assert HFMaskedDiffusionLM(model, gpt2_vocab.hf_tokenizer).mask_token_id == 50000  # then the config
    assert HFMaskedDiffusionLM(model).mask_token_id == 50000
    with pytest.raises(ValueError, match="outside"):
        HFMaskedDiffusionLM(model, mask_token_id=50258)


def test_a_missing_mask_id_is_a_typed_error(gpt2_vocab):
    model = _bert(50257, hidden=16, layers=1)
    with pytest.raises(MissingMaskTokenError, match="mask_token_id="):
        HFMaskedDiffusionLM(model, gpt2_vocab.hf_tokenizer)  # GPT-2's tokenizer has no mask token
    assert issubclass(MissingMaskTokenError, ValueError)
    with pytest.raises(TypeError, match="transformers model"):
        HFMaskedDiffusionLM(object(), mask_token_id=0)


def test_dream_style_logits_are_shifted_back():
    model = _bert(64, hidden=16, layers=1, mask_token_id=63)
    plain = HFMaskedDiffusionLM(model).canvas_logits([[1, 2, 3, 63]])
    shifted = HFMaskedDiffusionLM(model, shift_logits=True).canvas_logits([[1, 2, 3, 63]])
    assert torch.equal(shifted[0, 1:], plain[0, :-1]) and torch.equal(shifted[0, 0], plain[0, 0])
    model.config.model_type = "Dream"  # Dream's configs: shifted by default
    assert HFMaskedDiffusionLM(model).shift_logits


def test_add_mask_token_leaves_the_shared_tokenizer_alone(gpt2_vocab, masked_tokenizer):
    assert gpt2_vocab.hf_tokenizer.mask_token_id is None and len(gpt2_vocab.hf_tokenizer) == 50257
    assert masked_tokenizer.mask_token == MASK_TOKEN
    assert add_mask_token(masked_tokenizer) is masked_tokenizer  # has one already


# --- data and objective ---------------------------------------------------------------------


@pytest.mark.parametrize("arch", ["modernbert", "bert"])
def test_built_models_carry_their_mask_id(arch):
    model = build_diffusion_model(DiffusionConfig(vocab_size=50258, mask_token_id=50257, arch=arch, n_layer=1,
                                                  hidden=16, n_head=2, eos_token_id=EOS))
    assert model.config.mask_token_id == 50257 and model.config.tie_word_embeddings
    assert model.get_input_embeddings().padding_idx is None  # no frozen row: batches pad with the attention mask
    assert model.get_output_embeddings().weight is model.get_input_embeddings().weight
    lm = HFMaskedDiffusionLM(model)
    assert lm.mask_token_id == 50257 and lm.logits_width == 50258
    assert lm.canvas_logits([[1, 2, 50257, 50257]]).shape == (1, 4, 50258)
    with pytest.raises(ValueError, match="arch"):
        build_diffusion_model(DiffusionConfig(vocab_size=10, mask_token_id=9, arch="gpt2"))


def test_json_canvases_are_prompt_then_eos_padded_completion(json_canvases, gpt2_vocab):
    _, encoded = json_canvases
    assert encoded
    ids, prompt_len = encoded[0]
    assert len(ids) == prompt_len + 64 and ids[-1] == EOS
    prompt = gpt2_vocab.decode(ids[:prompt_len]).decode()
    assert prompt.startswith("Schema: {") and prompt.endswith("\nJSON: ")
    body = ids[prompt_len:]
    text = gpt2_vocab.decode(body[: body.index(EOS)]).decode()
    json.loads(text)  # the completion is the instance's JSON text
    assert all(t == EOS for t in body[body.index(EOS):])  # EOS to the canvas' end


def test_code_canvases_have_an_eos_header(gpt2_vocab):
    chunk = "int f(int x) {\n  return x + 1;\n}\n"
    [(ids, prompt_len)] = encode_code_canvases([chunk, "x" * 2000], gpt2_vocab, canvas_len=32)  # the long one dropped
    assert prompt_len == 1 and ids[0] == EOS and len(ids) == 33
    assert gpt2_vocab.decode(ids[1:]).decode() == chunk


def test_objective_is_the_weighted_masked_cross_entropy(json_canvases):
    _, encoded = json_canvases
    model = _bert(50258, hidden=16, layers=1, mask_token_id=50257)
    row = encoded[0]
    objective = DiffusionObjective(50257, EOS, variable_canvas=False, generator=torch.Generator().manual_seed(3))
    seen = []
    hook = model.base_model.register_forward_pre_hook(lambda m, a, kw: seen.append(kw["input_ids"].clone()),
                                                      with_kwargs=True)
    with torch.no_grad():
        loss, n_masked = objective(model, [row])
    hook.remove()
    ids, prompt_len = row
    noisy = seen[0][0]
    assert noisy[:prompt_len].tolist() == ids[:prompt_len]  # the prompt is never masked
    masked = noisy == 50257
    assert int(masked.sum()) == n_masked > 0
    assert noisy[~masked].tolist() == [t for t, m in zip(ids, masked.tolist()) if not m]
    # recompute with the same draws: t first, then the mask
    g = torch.Generator().manual_seed(3)
    t = objective.eps + (1 - objective.eps) * torch.rand(1, generator=g)
    with torch.no_grad():
        logits = model(input_ids=noisy[None]).logits[0]
    ce = torch.nn.functional.cross_entropy(logits[masked], torch.tensor(ids)[masked], reduction="sum")
    assert math.isclose(float(loss), float(ce / t / 64), rel_tol=1e-4)
    assert math.isclose(objective.masked_ce[-1], float(ce) / n_masked, rel_tol=1e-4)


def test_training_lowers_the_loss_on_a_fixed_batch(json_canvases):
    _, encoded = json_canvases
    batch = encoded[:4]
    config = DiffusionConfig(vocab_size=50258, mask_token_id=50257, n_layer=1, hidden=32, n_head=2,
                             max_positions=512, eos_token_id=EOS)
    model = build_diffusion_model(config, seed=0)

    def fixed_loss():
        probe = DiffusionObjective(50257, EOS, variable_canvas=False, generator=torch.Generator().manual_seed(0))
        with torch.no_grad():
            return float(probe(model.eval(), batch)[0])

    before = fixed_loss()
    objective = DiffusionObjective(50257, EOS)
    stats = train(model, batch, max_steps=30, batch_tokens=100_000, lr=1e-2, warmup_steps=1, pad_token_id=EOS,
                  log=None, loss_fn=objective)
    assert stats.steps == 30 and len(objective.masked_ce) == 30
    after = fixed_loss()
    assert after < 0.7 * before, (before, after)


def test_three_steps_save_a_folder_the_adapter_loads(tmp_path, maskbench_dir, gpt2_vocab_path):
    out = tmp_path / "tiny-diffusion"
    lines: list[str] = []
    code = main(["--vocab", str(gpt2_vocab_path), "--data", str(maskbench_dir), "--corpus", "json",
                 "--out", str(out), "--max-steps", "3", "--limit-files", "20", "--layers", "2", "--hidden", "32",
                 "--heads", "2", "--canvas", "64", "--eval-n", "4", "--batch-tokens", "2048"], log=lines.append)
    assert code == 0
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["train"]["steps"] == 3 and math.isfinite(metrics["train"]["final_loss"])
    assert metrics["config"]["mask_token_id"] == 50257
    lm = HFMaskedDiffusionLM.from_pretrained(out)
    assert lm.mask_token_id == 50257 == lm.model.config.mask_token_id == lm.tokenizer.mask_token_id
    assert lm.logits_width == 50258
    prompt = lm.tokenizer.encode('Schema: {"type":"integer"}\nJSON: ', add_special_tokens=False)
    logits = lm.canvas_logits([prompt + [lm.mask_token_id] * 8])
    assert logits.shape == (1, len(prompt) + 8, 50258) and torch.isfinite(logits).all()


def test_the_cpp_corpus_trains_from_given_sources(tmp_path, gpt2_vocab_path):
    source = tmp_path / "lib.cpp"
    source.write_text("".join(f"int f{i}(int x) {{\n  return x * {i} + {i + 1};\n}}\n" for i in range(60)))
    out = tmp_path / "tiny-diffusion-cpp"
    lines: list[str] = []
    code = main(["--vocab", str(gpt2_vocab_path), "--corpus", "cpp", "--source", str(source), "--out", str(out),
                 "--max-steps", "2", "--layers", "1", "--hidden", "16", "--heads", "2", "--canvas", "48",
                 "--eval-n", "0"], log=lines.append)
    assert code == 0
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["data"]["corpus"] == "cpp" and metrics["data"]["train_sequences"] > 0
    assert metrics["train"]["steps"] == 2
