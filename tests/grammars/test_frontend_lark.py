"""The Lark front end: Lark's loader does imports/templates/EBNF, we keep the language."""

from __future__ import annotations

import json

import pytest
from lark import Lark

from grammars.errors import GrammarSyntaxError, UnsupportedGrammarError
from grammars.frontends import parse_lark
from grammars.frontends._charclass import fold_case
from grammars.frontends.lark import IGNORE_RULE
from grammars.ir import Alt, Literal, Ref, Repeat, Seq, chars
from grammars.testing.oracles import char_level_accepts

JSON_GRAMMAR = r"""
?start: value

?value: object
      | array
      | string
      | SIGNED_NUMBER      -> number
      | "true"             -> true
      | "false"            -> false
      | "null"             -> null

array  : "[" [value ("," value)*] "]"
object : "{" [pair ("," pair)*] "}"
pair   : string ":" value

string : ESCAPED_STRING

%import common.ESCAPED_STRING
%import common.SIGNED_NUMBER
%import common.WS
%ignore WS
"""

JSON_MEMBERS = [
    '{"a": [1, 2.5e10, -3], "b": {"c": null}}',
    " [ true ,false,null ] ",
    '"with \\"escaped\\" quotes and \\\\"',
    "-12.5E+3",
    '{\n\t"k" :\r\n"v"\n}\n',
    "[]",
]
JSON_NON_MEMBERS = ['{"a" 1}', "[1,]", '"unterminated', '"a"b"', "tru", "[1 2]", '"\\"']


@pytest.fixture(scope="module")
def json_grammar():
    return parse_lark(JSON_GRAMMAR)


@pytest.mark.parametrize("text", JSON_MEMBERS)
def test_json_members(json_grammar, text: str) -> None:
    assert char_level_accepts(json_grammar, text)
    Lark(JSON_GRAMMAR, parser="lalr").parse(text)  # the same verdict as Lark itself


@pytest.mark.parametrize("text", JSON_NON_MEMBERS)
def test_json_non_members(json_grammar, text: str) -> None:
    assert not char_level_accepts(json_grammar, text)


def test_json_round_trip_of_python_json(json_grammar) -> None:
    doc = {"name": "x", "list": [1, -2.5, True, None, {"e": "é\n"}], "empty": {}}
    assert char_level_accepts(json_grammar, json.dumps(doc))
    assert char_level_accepts(json_grammar, json.dumps(doc, indent=2))


def test_ignore_rule_and_terminal_rules(json_grammar) -> None:
    rules = json_grammar.rule_map()
    assert json_grammar.start == "start"
    assert rules[IGNORE_RULE] == Repeat(Ref("WS"), 0, None)
    assert rules["WS"] == Repeat(chars(" \t\f\r\n"), 1, None)
    assert rules["start"].items[0] == Ref(IGNORE_RULE)  # type: ignore[union-attr]
    # every terminal use is followed by the ignore rule
    assert Seq((Ref("ESCAPED_STRING"), Ref(IGNORE_RULE))) == rules["string"]


ARITHMETIC = r"""
?start: sum
?sum: product
    | sum "+" product   -> add
    | sum "-" product   -> sub
?product: atom
    | product "*" atom  -> mul
    | product "/" atom  -> div
?atom: NUMBER           -> number
     | "-" atom         -> neg
     | NAME             -> var
     | "(" sum ")"
%import common.CNAME -> NAME
%import common.NUMBER
%import common.WS_INLINE
%ignore WS_INLINE
"""


def test_left_recursive_arithmetic() -> None:
    grammar = parse_lark(ARITHMETIC)
    rules = grammar.rule_map()
    assert Ref("sum") in rules["sum"].items[1].items  # type: ignore[union-attr]  (left recursion kept)
    for text in ["1+2*3", " a - -b / (c+4.5) ", "x", "((1))"]:
        assert char_level_accepts(grammar, text), text
    for text in ["1+", "(1", "1 2", "*x", "1\n+2"]:
        assert not char_level_accepts(grammar, text), text


def test_case_insensitive_literal_and_templates() -> None:
    grammar = parse_lark(
        """
        start: _sep{item, ","}
        _sep{x, sep}: x (sep x)*
        item: "select"i | /[0-9]+/
        """
    )
    assert char_level_accepts(grammar, "SeLeCt,12,select")
    assert not char_level_accepts(grammar, "selec")
    rules = grammar.rule_map()
    folded = Seq(tuple(fold_case(chars(c)) for c in "select"))
    assert folded in rules.values()
    assert folded.items[0] == chars("sS")  # only folds both re and ECMA-262 share: LONG S is re-only


def test_terminal_composition_with_flags() -> None:
    grammar = parse_lark('start: A\nA: "x" B\nB: "y"i\n')
    assert grammar.rule_map()["A"] == Seq((Literal("x"), chars("yY")))


def test_s_flag_and_priorities_are_accepted() -> None:
    grammar = parse_lark("start.2: A\nA.5: /a.b/s\n")
    assert char_level_accepts(grammar, "a\nb")


def test_repetition_operators() -> None:
    grammar = parse_lark('start: "a"~2..3 "b"? "c"+\n')
    assert char_level_accepts(grammar, "aabccc")
    assert not char_level_accepts(grammar, "abc")


def test_literals_are_literals() -> None:
    grammar = parse_lark('start: "a" | "b" "c"\n')
    rules = grammar.rule_map()
    assert rules["start"] == Alt((Ref("A"), Seq((Ref("B"), Ref("C")))))
    assert rules["A"] == Literal("a")


# --- errors -----------------------------------------------------------------------------------


def test_syntax_error_has_line_and_column() -> None:
    with pytest.raises(GrammarSyntaxError) as info:
        parse_lark('start: "a"\nfoo: "b" (\n', source="g.lark")
    err = info.value
    assert (err.line, err.column) == (2, 11)  # Lark reports the end of the line
    assert err.message and "line 2" not in err.message  # the position is not repeated
    assert str(err).startswith("g.lark:2:11: ")


def test_unexpected_token_has_line_and_column() -> None:
    with pytest.raises(GrammarSyntaxError) as info:
        parse_lark('start: "a"\nstart2: "a" )\n')
    assert (info.value.line, info.value.column) == (2, 13)


def test_undefined_rule_points_at_its_use() -> None:
    with pytest.raises(GrammarSyntaxError) as info:
        parse_lark('start: "a" value\n')
    assert "value" in info.value.message
    assert (info.value.line, info.value.column) == (1, 12)


def test_missing_import_and_missing_start() -> None:
    with pytest.raises(GrammarSyntaxError, match="cannot import"):
        parse_lark("%import nosuchmodule.X\nstart: X\n")
    with pytest.raises(GrammarSyntaxError, match="start rule 'main'"):
        parse_lark('start: "a"\n', start="main")


@pytest.mark.parametrize(
    ("text", "construct"),
    [
        ("start: X\n%declare X\n", "%declare"),
        ("start: A\nA: /a/m\n", "flag"),
        ("start: A\nA: /(?=a)a/\n", "lookahead"),
        ("start: A\nA: /^a/\n", "anchor"),
        ("start: A\nA: /a(?<!b)/\n", "lookbehind"),
    ],
)
def test_unsupported_constructs_fail_closed(text: str, construct: str) -> None:
    with pytest.raises(UnsupportedGrammarError, match=construct):
        parse_lark(text)


def test_terminal_regex_syntax_error_names_the_terminal() -> None:
    with pytest.raises(GrammarSyntaxError) as info:
        parse_lark("start: A\nA: /a{3,2}/\n")
    assert "terminal A" in str(info.value)


def test_c_comment_stops_at_the_first_close() -> None:
    grammar = parse_lark("start: (C_COMMENT | \"x\")*\n%import common.C_COMMENT\n")
    assert char_level_accepts(grammar, "/* a */x/** b **/")
    assert not char_level_accepts(grammar, "/* a */ b */")
