"""The small grammars and scripted models the statistical tests share (exact answers by enumeration).

A plain module, not a conftest, so tests use the tasks as values (``parametrize``):
``from sampler_tasks import skewed_task``. Each task is ``(grammar, lm, width)``.

* ``skewed_task``: ``0000|1[01]{3}`` over the tokens ``0``, ``1`` and EOS; the model prefers ``0``
  first, whose continuations are mostly ungrammatical — where masking distorts most.
* ``multibyte_task``: ``(a|b)(a|b)?c`` over single- and multi-byte tokens, with pseudo-random
  logits per prefix (``hashed_logits_fn``).
* ``budget_task``: ``[ab]{1,3}c`` over the same tokens, with a model biased towards single bytes,
  so that texts of more than two tokens carry over half the valid mass (a budget of 3 tokens,
  EOS included, removes them: ``tests/statistical/test_closing.py``).
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from grammars import CompiledGrammar, Compiler, TokenVocabulary
from samplers.enumerate import LogitsFn, hashed_logits_fn

SKEWED_PIECES = [b"0", b"1", b""]
SKEWED_EOS = 2
MULTI_PIECES = [b"a", b"b", b"c", b"ab", b"ba", b"bc", b"ac", b"aa", b""]


class Task(NamedTuple):
    grammar: CompiledGrammar
    lm: LogitsFn
    width: int


def skewed_lm(prefix) -> torch.Tensor:
    """P(0, 1, EOS): 0.75 / 0.24 / 0.01 first, then 0.5 / 0.45 / 0.05, then 0.1 / 0.1 / 0.8 after four."""
    if len(prefix) == 0:
        probs = [0.75, 0.24, 0.01]
    elif len(prefix) < 4:
        probs = [0.5, 0.45, 0.05]
    else:
        probs = [0.1, 0.1, 0.8]
    return torch.log(torch.tensor(probs))


def skewed_task() -> Task:
    vocab = TokenVocabulary.from_bytes(SKEWED_PIECES, eos_token_ids=[SKEWED_EOS])
    return Task(Compiler(vocab).compile_regex("0000|1[01]{3}"), skewed_lm, len(SKEWED_PIECES))


def multibyte_task(seed: int = 0, scale: float = 2.0) -> Task:
    vocab = TokenVocabulary.from_bytes(MULTI_PIECES, eos_token_ids=[len(MULTI_PIECES) - 1])
    grammar = Compiler(vocab).compile_regex("(a|b)(a|b)?c")
    return Task(grammar, hashed_logits_fn(len(MULTI_PIECES), seed=seed, scale=scale), len(MULTI_PIECES))


def budget_task(seed: int = 0) -> Task:
    vocab = TokenVocabulary.from_bytes(MULTI_PIECES, eos_token_ids=[len(MULTI_PIECES) - 1])
    grammar = Compiler(vocab).compile_regex("[ab]{1,3}c")
    bias = torch.tensor([1.5, 1.5, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.5])  # a, b, c likelier than pairs
    return Task(grammar, hashed_logits_fn(len(MULTI_PIECES), seed=seed, scale=1.0, bias=bias), len(MULTI_PIECES))
