"""``CorralLogitsProcessor`` inside ``model.generate``: batch 2, left padding, padded vocabulary,
several EOS ids, reuse with ``reset``, one grammar per row."""

from __future__ import annotations

import json
import re

import pytest
import torch

from engine import CorralLogitsProcessor

DIGITS = r"[1-9][0-9]{2,4}"
WORD = r"(cat|dog|bird)s?"


def generated_ids(model, tokenizer, prompts, processor, max_new_tokens=12, seed=0) -> list[list[int]]:
    """``model.generate`` with ``processor`` on left-padded prompts: each row's new token ids."""
    tokenizer.padding_side = "left"
    tokenizer.pad_token = tokenizer.eos_token
    batch = tokenizer(prompts, return_tensors="pt", padding=True)
    torch.manual_seed(seed)
    out = model.generate(**batch, logits_processor=[processor], max_new_tokens=max_new_tokens, do_sample=True,
                         pad_token_id=tokenizer.eos_token_id, eos_token_id=tokenizer.eos_token_id)
    return out[:, batch["input_ids"].shape[1]:].tolist()


def hf_generate(model, tokenizer, prompts, processor, max_new_tokens=12, seed=0):
    """Generated texts, special tokens (EOS, padding) dropped."""
    rows = generated_ids(model, tokenizer, prompts, processor, max_new_tokens, seed)
    return [tokenizer.decode(row, skip_special_tokens=True) for row in rows]


def hf_generate_rows(model, tokenizer, prompts, processor, max_new_tokens=12, seed=0):
    """Generated token ids per row (up to EOS) and whether the row ended with EOS."""
    rows = []
    for row in generated_ids(model, tokenizer, prompts, processor, max_new_tokens, seed):
        stopped = tokenizer.eos_token_id in row
        rows.append((row[: row.index(tokenizer.eos_token_id)] if stopped else row, stopped))
    return rows


def assert_prefix_allowed(grammar, tokens, stopped):
    matcher = grammar.matcher()
    assert matcher.try_advance(tokens) == len(tokens)  # every generated token was in the mask
    if stopped:
        assert matcher.is_accepting()


def test_batch_with_left_padding(tiny_gpt2, gpt2_vocab, gpt2_compiler):
    prompts = ["A number:", "Please write a long number here:"]  # different lengths: left padding
    processor = CorralLogitsProcessor(gpt2_compiler.compile_regex(DIGITS))
    assert processor.supports_continuous_batching is False
    for seed in range(2):
        texts = hf_generate(tiny_gpt2, gpt2_vocab.hf_tokenizer, prompts, processor, seed=seed)
        assert all(re.fullmatch(DIGITS, t) for t in texts), texts
        processor.reset()


def test_reuse_without_reset_starts_over_on_a_shorter_input(tiny_gpt2, gpt2_vocab, gpt2_compiler):
    processor = CorralLogitsProcessor(gpt2_compiler.compile_regex(DIGITS))
    long_prompts = ["Please write a long number here:", "and another one right here please:"]
    hf_generate(tiny_gpt2, gpt2_vocab.hf_tokenizer, long_prompts, processor)
    texts = hf_generate(tiny_gpt2, gpt2_vocab.hf_tokenizer, ["n:", "m:"], processor)  # no reset()
    assert all(re.fullmatch(DIGITS, t) for t in texts), texts


def test_one_grammar_per_row(tiny_gpt2, gpt2_vocab, gpt2_compiler):
    processor = CorralLogitsProcessor([gpt2_compiler.compile_regex(DIGITS), gpt2_compiler.compile_regex(WORD)])
    texts = hf_generate(tiny_gpt2, gpt2_vocab.hf_tokenizer, ["A number:", "An animal:"], processor)
    assert re.fullmatch(DIGITS, texts[0]) and re.fullmatch(WORD, texts[1]), texts
    with pytest.raises(ValueError, match="one per row"):
        processor(torch.zeros((3, 2), dtype=torch.long), torch.zeros((3, 50257)))


def test_json_grammar_in_model_generate(tiny_gpt2, gpt2_vocab, gpt2_compiler, json_gbnf):
    grammar = gpt2_compiler.compile_gbnf(json_gbnf)
    rows = hf_generate_rows(tiny_gpt2, gpt2_vocab.hf_tokenizer, ["JSON:", "Some JSON please:"],
                            CorralLogitsProcessor(grammar), max_new_tokens=24)
    for tokens, stopped in rows:  # the shim has no budget-aware closing: rows may end mid-value
        assert_prefix_allowed(grammar, tokens, stopped)
        if stopped:
            json.loads(gpt2_vocab.decode(tokens))


def test_schema_in_model_generate(tiny_gpt2, gpt2_vocab, gpt2_compiler):
    pytest.importorskip("grammars.frontends.json_schema")
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"],
              "additionalProperties": False}
    grammar = gpt2_compiler.compile_json_schema(schema)
    rows = hf_generate_rows(tiny_gpt2, gpt2_vocab.hf_tokenizer, ["Answer:", "Is it? Answer:"],
                            CorralLogitsProcessor(grammar), max_new_tokens=32)
    for tokens, stopped in rows:
        assert_prefix_allowed(grammar, tokens, stopped)
        if stopped:
            assert json.loads(gpt2_vocab.decode(tokens)) in ({"ok": True}, {"ok": False})


def test_padded_vocabulary_and_several_eos_ids(gpt2_vocab):
    """Scores wider than the tokenizer are masked; every EOS id is allowed exactly when accepting."""
    import dataclasses

    from grammars import Compiler

    extra_eos = 50255  # pretend a second end token; it must have no bytes, so make it special
    vocab = dataclasses.replace(
        gpt2_vocab, logits_width=50304, eos_token_ids=gpt2_vocab.eos_token_ids | {extra_eos},
        special_token_ids=gpt2_vocab.special_token_ids | {extra_eos},
        token_bytes=gpt2_vocab.token_bytes[:extra_eos] + (b"",) + gpt2_vocab.token_bytes[extra_eos + 1:],
    )
    processor = CorralLogitsProcessor(Compiler(vocab).compile_regex("ab"))
    a, b = vocab.encode("a")[0], vocab.encode("b")[0]
    ids = torch.tensor([[7, 8], [7, 8]])
    scores = processor(ids, torch.zeros((2, 50304)))
    assert torch.isinf(scores[:, 50257:]).all()  # padding columns
    assert torch.isfinite(scores[:, a]).all() and torch.isinf(scores[:, [50256, extra_eos]]).all()
    ids = torch.cat([ids, torch.tensor([[a], [a]])], dim=1)
    ids = torch.cat([ids, torch.tensor([[b], [b]])], dim=1)
    scores = processor(ids, torch.zeros((2, 50304)))
    assert torch.isfinite(scores[:, [50256, extra_eos]]).all()  # accepting: both EOS ids allowed
    ids = torch.cat([ids, torch.tensor([[extra_eos], [50256]])], dim=1)
    scores = processor(ids, torch.zeros((2, 50304)))  # finished rows stay finite for the softmax
    assert torch.isfinite(scores[:, :50257]).all()


def test_rows_reordered_by_beam_search_are_resynchronised(gpt2_vocab, gpt2_compiler):
    processor = CorralLogitsProcessor(gpt2_compiler.compile_regex(WORD))
    c, d = gpt2_vocab.encode("c")[0], gpt2_vocab.encode("d")[0]
    processor(torch.tensor([[1], [1]]), torch.zeros((2, 50257)))
    processor(torch.tensor([[1, c], [1, d]]), torch.zeros((2, 50257)))
    swapped = processor(torch.tensor([[1, d, gpt2_vocab.encode("o")[0]], [1, c, gpt2_vocab.encode("a")[0]]]),
                        torch.zeros((2, 50257)))
    g, t = gpt2_vocab.encode("g")[0], gpt2_vocab.encode("t")[0]
    assert torch.isfinite(swapped[0, g]) and torch.isinf(swapped[0, t])  # row 0 now holds "do"
    assert torch.isfinite(swapped[1, t]) and torch.isinf(swapped[1, g])  # row 1 now holds "ca"


def test_constructor_errors(gpt2_compiler, byte_vocab):
    from grammars import Compiler

    with pytest.raises(TypeError):
        CorralLogitsProcessor("a regex string")
    with pytest.raises(ValueError, match="one vocabulary"):
        CorralLogitsProcessor([gpt2_compiler.compile_regex("a"), Compiler(byte_vocab).compile_regex("a")])
