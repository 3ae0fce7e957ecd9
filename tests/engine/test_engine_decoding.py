"""The decoding loop with scripted models over the byte vocabulary (no weights, milliseconds).

Each test scripts a model whose preferences fight the constraint — EOS as early as possible,
never closing a bracket, preferring a token the grammar forbids — and checks the loop's
guarantees: EOS only at accepting states, budget-aware closing, forced tokens without model
calls, stop strings, seeds, batch == sequential, max_tokens bounds.
"""

from __future__ import annotations

import json
import re

import pytest
import torch

from engine import (
    ClosingPlanner,
    DecodeOptions,
    GenerationOptions,
    GenerationResult,
    ScriptedLM,
    decode,
    generate,
    generate_batch,
    resolve_sampler,
)
from grammars import Compiler
from samplers import MaskedSampler, SamplingParams

LIST = r"\[[a-z]+(,[a-z]+)*\]"


@pytest.fixture(scope="module")
def compiler(byte_vocab):
    return Compiler(byte_vocab)


def tok(vocab, piece: bytes | str) -> int:
    piece = piece.encode() if isinstance(piece, str) else piece
    return vocab.token_bytes.index(piece)


def eos(vocab) -> int:
    return min(vocab.eos_token_ids)


def prefers(vocab, weights: dict, default: float = 0.0) -> ScriptedLM:
    """A model with fixed preferences: ``{piece or "EOS": logit}``; everything else ``default``."""
    row = {}
    for piece, value in weights.items():
        row[eos(vocab) if piece == "EOS" else tok(vocab, piece)] = value
    return ScriptedLM(vocab.logits_width, lambda prefix: row, default=default)


def run(vocab, compiler, prompt="P", **kwargs) -> GenerationResult:
    kwargs.setdefault("seed", 0)
    return generate(prompt, tokenizer=vocab, compiler=compiler, **kwargs)


# --- EOS --------------------------------------------------------------------------------------


def test_eos_only_at_accepting_states(byte_vocab, compiler):
    eager = prefers(byte_vocab, {"EOS": 50.0})
    free = run(byte_vocab, compiler, model=eager)
    assert free.text == "" and free.finish_reason == "stop"  # unconstrained, the model stops at once
    for seed in range(5):
        result = run(byte_vocab, compiler, model=eager, regex=r"[a-c]{3,6}x", seed=seed)
        assert re.fullmatch(r"[a-c]{3,6}x", result.text), result.text
        assert result.finish_reason == "stop"
        assert eos(byte_vocab) not in result.token_ids


def test_eos_is_allowed_as_soon_as_the_grammar_accepts(byte_vocab, compiler):
    eager = prefers(byte_vocab, {"EOS": 50.0, "a": 40.0})
    result = run(byte_vocab, compiler, model=eager, regex=r"a+")
    assert result.text == "a" and result.finish_reason == "stop"


# --- forced tokens ----------------------------------------------------------------------------


def test_forced_tokens_skip_sampling_and_reach_the_model_together(byte_vocab, compiler):
    lm = prefers(byte_vocab, {"7": 5.0})
    result = run(byte_vocab, compiler, model=lm, regex=r"xyz[0-9]")
    assert result.text == "xyz7" and result.finish_reason == "stop"
    assert result.forced_tokens == 3
    # one model call: the digit. x, y, z were forced; after the digit only EOS is possible
    assert lm.calls == 1
    assert lm.prefixes[0][-3:] == tuple(tok(byte_vocab, c) for c in "xyz")


def test_fast_forward_off_samples_every_token(byte_vocab, compiler):
    lm = prefers(byte_vocab, {"7": 5.0})
    result = run(byte_vocab, compiler, model=lm, regex=r"xyz[0-9]", fast_forward=False)
    assert result.text == "xyz7" and result.forced_tokens == 0
    assert lm.calls == 5  # x, y, z, 7, EOS


def test_forced_tokens_count_against_the_budget(byte_vocab, compiler):
    lm = prefers(byte_vocab, {})
    result = run(byte_vocab, compiler, model=lm, regex=r"abcdefgh", max_tokens=3, budget_closing=False)
    assert result.finish_reason == "length"
    assert len(result.token_ids) <= 3


# --- budget-aware closing ---------------------------------------------------------------------


def never_closes(vocab):
    return prefers(vocab, {"a": 10.0, ",": 9.0, "]": -20.0, "EOS": -20.0})


@pytest.mark.parametrize("max_tokens", [4, 5, 6, 9, 13, 20])
def test_budget_closing_returns_a_complete_value(byte_vocab, compiler, max_tokens):
    result = run(byte_vocab, compiler, model=never_closes(byte_vocab), regex=LIST, max_tokens=max_tokens)
    assert re.fullmatch(LIST, result.text), result.text
    assert result.finish_reason == "stop"
    assert len(result.token_ids) + 1 <= max_tokens  # EOS counts against the budget


def test_without_budget_closing_the_same_model_is_truncated(byte_vocab, compiler):
    result = run(byte_vocab, compiler, model=never_closes(byte_vocab), regex=LIST, max_tokens=12,
                 budget_closing=False)
    assert result.finish_reason == "length"
    assert not re.fullmatch(LIST, result.text)
    assert len(result.token_ids) == 12


def test_impossible_budget_ends_with_length(byte_vocab, compiler):
    # the shortest completion is "[a]" + EOS = 4 tokens
    result = run(byte_vocab, compiler, model=never_closes(byte_vocab), regex=LIST, max_tokens=3)
    assert result.finish_reason == "length"
    assert len(result.token_ids) == 3


def test_budget_closing_on_nested_json(byte_vocab, compiler, json_gbnf):
    """A model that opens brackets and writes string content forever still yields parseable JSON."""
    lm = prefers(byte_vocab, {'{"': 8.0, "[": 7.0, "a": 6.0, '":': 6.0, '"': 5.0, "{": 5.0,
                              "}": -30.0, "]": -30.0, '"}': -30.0, "EOS": -30.0})
    for max_tokens in (8, 16, 30):
        result = run(byte_vocab, compiler, model=lm, grammar=json_gbnf, max_tokens=max_tokens)
        json.loads(result.text)
        assert result.finish_reason == "stop" and len(result.token_ids) < max_tokens
        assert result.budget_steered >= 1


def test_budget_closing_with_a_json_schema(byte_vocab, compiler):
    pytest.importorskip("grammars.frontends.json_schema")
    jsonschema = pytest.importorskip("jsonschema")
    schema = {"type": "object", "properties": {"name": {"type": "string"}, "tags": {"type": "array",
              "items": {"type": "string"}}}, "required": ["name", "tags"], "additionalProperties": False}
    lm = prefers(byte_vocab, {"a": 10.0, "b": 9.0, "EOS": -30.0, '"': -5.0, "]": -30.0})
    for max_tokens in (20, 28):
        result = run(byte_vocab, compiler, model=lm, schema=schema, max_tokens=max_tokens)
        assert result.finish_reason == "stop", result.text
        jsonschema.validate(result.value, schema)


# --- stop strings, budgets, seeds, batches ------------------------------------------------------


def spells(vocab, text: str, prompt_len: int) -> ScriptedLM:
    """A model that spells ``text`` one byte at a time, then wants EOS."""
    data = text.encode()

    def script(prefix):
        i = len(prefix) - prompt_len
        return {tok(vocab, data[i : i + 1]) if i < len(data) else eos(vocab): 30.0}

    return ScriptedLM(vocab.logits_width, script)


def test_stop_string_cuts_the_text(byte_vocab, compiler):
    lm = spells(byte_vocab, "hello world!", prompt_len=1)
    result = run(byte_vocab, compiler, model=lm, stop=["wor", "zzz"])
    assert result.text == "hello " and result.finish_reason == "stop_string"
    assert byte_vocab.decode(result.token_ids) == b"hello wor"


def test_stop_string_with_a_regex(byte_vocab, compiler):
    lm = spells(byte_vocab, "abcabc", prompt_len=1)
    result = run(byte_vocab, compiler, model=lm, regex=r"[abc]+", stop="ca")
    assert result.text == "ab" and result.finish_reason == "stop_string"


def test_max_tokens_is_a_hard_bound(byte_vocab, compiler):
    chatty = prefers(byte_vocab, {"EOS": -50.0})
    for max_tokens in (1, 2, 7):
        result = run(byte_vocab, compiler, model=chatty, max_tokens=max_tokens)
        assert len(result.token_ids) == max_tokens and result.finish_reason == "length"


def random_lm(vocab) -> ScriptedLM:
    """Deterministic pseudo-random logits per prefix, so different seeds pick different paths."""

    def script(prefix):
        gen = torch.Generator().manual_seed(hash(prefix) % (2**31))
        return torch.randn(vocab.logits_width, generator=gen) * 3

    return ScriptedLM(vocab.logits_width, script)


def test_same_seed_same_output(byte_vocab, compiler):
    lm = random_lm(byte_vocab)
    outs = [run(byte_vocab, compiler, model=lm, regex=r"[a-z]{2,10}", seed=s).text for s in (3, 3, 4, 5, 6)]
    assert outs[0] == outs[1]
    assert len(set(outs[1:])) > 1


def test_batch_equals_sequential_with_the_same_seeds(byte_vocab, compiler):
    lm = random_lm(byte_vocab)
    prompts = ["A", "BB", "C"]
    batch = generate_batch(prompts, model=lm, tokenizer=byte_vocab, compiler=compiler, regex=LIST,
                           seed=11, max_tokens=12)
    single = [generate(p, model=lm, tokenizer=byte_vocab, compiler=compiler, regex=LIST, seed=11 + i,
                       max_tokens=12) for i, p in enumerate(prompts)]
    assert [r.token_ids for r in batch] == [r.token_ids for r in single]
    assert [r.finish_reason for r in batch] == [r.finish_reason for r in single]
    explicit = generate_batch(prompts, model=lm, tokenizer=byte_vocab, compiler=compiler, regex=LIST,
                              seed=[11, 12, 13], max_tokens=12)
    assert [r.token_ids for r in explicit] == [r.token_ids for r in batch]


def test_direct_sampling_equals_the_masked_sampler(byte_vocab, compiler):
    """The loop's own draw (no second masking) picks exactly what MaskedSampler.draw picks."""
    lm = random_lm(byte_vocab)
    grammar = compiler.compile_regex(LIST)
    params = SamplingParams(temperature=0.8, top_p=0.9)
    outs = []
    for direct in (params, None):
        options = DecodeOptions(max_tokens=15, direct_params=direct)
        out = decode(lm, byte_vocab, [[tok(byte_vocab, "P")]] * 3, [grammar.matcher() for _ in range(3)],
                     [MaskedSampler(params).start(None) for _ in range(3)],
                     [torch.Generator().manual_seed(s) for s in range(3)], options,
                     planner=ClosingPlanner(byte_vocab))
        outs.append([o.token_ids for o in out])
    assert outs[0] == outs[1]


def test_timings_and_counts_are_reported(byte_vocab, compiler):
    result = run(byte_vocab, compiler, model=random_lm(byte_vocab), regex=LIST, max_tokens=10)
    assert result.first_token_s is not None and result.first_token_s >= 0
    assert result.per_token_s and all(t >= 0 for t in result.per_token_s)
    assert result.mean_token_s is not None and result.compile_s >= 0
    assert result.prompt_token_ids == [tok(byte_vocab, "P")]


# --- samplers -------------------------------------------------------------------------------


class CountingSampler:
    """A TokenSampler that is not MaskedSampler: the loop gives it raw logits and no fast-forward."""

    def __init__(self):
        self.inner = MaskedSampler()
        self.draws = 0
        self.finished = []

    def start(self, key):
        outer = self
        run = self.inner.start(key)

        class Run:
            def draw(self, logits, matcher, generator):
                outer.draws += 1
                return run.draw(logits, matcher, generator)

            def finish(self, tokens, completed):
                outer.finished.append(completed)

        return Run()


def test_custom_token_sampler_gets_every_step(byte_vocab, compiler):
    sampler = CountingSampler()
    result = run(byte_vocab, compiler, model=prefers(byte_vocab, {"7": 5.0}), regex=r"xyz[0-9]", sampler=sampler)
    assert result.text == "xyz7"
    assert sampler.draws == 5 and sampler.finished == [True]


class GreedySequenceSampler:
    """A decoder-level sampler (the SMC seam): its own loop over the batch logits callback."""

    def run(self, logits_fn, matcher, *, max_tokens, generator):
        m = matcher.fork()
        tokens = []
        while len(tokens) < max_tokens and not m.is_terminated():
            logits = logits_fn([tokens])[0]
            token = next(t for t in torch.argsort(logits, descending=True).tolist() if m.allows(t))
            m.advance(token)
            tokens.append(token)
        done = m.is_terminated()

        class Result:
            def __init__(self):
                self.tokens = [tuple(tokens)]
                self.completed = [done]
                self.log_weights = [0.0]
                self.log_ml = 0.0

            def sample(self, generator):
                return self.tokens[0]

        return Result()


def test_sequence_sampler_seam(byte_vocab, compiler):
    result = run(byte_vocab, compiler, model=prefers(byte_vocab, {"b": 5.0, "EOS": 6.0}), regex=r"a?b+",
                 sampler=GreedySequenceSampler())
    assert result.text == "b" and result.finish_reason == "stop"
    chatty = prefers(byte_vocab, {"b": 5.0, "EOS": -6.0})
    closed = run(byte_vocab, compiler, model=chatty, regex=r"a?b+", sampler=GreedySequenceSampler(), max_tokens=4)
    assert closed.text == "bbb" and closed.finish_reason == "stop"  # closing narrows its matcher too
    truncated = run(byte_vocab, compiler, model=chatty, regex=r"a?b+", sampler=GreedySequenceSampler(), max_tokens=4,
                    budget_closing=False)
    assert truncated.text == "bbbb" and truncated.finish_reason == "length"


@pytest.mark.parametrize("name", ["asap", "awrs", "smc"])
def test_named_samplers_produce_valid_output(byte_vocab, compiler, name):
    try:
        resolve_sampler(name)
    except ValueError:
        pytest.skip(f"samplers.{name} is not available in this checkout")
    lm = random_lm(byte_vocab)
    result = run(byte_vocab, compiler, model=lm, regex=LIST, sampler=name, max_tokens=40)
    if result.finish_reason == "stop":
        assert re.fullmatch(LIST, result.text), result.text
    else:
        assert result.finish_reason == "length"


def test_resolve_sampler():
    assert isinstance(resolve_sampler("masked"), MaskedSampler)
    assert resolve_sampler("masked", SamplingParams(temperature=0)).params.temperature == 0
    with pytest.raises(ValueError, match="unknown sampler"):
        resolve_sampler("beam")
    with pytest.raises(TypeError, match="start"):
        resolve_sampler(object())
    for name in ("asap", "awrs", "smc"):
        try:
            sampler = resolve_sampler(name)
        except ValueError as exc:  # not written yet in this checkout: a clear message
            assert name in str(exc) and "not available" in str(exc)
        else:
            assert callable(getattr(sampler, "start", None)) or callable(getattr(sampler, "run", None))


# --- arguments --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"regex": "a", "grammar": 'root ::= "a"'}, ValueError, "at most one constraint"),
        ({"regex": "a", "whitespace": "compact"}, ValueError, "schema= only"),
        ({"schema": {"type": "string"}, "stop": "x"}, ValueError, "stop= cannot"),
        ({"regex": 5}, TypeError, "regex must be a str"),
        ({"grammar": 5}, TypeError, "grammar must be"),
        ({"max_tokens": 0}, ValueError, "max_tokens"),
        ({"stop": [""]}, ValueError, "stop"),
        ({"seed": [1, 2]}, ValueError, "one per prompt"),
        ({"sampler": "nope"}, ValueError, "unknown sampler"),
        ({"sampler": object()}, TypeError, "start"),
        ({"temperature": -1.0}, ValueError, "temperature"),
        ({"temperature": float("nan")}, ValueError, "temperature"),
        ({"temperature": float("inf")}, ValueError, "temperature"),
        ({"temperature": "hot"}, TypeError, "temperature"),
        ({"top_p": float("nan")}, ValueError, "top_p"),
        ({"top_k": 2.5}, TypeError, "top_k"),
        ({"schema": 5}, TypeError, "schema must be"),
        ({"budget_closing": "yes"}, TypeError, "budget_closing must be a bool"),
        ({"fast_forward": 1}, TypeError, "fast_forward must be"),
        ({"seed": 2**64}, ValueError, "out of range"),
        ({"seed": [1.5]}, TypeError, "seed must be"),
        ({"device": "banana"}, ValueError, "unknown device"),
        ({"device": "meta"}, ValueError, "not available"),
        ({"dtype": "float7"}, ValueError, "unknown dtype"),
        ({"regex": "a", "sampler": "asap", "fast_forward": True}, ValueError, "fast_forward"),
    ],
)
def test_bad_arguments_raise_with_a_fix(byte_vocab, compiler, kwargs, error, match):
    lm = prefers(byte_vocab, {})
    with pytest.raises(error, match=match):
        generate("P", model=lm, tokenizer=byte_vocab, compiler=compiler, **kwargs)


def test_options_are_one_dataclass_given_by_name_or_prepared(byte_vocab, compiler):
    lm = random_lm(byte_vocab)
    prepared = GenerationOptions(regex=LIST, tokenizer=byte_vocab, compiler=compiler, max_tokens=30, seed=4)
    by_name = generate("P", model=lm, regex=LIST, tokenizer=byte_vocab, compiler=compiler, max_tokens=30, seed=4)
    assert generate("P", model=lm, options=prepared).token_ids == by_name.token_ids
    overridden = generate("P", model=lm, options=prepared, seed=5, max_tokens=3)
    assert overridden.finish_reason == "length" and len(overridden.token_ids) == 3  # keywords win
    assert prepared.max_tokens == 30  # frozen: the prepared options are untouched


def test_options_check_before_any_model_and_name_the_typo():
    with pytest.raises(ValueError, match="at most one constraint"):
        GenerationOptions(regex="a", grammar='root ::= "a"')
    with pytest.raises(ValueError, match="temperature"):
        GenerationOptions(temperature=-1.0)
    with pytest.raises(TypeError, match="compiler must be a grammars.Compiler"):
        GenerationOptions(compiler="yes")
    with pytest.raises(TypeError, match="unexpected keyword argument 'max_token'; did you mean 'max_tokens'"):
        generate("P", model=object(), max_token=5)


def test_signatures_show_every_option_with_its_one_default():
    import dataclasses
    import inspect

    defaults = {f.name: f.default for f in dataclasses.fields(GenerationOptions)}
    for func in (generate, generate_batch):
        params = inspect.signature(func).parameters
        assert {name: params[name].default for name in defaults} == defaults
        assert params["model"].kind is inspect.Parameter.KEYWORD_ONLY


def test_model_and_tokenizer_errors(byte_vocab):
    lm = prefers(byte_vocab, {})
    with pytest.raises(TypeError, match="tokenizer="):
        generate("P", model=lm)
    with pytest.raises(TypeError, match="model must be"):
        generate("P", model=object(), tokenizer=byte_vocab)
    with pytest.raises(ValueError, match="logits width|scores only"):
        generate("P", model=ScriptedLM(10, [{}]), tokenizer=byte_vocab)
    other = Compiler(byte_vocab).compile_regex("a")
    wide = ScriptedLM(byte_vocab.logits_width + 32, lambda p: {})
    with pytest.raises(ValueError, match="different vocabulary"):
        generate("P", model=wide, tokenizer=byte_vocab, grammar=other)


def test_grammar_errors_propagate_typed(byte_vocab, compiler):
    from grammars import GrammarSyntaxError

    with pytest.raises(GrammarSyntaxError):
        generate("P", model=prefers(byte_vocab, {}), tokenizer=byte_vocab, compiler=compiler, grammar="root ::= (")


class DeadEnd:
    """A matcher stuck where nothing, not even EOS, is allowed (a vocabulary that cannot spell the
    grammar's only continuation)."""

    num_consumed = 0

    def fill_mask(self, out, row=0):
        out[row] = 0

    def is_terminated(self):
        return False

    def forced_tokens(self, max_tokens=64):
        return []


def test_a_dead_end_raises_no_allowed_token_a_constraint_error(byte_vocab):
    from grammars import ConstraintError
    from samplers import NoAllowedToken

    with pytest.raises(ConstraintError) as caught:
        decode(prefers(byte_vocab, {"a": 1.0}), byte_vocab, [[0]], [DeadEnd()], [MaskedSampler().start()], [None])
    assert type(caught.value) is NoAllowedToken and "allows no token" in str(caught.value)


def test_a_constraint_that_accepts_nothing_raises_before_generating(byte_vocab):
    from grammars import EmptyLanguageError

    lm = prefers(byte_vocab, {})
    with pytest.raises(EmptyLanguageError):  # the default Compiler refuses it when compiling
        generate("P", model=lm, tokenizer=byte_vocab, schema=False)
    permissive = Compiler(byte_vocab, allow_empty_language=True)
    empty = permissive.compile_json_schema({"type": "integer", "minimum": 3, "maximum": 2})
    assert empty.accepts_nothing
    for kwargs in ({"grammar": empty}, {"schema": False, "compiler": permissive}):
        with pytest.raises(EmptyLanguageError, match="accepts no output"):
            generate("P", model=lm, tokenizer=byte_vocab, **kwargs)
