"""The compile entry points check their arguments: a wrong type is a ``TypeError`` naming the
function and the parameter (``compile_regex(5)`` used to say "object of type 'int' has no len()"),
a wrong value a ``ValueError``; a correct call still compiles."""

from __future__ import annotations

import numpy as np
import pytest

from grammars import (
    Compiler,
    Grammar,
    Limits,
    allocate_token_bitmask,
    compile_gbnf,
    compile_grammar,
    compile_json_schema,
    compile_lark,
    compile_regex,
    parse_gbnf,
    parse_lark,
)


@pytest.fixture(scope="module")
def compiler(byte_vocab):
    return Compiler(byte_vocab)


@pytest.fixture(scope="module")
def grammar():
    return parse_gbnf('root ::= "a"')


NOT_TEXT = [5, None, b"a", ["a"], 1.5]


@pytest.mark.parametrize("bad", NOT_TEXT, ids=repr)
@pytest.mark.parametrize(
    ("call", "where", "param"),
    [
        (lambda v, c, x: compile_regex(x, v), "compile_regex", "pattern"),
        (lambda v, c, x: compile_gbnf(x, v), "compile_gbnf", "text"),
        (lambda v, c, x: compile_lark(x, v), "compile_lark", "text"),
        (lambda v, c, x: compile_lark('start: "a"', v, start=x), "compile_lark", "start"),
        (lambda v, c, x: c.compile_regex(x), "Compiler.compile_regex", "pattern"),
        (lambda v, c, x: c.compile_gbnf(x), "Compiler.compile_gbnf", "text"),
        (lambda v, c, x: c.compile_lark(x), "Compiler.compile_lark", "text"),
        (lambda v, c, x: c.compile_lark('start: "a"', start=x), "Compiler.compile_lark", "start"),
        (lambda v, c, x: parse_gbnf(x), "parse_gbnf", "text"),
        (lambda v, c, x: parse_lark(x), "parse_lark", "text"),
        (lambda v, c, x: parse_lark('start: "a"', start=x), "parse_lark", "start"),
    ],
    ids=lambda x: x if isinstance(x, str) else "",
)
def test_grammar_text_must_be_a_str(byte_vocab, compiler, call, where, param, bad):
    with pytest.raises(TypeError, match=rf"{where}: {param} must be a str"):
        call(byte_vocab, compiler, bad)


@pytest.mark.parametrize("bad", [5, None, [], 1.5, object()], ids=lambda bad: type(bad).__name__)
@pytest.mark.parametrize(
    ("call", "where"),
    [
        (lambda v, c, x: compile_json_schema(x, v), "compile_json_schema"),
        (lambda v, c, x: c.compile_json_schema(x), "Compiler.compile_json_schema"),
    ],
    ids=["function", "method"],
)
def test_a_schema_is_a_dict_bool_text_or_pydantic_class(byte_vocab, compiler, call, where, bad):
    pytest.importorskip("grammars.frontends.json_schema")
    with pytest.raises(TypeError, match=rf"{where}: schema must be"):
        call(byte_vocab, compiler, bad)


def test_every_schema_kind_is_taken(byte_vocab, compiler):
    pytest.importorskip("grammars.frontends.json_schema")
    pydantic = pytest.importorskip("pydantic")

    class Point(pydantic.BaseModel):
        x: int

    for schema in ({"type": "integer"}, True, '{"type": "integer"}', b'{"type": "integer"}', Point):
        assert compiler.compile_json_schema(schema).matcher() is not None
    with pytest.raises(TypeError, match="unexpected keyword|whitespac"):
        compiler.compile_json_schema({"type": "integer"}, whitespaces="compact")


@pytest.mark.parametrize("bad", [5, None, "gpt-2", {"a": 1}], ids=repr)
@pytest.mark.parametrize(
    ("call", "where"),
    [
        (lambda v: compile_regex("a", v), "compile_regex"),
        (lambda v: compile_gbnf('root ::= "a"', v), "compile_gbnf"),
        (lambda v: compile_lark('start: "a"', v), "compile_lark"),
        (lambda v: compile_json_schema({"type": "integer"}, v), "compile_json_schema"),
        (lambda v: compile_grammar(parse_gbnf('root ::= "a"'), v), "compile_grammar"),
        (lambda v: Compiler(v), "Compiler"),
    ],
    ids=lambda x: x if isinstance(x, str) else "",
)
def test_vocab_must_be_a_token_vocabulary(call, where, bad):
    with pytest.raises(TypeError, match=rf"{where}: vocab must be a TokenVocabulary"):
        call(bad)


def test_grammar_must_be_the_ir(byte_vocab, compiler, grammar):
    for bad in ('root ::= "a"', 5, None):
        with pytest.raises(TypeError, match="compile_grammar: grammar must be a grammars.Grammar"):
            compile_grammar(bad, byte_vocab)
        with pytest.raises(TypeError, match="Compiler.compile_grammar: grammar must be a grammars.Grammar"):
            compiler.compile_grammar(bad)
    assert isinstance(grammar, Grammar) and compile_grammar(grammar, byte_vocab).matcher().allows(ord("a"))


def test_compiler_argument_must_fit_the_vocabulary(byte_vocab, compiler):
    from grammars import TokenVocabulary

    with pytest.raises(TypeError, match="compile_regex: compiler must be a grammars.Compiler"):
        compile_regex("a", byte_vocab, compiler="yes")
    other = TokenVocabulary.from_bytes([b"a", b""], eos_token_ids=[1])
    with pytest.raises(ValueError, match="compile_regex: compiler was built for a different vocabulary"):
        compile_regex("a", other, compiler=compiler)
    assert compile_regex("a", byte_vocab, compiler=compiler) is compiler.compile_regex("a")  # cached


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"limits": {"max_dfa_states": 5}}, TypeError, "limits must be a grammars.Limits"),
        ({"cache_size": 0}, ValueError, "cache_size must be >= 1"),
        ({"cache_size": 2.5}, TypeError, "cache_size must be an int"),
        ({"cache_size": True}, TypeError, "cache_size must be an int"),
        ({"walk_cache_bytes": -1}, ValueError, "walk_cache_bytes must be >= 0"),
        ({"allow_empty_language": 1}, TypeError, "allow_empty_language must be a bool"),
    ],
)
def test_compiler_options_are_checked(byte_vocab, kwargs, error, match):
    with pytest.raises(error, match=rf"Compiler: {match}"):
        Compiler(byte_vocab, **kwargs)
    assert Compiler(byte_vocab, limits=Limits(), cache_size=1, walk_cache_bytes=0).compile_regex("a") is not None


@pytest.mark.parametrize(
    ("args", "error"),
    [((1.0, 10), TypeError), ((True, 10), TypeError), ((1, "10"), TypeError), ((-1, 10), ValueError),
     ((1, 0), ValueError)],
)
def test_allocate_token_bitmask_checks_its_sizes(args, error):
    with pytest.raises(error, match="allocate_token_bitmask"):
        allocate_token_bitmask(*args)
    assert allocate_token_bitmask(np.int64(2), 33).shape == (2, 2)


def test_token_dfa_checks_states_and_tokens(byte_vocab, compiler):
    dfa = compiler.compile_regex("ab+").as_dfa()
    for method in ("is_accepting", "transitions", "allowed_mask", "shortest_completion"):
        with pytest.raises(TypeError, match=f"TokenDFA.{method}: state must be an int"):
            getattr(dfa, method)(1.0)
        with pytest.raises(ValueError, match=f"TokenDFA.{method}: state {dfa.n_states} is not a state"):
            getattr(dfa, method)(dfa.n_states)
        with pytest.raises(ValueError, match="is not a state"):
            getattr(dfa, method)(-1)
    with pytest.raises(TypeError, match="TokenDFA.next_state: a token id must be an int"):
        dfa.next_state(dfa.start, 97.0)
    assert dfa.next_state(dfa.start, 2**63) == -1 and dfa.next_state(dfa.start, -5) == -1
    assert dfa.next_state(dfa.start, np.int64(ord("a"))) >= 0
