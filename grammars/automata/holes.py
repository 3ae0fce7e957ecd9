"""Text with holes: can ``x1 □ x2 □ … □ xn`` still be completed into the language, and how?

Earley's algorithm run over an automaton instead of a string. The fills of the holes form a
regular language ``C = x1 Σ^[a1,b1] x2 … xn``; the text is completable iff ``L ∩ C`` is not
empty. Running Earley over ``C``'s automaton computes the Bar-Hillel intersection lazily and
only where the grammar predicts: an item ``(A → α • β, origin p)`` in the set of automaton state
``q`` says ``α`` derives a word that drives the automaton from ``p`` to ``q``. The automaton is a
chain of byte states for the fixed text, a chain of "any byte" states for each bounded hole and a
self-loop for an unbounded one, so states are processed in order and only a self-loop state
needs a fixpoint.

Scannerless, like the matcher: terminals are the grammar's byte DFAs, lexed byte by byte as
*lexemes* ``(terminal, DFA state, start state)`` that travel with the items. So a fragment that
begins or ends inside a terminal (half a string literal, half a number, half a UTF-8 character)
and a terminal that spans a hole need no special case, and ambiguity is handled as Earley
handles it.

Weights: every "any byte" step costs 1, fixed bytes 0. Each state's set is closed in order of
weight (Knuth's generalisation of Dijkstra to grammars; weights combine by sums, which never
decrease), so the first derivation found of each item is one with the fewest fill bytes, and the
back-pointers of first derivations are well-founded: ``witness`` reads the shortest fills off them.

Complexity: with ``n`` automaton states (fixed bytes plus ``max`` bytes per bounded hole, one per
unbounded hole) and a grammar of size ``|G|``, at most ``O(|G| n)`` items per set and ``O(|G| n³)``
work, as Earley; unambiguous grammars over fixed text stay near ``O(|G| n)``. Holes are where the
sets are large: a hole's set holds every item the grammar can predict there. Bounded by
``Limits.max_infill_items`` (items and lexemes per call) and ``Limits.max_step_seconds``; past
either, ``LimitExceeded``, never a guess.

``HoleChart`` keeps the sets of a growing fixed prefix, so a left-to-right decoder pays for the
prefix once and per check only for the new bytes and what follows them.
"""

from __future__ import annotations

import heapq
import os
import time
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from grammars.automata.cfg import TerminalCFG
from grammars.errors import LimitExceeded
from grammars.limits import Limits

__all__ = ["Completion", "HoleBounds", "HoleChart", "HoleGrammar", "PrefixChart", "normalise_holes"]

_ITEM = 0
_LEXEME = 1
_ANY = -1  # label of an "any byte" transition

#: back-pointer kinds
_PREDICTED = 0  # an item with the dot at the start, predicted in its own set
_STARTED = 1  # a lexeme at its terminal's start state
_BYTE = 2  # a lexeme one byte on: (kind, previous lexeme, its state, byte)
_TERM = 3  # an item past a terminal: (kind, previous item, its state, the finished lexeme)
_NT = 4  # an item past a nonterminal: (kind, previous item, its state, the finished item)

HoleBounds = tuple[int, "int | None"]


class HoleGrammar:
    """A ``TerminalCFG`` as tables Earley needs: items numbered, what follows each dot, the
    first item of each nonterminal's productions, and per-terminal DFA access."""

    def __init__(self, cfg: TerminalCFG):
        self.cfg = cfg
        next_symbol: list[int | None] = []
        lhs_of: list[int] = []
        first_items: dict[int, list[int]] = {}
        accept_items: set[int] = set()
        for prod in cfg.productions:
            first = len(next_symbol)
            first_items.setdefault(prod.lhs, []).append(first)
            for symbol in prod.rhs:
                next_symbol.append(symbol)
                lhs_of.append(prod.lhs)
            next_symbol.append(None)
            lhs_of.append(prod.lhs)
            if prod.lhs == cfg.start:
                accept_items.add(len(next_symbol) - 1)
        self.next_symbol = next_symbol
        self.lhs_of = lhs_of
        self.first_items = first_items
        self.accept_items = frozenset(accept_items)
        self.dfas = cfg.terminals
        self._flat = [d._flat for d in cfg.terminals]
        self._accepting = [d._acc for d in cfg.terminals]
        self._any: dict[tuple[int, int], list[tuple[int, int]]] = {}
        expecting: dict[int, list[int]] = {}
        for item, symbol in enumerate(next_symbol):
            if symbol is not None:
                expecting.setdefault(symbol, []).append(item)
        self.expecting = expecting
        rhs_symbols: dict[int, set[int]] = {}
        for prod in cfg.productions:
            rhs_symbols.setdefault(prod.lhs, set()).update(prod.rhs)
        self._rhs_symbols = rhs_symbols
        self._closure: dict[int, frozenset[int]] = {}
        self._inner: dict[frozenset[int], dict[int, list[int]]] = {}
        self._reach: dict[tuple[int, int], list[int]] = {}
        self._into: dict[tuple[int, int, int], list[int]] = {}

    @property
    def start(self) -> int:
        return self.cfg.start

    def step(self, terminal: int, state: int, byte: int) -> int:
        return self._flat[terminal][(state << 8) | byte]

    def accepting(self, terminal: int, state: int) -> bool:
        return self._accepting[terminal][state]

    def any_successors(self, terminal: int, state: int) -> list[tuple[int, int]]:
        """The distinct live states one byte leads to from ``state``, each with a byte that does."""
        key = (terminal, state)
        found = self._any.get(key)
        if found is None:
            row = self.dfas[terminal].table[state]
            targets, first_byte = np.unique(row, return_index=True)
            found = [(int(s), int(b)) for s, b in zip(targets, first_byte) if s >= 0]
            self._any[key] = found
        return found


    # --- what a hole of any length does (``HoleChart._close_loop``) ----------------------------

    def symbol_closure(self, symbol: int) -> frozenset[int]:
        """``symbol`` and every symbol some derivation from it uses: what a hole that predicts
        ``symbol`` predicts (inside a hole, every dot of every production is reachable)."""
        found = self._closure.get(symbol)
        if found is None:
            seen = {symbol}
            work = [symbol]
            while work:
                x = work.pop()
                for y in self._rhs_symbols.get(x, ()) if x >= 0 else ():
                    if y not in seen:
                        seen.add(y)
                        work.append(y)
            found = self._closure[symbol] = frozenset(seen)
        return found

    def inner_waits(self, predicted: frozenset[int]) -> dict[int, list[int]]:
        """For the nonterminals ``predicted`` in a hole: symbol -> the items of their productions
        with the dot before that symbol (every such item is in the hole's set, origin the hole)."""
        found = self._inner.get(predicted)
        if found is None:
            lhs_of = self.lhs_of
            found = {}
            for symbol, items in self.expecting.items():
                kept = [it for it in items if lhs_of[it] in predicted]
                if kept:
                    found[symbol] = kept
            if len(self._inner) > 64:
                self._inner.clear()
            self._inner[predicted] = found
        return found

    def reach(self, terminal: int, state: int) -> list[int]:
        """The DFA states any bytes lead to from ``state``, ``state`` included."""
        key = (terminal, state)
        found = self._reach.get(key)
        if found is None:
            seen = {state}
            work = [state]
            while work:
                s = work.pop()
                for s2, _ in self.any_successors(terminal, s):
                    if s2 not in seen:
                        seen.add(s2)
                        work.append(s2)
            found = self._reach[key] = sorted(seen)
        return found

    def into(self, terminal: int, state: int, byte: int) -> list[int]:
        """The states ``byte`` leads to after any bytes from ``state`` (``state`` -1: from the
        terminal's start, i.e. a lexeme that began anywhere in the hole)."""
        key = (terminal, state, byte)
        found = self._into.get(key)
        if found is None:
            table = self.dfas[terminal].table
            sources = np.arange(table.shape[0]) if state < 0 else np.asarray(self.reach(terminal, state))
            targets = np.unique(table[sources, byte])
            found = self._into[key] = [int(t) for t in targets if t >= 0]
        return found


class _Set:
    """One automaton state's Earley set. Everything in it is final once the set is closed."""

    __slots__ = ("items", "lexemes", "wait_nt", "wait_t", "done_nt", "done_t", "finished_nt", "finished_t",
                 "predicted", "started", "back")

    def __init__(self, witness: bool):
        self.items: dict[tuple[int, int], int] = {}
        self.lexemes: dict[tuple[int, int, int], int] = {}
        self.wait_nt: dict[int, list[tuple[int, int, int]]] = {}
        self.wait_t: dict[int, list[tuple[int, int, int]]] = {}
        self.done_nt: dict[int, tuple[int, tuple]] = {}  # completed from this very state, in a self-loop
        self.done_t: dict[int, tuple[int, tuple]] = {}
        self.finished_nt: set[tuple[int, int]] = set()  # (nonterminal, origin) already propagated
        self.finished_t: set[tuple[int, int]] = set()
        self.predicted: set[int] = set()
        self.started: set[int] = set()
        self.back: dict | None = {} if witness else None

    def __bool__(self) -> bool:
        return bool(self.items) or bool(self.lexemes)


class _LoopWaits(dict):
    """The wait lists of an unbounded hole's set: the items found there (a dict) plus the items
    of every production the hole predicts, built the first time a completion asks."""

    def __init__(self, inner: dict[int, list[int]], state: int):
        super().__init__()
        self._inner = inner
        self._state = state
        self._built: set[int] = set()

    def get(self, symbol, default=()):  # noqa: D401 - dict.get with the inner items merged in
        if symbol not in self._built:
            self._built.add(symbol)
            extra = [(it, self._state, 0) for it in self._inner.get(symbol, ())]
            if extra:
                self.setdefault(symbol, []).extend(extra)
        return dict.get(self, symbol, default)


class _LoopSet(_Set):
    """An unbounded hole's set in check-only mode, kept in closed form: the items found by
    skipping and completing (``items``), the lexemes that entered from before the hole
    (``outer``: each stands for every state any bytes lead to) and the terminals the hole starts
    (``inner_terminals``: each in every state)."""

    __slots__ = ("outer", "inner_terminals")

    def __init__(self):
        super().__init__(False)
        self.outer: list[tuple[int, int, int]] = []
        self.inner_terminals: list[int] = []

    def __bool__(self) -> bool:
        return bool(self.items) or bool(self.outer) or bool(self.inner_terminals)


@dataclass(frozen=True)
class Completion:
    """What ``HoleChart.check`` found: the fewest fill bytes, and where to read the fills."""

    fill_bytes: int
    sets: list
    automaton: "_Automaton"
    state: int
    key: tuple


@dataclass
class _Automaton:
    """The states after the chart's last one: for each, its incoming transitions
    ``(source, byte | _ANY)``, whether it loops on any byte, and the hole it lies in."""

    first: int
    incoming: list[list[tuple[int, int]]]
    self_loop: list[bool]
    hole_of: list[int]
    finals: set[int]


def _automaton(first: int, parts: Sequence[bytes], holes: Sequence[HoleBounds]) -> _Automaton:
    """Hole ``i`` then fixed text ``parts[i]``, for each ``i``, after state ``first``."""
    incoming: list[list[tuple[int, int]]] = []
    self_loop: list[bool] = []
    hole_of: list[int] = []

    def new(sources: list[tuple[int, int]], loop: bool, hole: int) -> int:
        incoming.append(sources)
        self_loop.append(loop)
        hole_of.append(hole)
        return first + len(incoming)

    exits = {first}
    for index, (part, (low, high)) in enumerate(zip(parts, holes)):
        reachable = set(exits) if low == 0 else set()
        previous = sorted(exits)
        if high is None:
            length = max(low, 1)
            for i in range(length):
                last = i == length - 1
                state = new([(p, _ANY) for p in previous], last, index)
                if last:
                    incoming[-1].append((state, _ANY))
                previous = [state]
            reachable.add(previous[0])
        else:
            for i in range(high):
                state = new([(p, _ANY) for p in previous], False, index)
                previous = [state]
                if i + 1 >= low:
                    reachable.add(state)
        exits = reachable
        for byte in part:
            state = new([(p, byte) for p in sorted(exits)], False, -1)
            exits = {state}
    return _Automaton(first, incoming, self_loop, hole_of, exits)


def normalise_holes(parts: Sequence[bytes], holes: Sequence[HoleBounds] | None) -> list[HoleBounds]:
    """One ``(min, max)`` per hole, checked: ``max`` None means unbounded."""
    count = len(parts) - 1
    if holes is None:
        return [(0, None)] * count
    holes = list(holes)
    if len(holes) != count:
        raise ValueError(f"hole_bytes has {len(holes)} bounds for {count} holes")
    out = []
    for i, bound in enumerate(holes):
        if bound is None:
            out.append((0, None))
            continue
        try:
            low, high = bound
        except (TypeError, ValueError):
            raise ValueError(f"hole_bytes[{i}] must be (min, max), got {bound!r}") from None
        if isinstance(low, bool) or not isinstance(low, int) or low < 0:
            raise ValueError(f"hole_bytes[{i}]: min must be an int >= 0, got {low!r}")
        if high is not None and (isinstance(high, bool) or not isinstance(high, int) or high < low):
            raise ValueError(f"hole_bytes[{i}]: max must be None or an int >= min, got {high!r}")
        out.append((low, high))
    return out


class HoleChart:
    """Earley sets over a fixed prefix, extended byte by byte, and checks of what may follow.

    ``extend(data)`` appends the prefix's bytes; ``truncate(n)`` rolls back to ``n`` bytes;
    ``check(parts, holes)`` asks whether the prefix, then hole 0, ``parts[0]``, hole 1, … can be
    completed, without changing the chart. ``witness=True`` keeps back-pointers for ``fills``.
    """

    def __init__(self, grammar: HoleGrammar, limits: Limits | None = None, *, witness: bool = False):
        self.grammar = grammar
        self.limits = limits or Limits()
        self.witness = witness
        self._items_bound = self.limits.max_infill_items
        self._work = 0
        self._deadline = float("inf")
        self.sets: list[_Set] = []
        self._seq = 0
        heap: list = []
        if grammar.start >= 0:
            for first in grammar.first_items.get(grammar.start, ()):
                self._push(heap, 0, _ITEM, (first, 0), (_PREDICTED,))
        self.sets.append(_Set(witness))
        self._run(lambda: self._close(0, heap, False))

    # --- public ---------------------------------------------------------------------------

    @property
    def length(self) -> int:
        """Bytes of fixed prefix in the chart."""
        return len(self.sets) - 1

    @property
    def alive(self) -> bool:
        """The prefix is a prefix of some string of the language (its last set is not empty)."""
        return bool(self.sets[-1])

    def extend(self, data: bytes) -> bool:
        """Append ``data`` to the prefix; returns ``alive``. A dead prefix stays dead."""
        def work():
            for byte in data:
                q = len(self.sets)
                heap: list = []
                self._transfer(self.sets[q - 1], q - 1, byte, heap)
                self.sets.append(_Set(self.witness))
                self._close(q, heap, False)
        self._run(work)
        return self.alive

    def truncate(self, length: int) -> None:
        """Forget the prefix past ``length`` bytes."""
        if not 0 <= length <= self.length:
            raise ValueError(f"cannot truncate a {self.length}-byte chart to {length}")
        del self.sets[length + 1:]

    def check(self, parts: Sequence[bytes], holes: Sequence[HoleBounds]) -> "Completion | None":
        """Close the sets of hole 0, ``parts[0]``, hole 1, … after the prefix, without keeping
        them; the fewest-fill-byte completion found, or None when there is none."""
        grammar = self.grammar
        if grammar.start < 0 or not self.alive:
            return None
        base = self.length
        auto = _automaton(base, parts, holes)
        sets = self.sets

        def work():
            for offset, sources in enumerate(auto.incoming):
                q = base + 1 + offset
                heap: list = []
                for source, label in sources:
                    if source != q and sets[source]:  # the self-loop runs inside the closure
                        self._transfer(sets[source], source, label, heap)
                if auto.self_loop[offset] and not self.witness:
                    sets.append(_LoopSet())
                    self._close_loop(q, heap)
                else:
                    sets.append(_Set(self.witness))
                    self._close(q, heap, auto.self_loop[offset])
        try:
            self._run(work)
            best = None
            accept = grammar.accept_items
            for q in auto.finals:
                for (item, origin), weight in sets[q].items.items():
                    if origin == 0 and item in accept and (best is None or weight < best[0]):
                        best = (weight, q, (item, origin))
            if best is None:
                return None
            return Completion(best[0], list(sets) if self.witness else [], auto, best[1], best[2])
        finally:
            del sets[base + 1:]

    @staticmethod
    def fills(found: "Completion", n_holes: int) -> list[bytes]:
        """The bytes each hole gets in the derivation ``check`` found (``witness=True``)."""
        sets, auto, q, key = found.sets, found.automaton, found.state, found.key
        if not sets:
            raise ValueError("fills need a chart built with witness=True")
        fills = [bytearray() for _ in range(n_holes)]
        base = auto.first
        stack: list[tuple[int, int, tuple]] = [(_ITEM, q, key)]
        while stack:
            kind, state, key = stack.pop()
            back = sets[state].back[(kind, key)]
            tag = back[0]
            if tag == _PREDICTED or tag == _STARTED:
                continue
            if tag == _BYTE:
                _, previous, source, byte = back
                if state > base and auto.hole_of[state - base - 1] >= 0:  # hole states are entered by "any byte"
                    fills[auto.hole_of[state - base - 1]].append(byte)
                stack.append((_LEXEME, source, previous))
            else:
                _, previous, source, child = back
                # read right to left (a lexeme's chain runs backwards): the right child pops first
                stack.append((_ITEM, source, previous))
                stack.append((_LEXEME if tag == _TERM else _ITEM, state, child))
        # bytes were collected right to left
        return [bytes(reversed(f)) for f in fills]

    # --- the algorithm ---------------------------------------------------------------------

    def _run(self, work) -> None:
        self._work = 0
        seconds = self.limits.max_step_seconds
        self._deadline = time.monotonic() + seconds if seconds != float("inf") else float("inf")
        work()

    def _push(self, heap: list, weight: int, kind: int, key: tuple, back: tuple) -> None:
        self._seq += 1
        heapq.heappush(heap, (weight, self._seq, kind, key, back))

    def _transfer(self, source: _Set, q: int, label: int, heap: list) -> None:
        """Push ``source``'s lexemes one byte on (``label``) into the next state's heap."""
        grammar = self.grammar
        push = self._push
        if isinstance(source, _LoopSet):
            if label == _ANY:  # pragma: no cover - an unbounded hole is always followed by fixed text
                raise AssertionError("no 'any byte' transition leaves an unbounded hole")
            for t in source.inner_terminals:
                for s2 in grammar.into(t, -1, label):
                    push(heap, 0, _LEXEME, (t, s2, q), (_BYTE,))
            for t, s, start in source.outer:
                for s2 in grammar.into(t, s, label):
                    push(heap, 0, _LEXEME, (t, s2, start), (_BYTE,))
            return
        if label == _ANY:
            for (t, s, start), weight in source.lexemes.items():
                for s2, byte in grammar.any_successors(t, s):
                    push(heap, weight + 1, _LEXEME, (t, s2, start), (_BYTE, (t, s, start), q, byte))
        else:
            step = grammar.step
            for (t, s, start), weight in source.lexemes.items():
                s2 = step(t, s, label)
                if s2 >= 0:
                    push(heap, weight, _LEXEME, (t, s2, start), (_BYTE, (t, s, start), q, label))

    def _close_loop(self, q: int, heap: list) -> None:
        """Close an unbounded hole's set in closed form (check-only mode, weights unused): a
        hole can hold any derivation, so an item skips any symbol after its dot, a lexeme that
        entered the hole can finish there, and every symbol an item still expects is predicted,
        with every dot of its productions. Equal to ``_close(q, heap, loop=True)``'s answer, in
        time linear in the items that reach the hole instead of in the whole grammar."""
        grammar = self.grammar
        S: _LoopSet = self.sets[q]
        sets = self.sets
        next_symbol, lhs_of = grammar.next_symbol, grammar.lhs_of
        bound = self._items_bound
        items = S.items
        work: list[tuple[int, int]] = []
        seen_outer: set[tuple[int, int, int]] = set()
        finished: set[tuple[int, int]] = set()

        def complete(symbol: int, origin: int) -> None:
            if (symbol, origin) in finished:
                return
            finished.add((symbol, origin))
            source = sets[origin]
            waits = source.wait_t if symbol < 0 else source.wait_nt
            for it, org, _ in waits.get(~symbol if symbol < 0 else symbol, ()):
                key = (it + 1, org)
                if key not in items:
                    items[key] = 0
                    work.append(key)

        for _, _, kind, key, _ in heap:
            if kind != _LEXEME or key in seen_outer:
                continue
            seen_outer.add(key)
            S.outer.append(key)
            t, _, start = key
            complete(~t, start)
        predicted: set[int] = set()
        while work:
            self._work += 1
            if self._work > bound:
                raise LimitExceeded("max_infill_items", bound)
            if not self._work & 1023 and time.monotonic() > self._deadline:
                raise LimitExceeded("max_step_seconds", self.limits.max_step_seconds)
            item, origin = work.pop()
            symbol = next_symbol[item]
            if symbol is None:
                complete(lhs_of[item], origin)
                continue
            if symbol not in predicted:
                predicted |= grammar.symbol_closure(symbol)
            key = (item + 1, origin)
            if key not in items:
                items[key] = 0
                work.append(key)
            bucket = S.wait_t if symbol < 0 else S.wait_nt
            bucket.setdefault(~symbol if symbol < 0 else symbol, []).append((item, origin, 0))
        nonterminals = frozenset(x for x in predicted if x >= 0)
        waits = _LoopWaits(grammar.inner_waits(nonterminals), q)
        for symbol, entries in S.wait_nt.items():
            dict.__setitem__(waits, symbol, entries)
        S.wait_nt = waits
        inner_t = _LoopWaits({~x: v for x, v in grammar.inner_waits(nonterminals).items() if x < 0}, q)
        for symbol, entries in S.wait_t.items():
            dict.__setitem__(inner_t, symbol, entries)
        S.wait_t = inner_t
        S.inner_terminals = sorted(~x for x in predicted if x < 0)

    def _close(self, q: int, heap: list, loop: bool) -> None:
        """Close state ``q``'s set in order of weight: predictions, completions, lexemes started
        here, and (``loop``) every byte of a self-loop."""
        grammar = self.grammar
        S = self.sets[q]
        sets = self.sets
        push = self._push
        pop = heapq.heappop
        next_symbol, lhs_of, first_items = grammar.next_symbol, grammar.lhs_of, grammar.first_items
        keep = S.back
        bound = self._items_bound
        while heap:
            weight, _, kind, key, back = pop(heap)
            self._work += 1
            if self._work > bound:
                raise LimitExceeded("max_infill_items", bound)
            if not self._work & 1023 and time.monotonic() > self._deadline:
                raise LimitExceeded("max_step_seconds", self.limits.max_step_seconds)
            if kind == _ITEM:
                if key in S.items:
                    continue
                S.items[key] = weight
                if keep is not None:
                    keep[(_ITEM, key)] = back
                item, origin = key
                symbol = next_symbol[item]
                if symbol is None:
                    lhs = lhs_of[item]
                    if origin == q:
                        if lhs in S.done_nt:
                            continue
                        S.done_nt[lhs] = (weight, key)
                        waiting = S.wait_nt.get(lhs, ())
                    else:
                        if (lhs, origin) in S.finished_nt:
                            continue
                        S.finished_nt.add((lhs, origin))
                        waiting = sets[origin].wait_nt.get(lhs, ())
                    for it, org, w in waiting:
                        push(heap, w + weight, _ITEM, (it + 1, org), (_NT, (it, org), origin, key))
                elif symbol >= 0:
                    S.wait_nt.setdefault(symbol, []).append((item, origin, weight))
                    if symbol not in S.predicted:
                        S.predicted.add(symbol)
                        for first in first_items.get(symbol, ()):
                            push(heap, 0, _ITEM, (first, q), (_PREDICTED,))
                    done = S.done_nt.get(symbol)
                    if done is not None:
                        push(heap, weight + done[0], _ITEM, (item + 1, origin), (_NT, key, q, done[1]))
                else:
                    t = ~symbol
                    S.wait_t.setdefault(t, []).append((item, origin, weight))
                    if t not in S.started:
                        S.started.add(t)
                        push(heap, 0, _LEXEME, (t, grammar.dfas[t].start, q), (_STARTED,))
                    done = S.done_t.get(t)
                    if done is not None:
                        push(heap, weight + done[0], _ITEM, (item + 1, origin), (_TERM, key, q, done[1]))
            else:
                if key in S.lexemes:
                    continue
                S.lexemes[key] = weight
                if keep is not None:
                    keep[(_LEXEME, key)] = back
                t, s, start = key
                if grammar.accepting(t, s):
                    waiting = ()
                    if start == q:
                        if t not in S.done_t:
                            S.done_t[t] = (weight, key)
                            waiting = S.wait_t.get(t, ())
                    elif (t, start) not in S.finished_t:
                        S.finished_t.add((t, start))
                        waiting = sets[start].wait_t.get(t, ())
                    for it, org, w in waiting:
                        push(heap, w + weight, _ITEM, (it + 1, org), (_TERM, (it, org), start, key))
                if loop:
                    for s2, byte in grammar.any_successors(t, s):
                        push(heap, weight + 1, _LEXEME, (t, s2, start), (_BYTE, key, q, byte))


# --- the questions, as CompiledGrammar asks them ------------------------------------------------


def texts_as_bytes(parts: Sequence[str | bytes], what: str = "parts") -> tuple[list[bytes], bool]:
    """``parts`` as bytes, and whether they were all ``str`` (then fills are returned as str)."""
    if isinstance(parts, (str, bytes, bytearray)) or not isinstance(parts, Sequence):
        raise TypeError(f"{what} must be a sequence of fixed texts (str or bytes) with a hole between each "
                        f"pair, e.g. [prefix, suffix]; got {type(parts).__name__}")
    if not parts:
        raise ValueError(f"{what} must hold at least one text")
    out = []
    text = True
    for i, part in enumerate(parts):
        if isinstance(part, str):
            out.append(part.encode("utf-8", "surrogatepass"))
        elif isinstance(part, (bytes, bytearray, memoryview)):
            out.append(bytes(part))
            text = False
        else:
            raise TypeError(f"{what}[{i}] must be str or bytes, got {type(part).__name__}")
    return out, text


def _merged(parts: list[bytes], holes: list[HoleBounds]) -> tuple[list[bytes], list[HoleBounds], list[list[int]]]:
    """Adjacent holes (an empty fixed text between them) as one, with the original holes each
    merged hole stands for: the automaton then has no empty fixed part inside."""
    out_parts = [parts[0]]
    out_holes: list[HoleBounds] = []
    groups: list[list[int]] = []
    for i, bound in enumerate(holes):
        if groups and out_parts[-1] == b"" and len(out_parts) > 1:
            low, high = out_holes[-1]
            out_holes[-1] = (low + bound[0], None if high is None or bound[1] is None else high + bound[1])
            groups[-1].append(i)
            out_parts[-1] = parts[i + 1]
        else:
            out_holes.append(bound)
            groups.append([i])
            out_parts.append(parts[i + 1])
    return out_parts, out_holes, groups


def _split(fill: bytes, bounds: list[HoleBounds]) -> list[bytes]:
    """One merged hole's fill shared among the holes it stands for, each within its bounds:
    every hole takes its minimum, and the rest goes to the first that has room."""
    sizes = [low for low, _ in bounds]
    rest = len(fill) - sum(sizes)
    for i, (low, high) in enumerate(bounds):
        room = rest if high is None else min(rest, high - low)
        sizes[i] += room
        rest -= room
    out, at = [], 0
    for size in sizes:
        out.append(fill[at:at + size])
        at += size
    return out


def _question(grammar: HoleGrammar, parts: Sequence[str | bytes], hole_bytes: Sequence[HoleBounds] | None):
    """``parts`` and ``hole_bytes`` checked and normalised: ``(answer, text, holes, fixed, merged,
    groups)``, with ``answer`` True/False where the grammar decides at once (no start symbol, or
    the empty text of a nullable language), else None and adjacent holes merged."""
    data, text = texts_as_bytes(parts)
    holes = normalise_holes(data, hole_bytes)
    if grammar.start < 0 and not grammar.cfg.start_nullable:
        return False, text, holes, None, None, None
    if not any(data) and all(low == 0 for low, _ in holes) and grammar.cfg.start_nullable:
        return True, text, holes, None, None, None
    fixed, merged, groups = _merged(data, holes)
    return None, text, holes, fixed, merged, groups


def solve(grammar: HoleGrammar, parts: Sequence[str | bytes], hole_bytes: Sequence[HoleBounds] | None,
          limits: Limits, *, witness: bool) -> tuple[bool, list[bytes] | None, bool]:
    """(completable, the fills of a fewest-byte completion when ``witness``, parts were str)."""
    answer, text, holes, fixed, merged, groups = _question(grammar, parts, hole_bytes)
    if answer is not None:
        return answer, ([b""] * len(holes) if answer else None), text
    chart = HoleChart(grammar, limits, witness=witness)
    chart.extend(fixed[0])
    found = chart.check(fixed[1:], merged)
    if found is None:
        return False, None, text
    if not witness:
        return True, None, text
    fills: list[bytes] = []
    for fill, group in zip(chart.fills(found, len(merged)), groups):
        fills.extend(_split(fill, [holes[i] for i in group]))
    return True, fills, text


class PrefixChart:
    """``completable`` for a run of questions whose first fixed texts share long beginnings — a
    diffusion canvas, whose committed left part only grows while its proposals change. The chart
    over the last first text is kept and parsed again only from where the next one differs, so a
    check pays for what follows the common part (one-shot ``solve`` parses it all every time)."""

    def __init__(self, grammar: HoleGrammar, limits: Limits | None = None):
        self.grammar = grammar
        self.chart = HoleChart(grammar, limits)
        self.text = b""

    def completable(self, parts: Sequence[str | bytes], hole_bytes: Sequence[HoleBounds] | None = None) -> bool:
        answer, _, _, fixed, merged, _ = _question(self.grammar, parts, hole_bytes)
        if answer is not None:
            return answer
        self._hold(fixed[0])
        return self.chart.check(fixed[1:], merged) is not None

    def _hold(self, first: bytes) -> None:
        """The chart over ``first``: truncated to the common beginning, extended by the rest."""
        common = len(os.path.commonprefix([self.text, first]))
        self.chart.truncate(common)
        self.text = first[:common]
        self.chart.extend(first[common:])  # past a limit, ``text`` stays the common part: the next call cuts back
        self.text = first
