"""What may follow a growing prefix: one fixed run of holes and texts, asked once per token.

An infilling decoder writes hole ``j`` a token at a time and asks, for every token it draws,
whether ``prefix + token``, then the rest of the hole, ``x_{j+1}``, hole, …, ``x_n`` can still be
completed. ``HoleChart.check`` answers by parsing everything after the prefix again, each time:
after an unbounded hole that is a substring parse of the rest of the text (every item the grammar
predicts inside the hole), tens to hundreds of milliseconds on a C++ function. Yet the suffix
is the same for the whole hole; only the prefix grows.

``SuffixOracle`` splits the question at the prefix's end, state 0 of the suffix's automaton
(``holes._automaton``: "any byte" states for holes, a self-loop for an unbounded one, a byte
chain for each fixed text). Two kinds of Earley items continue past that point:

* items that *begin* in the suffix. They do not depend on the prefix, so they are kept, in one
  chart over the suffix automaton that lives as long as the oracle. Its predictions are made
  on demand (``_derive``: the states where a symbol predicted at state ``r`` ends), and the
  chart is run to quiescence after each, so what it says of a predicted symbol is final:
  further predictions add items but no derivation of a symbol already predicted.
* the prefix's *own* items carried on. Where an item ends depends on its dotted rule and the
  state it stands at, never on its origin: ``_ends(item, r)`` — the states where the rest of the
  item's right-hand side, started at ``r``, can end — is built from ``_derive`` and remembered.

A check then walks the prefix's stack only: each item of the prefix's last Earley set is carried
to its ends (a lexeme in progress likewise), where its left-hand side is complete; that advances
the items of its origin set that waited for it, which are carried on from there, and so on. The
text is completable iff the start symbol completes with origin 0 at a final state. Every step is
an Earley step over the product of text and automaton (an item ``(A → α • β, o)`` in state ``r``
says ``α`` derives a word that drives the automaton from ``o`` to ``r``), so the answer equals
``HoleChart.check``'s; only the order of the work and what is remembered differ.

Cost: the first checks of a hole pay for the suffix's chart (at most what one ``HoleChart.check``
builds, spread over the predictions actually asked for); afterwards a check costs the items of
the prefix's last set plus the completions its stack reaches, each a dictionary lookup. Bounded
by ``Limits``: per call ``max_step_seconds``, and ``max_infill_items`` items and lexemes in the
oracle's chart as a whole; past either, ``LimitExceeded`` (the chart keeps its pending work, so
a later call resumes it and never reads a half-built answer).
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from grammars.automata.holes import _ANY, HoleBounds, HoleChart, HoleGrammar, _automaton
from grammars.errors import LimitExceeded
from grammars.limits import Limits

__all__ = ["SuffixOracle"]

_ITEM = 0
_LEXEME = 1
_COMPLETE = 2  # an agenda entry: (symbol, origin) complete at a state


class SuffixOracle:
    """Is ``prefix`` · ``holes[0]`` · ``parts[0]`` · ``holes[1]`` · … completable, for a prefix
    held in a ``HoleChart`` that changes between calls while ``parts`` and ``holes`` do not."""

    def __init__(self, grammar: HoleGrammar, parts: Sequence[bytes], holes: Sequence[HoleBounds],
                 limits: Limits | None = None):
        if len(parts) != len(holes):
            raise ValueError(f"{len(holes)} hole bounds for {len(parts)} fixed texts")
        self.grammar = grammar
        self.limits = limits or Limits()
        auto = _automaton(0, list(parts), list(holes))
        states = len(auto.incoming) + 1
        self._out: list[list[tuple[int, int]]] = [[] for _ in range(states)]
        for offset, sources in enumerate(auto.incoming):
            for source, label in sources:
                self._out[source].append((label, offset + 1))
        self.finals = frozenset(auto.finals)
        # Where the prefix's items and lexemes enter. After a first hole (0, None), state 0 leads
        # by "any byte" into the hole's self-loop state 1 and both lead into the same text, so a
        # symbol derives the same ends from either (no symbol derives the empty word): entering
        # at state 1 shares every prediction with the items that start inside the hole, so a
        # prefix the oracle has not seen rarely needs a new parse of the suffix.
        self._entry = 1 if holes and holes[0][0] == 0 and holes[0][1] is None else 0
        # nothing fixed follows and the holes may stay empty or grow without end: every live
        # prefix completes (every symbol is productive, every live lexer state can accept)
        self._only_liveness = not any(parts) and all(low == 0 and high is None for low, high in holes)
        self._items: list[set[tuple[int, int]]] = [set() for _ in range(states)]
        self._lexemes: list[set[tuple[int, int, int]]] = [set() for _ in range(states)]
        self._waiting: dict[tuple[int, int], list[tuple[int, int]]] = {}  # (state, symbol) -> items
        self._done: dict[tuple[int, int], set[int]] = {}  # (symbol, origin) -> end states
        self._predicted: set[tuple[int, int]] = set()
        self._agenda: list[tuple] = []
        self._ends_memo: dict[tuple[int, int], tuple[int, ...]] = {}
        self._lexeme_memo: dict[tuple[int, int], tuple[int, ...]] = {}
        self._virtual = 0
        self._size = 0
        self._deadline = float("inf")
        first_items = grammar.first_items
        self._predicted_items = frozenset(i for items in first_items.values() for i in items)

    # --- the question ----------------------------------------------------------------------

    def completable(self, chart: HoleChart) -> bool:
        """Whether ``chart``'s prefix followed by the holes and texts can be completed."""
        grammar = self.grammar
        if grammar.start < 0:
            return bool(grammar.cfg.start_nullable and chart.length == 0 and 0 in self.finals)
        if not chart.alive:
            return False
        if self._only_liveness:
            return True
        if chart.length == 0 and grammar.cfg.start_nullable and 0 in self.finals:
            return True  # the empty text, which the CFG's productions (without epsilon) do not derive
        seconds = self.limits.max_step_seconds
        self._deadline = time.monotonic() + seconds if seconds != float("inf") else float("inf")
        sets = chart.sets
        base = chart.length
        last = sets[-1]
        next_symbol, lhs_of = grammar.next_symbol, grammar.lhs_of
        predicted_items = self._predicted_items
        ends = self._ends
        entry = self._entry
        pending: list[tuple[int, int, int]] = []
        for item, origin in last.items:
            if next_symbol[item] is None:
                continue  # its completion is already in the set
            if origin == base and base > 0 and item in predicted_items:
                continue  # the item that predicted it is in the set and covers it
            lhs = lhs_of[item]
            for r in ends(item, entry):
                pending.append((lhs, origin, r))
        dfas = grammar.dfas
        for t, s, start in last.lexemes:
            if start == base and s == dfas[t].start:
                continue  # started here for an item of the set, which covers it
            for r in self._lexeme_ends(t, s):
                pending.append((~t, start, r))
        goal, finals = grammar.start, self.finals
        seen: set[tuple[int, int, int]] = set()
        while pending:
            key = pending.pop()
            if key in seen:
                continue
            seen.add(key)
            symbol, origin, r = key
            if origin == 0 and symbol == goal and r in finals:
                return True
            source = sets[origin]
            waits = source.wait_t.get(~symbol) if symbol < 0 else source.wait_nt.get(symbol)
            for item, item_origin, _ in waits or ():
                lhs = lhs_of[item]
                for r2 in ends(item + 1, r):
                    pending.append((lhs, item_origin, r2))
        return False

    # --- what the suffix's chart says -------------------------------------------------------

    def _ends(self, item: int, r: int) -> tuple[int, ...]:
        """The states where the rest of ``item``'s right-hand side, begun at state ``r``, ends."""
        key = (item, r)
        found = self._ends_memo.get(key)
        if found is None:
            symbol = self.grammar.next_symbol[item]
            if symbol is None:
                found = (r,)
            else:
                out: set[int] = set()
                for r1 in self._derive(symbol, r):
                    out.update(self._ends(item + 1, r1))
                found = tuple(sorted(out))
            self._ends_memo[key] = found
        return found

    def _derive(self, symbol: int, r: int) -> set[int] | tuple:
        """The states a derivation of ``symbol`` (``~t`` for terminal ``t``) begun at ``r`` ends in."""
        if (r, symbol) not in self._predicted:
            self._predicted.add((r, symbol))
            self._predict(symbol, r)
        if self._agenda:
            self._run()
        return self._done.get((symbol, r), ())

    def _lexeme_ends(self, t: int, s: int) -> tuple[int, ...]:
        """The states where a lexeme of terminal ``t`` in DFA state ``s`` at the entry can end."""
        key = (t, s)
        found = self._lexeme_memo.get(key)
        if found is None:
            self._virtual -= 1
            origin = self._virtual  # no item waits at a virtual origin: only its ends are read
            self._add_lexeme(self._entry, t, s, origin)
            self._run()
            found = self._lexeme_memo[key] = tuple(sorted(self._done.pop((~t, origin), ())))
        return found

    # --- the chart ------------------------------------------------------------------------------

    def _predict(self, symbol: int, r: int) -> None:
        if symbol >= 0:
            for first in self.grammar.first_items.get(symbol, ()):
                self._add_item(r, first, r)
        else:
            self._add_lexeme(r, ~symbol, self.grammar.dfas[~symbol].start, r)

    def _add_item(self, r: int, item: int, origin: int) -> None:
        bucket = self._items[r]
        key = (item, origin)
        if key not in bucket:
            bucket.add(key)
            self._grow()
            self._agenda.append((_ITEM, r, item, origin))

    def _add_lexeme(self, r: int, t: int, s: int, origin: int) -> None:
        bucket = self._lexemes[r]
        key = (t, s, origin)
        if key not in bucket:
            bucket.add(key)
            self._grow()
            self._agenda.append((_LEXEME, r, t, s, origin))

    def _grow(self) -> None:
        self._size += 1
        if self._size > self.limits.max_infill_items:
            raise LimitExceeded("max_infill_items", self.limits.max_infill_items)

    def _run(self) -> None:
        """Process the agenda to quiescence (in any order: Earley's sets are order-independent
        once completions look both ways, at waiting items and at what is already complete).
        The adds are inlined: this loop is where a hole's first check spends its time."""
        grammar = self.grammar
        next_symbol, lhs_of, first_items, dfas = grammar.next_symbol, grammar.lhs_of, grammar.first_items, grammar.dfas
        flat, accepting, any_successors = grammar._flat, grammar._accepting, grammar.any_successors
        agenda, waiting, done, predicted = self._agenda, self._waiting, self._done, self._predicted
        items, lexemes, out = self._items, self._lexemes, self._out
        bound = self.limits.max_infill_items
        push, pop = agenda.append, agenda.pop
        size = self._size
        work = 0
        try:
            while agenda:
                work += 1
                if not work & 1023:
                    if time.monotonic() > self._deadline:
                        raise LimitExceeded("max_step_seconds", self.limits.max_step_seconds)
                    if size > bound:
                        raise LimitExceeded("max_infill_items", bound)
                entry = pop()
                kind = entry[0]
                if kind == _LEXEME:
                    _, r, t, s, origin = entry
                    if accepting[t][s]:
                        push((_COMPLETE, r, ~t, origin))
                    row = flat[t]
                    for label, r2 in out[r]:
                        bucket = lexemes[r2]
                        if label == _ANY:
                            for s2, _ in any_successors(t, s):
                                key = (t, s2, origin)
                                if key not in bucket:
                                    bucket.add(key)
                                    size += 1
                                    push((_LEXEME, r2, t, s2, origin))
                        else:
                            s2 = row[(s << 8) | label]
                            if s2 >= 0:
                                key = (t, s2, origin)
                                if key not in bucket:
                                    bucket.add(key)
                                    size += 1
                                    push((_LEXEME, r2, t, s2, origin))
                    continue
                if kind == _ITEM:
                    _, r, item, origin = entry
                    symbol = next_symbol[item]
                    if symbol is not None:
                        key = (r, symbol)
                        waiters = waiting.get(key)
                        if waiters is None:
                            waiters = waiting[key] = []
                        waiters.append((item, origin))
                        ends = done.get((symbol, r))
                        if ends:
                            for r2 in tuple(ends):
                                bucket = items[r2]
                                key2 = (item + 1, origin)
                                if key2 not in bucket:
                                    bucket.add(key2)
                                    size += 1
                                    push((_ITEM, r2, item + 1, origin))
                        if key not in predicted:
                            predicted.add(key)
                            if symbol >= 0:
                                bucket = items[r]
                                for first in first_items.get(symbol, ()):
                                    key2 = (first, r)
                                    if key2 not in bucket:
                                        bucket.add(key2)
                                        size += 1
                                        push((_ITEM, r, first, r))
                            else:
                                t = ~symbol
                                key2 = (t, dfas[t].start, r)
                                bucket = lexemes[r]
                                if key2 not in bucket:
                                    bucket.add(key2)
                                    size += 1
                                    push((_LEXEME, r, t, dfas[t].start, r))
                        continue
                    symbol = lhs_of[item]
                else:  # a lexeme accepted: its terminal is complete
                    _, r, symbol, origin = entry
                # (symbol, origin) complete at r: every item waiting for it there moves on
                ends = done.get((symbol, origin))
                if ends is None:
                    ends = done[(symbol, origin)] = set()
                elif r in ends:
                    continue
                ends.add(r)
                if origin >= 0:
                    bucket = items[r]
                    for waiter, waiter_origin in waiting.get((origin, symbol), ()):
                        key = (waiter + 1, waiter_origin)
                        if key not in bucket:
                            bucket.add(key)
                            size += 1
                            push((_ITEM, r, waiter + 1, waiter_origin))
        finally:
            self._size = size
