"""CorralCanvasProcessor inside DiffusionGemma's own generate: every emitted canvas valid.

A random-weights DiffusionGemma (two layers, hidden size 32, GPT-2's 50,257 tokens) is built
from a config; its unconstrained output is noise, so each validity assertion can fail.
"""

from __future__ import annotations

import itertools
import json
import re
from collections import Counter

import jsonschema
import pytest
import torch

pytest.importorskip("transformers.models.diffusion_gemma", reason="needs a transformers with DiffusionGemma (5.x)")

from transformers import (
    DiffusionGemmaConfig,
    DiffusionGemmaForBlockDiffusion,
    LogitsProcessor,
    LogitsProcessorList,
)

from engine.diffusion_hook import CanvasHookError, CorralCanvasProcessor
from samplers import dingo_map
from samplers.enumerate import chisquare_pvalue

EOS = 50256
CANVAS = 16
STEPS = 3  # a point-mass canvas is stable from its second step on
SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "boolean"}},
          "required": ["a", "b"], "additionalProperties": False}
RECORDS = 'root ::= "{" kv ("," kv)* "}"\nkv ::= "\\"" [a-z]+ "\\":" v\nv ::= [0-9]+ | "[" (v ("," v)*)? "]"'
PATTERN = r"[a-c]{2,4}-[0-9]{1,3}"
PROMPTS = torch.tensor([[EOS, 90], [EOS, 16]])


@pytest.fixture(scope="module")
def model():
    text = {"vocab_size": 50257, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
            "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 16, "global_head_dim": 16,
            "layer_types": ["sliding_attention", "full_attention"], "sliding_window": 64,
            "num_experts": 2, "top_k_experts": 1, "moe_intermediate_size": 32,  # the encoder is always MoE
            "pad_token_id": EOS, "eos_token_id": EOS, "bos_token_id": EOS}
    vision = {"model_type": "gemma4_vision", "hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 1,
              "num_attention_heads": 1, "num_key_value_heads": 1, "head_dim": 16, "position_embedding_size": 64}
    config = DiffusionGemmaConfig(text_config=text, vision_config=vision, canvas_length=CANVAS)
    torch.manual_seed(0)
    # eager: the SDPA path passes is_causal twice in this transformers version
    return DiffusionGemmaForBlockDiffusion._from_config(config, attn_implementation="eager").eval()


def generate(model, *processors, max_new_tokens=CANVAS, prompts=PROMPTS, seed=1):
    torch.manual_seed(seed)  # the starting canvas is uniform noise from torch's global generator
    out = model.generate(prompts, logits_processor=LogitsProcessorList(list(processors)),
                         max_new_tokens=max_new_tokens, max_denoising_steps=STEPS, eos_token_id=EOS, pad_token_id=EOS)
    return out.sequences[:, prompts.shape[1]:].tolist()


@pytest.fixture(scope="module")
def unconstrained(model, gpt2_vocab) -> list[str]:
    """What the random model writes on its own: noise, which no constraint below accepts."""
    return texts(gpt2_vocab, generate(model))


def texts(vocab, rows) -> list[str]:
    """Each row's text: everything before its first EOS."""
    return [vocab.decode(row[: row.index(EOS)] if EOS in row else row).decode("utf-8") for row in rows]


def parses(text: str) -> bool:
    try:
        jsonschema.validate(json.loads(text), SCHEMA)
    except (ValueError, jsonschema.ValidationError):
        return False
    return True


def test_json_schema_outputs_validate_and_unconstrained_ones_do_not(model, gpt2_vocab, gpt2_compiler, unconstrained):
    grammar = gpt2_compiler.compile_json_schema(SCHEMA)
    assert not any(parses(t) for t in unconstrained)
    for text in texts(gpt2_vocab, generate(model, CorralCanvasProcessor(grammar))):
        assert parses(text), text


def test_context_free_grammar_over_two_canvases(model, gpt2_vocab, gpt2_compiler, unconstrained):
    grammar = gpt2_compiler.compile_gbnf(RECORDS)
    assert not grammar.is_regular  # the left-to-right path with budget-aware closing
    assert not any(grammar.completable([t]) for t in unconstrained)
    rows = generate(model, CorralCanvasProcessor(grammar, max_new_tokens=2 * CANVAS), max_new_tokens=2 * CANVAS,
                    prompts=PROMPTS[:1])
    [text] = texts(gpt2_vocab, rows)
    assert grammar.completable([text]), text


def test_regex_with_dingo_and_a_mixed_batch(model, gpt2_vocab, gpt2_compiler, unconstrained):
    regex = gpt2_compiler.compile_regex(PATTERN)
    records = gpt2_compiler.compile_gbnf(RECORDS)
    assert not any(re.fullmatch(PATTERN, t) for t in unconstrained)
    processor = CorralCanvasProcessor(regex, temperature=1.0, generator=torch.Generator().manual_seed(0))
    for seed in range(2):  # one processor, reused: each generate call starts over
        for text in texts(gpt2_vocab, generate(model, processor, seed=seed)):
            assert re.fullmatch(PATTERN, text), text
    first, second = texts(gpt2_vocab, generate(model, CorralCanvasProcessor([regex, records])))
    assert re.fullmatch(PATTERN, first), first
    assert records.completable([second]), second


class Recorder(LogitsProcessor):
    """Keeps the raw scores of every step (placed before the corral processor)."""

    def __init__(self):
        self.scores = []

    def __call__(self, input_ids, scores, cur_step):
        self.scores.append(scores.clone())
        return scores


def valid_canvases(vocab, length: int) -> list[list[int]]:
    """Every valid canvas of ``FINITE``: each tokenization of each string, EOS-padded."""
    ids = {piece: i for i, piece in enumerate(vocab.token_bytes) if i != EOS}
    canvases = []
    for n in (1, 2):
        for letters in itertools.product(b"abc", repeat=n):
            text = bytes(letters)
            for split in [[text]] if n == 1 else [[text], [text[:1], text[1:]]]:
                if all(piece in ids for piece in split):
                    tokens = [ids[piece] for piece in split]
                    canvases.append(tokens + [EOS] * (length - len(tokens)))
    return canvases


FINITE = "[abc]{1,2}"


def canvas_logp(logp: torch.Tensor, canvas: list[int]) -> float:
    return float(logp[torch.arange(len(canvas)), torch.tensor(canvas)].sum())


def test_the_emitted_canvas_is_the_best_valid_one_by_enumeration(model, gpt2_vocab, gpt2_compiler):
    """The last step's scores rank every valid canvas; the best one is what generate emitted."""
    grammar = gpt2_compiler.compile_regex(FINITE)
    recorder = Recorder()
    [row] = generate(model, recorder, CorralCanvasProcessor(grammar), prompts=PROMPTS[:1])
    logp = torch.log_softmax(recorder.scores[-1][0].float(), dim=-1)
    assert row == max(valid_canvases(gpt2_vocab, CANVAS), key=lambda c: canvas_logp(logp, c))
    tokens, _, _ = dingo_map(grammar.as_dfa(), recorder.scores[-1][0])
    assert row == tokens


@pytest.mark.statistical
def test_sampled_canvases_follow_the_constrained_product_distribution(gpt2_vocab, gpt2_compiler):
    """temperature=1: canvases drawn with probability proportional to the product of the
    positions' probabilities, among the valid canvases (exact enumeration, chi-square)."""
    length, draws = 3, 1500
    processor = CorralCanvasProcessor(gpt2_compiler.compile_regex(FINITE), temperature=1.0,
                                      generator=torch.Generator().manual_seed(0))
    scores = torch.randn(1, length, 50257, generator=torch.Generator().manual_seed(3))
    logp = torch.log_softmax(scores[0], dim=-1)
    canvases = valid_canvases(gpt2_vocab, length)
    weights = torch.tensor([canvas_logp(logp, c) for c in canvases]).softmax(dim=0).tolist()
    probs = {tuple(c): w for c, w in zip(canvases, weights)}
    counts = Counter(tuple(processor(PROMPTS[:1], scores, torch.tensor(1))[0].argmax(dim=-1).tolist())
                     for _ in range(draws))
    assert set(counts) <= set(probs)
    assert chisquare_pvalue(counts, probs) > 1e-3, counts.most_common(5)


class Tamper(LogitsProcessor):
    """A processor after the corral one that overwrites the scores: the argmax becomes token 0."""

    def __call__(self, input_ids, scores, cur_step):
        return torch.zeros_like(scores)


def test_fails_closed(model, gpt2_compiler):
    regex = gpt2_compiler.compile_regex(PATTERN)
    with pytest.raises(CanvasHookError) as err:  # the canvas "!!!…" reaches the next canvas's first call
        generate(model, CorralCanvasProcessor(regex), Tamper(), max_new_tokens=2 * CANVAS, prompts=PROMPTS[:1])
    assert err.value.setting == "logits_processor"
    for mode in ("dingo", "left_to_right"):  # 20 tokens at least, 16 positions
        long = gpt2_compiler.compile_regex("(q z ){10}")
        with pytest.raises(CanvasHookError) as err:
            generate(model, CorralCanvasProcessor(long, mode=mode), prompts=PROMPTS[:1])
        assert err.value.setting == "max_new_tokens"
    with pytest.raises(CanvasHookError) as err:  # autoregressive scores [batch, vocab]
        CorralCanvasProcessor(regex)(PROMPTS, torch.zeros(2, 50257), torch.tensor(1))
    assert err.value.setting == "logits_processor"


def test_a_row_frozen_at_an_earlier_step_emits_an_earlier_choice(gpt2_compiler):
    """generate keeps a row's argmax from the step its stopping rule froze it at, while other rows
    go on: any canvas the processor chose during the canvas is accepted, nothing else is."""
    processor = CorralCanvasProcessor(gpt2_compiler.compile_regex(PATTERN), temperature=1.0,
                                      generator=torch.Generator().manual_seed(0))
    prompt = PROMPTS[:1]
    gen = torch.Generator().manual_seed(0)
    steps = [processor(prompt, torch.randn(1, CANVAS, 50257, generator=gen), torch.tensor(2)) for _ in range(2)]
    first, second = (out[0].argmax(dim=-1) for out in steps)
    assert not torch.equal(first, second)
    scores = torch.randn(1, CANVAS, 50257, generator=gen)
    out = processor(torch.cat([prompt, first[None]], dim=1), scores.clone(), torch.tensor(2))
    assert torch.equal(out, scores)  # the text ended in that canvas: the row is finished, left alone
    processor.reset()
    processor(prompt, torch.randn(1, CANVAS, 50257, generator=gen), torch.tensor(2))
    with pytest.raises(CanvasHookError):
        processor(torch.cat([prompt, torch.zeros(1, CANVAS, dtype=torch.long)], dim=1), scores, torch.tensor(2))


def test_check_settings_names_what_generate_would_get_wrong(model, gpt2_compiler):
    processor = CorralCanvasProcessor(gpt2_compiler.compile_regex(PATTERN), max_new_tokens=2 * CANVAS)
    good = {"logits_processor": LogitsProcessorList([processor]), "max_new_tokens": 2 * CANVAS, "eos_token_id": EOS}
    processor.check_settings(model, PROMPTS, **good)
    for setting, value in [("eos_token_id", [EOS, 1]),  # GPT-2's id 1 is '"': text to the grammar
                           ("max_new_tokens", CANVAS),
                           ("logits_processor", [processor]),
                           ("logits_processor", LogitsProcessorList([processor, Tamper()]))]:
        with pytest.raises(CanvasHookError) as err:
            processor.check_settings(model, PROMPTS, **{**good, setting: value})
        assert err.value.setting == setting
