"""``LanguageModel`` adapters: the scripted mock, and ``HFCausalLM`` whose KV-cache reuse must give
the logits a from-scratch forward pass gives, through extensions, rollbacks (crop), row
reorders, duplications (SMC resampling) and batches of different lengths."""

from __future__ import annotations

import random

import pytest
import torch

from engine import HFCausalLM, LanguageModel, ScriptedLM
from engine.lm import OUTPUT_VOCAB_FILE, chain_logits, read_output_vocab

# --- ScriptedLM -------------------------------------------------------------------------------


def test_scripted_steps_repeat_the_last_entry():
    lm = ScriptedLM(4, [{1: 5.0}, [0.0, 0.0, 0.0, 9.0]], default=-1.0)
    first = lm.next_logits([[0], [0, 1]])
    assert first.tolist() == [[-1.0, 5.0, -1.0, -1.0]] * 2
    assert lm.next_logits([[0]]).argmax().item() == 3
    assert lm.next_logits([[0]]).argmax().item() == 3
    assert lm.calls == 3 and lm.rows == 4 and lm.prefixes[1] == (0, 1)


def test_scripted_function_of_the_prefix_and_validation():
    lm = ScriptedLM(3, lambda prefix: torch.tensor([float(len(prefix)), 0.0, 0.0]))
    assert lm.next_logits([[1, 2]])[0, 0].item() == 2.0
    assert isinstance(lm, LanguageModel)
    with pytest.raises(ValueError, match="empty"):
        lm.next_logits([[]])
    with pytest.raises(ValueError, match="outside"):
        lm.next_logits([[5]])
    with pytest.raises(ValueError, match="at least one"):
        lm.next_logits([])
    with pytest.raises(ValueError, match="entries"):
        ScriptedLM(3, [[1.0, 2.0]]).next_logits([[0]])


# --- HFCausalLM ---------------------------------------------------------------------------------


def random_walk(width: int, steps: int, seed: int):
    """Batches of prefixes as a decoder (and SMC) would produce them."""
    rng = random.Random(seed)
    prefixes = [[rng.randrange(width) for _ in range(rng.randrange(1, 7))] for _ in range(3)]
    for _ in range(steps):
        nxt = []
        for p in prefixes:
            r = rng.random()
            if r < 0.55:
                p = p + [rng.randrange(width) for _ in range(rng.randrange(1, 4))]  # sample / fast-forward
            elif r < 0.8 and len(p) > 1:
                p = p[: rng.randrange(1, len(p))]  # rollback
            nxt.append(p)
        if rng.random() < 0.25:  # resample: reorder, duplicate, drop rows
            nxt = [nxt[rng.randrange(len(nxt))] for _ in range(rng.randrange(1, 5))]
        prefixes = nxt
        yield prefixes


@pytest.mark.parametrize("arch", ["tiny_gpt2", "tiny_llama"])
def test_kv_cache_gives_the_logits_of_a_fresh_forward_pass(request, arch):
    model = request.getfixturevalue(arch)
    cached, fresh = HFCausalLM(model), HFCausalLM(model, use_cache=False)
    worst = 0.0
    for prefixes in random_walk(cached.logits_width, steps=15, seed=3):
        a, b = cached.next_logits(prefixes), fresh.next_logits(prefixes)
        assert a.shape == (len(prefixes), cached.logits_width)
        worst = max(worst, (a - b).abs().max().item())
    assert worst < 1e-4
    assert cached.tokens_fed < fresh.tokens_fed  # the cache was reused despite rollbacks and resampling


def test_cache_extends_by_the_new_tokens_only(tiny_gpt2):
    lm = HFCausalLM(tiny_gpt2)
    lm.next_logits([[1, 2, 3], [4, 5]])
    fed = lm.tokens_fed
    lm.next_logits([[1, 2, 3, 6], [4, 5, 7, 8, 9]])  # one sampled token; three fast-forwarded
    assert lm.tokens_fed - fed == 4 and lm.forward_calls == 2
    again = lm.next_logits([[1, 2, 3, 6], [4, 5, 7, 8, 9]])  # nothing new: no forward pass
    assert lm.forward_calls == 2 and again.shape[0] == 2


def test_rollback_crops_the_cache(tiny_gpt2):
    lm = HFCausalLM(tiny_gpt2)
    ref = HFCausalLM(tiny_gpt2, use_cache=False)
    lm.next_logits([[1, 2, 3, 4, 5, 6]])
    assert lm.cached_tokens == 6
    out = lm.next_logits([[1, 2, 3, 9]])
    assert lm.cached_tokens == 4
    assert torch.allclose(out, ref.next_logits([[1, 2, 3, 9]]), atol=1e-5)
    shorter = lm.next_logits([[1, 2]])  # a strict prefix: re-feed its last token for the logits
    assert torch.allclose(shorter, ref.next_logits([[1, 2]]), atol=1e-5)
    lm.reset()
    assert lm.cached_tokens == 0


@pytest.mark.parametrize("arch", ["tiny_gpt2", "tiny_llama"])
def test_chain_logits_score_every_prefix_in_one_pass(request, arch):
    """Speculative verification of a chain: the logits after each prefix ``context + tokens[:i]``
    from one forward pass of one row, equal to scoring every prefix from scratch, through cached
    contexts, rejected drafts (cropped by the next call), trees and multi-row calls."""
    model = request.getfixturevalue(arch)
    lm, fresh = HFCausalLM(model), HFCausalLM(model, use_cache=False)
    rng = random.Random(7)
    context = [rng.randrange(lm.logits_width) for _ in range(9)]
    worst = 0.0
    for step in range(12):
        drafts = [rng.randrange(lm.logits_width) for _ in range(rng.randrange(1, 6))]
        calls = lm.forward_calls
        rows = chain_logits(lm, context, drafts)
        assert rows.shape == (len(drafts) + 1, lm.logits_width)
        assert lm.forward_calls - calls <= 1  # one pass (none when nothing is new)
        expected = fresh.next_logits([context + drafts[:i] for i in range(len(drafts) + 1)])
        worst = max(worst, (rows - expected).abs().max().item())
        picked = chain_logits(lm, context, drafts, positions=[0, len(drafts)])
        assert torch.allclose(picked, expected[[0, len(drafts)]], atol=1e-4)
        keep = rng.randrange(len(drafts) + 1)  # accept some drafts, then a corrected token
        context = context + drafts[:keep] + [rng.randrange(lm.logits_width)]
        if step % 4 == 3:  # other call shapes in between: a tree, several rows
            lm.tree_logits(context, [-1, 0, -1], [1, 2, 3])
            lm.next_logits([context, context[:-2]])
    assert worst < 1e-4
    assert lm.tokens_fed < fresh.tokens_fed
    rows = chain_logits(ScriptedLM(lm.logits_width, lambda prefix: {len(prefix): 1.0}), [1, 2], [3, 4])
    assert rows.argmax(dim=-1).tolist() == [2, 3, 4]  # the fallback scores the prefixes as rows


@pytest.mark.parametrize("arch", ["tiny_gpt2", "tiny_llama"])
def test_output_ids_restrict_the_output_layer(request, arch):
    """A reduced-vocabulary draft: the full model's logits on the kept ids, -inf elsewhere, through
    plain calls, chains and trees."""
    model = request.getfixturevalue(arch)
    full = HFCausalLM(model)
    keep = sorted(random.Random(1).sample(range(full.logits_width), 300) + [50256])
    small = HFCausalLM(model, output_ids=keep)
    assert small.logits_width == full.logits_width
    outside = torch.ones(full.logits_width, dtype=torch.bool)
    outside[keep] = False
    context = [5, 6, 7, 8]
    for a, b in ((small.next_logits([context, context[:2]]), full.next_logits([context, context[:2]])),
                 (small.chain_logits(context, [9, 10]), full.chain_logits(context, [9, 10])),
                 (small.tree_logits(context, [-1, -1, 0], [11, 12, 13]), full.tree_logits(context, [-1, -1, 0], [11, 12, 13]))):
        assert torch.allclose(a[:, keep], b[:, keep], atol=1e-5)
        assert torch.isneginf(a[:, outside]).all()


def test_output_ids_are_checked(tiny_gpt2):
    with pytest.raises(ValueError, match="empty"):
        HFCausalLM(tiny_gpt2, output_ids=[])
    with pytest.raises(ValueError, match="outside"):
        HFCausalLM(tiny_gpt2, output_ids=[1, 10**6])
    from transformers import Gemma2Config, Gemma2ForCausalLM

    gemma = Gemma2ForCausalLM(Gemma2Config(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                           num_attention_heads=2, num_key_value_heads=1, head_dim=8))
    with pytest.raises(ValueError, match="final_logit_softcapping"):
        HFCausalLM(gemma, output_ids=[1, 2, 3])


def test_output_vocabulary_file(tmp_path, tiny_model_dir):
    from engine.distill import write_output_vocab
    from engine.speculative import load_draft_lm

    assert read_output_vocab(tmp_path) is None
    (tmp_path / OUTPUT_VOCAB_FILE).write_text("[1, 2]")
    with pytest.raises(ValueError, match="not an output vocabulary"):
        read_output_vocab(tmp_path)
    folder = tmp_path / "draft"
    folder.mkdir()
    for f in tiny_model_dir.iterdir():
        (folder / f.name).write_bytes(f.read_bytes())
    assert load_draft_lm(folder)._head is None  # no file: the full output layer
    write_output_vocab(folder, [3, 1, 50256], source="test")
    lm = load_draft_lm(folder)
    assert torch.isfinite(lm.next_logits([[5, 6]])[0]).nonzero().flatten().tolist() == [1, 3, 50256]


def test_returned_logits_are_the_callers(tiny_gpt2):
    lm = HFCausalLM(tiny_gpt2)
    out = lm.next_logits([[1, 2]])
    out.fill_(float("-inf"))  # a decoder masks in place
    assert torch.isfinite(lm.next_logits([[1, 2]])).all()


def test_padded_output_layer_sets_the_width():
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(vocab_size=1000, n_embd=16, n_layer=1, n_head=2))
    model.resize_token_embeddings(1024)
    assert HFCausalLM(model).logits_width == 1024


def test_from_pretrained_round_trip(tiny_model_dir, tiny_gpt2):
    lm = HFCausalLM.from_pretrained(tiny_model_dir, dtype="float32", local_files_only=True)
    ref = HFCausalLM(tiny_gpt2)
    assert torch.allclose(lm.next_logits([[5, 6, 7]]), ref.next_logits([[5, 6, 7]]), atol=1e-6)


def test_bad_inputs():
    with pytest.raises(TypeError, match="PreTrainedModel"):
        HFCausalLM(object())
    from engine.lm import resolve_dtype

    with pytest.raises(ValueError, match="unknown dtype"):
        resolve_dtype("float7")


def test_devices_and_dtypes_are_checked_before_anything_moves(monkeypatch, tiny_gpt2):
    """``device="cuda"`` without CUDA used to end in an ``AssertionError`` deep inside torch."""
    from engine.lm import resolve_device, resolve_dtype

    assert resolve_device("cpu") == torch.device("cpu") and resolve_device(torch.device("cpu")).type == "cpu"
    with pytest.raises(ValueError, match="unknown device 'banana'"):
        resolve_device("banana")
    with pytest.raises(ValueError, match="'meta' is not available"):
        resolve_device("meta")
    with pytest.raises(TypeError, match="device must be"):
        resolve_device(0)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ValueError, match="'cuda:1' is not available"):
        resolve_device("cuda:1")
    with pytest.raises(ValueError, match="'cuda' is not available"):
        HFCausalLM(tiny_gpt2, device="cuda")
    with pytest.raises(ValueError, match="not a floating"):
        resolve_dtype("int64")
    with pytest.raises(TypeError, match="dtype must be"):
        resolve_dtype(32)
    assert resolve_dtype("torch.bfloat16") is torch.bfloat16
