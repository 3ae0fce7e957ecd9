"""``ir.references``: the rules an expression names, in order of first occurrence, cached on the
nodes (the front end orders rules by them, the lowering asks them of every item)."""

from __future__ import annotations

import pickle
import sys

from grammars.ir import Alt, Chars, Literal, Ref, Repeat, Seq, references


def test_names_in_order_of_first_occurrence_without_duplicates():
    shared = Seq((Ref("b"), Literal("x"), Ref("a")))
    expr = Alt((Seq((Ref("c"), shared)), Repeat(shared, 0, None), Ref("c"), Chars(((0x61, 0x7A),))))
    assert references(expr) == ("c", "b", "a")
    assert references(shared) == ("b", "a")
    assert references(Ref("r")) == ("r",)
    assert references(Literal("x")) == () and references(Seq(())) == ()


def test_cached_on_the_nodes_and_left_out_of_pickles():
    expr = Seq((Literal("a"), Alt((Ref("x"), Ref("y")))))
    first = references(expr)
    assert expr.__dict__["_refs"] is first and references(expr) is first
    copy = pickle.loads(pickle.dumps(expr))
    assert "_refs" not in copy.__dict__ and references(copy) == first


def test_nesting_deeper_than_the_recursion_limit():
    expr = Ref("leaf")
    for i in range(sys.getrecursionlimit() * 3):
        expr = Seq((Literal("("), expr, Ref(f"r{i % 3}")))
    assert references(expr) == ("leaf", "r0", "r1", "r2")
