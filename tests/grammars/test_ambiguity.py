"""Ambiguous grammars: the work per token stays polynomial in the text, the language stays exact,
and the bounds on ambiguity and time leave the matcher unchanged and usable.

The parser shares parses in a graph-structured stack (``grammars.automata.lr``). The size and
work checks fail on a parser keeping one linear stack per parse: its states grow with the text
and its masks with their paths (``a ::= a a | "x"`` took seconds a token by the 50th on Llama 3's
vocabulary). Exactness is checked against references sharing no code with the parser: the
character-level Earley oracle, the matcher laws, and a textbook LR(0) run over linear stacks.
"""

from __future__ import annotations

import random
import types

import numpy as np
import pytest

from grammars import Compiler, LimitExceeded, Limits, TokenVocabulary, allocate_token_bitmask
from grammars.automata import lr as lr_module
from grammars.testing.laws import MatcherLaws, allowed_tokens
from grammars.testing.oracles import char_level_accepts

GRAMMARS = {
    "binary": 'root ::= a\na ::= a a | "x"',
    "binary-ternary": 'root ::= s\ns ::= s s | s s s | "x"',
    "expression": 'root ::= e\ne ::= e "+" e | e "*" e | "n"',
    # unit cycles a -> b -> c -> a, left recursion (a "+" b, a "-"), right recursion (c "*" b)
    "cycles": 'root ::= a\na ::= b | a "+" b | "(" a ")"\nb ::= c | c "*" b | a "-"\nc ::= a | "n" | b',
}
ALPHABETS = {"binary": "xy", "binary-ternary": "xy", "expression": "n+*", "cycles": "n+*-()"}
VALID_TEXTS = {
    "binary": "x" * 24,
    "binary-ternary": "x" * 24,
    "expression": "n+n*n+n*n*n+n+n",
    "cycles": "(n-*n)+n--*(n+n)-",
}
PIECES = [b"x", b"y", b"xx", b"xxx", b"xxxxxxxx", b"xy", b"n", b"+", b"*", b"-", b"(", b")",
          b"n+", b"+n", b"n*n", b"n)", b"(n", b"--", b"-*"]


@pytest.fixture(scope="module")
def vocab() -> TokenVocabulary:
    eos = len(PIECES)
    return TokenVocabulary.from_bytes(PIECES + [b""], eos_token_ids=[eos], special_token_ids=[eos])


@pytest.fixture(scope="module")
def compiler(vocab) -> Compiler:
    return Compiler(vocab)


def _token(vocab: TokenVocabulary, text: str) -> int:
    return vocab.token_bytes.index(text.encode())


def _run(matcher, vocab, text: str) -> tuple[int, bool]:
    """(characters consumed before the first rejected one, accepting at the end), one
    character token at a time."""
    for i, ch in enumerate(text):
        if matcher.try_advance([_token(vocab, ch)]) != 1:
            return i, False
    return len(text), matcher.is_accepting()


# --- polynomial work ---------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["binary", "binary-ternary"])
def test_work_per_token_stays_polynomial(compiler, vocab, name):
    """240 tokens of ``x`` with a mask at each: the state keeps a constant size, each token
    creates a constant number of stack nodes, and the closure work of token n is O(n^2) (the
    GSS bound for binary rules; a linear-stack parser's grows exponentially)."""
    grammar = compiler.compile_gbnf(GRAMMARS[name])
    parser = grammar._runtime.parser
    matcher = grammar.matcher()
    words = allocate_token_bitmask(1, vocab.logits_width)
    x = _token(vocab, "x")
    work, nodes, sizes = [], [], []
    for n in range(1, 241):
        work0, nodes0 = parser.work, parser.nodes_created
        matcher.fill_mask(words, 0)
        matcher.advance(x)
        work.append(parser.work - work0)
        nodes.append(parser.nodes_created - nodes0)
        sizes.append(len(matcher.state))
        assert matcher.is_accepting(), n
        assert work[-1] <= 2 * (n + 8) ** 2, (n, work[-1])  # its mask parses up to 8 x's ahead
    assert max(sizes) <= 4, sizes
    assert max(nodes[1:]) <= 8, nodes  # the first mask looks 8 tokens ahead, then one more each
    assert work[-1] > work[119] > work[59] > 0  # the counter does count: work grows with the text
    assert work[-1] <= 5 * work[119], (work[119], work[-1])  # ~4x for quadratic
    MatcherLaws(matcher, vocab).check_all()


def test_expression_grammar_stays_small_along_a_long_text(compiler, vocab):
    """``n+n*n...`` has Catalan-many parses; the state stays a handful of configurations."""
    matcher = compiler.compile_gbnf(GRAMMARS["expression"]).matcher()
    tokens = [_token(vocab, ch) for ch in "n" + "+n*n" * 60]
    for i, token in enumerate(tokens):
        matcher.advance(token)
        assert len(matcher.state) <= 8, (i, len(matcher.state))
    assert matcher.is_accepting()


# --- exactness ---------------------------------------------------------------------------------


def _random_texts(grammar, vocab, alphabet: str, rng: random.Random, count: int) -> set[str]:
    """Texts over ``alphabet``: half uniform, half a walk that takes a character the matcher
    allows 4 times in 5 (so that prefixes of the language and sentences are frequent too)."""
    texts = {"".join(rng.choice(alphabet) for _ in range(rng.randint(1, 9))) for _ in range(count // 2)}
    for _ in range(count // 2):
        probe, text = grammar.matcher(), ""
        for _ in range(rng.randint(1, 10)):
            allowed = [ch for ch in alphabet if probe.allows(_token(vocab, ch))]
            ch = rng.choice(allowed) if allowed and rng.random() < 0.8 else rng.choice(alphabet)
            text += ch
            if probe.try_advance([_token(vocab, ch)]) != 1:
                break
        texts.add(text)
    return texts


@pytest.mark.parametrize("name", sorted(GRAMMARS))
def test_language_is_the_oracle_s(compiler, vocab, name):
    """Random texts over the grammar's characters: accepted iff the Earley oracle accepts, and
    every prefix the matcher keeps alive completes (by its shortest completion) to a sentence."""
    grammar = compiler.compile_gbnf(GRAMMARS[name])
    texts = {""} | _random_texts(grammar, vocab, ALPHABETS[name], random.Random(sum(map(ord, name))), 200)
    accepted = rejected = 0
    for text in sorted(texts):
        matcher = grammar.matcher()
        consumed, accepts = _run(matcher, vocab, text)
        assert accepts == char_level_accepts(grammar.grammar, text), text
        accepted += accepts
        rejected += consumed < len(text)
        completion = matcher.shortest_completion_text()
        assert completion is not None, (text, consumed)
        assert char_level_accepts(grammar.grammar, text[:consumed] + completion.decode()), (text, completion)
    assert accepted >= 5 and rejected >= 5, (accepted, rejected)  # both sides of the language


@pytest.mark.parametrize("name", sorted(GRAMMARS))
def test_matcher_laws_along_a_valid_text(compiler, vocab, name):
    matcher = compiler.compile_gbnf(GRAMMARS[name]).matcher()
    text = VALID_TEXTS[name]
    for i, ch in enumerate(text):
        if i < 6 or i % 5 == 0:
            MatcherLaws(matcher, vocab).check_all()
        matcher.advance(_token(vocab, ch))
    assert matcher.is_accepting()
    MatcherLaws(matcher, vocab).check_all()


def _linear_stacks(node) -> set[tuple[int, ...]]:
    """Every linear stack (bottom first) a graph-structured stack node stands for."""
    if not node.parents:
        return {(node.state,)}
    return {below + (node.state,) for parent in node.parents for below in _linear_stacks(parent)}


def _textbook_reduce(lr, stacks: set[tuple[int, ...]]) -> set[tuple[int, ...]]:
    """Every linear stack reachable from ``stacks`` by LR(0) reductions (``stacks`` included)."""
    seen = set(stacks)
    todo = list(stacks)
    while todo:
        stack = todo.pop()
        for p in lr.state(stack[-1]).reductions:
            below = stack[: len(stack) - len(lr.rhs[p])]
            reduced = below + (lr.goto(below[-1], lr.lhs[p]),)
            if reduced not in seen:
                seen.add(reduced)
                todo.append(reduced)
    return seen


def _terminal(cfg, lexeme: bytes) -> int:
    """The index of the terminal whose DFA accepts exactly ``lexeme`` among the grammar's."""
    for t, dfa in enumerate(cfg.terminals):
        state = dfa.start
        for byte in lexeme:
            state = int(dfa.table[state, byte]) if state >= 0 else -1
        if state >= 0 and dfa.accepting[state]:
            return t
    raise AssertionError(f"no terminal for {lexeme!r}")


@pytest.mark.parametrize("name,text", [("expression", "n+n*n+n*n+n"), ("cycles", "(n-*n)+n+n*n+n-"),
                                       ("binary-ternary", "xxxxxxx")])
def test_graph_stack_stands_for_exactly_the_textbook_linear_stacks(compiler, name, text):
    """Terminal by terminal, the nodes ``Parser.shift`` builds stand for exactly the linear
    stacks of a textbook LR(0) run following every action, and acceptance agrees."""
    grammar = compiler.compile_gbnf(GRAMMARS[name])
    cfg, parser = grammar._cfg, grammar._runtime.parser
    lr = parser.lr
    nodes = [parser.root]
    stacks = {(lr.initial,)}
    most_parses = 0
    for ch in text:
        symbol = ~_terminal(cfg, ch.encode())
        reduced = _textbook_reduce(lr, stacks)
        stacks = {s + (lr.goto(s[-1], symbol),) for s in reduced if symbol in lr.state(s[-1]).shifts}
        nodes = list(dict.fromkeys(s for n in nodes for s in parser.shift(n, ~symbol)))
        assert set().union(*(_linear_stacks(n) for n in nodes)) == stacks, ch
        assert len(nodes) == len({lr.goto(s[-2], symbol) for s in stacks}), "one node per goto state"
        most_parses = max(most_parses, len(stacks))
    accepts = any(lr.state(s[-1]).accepts for s in _textbook_reduce(lr, stacks))
    assert accepts and any(parser.transitions(n).accepts for n in nodes)
    assert most_parses > 4  # the text is ambiguous: several linear stacks shared by few nodes


# --- limits ------------------------------------------------------------------------------------

HIGHLY_AMBIGUOUS = 'root ::= s\ns ::= s s | s s s | s s s s | "(" s ")" | "x"'


def _masks_along(grammar, vocab, tokens: list[int]) -> list[np.ndarray]:
    matcher = grammar.matcher()
    out = []
    for token in tokens:
        out.append(allowed_tokens(matcher, vocab.logits_width))
        matcher.advance(token)
    return out


def test_ambiguity_bound_raises_and_leaves_the_matcher_usable(vocab):
    """Under a small ``max_parser_stacks`` a long ambiguous text hits the bound: the error
    names it, the matcher keeps its state, the same call fails the same way again (the bound is
    deterministic), and rolled back the matcher goes on as one of the unbounded grammar does."""
    limited = Compiler(vocab, limits=Limits(max_parser_stacks=60)).compile_gbnf(HIGHLY_AMBIGUOUS)
    matcher = limited.matcher()
    x = _token(vocab, "x")

    def mask_and_advance() -> None:
        allowed_tokens(matcher, vocab.logits_width)
        matcher.advance(x)

    for _ in range(200):
        before = matcher.freeze()
        try:
            mask_and_advance()
        except LimitExceeded as exc:
            assert exc.limit == "max_parser_stacks"
            break
    else:
        pytest.fail("the bound never fired")
    hit_at = matcher.num_consumed
    assert hit_at > 3 and matcher.freeze() == before
    with pytest.raises(LimitExceeded):
        mask_and_advance()
    assert matcher.num_consumed == hit_at and matcher.freeze() == before
    matcher.rollback(hit_at - 2)
    tokens = [_token(vocab, ch) for ch in "x(x)"]
    assert matcher.try_advance(tokens) == len(tokens)
    reference = Compiler(vocab).compile_gbnf(HIGHLY_AMBIGUOUS)
    assert np.array_equal(allowed_tokens(matcher, vocab.logits_width),
                          _masks_along(reference, vocab, [x, x] + tokens + [x])[-1])
    MatcherLaws(matcher, vocab).check_all()


def test_configuration_bound_raises_and_leaves_the_matcher_usable(vocab):
    limited = Compiler(vocab, limits=Limits(max_configurations=2)).compile_gbnf(GRAMMARS["expression"])
    matcher = limited.matcher()
    with pytest.raises(LimitExceeded) as info:
        matcher.advance(_token(vocab, "n"))
    assert info.value.limit == "max_configurations"
    assert matcher.num_consumed == 0 and matcher.freeze() == limited.matcher().freeze()
    assert not matcher.is_accepting()


class _JumpyClock:
    """A stand-in for ``time`` that stands still, except that one reading in five (seeded) jumps
    a minute ahead: with ``max_step_seconds=1`` a call is cut at a random clock check, deep
    inside the parse or a mask walk, deterministically."""

    def __init__(self, seed: int) -> None:
        self.now = 0.0
        self.rng = random.Random(seed)

    def monotonic(self) -> float:
        if self.rng.random() < 0.2:
            self.now += 60.0
        return self.now


@pytest.mark.parametrize("seed", [0, 1])
def test_time_bound_aborts_mid_call_and_caches_keep_only_whole_values(vocab, monkeypatch, seed):
    """Every call is retried after ``LimitExceeded("max_step_seconds")`` until it finishes (the
    work already done is cached, so tries get further); the state never changes on an abort,
    and the masks met on the way are those of an unbounded compilation, so no cache kept a
    value an abort had cut short."""
    text = "x" * 30 + "(" + "x" * 10 + ")"
    tokens = [_token(vocab, ch) for ch in text]
    reference = _masks_along(Compiler(vocab).compile_gbnf(HIGHLY_AMBIGUOUS), vocab, tokens)
    limited = Compiler(vocab, limits=Limits(max_step_seconds=1.0)).compile_gbnf(HIGHLY_AMBIGUOUS)
    monkeypatch.setattr(lr_module, "time", types.SimpleNamespace(monotonic=_JumpyClock(seed).monotonic))
    matcher = limited.matcher()
    cut_steps = set()
    for step, token in enumerate(tokens):
        for _ in range(10_000):
            state = matcher.freeze()
            try:
                mask = allowed_tokens(matcher, vocab.logits_width)
                matcher.advance(token)
                break
            except LimitExceeded as exc:
                assert exc.limit == "max_step_seconds"
                assert matcher.freeze() == state and matcher.num_consumed == step
                cut_steps.add(step)
        else:
            pytest.fail(f"step {step} never finished")
        assert np.array_equal(mask, reference[step]), step
    assert len(cut_steps) > len(tokens) // 3, cut_steps
    assert matcher.is_accepting()


def test_time_bound_outside_any_call_never_fires(vocab):
    """The clock only runs inside a matcher call: a parser used directly is never cut short."""
    grammar = Compiler(vocab, limits=Limits(max_step_seconds=0.0)).compile_gbnf(GRAMMARS["binary"])
    parser = grammar._runtime.parser
    assert parser.transitions(parser.root).shifts
    with pytest.raises(LimitExceeded) as info:
        grammar.matcher().advance(_token(vocab, "x"))
    assert info.value.limit == "max_step_seconds"
    assert Limits().max_step_seconds == 10.0
