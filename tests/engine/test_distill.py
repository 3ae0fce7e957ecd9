"""``engine.distill``: the reduced output vocabulary of a draft model and its distillation from the
target (soft labels over that vocabulary), down to a draft that ``load_draft_lm`` loads reduced."""

from __future__ import annotations

import json

import pytest
import torch

from engine.distill import distillation_loss, frequent_tokens, main
from engine.lm import read_output_vocab


def test_frequent_tokens_rank_completion_tokens_only():
    encoded = [([9, 9, 9, 1, 2, 2, 3], 3), ([9, 4, 2, 3, 3], 1)]  # prompts (9s, one 4 aside) never count
    assert frequent_tokens(encoded, 2) == [2, 3]
    assert frequent_tokens(encoded, 3, always=[50]) == [1, 2, 3, 50]  # 1 and 4 tie at one: the lower id
    assert frequent_tokens(encoded, 10) == [1, 2, 3, 4]
    with pytest.raises(ValueError, match="at least one"):
        frequent_tokens(encoded, 0)


def _models():
    from transformers import GPT2Config, GPT2LMHeadModel

    def config(init):  # no dropout; a teacher with large weights is far from uniform
        return GPT2Config(vocab_size=40, n_embd=16, n_layer=1, n_head=2, n_positions=64, initializer_range=init,
                          resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)

    torch.manual_seed(0)
    teacher = GPT2LMHeadModel(config(0.5)).eval()
    torch.manual_seed(1)
    student = GPT2LMHeadModel(config(0.02))
    return teacher, student


def test_distillation_loss_is_least_at_the_teacher_and_training_lowers_it():
    """Cross-entropy against the teacher's softmax over the kept ids: the teacher's own entropy for
    a copy of the teacher (KL 0), more for any other student; a few steps bring a student closer."""
    teacher, student = _models()
    keep = [0, 3, 5, 7, 11, 13, 20, 39]
    rows = [([1, 2, 3, 5, 7, 11], 2), ([4, 4, 13, 20, 39], 3)]
    loss_fn = distillation_loss(teacher, keep)
    at_teacher, n = loss_fn(teacher, rows)
    assert n == 4 + 2  # the positions predicting each completion token
    other, _ = loss_fn(student, rows)
    assert float(other) > float(at_teacher) + 1e-3
    optimizer = torch.optim.Adam(student.parameters(), lr=1e-2)
    for _ in range(30):
        loss, _ = loss_fn(student, rows)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    after = float(loss_fn(student, rows)[0])
    assert after - float(at_teacher) < (float(other) - float(at_teacher)) / 2  # the KL at least halved


def test_command_line_writes_a_reduced_draft(tmp_path, tiny_model_dir, gpt2_vocab_path, maskbench_dir):
    from engine.speculative import load_draft_lm

    out = tmp_path / "draft"
    code = main(["--target", str(tiny_model_dir), "--draft", str(tiny_model_dir), "--vocab", str(gpt2_vocab_path),
                 "--data", str(maskbench_dir), "--out", str(out), "--limit-files", "30", "--output-vocab", "64",
                 "--max-outputs", "2", "--max-tokens", "6", "--max-steps", "2", "--batch-tokens", "2048"])
    assert code == 0
    ids = read_output_vocab(out)
    assert 50256 in ids and 64 <= len(ids) <= 65  # the 64 most frequent completion tokens, EOS always
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["target_outputs"] == 2 and metrics["steps"] == 2 and 0 < metrics["corpus_coverage"] < 1
    lm = load_draft_lm(out)
    finite = torch.isfinite(lm.next_logits([[5, 6, 7]])[0]).nonzero().flatten().tolist()
    assert finite == ids
