"""Every matcher kind refuses malformed arguments alike, with the state unchanged.

The contract (``grammars.TokenMatcher``): a token id that is not an int (``bool`` and floats are
not; numpy integers are) is a ``TypeError``, a negative count a ``ValueError``, a mask buffer of
another dtype a ``TypeError`` — never a silent truncation or a token nobody chose. An int that is
no token of the vocabulary (negative, padding, beyond int64) is "not allowed", not an error. Each
case runs on every kind: ``Matcher`` (grammar and JSON Schema), ``DFAMatcher``,
``UnconstrainedMatcher`` and the samplers' ``NarrowedMatcher``.
"""

from __future__ import annotations

import numpy as np
import pytest

from grammars import (
    Compiler,
    MatchError,
    RollbackError,
    TokenRejected,
    UnconstrainedMatcher,
    allocate_token_bitmask,
)
from grammars.bitmask import unpack_bits
from samplers.narrowing import NarrowedMatcher

KINDS = ["Matcher", "Matcher(json schema)", "DFAMatcher", "UnconstrainedMatcher", "NarrowedMatcher"]

BAD_TOKENS = [2.9, 97.0, True, False, np.bool_(True), "a", None, [97], np.float64(97.0)]
NOT_TOKENS = [-1, 2**63, 2**70, -(2**63) - 1]  # ints, but no token of any vocabulary


@pytest.fixture(scope="module")
def compiler(byte_vocab):
    return Compiler(byte_vocab)


def make(kind: str, compiler, vocab):
    """A fresh matcher of ``kind`` that has consumed ``a`` (so rollbacks and states are non-trivial)."""
    if kind == "Matcher":
        matcher = compiler.compile_gbnf('root ::= "a" [a-c]+ "x"').matcher()
    elif kind == "Matcher(json schema)":
        matcher = compiler.compile_json_schema({"type": "string"}).matcher()
    elif kind == "DFAMatcher":
        matcher = compiler.compile_regex("a[a-c]+x").as_dfa().matcher()
    elif kind == "UnconstrainedMatcher":
        matcher = UnconstrainedMatcher(vocab)
    else:
        matcher = NarrowedMatcher(compiler.compile_regex("a[a-c]+x").matcher(), lambda m, t: t != ord("c"), vocab)
    matcher.advance(ord('"') if kind == "Matcher(json schema)" else ord("a"))
    return matcher


def mask_of(matcher, vocab) -> np.ndarray:
    words = allocate_token_bitmask(1, vocab.logits_width)
    matcher.fill_mask(words, 0)
    return words[0].copy()


def snapshot(matcher, vocab):
    return matcher.num_consumed, matcher.freeze(), mask_of(matcher, vocab).tobytes()


# --- token ids --------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("method", ["allows", "check", "rejection", "advance"])
@pytest.mark.parametrize("bad", BAD_TOKENS, ids=repr)
def test_a_token_id_must_be_an_int(byte_vocab, compiler, kind, method, bad):
    matcher = make(kind, compiler, byte_vocab)
    before = snapshot(matcher, byte_vocab)
    with pytest.raises(TypeError, match="token id must be an int"):
        getattr(matcher, method)(bad)
    assert snapshot(matcher, byte_vocab) == before


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("token", NOT_TOKENS, ids=repr)
def test_an_int_that_is_no_token_is_not_allowed(byte_vocab, compiler, kind, token):
    """``check(2**63)`` used to overflow in numpy where ``allows`` answered False."""
    matcher = make(kind, compiler, byte_vocab)
    before = snapshot(matcher, byte_vocab)
    assert matcher.allows(token) is False
    result = matcher.check(token)
    assert not result.allowed and not len(result.accepted)
    assert matcher.rejection(token) is not None
    with pytest.raises(TokenRejected):
        matcher.advance(token)
    assert matcher.try_advance([token]) == 0
    assert snapshot(matcher, byte_vocab) == before


@pytest.mark.parametrize("kind", KINDS)
def test_numpy_integers_are_token_ids(byte_vocab, compiler, kind):
    matcher = make(kind, compiler, byte_vocab)
    b = np.int64(ord("b"))
    assert matcher.allows(b) and matcher.check(np.int32(ord("b"))).allowed and matcher.rejection(np.uint8(98)) is None
    matcher.advance(b)
    assert matcher.num_consumed == 2
    assert matcher.try_advance(np.array([ord("b"), ord("b")], dtype=np.int16)) == 2


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("tokens", [5, "bb", b"bb", [ord("b"), 2.9], [ord("b"), True], [ord("b"), None]], ids=repr)
def test_try_advance_checks_every_id_before_consuming_any(byte_vocab, compiler, kind, tokens):
    matcher = make(kind, compiler, byte_vocab)
    before = snapshot(matcher, byte_vocab)
    with pytest.raises(TypeError):
        matcher.try_advance(tokens)
    assert snapshot(matcher, byte_vocab) == before


# --- counts -----------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("bad", [True, 1.0, "1", None, np.float32(1)], ids=repr)
def test_counts_must_be_ints(byte_vocab, compiler, kind, bad):
    """``rollback(True)`` used to roll back one token."""
    matcher = make(kind, compiler, byte_vocab)
    before = snapshot(matcher, byte_vocab)
    with pytest.raises(TypeError, match="must be an int"):
        matcher.rollback(bad)
    with pytest.raises(TypeError, match="must be an int"):
        matcher.forced_tokens(bad)
    assert snapshot(matcher, byte_vocab) == before


@pytest.mark.parametrize("kind", KINDS)
def test_counts_must_not_be_negative(byte_vocab, compiler, kind):
    matcher = make(kind, compiler, byte_vocab)
    before = snapshot(matcher, byte_vocab)
    for call in (lambda: matcher.rollback(-1), lambda: matcher.forced_tokens(-1)):
        with pytest.raises(ValueError, match=">= 0") as info:
            call()
        assert not isinstance(info.value, MatchError)  # an argument error, not a matcher state error
    with pytest.raises(RollbackError):
        matcher.rollback(2)  # one token consumed
    assert snapshot(matcher, byte_vocab) == before
    matcher.rollback(np.int64(1))
    assert matcher.num_consumed == 0
    assert matcher.forced_tokens(0) == []


# --- mask buffers -----------------------------------------------------------------------------


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("dtype", [np.int16, np.uint8, np.bool_, np.float32, np.int64, np.uint64])
def test_fill_mask_refuses_buffers_that_would_truncate_words(byte_vocab, compiler, kind, dtype):
    matcher = make(kind, compiler, byte_vocab)
    words = (byte_vocab.logits_width + 31) // 32
    out = np.zeros((1, words * 4), dtype=dtype)
    with pytest.raises(TypeError, match="int32 or uint32"):
        matcher.fill_mask(out, 0)
    assert not out.any()


@pytest.mark.parametrize("kind", KINDS)
def test_fill_mask_refuses_what_is_not_a_buffer_or_a_row(byte_vocab, compiler, kind):
    matcher = make(kind, compiler, byte_vocab)
    words = (byte_vocab.logits_width + 31) // 32
    with pytest.raises(TypeError, match="numpy"):
        matcher.fill_mask([0] * words, 0)
    with pytest.raises(ValueError, match="needs"):
        matcher.fill_mask(np.zeros((1, words - 1), dtype=np.int32), 0)
    with pytest.raises(ValueError, match="dimensions"):
        matcher.fill_mask(np.zeros((1, 1, words), dtype=np.int32), 0)
    with pytest.raises(ValueError, match="out of range"):
        matcher.fill_mask(np.zeros((2, words), dtype=np.int32), 2)
    with pytest.raises(ValueError, match="out of range"):
        matcher.fill_mask(np.zeros((2, words), dtype=np.int32), -1)
    for row in (1.0, True, "0", None):
        with pytest.raises(TypeError, match="row must be an int"):
            matcher.fill_mask(np.zeros((2, words), dtype=np.int32), row)
    frozen = np.zeros((1, words), dtype=np.int32)
    frozen.setflags(write=False)
    with pytest.raises(ValueError, match="read-only"):
        matcher.fill_mask(frozen, 0)


@pytest.mark.parametrize("kind", KINDS)
def test_fill_mask_takes_wider_rows_and_uint32_words(byte_vocab, compiler, kind):
    """Serving engines size masks by the model's logits width: a wider row is filled, the rest cleared."""
    matcher = make(kind, compiler, byte_vocab)
    expected = mask_of(matcher, byte_vocab)
    words = expected.shape[0]
    wide = np.full((3, words + 5), -1, dtype=np.int32)
    matcher.fill_mask(wide, np.int64(1))
    assert np.array_equal(wide[1, :words], expected) and not wide[1, words:].any()
    assert (wide[0] == -1).all() and (wide[2] == -1).all()  # other rows untouched
    unsigned = np.full(words + 1, 0xFFFFFFFF, dtype=np.uint32)
    matcher.fill_mask(unsigned)
    assert np.array_equal(unsigned[:words].view(np.int32), expected) and unsigned[words] == 0
    allowed = unpack_bits(expected, byte_vocab.logits_width)
    assert allowed.any() and not unpack_bits(wide[1], (words + 5) * 32)[byte_vocab.logits_width :].any()
