"""The LR(0) automaton's item sets against the textbook closure, on grammars with recursion."""

from __future__ import annotations

import pytest

from grammars.automata.cfg import is_terminal
from grammars.automata.lr import LR0Automaton


def _reference_state(lr: LR0Automaton, kernel: frozenset) -> tuple[dict, tuple, bool]:
    """Closure by fixpoint over items, then shifts grouped by symbol (no memo, no shortcuts)."""
    items = set(kernel)
    changed = True
    while changed:
        changed = False
        for p, dot in list(items):
            rhs = lr.rhs[p]
            if dot < len(rhs) and not is_terminal(rhs[dot]):
                for q, lhs in enumerate(lr.lhs):
                    if lhs == rhs[dot] and (q, 0) not in items:
                        items.add((q, 0))
                        changed = True
    shifts: dict = {}
    reductions = []
    accepts = False
    for p, dot in items:
        rhs = lr.rhs[p]
        if dot < len(rhs):
            shifts.setdefault(rhs[dot], set()).add((p, dot + 1))
        elif p == lr.augmented:
            accepts = True
        else:
            reductions.append(p)
    return {s: frozenset(k) for s, k in shifts.items()}, tuple(sorted(reductions)), accepts


GRAMMARS = {
    "expression": r'''
        root ::= expr
        expr ::= expr [+-] term | term
        term ::= term [*/] factor | factor
        factor ::= [0-9]+ | "(" expr ")" | "-" factor
    ''',
    "nested lists": r'''
        root ::= value
        value ::= "[" ( value ( "," value )* )? "]" | [a-z]+ | obj
        obj ::= "{" ( pair ( "," pair )* )? "}"
        pair ::= [a-z]+ ":" value
    ''',
    "shared prefixes": r'''
        root ::= "<" x ">"
        x ::= a b | a c | b c
        a ::= "(" x ")" | "u"
        b ::= "[" x "]" | "v" | a
        c ::= "{" x "}" | "w"
    ''',
}


@pytest.mark.parametrize("name", sorted(GRAMMARS))
def test_every_reachable_state_is_the_reference_closure(name):
    from grammars import Compiler, TokenVocabulary

    vocab = TokenVocabulary.from_bytes([bytes([b]) for b in range(32, 127)] + [b""], eos_token_ids=[95])
    grammar = Compiler(vocab).compile_gbnf(GRAMMARS[name])
    lr = LR0Automaton(grammar._cfg)
    todo = [lr.initial]
    seen = {lr.initial}
    while todo:
        state = todo.pop()
        for symbol in lr.state(state).shifts:
            target = lr.goto(state, symbol)
            if target not in seen:
                seen.add(target)
                todo.append(target)
    kernels = {idx: kernel for kernel, idx in lr._kernels.items()}
    assert len(seen) > 10
    for idx in seen:
        shifts, reductions, accepts = _reference_state(lr, kernels[idx])
        state = lr.state(idx)
        assert (state.shifts, state.reductions, state.accepts) == (shifts, reductions, accepts), idx
