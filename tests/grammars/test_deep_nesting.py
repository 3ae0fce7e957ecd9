"""Deep nesting end to end: schemas, grammars, regexes and IR nested up to a thousand levels
compile, and their matchers accept a valid text and reject an invalid one, on Python's ordinary
stack. Every walk whose depth the input controls runs with an explicit stack (``run_frames``,
post-order loops): the front ends' parsers, IR hashing and equality, lowering, the NFA builder
and the compile cache key. Checks run with the recursion limit only a few hundred frames above
the caller, so a walk that recursed once per level would fail here; a construct nested past
what a dependency's own recursion allows (Lark's loader) is a typed ``LimitExceeded``.

Also: the JSON Schema front end checks ``const``/``enum`` sizes against the ``Compiler``'s
``Limits``, not the defaults.
"""

from __future__ import annotations

import json
import random
import sys
import time
from contextlib import contextmanager

import pytest

from grammars import Compiler, Grammar, LimitExceeded, Limits, TokenVocabulary, allocate_token_bitmask
from grammars.automata.frames import run_frames
from grammars.frontends import parse_gbnf, parse_lark, parse_regex
from grammars.frontends.json_schema import parse_json_schema
from grammars.frontends.json_schema.document import canonical_json, load_schema
from grammars.ir import Alt, Literal, Ref, Repeat, Seq

#: frames a compile and a match need above the caller, whatever the nesting depth (about 150
#: measured); a walk that recursed per level would need thousands at depth 1,000
STACK_HEADROOM = 400


@pytest.fixture(scope="module")
def vocab() -> TokenVocabulary:
    pieces = [bytes([b]) for b in range(256)]
    vocab = TokenVocabulary.from_bytes(pieces + [b""], eos_token_ids=[256], special_token_ids=[256])
    Compiler(vocab).compile_json_schema({"type": "array", "items": {"type": "integer"}}).matcher().allows(0)  # warm-up
    return vocab


def _depth() -> int:
    frame, n = sys._getframe(), 0
    while frame is not None:
        frame, n = frame.f_back, n + 1
    return n


@contextmanager
def shallow_stack():
    """Python's recursion limit set to ``STACK_HEADROOM`` frames above the caller."""
    old = sys.getrecursionlimit()
    sys.setrecursionlimit(_depth() + STACK_HEADROOM)
    try:
        yield
    finally:
        sys.setrecursionlimit(old)


def accepts(compiled, text: str) -> bool:
    matcher = compiled.matcher()
    data = list(text.encode())
    return matcher.try_advance(data) == len(data) and matcher.is_accepting()


def compile_and_judge(build, valid: str, invalid: str) -> float:
    """Seconds to compile; asserts ``valid`` is accepted and ``invalid`` rejected."""
    with shallow_stack():
        started = time.perf_counter()
        compiled = build()
        seconds = time.perf_counter() - started
        assert accepts(compiled, valid)
        assert not accepts(compiled, invalid)
    return seconds


def nested_objects(depth: int) -> dict:
    schema: dict = {"type": "integer"}
    for _ in range(depth):
        schema = {"type": "object", "properties": {"a": schema}, "required": ["a"]}
    return schema


def nested_arrays(depth: int) -> dict:
    schema: dict = {"type": "integer"}
    for _ in range(depth):
        schema = {"type": "array", "items": schema}
    return schema


# --- JSON Schema ----------------------------------------------------------------------------------


@pytest.mark.parametrize("depth", [150, 500, 1000])
def test_nested_object_schemas_compile_and_match(vocab, depth):
    compile_and_judge(lambda: Compiler(vocab).compile_json_schema(nested_objects(depth)),
                      '{"a":' * depth + "7" + "}" * depth, '{"a":' * depth + '"x"' + "}" * depth)


@pytest.mark.parametrize("depth", [150, 500, 1000])
def test_nested_array_schemas_compile_and_match(vocab, depth):
    compile_and_judge(lambda: Compiler(vocab).compile_json_schema(nested_arrays(depth)),
                      "[" * depth + "7" + "]" * depth, "[" * depth + "7" + "]" * (depth - 1))


def test_nested_any_of_and_deep_patterns(vocab):
    depth = 1000
    schema: dict = {"type": "integer"}
    for _ in range(depth):
        schema = {"anyOf": [{"type": "array", "items": schema}, {"type": "string"}]}
    compile_and_judge(lambda: Compiler(vocab).compile_json_schema(schema), "[" * depth + "7" + "]" * depth,
                      "[" * depth + "true" + "]" * depth)
    pattern = "^" + "(a|b" * depth + ")" * depth + "$"
    compile_and_judge(lambda: Compiler(vocab).compile_json_schema({"type": "string", "pattern": pattern}),
                      '"' + "b" * depth + '"', '"ab"')


def test_the_cache_key_of_a_deep_schema_is_its_canonical_text(vocab):
    """``json.dumps`` stops near 1,000 levels; ``canonical_json`` writes any depth, and the same
    text as ``json.dumps(sort_keys=True, ensure_ascii=False)`` wherever that works."""
    rng = random.Random(7)

    def value(level: int):
        kind = rng.randrange(6 if level < 4 else 4)
        if kind == 0:
            return rng.choice([None, True, False, 0, -3, 2.5, 1e300, "é\n\"x\\", ""])
        if kind == 1:
            return rng.randrange(-10**20, 10**20)
        if kind == 2:
            return "".join(rng.choice("ab\u00e9\u2028\"\\\x01") for _ in range(rng.randrange(5)))
        if kind == 3:
            return rng.random()
        if kind == 4:
            return [value(level + 1) for _ in range(rng.randrange(4))]
        return {rng.choice(["b", "a", "é", "", "a b", "Z"]): value(level + 1) for _ in range(rng.randrange(4))}

    for _ in range(300):
        document = load_schema({"x": value(0), "y": [value(1), {}]})
        assert canonical_json(document) == json.dumps(document, sort_keys=True, ensure_ascii=False)
    deep = load_schema(nested_arrays(3000))
    with shallow_stack():
        text = canonical_json(deep)
    assert text == '{"items": ' * 3000 + '{"type": "integer"}' + ', "type": "array"}' * 3000
    compiler = Compiler(vocab)
    assert compiler.compile_json_schema(nested_arrays(1200)) is compiler.compile_json_schema(nested_arrays(1200))


# --- GBNF, Lark, regex, IR ---------------------------------------------------------------------------


def test_gbnf_rules_nested_a_thousand_deep(vocab):
    depth = 1000
    text = 'root ::= "(" r1 ")"\n' + "".join(f'r{i} ::= "(" r{i + 1} ")"\n' for i in range(1, depth)) + f'r{depth} ::= "x"\n'
    valid = "(" * depth + "x" + ")" * depth
    compile_and_judge(lambda: Compiler(vocab).compile_gbnf(text), valid, valid[:-1])


def test_gbnf_parentheses_nested_a_thousand_deep(vocab):
    """The GBNF parser's groups, and a non-regular rule nested inside them."""
    depth = 1000
    text = "root ::= " + '("(" ' * depth + "root? " + '")")' * depth + ' | "x"\n'
    with shallow_stack():
        parse_gbnf(text)
    compile_and_judge(lambda: Compiler(vocab).compile_gbnf(text), "(" * depth + "x" + ")" * depth,
                      "(" * depth + "x" + ")" * (depth - 1))
    stars = "root ::= " + '("a" ' * depth + "[0-9]+ " + '"b")*' * depth + "\n"
    compile_and_judge(lambda: Compiler(vocab).compile_gbnf(stars), "a" * depth + "1" + "b" * depth, "a1b")


def test_lark_rules_nested_a_thousand_deep(vocab):
    depth = 1000
    text = 'start: "(" r1 ")"\n' + "".join(f'r{i}: "(" r{i + 1} ")"\n' for i in range(1, depth)) + f'r{depth}: "x"\n'
    valid = "(" * depth + "x" + ")" * depth
    compile_and_judge(lambda: Compiler(vocab).compile_lark(text), valid, valid[1:])


def test_lark_parentheses_past_its_loader_are_a_typed_limit():
    """Lark's own loader recurses once per nested parenthesis: past Python's limit the error is
    ``LimitExceeded("recursion")`` from ``parse_lark`` itself, never a ``RecursionError``."""
    text = "start: " + '("(" ' * 3000 + '"x"' + ' ")")' * 3000 + "\n"
    with pytest.raises(LimitExceeded) as info:
        parse_lark(text)
    assert info.value.limit == "recursion"
    assert parse_lark('start: ("(" "x" ")")\n').start == "start"  # usable afterwards


def test_regexes_nested_a_thousand_deep(vocab):
    depth = 1000
    compile_and_judge(lambda: Compiler(vocab).compile_regex("(" * depth + "a" + ")" * depth), "a", "aa")
    compile_and_judge(lambda: Compiler(vocab).compile_regex("(a|b" * depth + ")" * depth), "b" * depth, "b" * depth + "a")
    compile_and_judge(lambda: Compiler(vocab).compile_regex("(a" * depth + ")?" * depth), "a" * 10, "ab")
    compile_and_judge(lambda: Compiler(vocab).compile_regex("(" * depth + "a*" + ")*" * depth), "aaa", "b")
    with shallow_stack():
        assert parse_regex("(" * 5000 + "a" + ")" * 5000) == Literal("a")


def test_nested_repetitions_share_their_automata_without_nesting_calls(vocab):
    """Each repetition below the root is compiled once as a DFA of its own and embedded; those
    compilations run innermost first, so they do not nest however deep the repetitions go."""
    depth = 150
    compile_and_judge(lambda: Compiler(vocab).compile_regex("(a" * depth + "b" + ")*" * depth),
                      "a" * depth + "b", "a" * (depth - 1) + "b")


def _deep_regular_expr(depth: int):
    expr = Literal("x")
    for i in range(depth):
        expr = Seq((Literal("("), Alt((expr, Literal("y"))), Literal(")"))) if i % 2 else \
            Alt((Seq((Literal("["), expr, Literal("]"))), Literal("z")))
    return expr


def test_deep_ir_expressions_compile_and_match(vocab):
    depth = 1000  # even: the outermost node is a sequence
    regular = _deep_regular_expr(depth)
    compile_and_judge(lambda: Compiler(vocab).compile_grammar(Grammar.of({"root": regular}, "root")), "(y)", "(y")
    recursive: object = Ref("root")
    for _ in range(depth):
        recursive = Repeat(Seq((Literal("a"), recursive, Literal("b"))), 0, 2)
    grammar = Grammar.of({"root": Alt((recursive, Literal("x")))}, "root")  # type: ignore[arg-type]
    compile_and_judge(lambda: Compiler(vocab).compile_grammar(grammar), "aabbab", "aabba")
    compile_and_judge(lambda: Compiler(vocab).compile_grammar(grammar), "a" * depth + "x" + "b" * depth, "axb")


def test_deep_ir_hashes_and_compares_without_recursion():
    depth = 5000
    with shallow_stack():
        a, b = _deep_regular_expr(depth), _deep_regular_expr(depth)
        assert hash(a) == hash(b) and a == b and a == b
        assert a != _deep_regular_expr(depth - 1)
        assert {a: 1}[b] == 1
    # equal subtrees met crosswise are linked to one representative, never into a cycle
    x, y = _deep_regular_expr(50), _deep_regular_expr(50)
    assert Seq((x, y)) == Seq((y, x)) and x == y and y == x


def test_frames_throw_errors_into_their_callers():
    def leaf(n):
        if n == 0:
            raise KeyError("bottom")
        return (yield leaf(n - 1))

    def catcher():
        try:
            yield leaf(5000)
        except KeyError:
            return "caught"

    with shallow_stack():
        assert run_frames(catcher()) == "caught"
        with pytest.raises(KeyError):
            run_frames(leaf(5000))


# --- the matcher on a thousand-deep parser stack ----------------------------------------------------


def test_matching_a_thousand_deep_instance(vocab):
    depth = 1000
    compiled = Compiler(vocab).compile_json_schema(nested_arrays(depth))
    with shallow_stack():
        matcher = compiled.matcher()
        opened = list(("[" * depth + "7").encode())
        assert matcher.try_advance(opened) == len(opened)
        mask = allocate_token_bitmask(1, vocab.logits_width)
        matcher.fill_mask(mask, 0)
        assert matcher.allows(ord("]")) and not matcher.allows(ord("}"))
        assert matcher.shortest_completion_text() == b"]" * depth
        completion = matcher.shortest_completion()
        assert completion is not None and len(completion) == depth
        fork = matcher.fork()
        assert fork.try_advance(list(completion)) == depth and fork.is_accepting()
        matcher.rollback(depth)
        assert matcher.num_consumed == 1 and not matcher.is_accepting()


# --- the compiler's limits reach the JSON Schema front end -------------------------------------------


def test_small_limits_refuse_literals_the_defaults_admit(vocab):
    small = Compiler(vocab, limits=Limits(max_dfa_states=50))
    cases = [
        ({"enum": ["alpha", "beta", "gamma", "delta"]}, "max_dfa_states", "'enum' at #"),  # strings as one automaton
        ({"const": [1, "abcdefghijklmnop", 3]}, "max_dfa_states", "'const' at #"),  # one value's estimate
    ]
    for schema, limit, where in cases:
        assert parse_json_schema(load_schema(schema)).rules  # fits the defaults
        Compiler(vocab).compile_json_schema(schema)
        with pytest.raises(LimitExceeded) as info:
            small.compile_json_schema(schema)
        assert info.value.limit == limit and where in str(info.value), str(info.value)
    values = {"enum": [[1, 2], [3, 4], [5, 6], {"a": 1}, {"b": [1, 2, 3]}, None, True]}
    Compiler(vocab).compile_json_schema(values)
    with pytest.raises(LimitExceeded) as info:
        Compiler(vocab, limits=Limits(max_nfa_states=100)).compile_json_schema(values)  # the values together
    assert info.value.limit == "max_nfa_states" and "'enum' at #" in str(info.value)
    keys = {"type": "object", "properties": {"averyveryverylongpropertyname": {"type": "integer"}}}
    with pytest.raises(LimitExceeded) as info:
        small.compile_json_schema(keys)
    assert info.value.limit == "max_dfa_states"


def test_raised_limits_admit_a_literal_the_defaults_refuse(vocab):
    value = "ab" * 17_000  # about 204,000 byte states: past the default max_dfa_states=200,000
    with pytest.raises(LimitExceeded) as info:
        Compiler(vocab).compile_json_schema({"const": value})
    assert info.value.limit == "max_dfa_states" and "'const' at #" in str(info.value)
    compiled = Compiler(vocab, limits=Limits(max_dfa_states=400_000)).compile_json_schema({"const": value})
    assert accepts(compiled, json.dumps(value)) and not accepts(compiled, json.dumps(value[:-1]))
