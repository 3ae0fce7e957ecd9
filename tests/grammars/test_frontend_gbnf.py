"""The GBNF front end: llama.cpp's example grammars parse, small grammars have the expected IR,
errors point at the right line and column, and the languages are right (via the Lark oracle)."""

from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from grammars.errors import GrammarSyntaxError, UnsupportedGrammarError
from grammars.frontends import parse_gbnf
from grammars.ir import MAX_CODE_POINT, Alt, Chars, Literal, Ref, Repeat, Seq, chars
from grammars.testing.oracles import char_level_accepts
from shared_data import shared_path

SHARED_GRAMMARS = ["arithmetic", "c", "chess", "english", "japanese", "json", "json_arr", "list"]


def shared_grammar(name: str):
    path = shared_path("gbnf", f"{name}.gbnf")
    return parse_gbnf(path.read_text(encoding="utf-8"), source=str(path))


@pytest.mark.parametrize("name", SHARED_GRAMMARS)
def test_shared_grammars_parse(name: str) -> None:
    grammar = shared_grammar(name)
    assert grammar.start == "root"
    assert "root" in grammar.rule_map()


def test_every_shared_file_parses() -> None:
    folder = shared_path("gbnf")
    files = sorted(folder.glob("*.gbnf"))
    assert files
    for path in files:
        parse_gbnf(path.read_text(encoding="utf-8"), source=str(path))


# --- IR shapes --------------------------------------------------------------------------------


def test_small_grammar_shape() -> None:
    grammar = parse_gbnf('root ::= "ab" item* | "c"\nitem ::= [a-c0-9]\n')
    assert grammar.rule_map() == {
        "root": Alt((Seq((Literal("ab"), Repeat(Ref("item"), 0, None))), Literal("c"))),
        "item": chars(("a", "c"), ("0", "9")),
    }
    assert grammar.start == "root"


def test_escapes_are_code_points() -> None:
    text = r'root ::= "\x41\u00e9\U0001F600\n\r\t\\\"\[\]" [\x00-\x1F\]]'
    body = parse_gbnf(text).rule_map()["root"]
    assert body == Seq((Literal('A\u00e9\U0001F600\n\r\t\\"[]'), Chars(((0, 0x1F), (0x5D, 0x5D)))))


def test_xHH_is_a_code_point_not_a_byte() -> None:
    assert parse_gbnf(r'root ::= "\xe9"').rule_map()["root"] == Literal("é")


def test_classes_dot_and_negation() -> None:
    rules = parse_gbnf('root ::= [^"\\\\] . [-a] [a-]\nnone ::= []\n').rule_map()
    negated, dot, dash_first, dash_last = rules["root"].items  # type: ignore[union-attr]
    assert negated == chars('"\\').complement()
    assert dot == Chars(((0, MAX_CODE_POINT),)) and dot.contains(ord("\n"))
    assert dash_first == dash_last == chars("-a")
    assert rules["none"] == Chars(())


def test_quantifiers() -> None:
    rules = parse_gbnf('root ::= "a"? "b"+ "c"{3} "d"{2,} "e"{ 0 , 1000 } ("f" "g")*\n').rule_map()
    assert rules["root"] == Seq(
        (
            Repeat(Literal("a"), 0, 1),
            Repeat(Literal("b"), 1, None),
            Repeat(Literal("c"), 3, 3),
            Repeat(Literal("d"), 2, None),
            Repeat(Literal("e"), 0, 1000),
            Repeat(Seq((Literal("f"), Literal("g"))), 0, None),
        )
    )


def test_layout_names_comments_and_continuations() -> None:
    text = """
# a comment line
root ::= my-rule_2 # trailing comment
   "x"
  | "y"   # a continuation line starting with |
my-rule_2 ::=
  ( "a"
    | "b" )
empty ::=
"""
    rules = parse_gbnf(text).rule_map()
    assert rules["root"] == Alt((Seq((Ref("my-rule_2"), Literal("x"))), Literal("y")))
    assert rules["my-rule_2"] == Alt((Literal("a"), Literal("b")))
    assert rules["empty"] == Literal("")


def test_empty_alternative_and_crlf() -> None:
    rules = parse_gbnf('root ::= | "a"\r\nws ::= " "?\r\n').rule_map()
    assert rules["root"] == Alt((Literal(""), Literal("a")))
    assert rules["ws"] == Repeat(Literal(" "), 0, 1)


def test_left_recursion_is_kept() -> None:
    grammar = parse_gbnf('root ::= root "a" | "b"')
    assert grammar.rule_map()["root"] == Alt((Seq((Ref("root"), Literal("a"))), Literal("b")))
    assert char_level_accepts(grammar, "baaa")


# --- errors -----------------------------------------------------------------------------------

ERRORS = [
    ('root ::= "a" item\n', 1, 14, "undefined rule 'item'"),
    ('root ::= "a"\nx ::= (\n  "b" missing)\n', 3, 7, "undefined rule 'missing'"),
    ('item ::= "a"\n', 1, 1, "no 'root' rule"),
    ('root ::= "a"\nroot ::= "b"\n', 2, 1, "defined twice"),
    ('root ::= "abc\n', 1, 10, "unterminated string"),
    ('root ::= [abc\n', 1, 10, "unterminated character class"),
    ('root ::= "a\\q"\n', 1, 12, "unknown escape"),
    ('root ::= "\\x4"\n', 1, 11, "hex digits"),
    ('root ::= * "a"\n', 1, 10, "expected an item"),
    ('root ::= ("a" "b"\n', 1, 10, "expected ')'"),
    ('root ::= "a")\n', 1, 13, "unbalanced"),
    ('root ::= "a" ; "b"\n', 1, 14, "unexpected character ';'"),
    ('root "a"\n', 1, 6, "expected '::='"),
    ('root ::= "a"{2\n', 1, 15, "expected '}'"),
    ('root ::= "a"{x}\n', 1, 14, "expected an integer"),
    ('root ::= "a"{3,2}\n', 1, 13, "bad repetition bounds"),
    ('root ::= [z-a]\n', 1, 11, "bad character range"),
    ('root ::= "a" x ::= "b"\n', 1, 16, "unexpected character ':'"),
    ('root ::= "\\uD800"\n', 1, 11, "surrogate"),
]


@pytest.mark.parametrize(("text", "line", "column", "message"), ERRORS)
def test_errors_have_line_column_and_caret(text: str, line: int, column: int, message: str) -> None:
    with pytest.raises(GrammarSyntaxError) as info:
        parse_gbnf(text, source="g.gbnf")
    err = info.value
    assert message in err.message
    assert (err.line, err.column) == (line, column)
    assert str(err).startswith(f"g.gbnf:{line}:{column}: ")
    caret_line = err.context().split("\n")[1]
    assert caret_line == " " * (column - 1) + "^"


def test_undefined_reference_context() -> None:
    with pytest.raises(GrammarSyntaxError) as info:
        parse_gbnf('root ::= value\nvalue ::= "a" | numbr\n')
    assert info.value.context() == 'value ::= "a" | numbr\n                ^'


@pytest.mark.parametrize("text", ['root ::= <[1234]>\n', 'root ::= !"a"\n', "root ::= <|eot|>\n"])
def test_token_level_syntax_fails_closed(text: str) -> None:
    with pytest.raises(UnsupportedGrammarError, match="token-level"):
        parse_gbnf(text)


# --- languages (Lark oracle) -------------------------------------------------------------------


def test_arithmetic_language() -> None:
    grammar = shared_grammar("arithmetic")
    assert char_level_accepts(grammar, "1+2*(3-4)/5=x\n")
    assert char_level_accepts(grammar, "a = b\nx1_y=(1 )\n")
    assert not char_level_accepts(grammar, "1+=x\n")
    assert not char_level_accepts(grammar, "1=x")
    assert not char_level_accepts(grammar, "")


JSON_MEMBERS = [
    '{"a": [1, 2.5e1, -3], "b": {"c": null}}',
    '{}',
    '{"k": "\\u00e9\\n", "t": true}',
    '{\n  "a": "x"\n}',
    '{"nested": [[], [{}], "é😀"]}',
]
# (json.gbnf's exponent is [0-9] [1-9]{0,15}, so "1e10" is not in its language)
JSON_NON_MEMBERS = [
    '{"a": 1e10}',
    '{"a": 01}',
    "[1, 2]",
    '{"a" 1}',
    '{"a": tru}',
    '{"a": "\x01"}',
    '{"a": 1,}',
    '{"a": "\\x"}',
]


@pytest.mark.parametrize("text", JSON_MEMBERS)
def test_json_gbnf_accepts(text: str) -> None:
    assert char_level_accepts(shared_grammar("json"), text)


@pytest.mark.parametrize("text", JSON_NON_MEMBERS)
def test_json_gbnf_rejects(text: str) -> None:
    assert not char_level_accepts(shared_grammar("json"), text)


def test_other_shared_languages() -> None:
    assert char_level_accepts(shared_grammar("json_arr"), '[\n{"a": 1},\n2]')
    assert not char_level_accepts(shared_grammar("json_arr"), '[1]')
    assert char_level_accepts(shared_grammar("list"), "- one\n- two\n")
    assert not char_level_accepts(shared_grammar("list"), "- one\u2028\n")
    assert char_level_accepts(shared_grammar("chess"), "1. e4 e5\n2. Nf3 Nc6\n")
    assert not char_level_accepts(shared_grammar("chess"), "1. e4 e5\n")
    assert char_level_accepts(shared_grammar("english"), "Hello, world!")
    assert char_level_accepts(shared_grammar("japanese"), "こんにちは 世界")
    assert not char_level_accepts(shared_grammar("japanese"), "hello")
    assert char_level_accepts(shared_grammar("c"), "int main(){return 0;}")
    assert not char_level_accepts(shared_grammar("c"), "int main(){return 0}")


# A GBNF grammar and the Python regex with the same language, compared on random strings:
# checks the front end and the oracle against an independent implementation.
GBNF_VS_REGEX = [
    ('root ::= ("a" | "b" "c")* "d"?', r"(a|bc)*d?"),
    ('root ::= x{2,3} | "c"\nx ::= [ab]', r"[ab]{2,3}|c"),
    ('root ::= [^a-b]+ "."', r"[^a-b]+\."),
    ('root ::= "a"{2,5} [bc]{0,3} "d"{1,}', r"a{2,5}[bc]{0,3}d+"),
    ('root ::= item ("," item)*\nitem ::= "a"+ | "{" root "}"', None),
]


@pytest.mark.parametrize(("gbnf", "regex"), [case for case in GBNF_VS_REGEX if case[1]])
@settings(max_examples=60, deadline=None)
@given(text=st.text(alphabet="abcd.,{}", max_size=6))
def test_oracle_agrees_with_python_re(gbnf: str, regex: str, text: str) -> None:
    assert char_level_accepts(parse_gbnf(gbnf), text) == (re.fullmatch(regex, text) is not None)


def test_oracle_counts_large_bounds_exactly() -> None:
    grammar = parse_gbnf('root ::= "a"{3,1000} "b"')
    for count in (0, 2, 3, 4, 511, 512, 999, 1000, 1001):
        assert char_level_accepts(grammar, "a" * count + "b") == (3 <= count <= 1000), count


def test_recursive_grammar_language() -> None:
    grammar = parse_gbnf(GBNF_VS_REGEX[-1][0])
    assert char_level_accepts(grammar, "a,{aa,{a}},a")
    assert not char_level_accepts(grammar, "a,{aa,{a},a")
    assert not char_level_accepts(grammar, "{}")
