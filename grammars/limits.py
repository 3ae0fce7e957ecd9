"""Resource bounds that travel with a compilation, so hostile input fails with ``LimitExceeded``."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Limits"]


@dataclass(frozen=True)
class Limits:
    """Upper bounds on the work one grammar may cause.

    The defaults admit every grammar in the project's test data with a wide margin; a server
    taking grammars from users may lower them. Hitting a bound raises ``LimitExceeded`` naming it;
    at match time the matcher is then unchanged and usable (no cache keeps a partial value).
    """

    #: states of one terminal's byte DFA (subset construction output)
    max_dfa_states: int = 200_000
    #: NFA states built for one terminal (bounded repetition unrolls into copies)
    max_nfa_states: int = 2_000_000
    #: productions after normalisation (epsilon elimination can multiply them)
    max_productions: int = 500_000
    #: edges (node, parent) one reduction closure adds to the graph-structured stack when a
    #: lexeme ends: the stack nodes a step creates, so the ambiguity bound
    max_parser_stacks: int = 20_000
    #: configurations (stack, terminal, lexer state) in one match state; configurations that
    #: differ only in their stacks' parents are merged, so this bounds distinct parser contexts
    max_configurations: int = 100_000
    #: entries kept in each per-grammar memo table before it is cleared
    max_cache_entries: int = 200_000
    #: wall-clock seconds one matcher call (advance, allows, check, fill_mask, a shortest
    #: completion) may spend parsing and walking, checked cooperatively; ``float("inf")`` disables it.
    #: The only bound whose outcome depends on the machine and on what earlier calls cached.
    max_step_seconds: float = 10.0
    #: Earley items and lexemes one text-with-holes question (``completable``, ``complete``, an
    #: infilling check) may build: a hole's set holds every item the grammar predicts there
    max_infill_items: int = 2_000_000
