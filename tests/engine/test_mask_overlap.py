"""Masks filled while the forward pass runs (``DecodeOptions.overlap_masks``).

The overlap must change nothing but the clock: the same tokens, the same model calls on the same
batches, the same random streams as the sequential order; the model never runs twice at once and
every call has ended before an error leaves ``decode``. Scripted models over the byte vocabulary
(milliseconds), plus one random tiny GPT-2 with its KV cache.
"""

from __future__ import annotations

import threading
import time

import pytest
import torch

from engine import ClosingPlanner, DecodeOptions, HFCausalLM, ScriptedLM, decode
from grammars import Compiler, UnconstrainedMatcher
from samplers import MaskedSampler, NoAllowedToken, SamplingParams

LIST = r"\[[a-z]+(,[a-z]+)*\]"
GREEDY = SamplingParams(temperature=0.0)
SAMPLED = SamplingParams(temperature=0.9, top_p=0.95)


@pytest.fixture(scope="module")
def compiler(byte_vocab):
    return Compiler(byte_vocab)


def tok(vocab, piece: str) -> int:
    return vocab.token_bytes.index(piece.encode())


def random_script(vocab):
    """Deterministic pseudo-random logits per prefix: different seeds take different paths."""

    def script(prefix):
        gen = torch.Generator().manual_seed(hash(prefix) % (2**31))
        return torch.randn(vocab.logits_width, generator=gen) * 3

    return script


class RecordingLM(ScriptedLM):
    """A ScriptedLM that fails on re-entrance and records each call's thread, grad mode and interval."""

    def __init__(self, width, script, *, sleep_s: float = 0.0, fail_at: int | None = None):
        super().__init__(width, script)
        self.sleep_s = sleep_s
        self.fail_at = fail_at
        self.active = 0
        self.threads: list[threading.Thread] = []
        self.grad: list[bool] = []
        self.intervals: list[tuple[float, float]] = []
        self.batches: list[int] = []

    def next_logits(self, prefixes):
        self.active += 1
        try:
            assert self.active == 1, "the model was called while another call was running"
            start = time.perf_counter()
            self.threads.append(threading.current_thread())
            self.grad.append(torch.is_grad_enabled())
            self.batches.append(len(prefixes))
            if self.sleep_s:
                time.sleep(self.sleep_s)  # releases the GIL, as a forward pass's kernels do
            if self.fail_at is not None and self.calls == self.fail_at:
                raise RuntimeError("scripted model failure")
            out = super().next_logits(prefixes)
            self.intervals.append((start, time.perf_counter()))
            return out
        finally:
            self.active -= 1


class TimedMatcher:
    """A matcher whose ``fill_mask`` records its interval (optionally sleeping), or, from
    ``dead_after`` consumed tokens on, writes an empty mask (a broken grammar)."""

    def __init__(self, inner, *, sleep_s: float = 0.0, dead_after: int | None = None, accepting=None):
        self.inner = inner
        self.sleep_s = sleep_s
        self.dead_after = dead_after
        self.fills: list[tuple[float, float]] = []
        self.died_at: float | None = None
        if accepting is not None:
            self.is_accepting = accepting

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def fill_mask(self, out, row=0):
        start = time.perf_counter()
        if self.dead_after is not None and self.inner.num_consumed >= self.dead_after:
            out[row] = 0
            self.died_at = start
            return
        if self.sleep_s:
            time.sleep(self.sleep_s)
        self.inner.fill_mask(out, row)
        self.fills.append((start, time.perf_counter()))


def run_decode(lm, vocab, matchers, *, overlap, seeds=None, params=GREEDY, direct=True, planner=None, **options):
    n = len(matchers)
    seeds = range(n) if seeds is None else seeds
    generators = [torch.Generator().manual_seed(s) for s in seeds]
    opts = DecodeOptions(overlap_masks=overlap, direct_params=params if direct else None, **options)
    prompts = [[tok(vocab, "P"), i] for i in range(n)]  # distinct rows, even greedy
    out = decode(lm, vocab, prompts, matchers, [MaskedSampler(params).start() for _ in range(n)],
                 generators, opts, planner=planner)
    return out, generators


def both_orders(vocab, make_matchers, script, **kwargs):
    """(outputs, generators, model) with the overlap on, then off."""
    results = []
    for overlap in (True, False):
        lm = RecordingLM(vocab.logits_width, script)
        out, gens = run_decode(lm, vocab, make_matchers(), overlap=overlap, **kwargs)
        results.append((out, gens, lm))
    return results


def summary(out):
    return [(o.token_ids, o.text, o.finish_reason, o.forced_tokens, o.budget_steered, o.log_weight) for o in out]


# --- same outputs -----------------------------------------------------------------------------


@pytest.mark.parametrize("params", [GREEDY, SAMPLED], ids=["greedy", "sampled"])
@pytest.mark.parametrize("direct", [True, False], ids=["direct", "sampler"])
def test_overlap_gives_the_sequential_outputs_and_model_calls(byte_vocab, compiler, params, direct):
    grammar = compiler.compile_regex(LIST)
    forced_end = compiler.compile_regex(r"xyz[0-9]")

    def matchers():  # rows that end at different steps, one by its mask, one unconstrained
        return [grammar.matcher() for _ in range(4)] + [forced_end.matcher(), UnconstrainedMatcher(byte_vocab)]

    (on, gens_on, lm_on), (off, gens_off, lm_off) = both_orders(
        byte_vocab, matchers, random_script(byte_vocab), seeds=[3, 4, 5, 6, 7, 8], params=params, direct=direct,
        planner=ClosingPlanner(byte_vocab), max_tokens=14)
    assert summary(on) == summary(off)
    assert len({len(o.token_ids) for o in on[:4]}) > 1, "rows should finish at different steps"
    assert on[4].text == off[4].text and on[4].finish_reason == "stop"
    assert lm_on.prefixes == lm_off.prefixes and lm_on.batches == lm_off.batches  # the same calls, same batches
    assert [g.get_state().tolist() for g in gens_on] == [g.get_state().tolist() for g in gens_off]
    assert all(len(o.mask_wait_s) == len(o.per_token_s) for o in on + off)


def test_a_grammar_that_forces_its_end_makes_no_model_call(byte_vocab, compiler):
    digit = compiler.compile_regex(r"xyz[0-9]")
    lm = RecordingLM(byte_vocab.logits_width, lambda prefix: {tok(byte_vocab, "7"): 5.0})
    out, _ = run_decode(lm, byte_vocab, [digit.matcher(), digit.matcher()], overlap=True)
    assert [o.text for o in out] == [b"xyz7", b"xyz7"] and {o.finish_reason for o in out} == {"stop"}
    assert lm.calls == 1  # the digit; after it both masks hold only EOS: no call for that step
    fixed = compiler.compile_regex("xyz")  # forced from the start (no multi-byte token spells part of it)
    lm = RecordingLM(byte_vocab.logits_width, lambda prefix: {})
    out, _ = run_decode(lm, byte_vocab, [fixed.matcher(), fixed.matcher()], overlap=True)
    assert [o.text for o in out] == [b"xyz", b"xyz"] and {o.finish_reason for o in out} == {"stop"}
    assert lm.calls == 0


def test_a_row_found_eos_only_after_the_forward_started_has_its_logits_dropped(byte_vocab, compiler):
    """A matcher that does not say it accepts is masked during the forward; its row is dropped then."""
    grammar, digit = compiler.compile_regex(LIST), compiler.compile_regex(r"xyz[0-9]")
    script = random_script(byte_vocab)
    outs = []
    for overlap in (True, False):
        lm = RecordingLM(byte_vocab.logits_width, script)
        quiet = TimedMatcher(digit.matcher(), accepting=lambda: False)
        out, _ = run_decode(lm, byte_vocab, [grammar.matcher(), quiet, grammar.matcher()], overlap=overlap,
                            seeds=[1, 2, 3], params=SAMPLED, max_tokens=12)
        outs.append((summary(out), lm))
    (on, lm_on), (off, lm_off) = outs
    assert on == off and on[1][2] == "stop"
    assert lm_on.rows == lm_off.rows + 1  # the quiet row was scored once more, and its logits dropped


# --- threads --------------------------------------------------------------------------------


def test_the_model_runs_in_one_worker_thread_never_twice_at_once(byte_vocab, compiler):
    grammar = compiler.compile_regex(LIST)
    lm = RecordingLM(byte_vocab.logits_width, random_script(byte_vocab), sleep_s=0.002)
    with torch.no_grad():
        run_decode(lm, byte_vocab, [grammar.matcher() for _ in range(3)], overlap=True, max_tokens=10)
    assert lm.calls > 1 and len(set(lm.threads)) == 1  # RecordingLM asserts there is no re-entrance
    assert lm.threads[0] is not threading.main_thread()
    assert not any(lm.grad), "the caller's no_grad must reach the worker thread"
    assert not lm.threads[0].is_alive()  # joined when decode returns
    off = RecordingLM(byte_vocab.logits_width, random_script(byte_vocab))
    run_decode(off, byte_vocab, [grammar.matcher()], overlap=False, max_tokens=5)
    assert set(off.threads) == {threading.main_thread()}


def test_masks_fill_while_the_forward_runs(byte_vocab, compiler):
    grammar = compiler.compile_regex(LIST)
    waits = {}
    for overlap in (True, False):
        lm = RecordingLM(byte_vocab.logits_width, random_script(byte_vocab), sleep_s=0.06)
        matchers = [TimedMatcher(grammar.matcher(), sleep_s=0.01) for _ in range(4)]
        out, _ = run_decode(lm, byte_vocab, matchers, overlap=overlap, max_tokens=5, fast_forward=False)
        fills = [f for m in matchers for f in m.fills]
        during = [any(s < b and e > a for s, e in fills) for a, b in lm.intervals]  # a mask overlaps the call
        assert all(during) if overlap else not any(during), (overlap, during)
        waits[overlap] = [w for o in out for w in o.mask_wait_s]
    # sequentially each forward waits for the step's 10 ms masks; overlapped they end within its 60 ms
    assert min(waits[False]) >= 0.01
    assert sum(waits[True]) / len(waits[True]) < 0.5 * sum(waits[False]) / len(waits[False])


def test_no_allowed_token_propagates_after_the_forward_ends(byte_vocab, compiler):
    grammar = compiler.compile_regex(LIST)
    lm = RecordingLM(byte_vocab.logits_width, random_script(byte_vocab), sleep_s=0.05)
    dead = TimedMatcher(grammar.matcher(), dead_after=2)
    with pytest.raises(NoAllowedToken, match="allows no token"):
        run_decode(lm, byte_vocab, [grammar.matcher(), dead], overlap=True, max_tokens=10, fast_forward=False)
    # the step's call was made, and had ended (thread joined) before the error left decode
    assert dead.died_at is not None and len(lm.intervals) == lm.calls
    assert lm.active == 0 and not lm.threads[-1].is_alive()
    off = RecordingLM(byte_vocab.logits_width, random_script(byte_vocab), sleep_s=0.05)
    with pytest.raises(NoAllowedToken):
        run_decode(off, byte_vocab, [grammar.matcher(), TimedMatcher(grammar.matcher(), dead_after=2)],
                   overlap=False, max_tokens=10, fast_forward=False)
    assert off.calls == lm.calls - 1  # sequentially the step's call is never made


def test_a_model_error_propagates_from_the_worker(byte_vocab, compiler):
    grammar = compiler.compile_regex(LIST)
    lm = RecordingLM(byte_vocab.logits_width, random_script(byte_vocab), fail_at=1)
    with pytest.raises(RuntimeError, match="scripted model failure"):
        run_decode(lm, byte_vocab, [grammar.matcher(), grammar.matcher()], overlap=True, max_tokens=10)
    assert lm.active == 0 and lm.calls == 1 and not lm.threads[-1].is_alive()


# --- a real model ---------------------------------------------------------------------------


def test_overlap_equals_sequential_on_a_real_model(tiny_gpt2, gpt2_vocab, gpt2_compiler):
    grammar = gpt2_compiler.compile_regex(r"[a-z]{1,8}@[a-z]{2,6}\.(com|org)")
    prompts = [gpt2_vocab.encode(p) for p in ("Email: ", "Write an email address please: ", "x")]
    outs = []
    for overlap in (True, False):
        lm = HFCausalLM(tiny_gpt2)
        options = DecodeOptions(max_tokens=16, overlap_masks=overlap, direct_params=SAMPLED)
        out = decode(lm, gpt2_vocab, prompts, [grammar.matcher() for _ in prompts],
                     [MaskedSampler(SAMPLED).start() for _ in prompts],
                     [torch.Generator().manual_seed(s) for s in (5, 6, 7)], options)
        outs.append((summary(out), lm.forward_calls))
    assert outs[0] == outs[1]
