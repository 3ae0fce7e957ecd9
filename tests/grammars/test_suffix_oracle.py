"""``SuffixOracle``: the per-token completability check of an infilling decoder.

The oracle answers "is prefix · hole · x · hole · … completable" for a prefix that grows and
shrinks between calls while the suffix stays fixed, remembering what it learnt of the suffix. Its
answers must equal ``HoleChart.check``'s (which parses the suffix afresh every time) and brute
force's on bounded holes, whatever order the prefixes come in.
"""

from __future__ import annotations

import gzip
import json
import random

import pytest
from shared_data import shared_path
from test_holes import SMALL_GRAMMARS, brute_force

from grammars import (
    Compiler,
    Limits,
    TokenVocabulary,
    builtin_grammar,
    compile_gbnf,
    compile_json_schema,
)
from grammars.automata.holes import HoleChart
from grammars.automata.suffix import SuffixOracle
from grammars.errors import LimitExceeded

BYTES = [bytes([b]) for b in range(256)]


@pytest.fixture(scope="module")
def vocab():
    return TokenVocabulary.from_bytes(BYTES + [b""], eos_token_ids=[256], special_token_ids=[256])


def reference(grammar, prefix: bytes, parts: list[bytes], holes) -> bool:
    """The one-shot answer (``HoleChart.check`` on a fresh chart, adjacent holes merged)."""
    return grammar.completable([prefix, *parts], hole_bytes=holes)


def oracle_answer(oracle: SuffixOracle, chart: HoleChart, prefix: bytes) -> bool:
    """The oracle on ``prefix``, reusing ``chart`` (truncated to the common part, then extended)."""
    common = 0
    # the chart holds some earlier prefix; keep what it shares with this one
    held = getattr(chart, "_test_text", b"")
    while common < min(len(held), len(prefix)) and held[common] == prefix[common]:
        common += 1
    chart.truncate(common)
    chart.extend(prefix[common:])
    chart._test_text = prefix
    return oracle.completable(chart)


@pytest.mark.parametrize("name", sorted(SMALL_GRAMMARS))
def test_agrees_with_brute_force_and_the_chart_on_small_grammars(vocab, name):
    source, alphabet = SMALL_GRAMMARS[name]
    grammar = compile_gbnf(source, vocab)
    rng = random.Random(name)
    answers = {True: 0, False: 0}
    for _ in range(12):
        n_parts = rng.choice([1, 2, 2, 3])
        parts = [bytes(rng.choice(alphabet) for _ in range(rng.randint(0, 3))) for _ in range(n_parts)]
        bounded = rng.random() < 0.5
        holes = [(lo, lo + rng.randint(0, 2)) if bounded else (lo, None) for lo in
                 (rng.randint(0, 1) for _ in range(n_parts))]
        oracle = SuffixOracle(grammar.hole_grammar, parts, holes)
        chart = HoleChart(grammar.hole_grammar)
        # many prefixes, in random order, against one oracle: its memory must not leak answers
        for _ in range(10):
            prefix = bytes(rng.choice(alphabet) for _ in range(rng.randint(0, 6)))
            got = oracle_answer(oracle, chart, prefix)
            assert got == reference(grammar, prefix, parts, holes), (prefix, parts, holes)
            if bounded and n_parts <= 2:
                assert got == brute_force(grammar, [prefix, *parts], holes, alphabet), (prefix, parts, holes)
            answers[got] += 1
    assert answers[True] and answers[False], answers


def test_agrees_with_the_chart_on_a_json_schema(vocab):
    schema = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 6},
                                               "tags": {"type": "array", "items": {"enum": ["a", "bc"]}}},
              "required": ["name"], "additionalProperties": False}
    grammar = compile_json_schema(schema, vocab)
    text = b'{"name":"Alice","tags":["a","bc"]}'
    rng = random.Random(5)
    alphabet = b'{}[]",:abcnmetAlis'
    for _ in range(8):
        cut = sorted(rng.sample(range(len(text) + 1), 2))
        head, tail = text[:cut[0]], text[cut[1]:]
        parts = [tail]
        oracle = SuffixOracle(grammar.hole_grammar, parts, [(0, None)])
        chart = HoleChart(grammar.hole_grammar)
        for n in range(len(head) + 1):
            for prefix in (head[:n], head[:n] + bytes([rng.choice(alphabet)])):
                assert oracle_answer(oracle, chart, prefix) == reference(grammar, prefix, parts, [(0, None)]), \
                    (prefix, tail)


@pytest.fixture(scope="module")
def cpp(vocab):
    return Compiler(vocab).compile_lark(builtin_grammar("cpp"))


def test_agrees_with_the_chart_on_cpp_while_a_hole_is_written(cpp):
    """HumanEval-X programs with their last lines cut: the true fill written a few bytes at a time
    and, at each step, a corrupted variant; every answer is compared with a fresh chart's."""
    path = shared_path("humaneval-x", "humaneval_cpp.jsonl.gz")
    with gzip.open(path, "rt", encoding="utf-8") as f:
        tasks = [json.loads(line) for line in f]
    rng = random.Random(1)
    answers = {True: 0, False: 0}
    for task in tasks[2:4]:
        program = (task["declaration"] + task["canonical_solution"]).encode()
        lines = program.splitlines(keepends=True)
        cut_at = len(b"".join(lines[:-3]))
        end = cut_at + len(lines[-3]) + len(lines[-2])
        head, fill, tail = program[:cut_at], program[cut_at:end], program[end:]
        for holes, parts in (([(0, None)], [tail]), ([(0, None), (0, None)], [tail[:2], tail[3:]])):
            oracle = SuffixOracle(cpp.hole_grammar, parts, holes)
            chart = HoleChart(cpp.hole_grammar)
            at = 0
            while at <= len(fill):
                prefix = head + fill[:at]
                for candidate in (prefix, prefix + bytes([rng.choice(b"(){};=+x1 \n\"'")])):
                    got = oracle_answer(oracle, chart, candidate)
                    assert got == reference(cpp, candidate, parts, holes), (task["task_id"], candidate[-40:])
                    answers[got] += 1
                at += rng.randint(2, 8)
    assert answers[True] and answers[False], answers


def test_the_closing_question_and_bounded_first_holes(cpp):
    """A hole that must end here ((0, 0)) or has a byte budget: the oracle still agrees."""
    head = b"int f(int x) {\n  return x"
    parts = [b";\n}\n"]
    for holes in ([(0, 0)], [(0, 3)], [(2, None)]):
        oracle = SuffixOracle(cpp.hole_grammar, parts, holes)
        chart = HoleChart(cpp.hole_grammar)
        for extra in (b"", b" + 1", b" +", b" * (", b"}"):
            prefix = head + extra
            assert oracle_answer(oracle, chart, prefix) == reference(cpp, prefix, parts, holes), (holes, extra)


def test_past_its_limits_the_oracle_raises_and_never_guesses(cpp):
    limits = Limits(max_infill_items=2_000)
    head = b"int f(int x) {\n  int y = "
    oracle = SuffixOracle(cpp.hole_grammar, [b";\n  return y;\n}\n"], [(0, None)], limits)
    chart = HoleChart(cpp.hole_grammar)
    chart.extend(head)
    for _ in range(2):  # the pending work stays pending: a second call raises again
        with pytest.raises(LimitExceeded):
            oracle.completable(chart)
    roomy = SuffixOracle(cpp.hole_grammar, [b";\n  return y;\n}\n"], [(0, None)])
    assert roomy.completable(chart)


def test_the_empty_text_of_a_nullable_language(vocab):
    grammar = compile_gbnf('root ::= "ab"*', vocab)
    for parts, holes in (([b""], [(0, 0)]), ([b"", b""], [(0, 0), (0, 1)]), ([b"ab"], [(0, 0)]), ([b"b"], [(0, 0)])):
        oracle = SuffixOracle(grammar.hole_grammar, parts, holes)
        assert oracle.completable(HoleChart(grammar.hole_grammar)) == reference(grammar, b"", parts, holes), parts


def test_arguments_are_checked(cpp):
    with pytest.raises(ValueError, match="hole bounds"):
        SuffixOracle(cpp.hole_grammar, [b"x", b"y"], [(0, None)])
