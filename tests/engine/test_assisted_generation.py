"""transformers' assisted generation keeps working with ``CorralLogitsProcessor``.

The processor follows the prefix it is shown (not a private counter), so the speculative
prefixes assisted generation hands it — and the rollbacks it never announces — leave it in
step: greedy assisted outputs equal unassisted ones token for token, with a draft model and with
prompt lookup, at batch 1; sampled assisted outputs stay inside the grammar.
"""

from __future__ import annotations

import re

import pytest
import torch

from engine import CorralLogitsProcessor

DIGITS = r"[1-9][0-9]{2,6}"
LIST = r"\[(cat|dog|bird)(, (cat|dog|bird)){0,4}\]"


@pytest.fixture(scope="module")
def draft_gpt2(gpt2_vocab):
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(5)
    config = GPT2Config(vocab_size=gpt2_vocab.logits_width, n_embd=16, n_layer=1, n_head=2, n_positions=512,
                        bos_token_id=50256, eos_token_id=50256)
    return GPT2LMHeadModel(config).eval()


def run(model, tokenizer, prompt, processor, **kwargs):
    batch = tokenizer([prompt], return_tensors="pt")
    out = model.generate(**batch, logits_processor=[processor], max_new_tokens=16, pad_token_id=tokenizer.eos_token_id,
                         eos_token_id=tokenizer.eos_token_id, **kwargs)
    return out[0, batch["input_ids"].shape[1]:].tolist()


def text_of(tokenizer, ids) -> str:
    return tokenizer.decode(ids, skip_special_tokens=True)


@pytest.mark.parametrize("pattern", [DIGITS, LIST])
@pytest.mark.parametrize("assist", ["draft_model", "prompt_lookup"])
def test_greedy_assisted_equals_unassisted(tiny_gpt2, draft_gpt2, gpt2_vocab, gpt2_compiler, pattern, assist):
    tokenizer = gpt2_vocab.hf_tokenizer
    grammar = gpt2_compiler.compile_regex(pattern)
    prompt = "cat dog [cat, dog] 1234 values:"
    plain = run(tiny_gpt2, tokenizer, prompt, CorralLogitsProcessor(grammar), do_sample=False)
    extra = {"assistant_model": draft_gpt2} if assist == "draft_model" else {"prompt_lookup_num_tokens": 3}
    assisted = run(tiny_gpt2, tokenizer, prompt, CorralLogitsProcessor(grammar), do_sample=False, **extra)
    assert assisted == plain
    matcher = grammar.matcher()
    body = [t for t in plain if t != tokenizer.eos_token_id]
    assert matcher.try_advance(body) == len(body)  # every token was allowed


@pytest.mark.parametrize("assist", ["draft_model", "prompt_lookup"])
def test_sampled_assisted_outputs_stay_in_the_grammar(tiny_gpt2, draft_gpt2, gpt2_vocab, gpt2_compiler, assist):
    tokenizer = gpt2_vocab.hf_tokenizer
    grammar = gpt2_compiler.compile_regex(LIST)
    extra = {"assistant_model": draft_gpt2} if assist == "draft_model" else {"prompt_lookup_num_tokens": 3}
    for seed in range(3):
        torch.manual_seed(seed)
        ids = run(tiny_gpt2, tokenizer, "[cat, dog] list:", CorralLogitsProcessor(grammar), do_sample=True, **extra)
        body = [t for t in ids if t != tokenizer.eos_token_id]
        matcher = grammar.matcher()
        assert matcher.try_advance(body) == len(body), text_of(tokenizer, ids)
        if tokenizer.eos_token_id in ids:
            assert re.fullmatch(LIST, text_of(tokenizer, body))
