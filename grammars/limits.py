"""Resource bounds that travel with a compilation, so hostile input fails with ``LimitExceeded``."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Limits"]


@dataclass(frozen=True)
class Limits:
    """Upper bounds on the work one grammar may cause.

    The defaults admit every grammar in the project's test data with a wide margin; a server
    taking grammars from users may lower them. Hitting a bound raises ``LimitExceeded`` naming it.
    """

    #: states of one terminal's byte DFA (subset construction output)
    max_dfa_states: int = 200_000
    #: NFA states built for one terminal (bounded repetition unrolls into copies)
    max_nfa_states: int = 2_000_000
    #: productions after normalisation (epsilon elimination can multiply them)
    max_productions: int = 500_000
    #: parser stacks alive at once in one match state (ambiguity bound)
    max_parser_stacks: int = 20_000
    #: configurations (stack, terminal, lexer state) in one match state
    max_configurations: int = 100_000
    #: entries kept in each per-grammar memo table before it is cleared
    max_cache_entries: int = 200_000
