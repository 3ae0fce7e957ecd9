"""A lazily built LR(0) automaton and a non-deterministic parser over hash-consed stacks.

Why this parser: it accepts any CFG in the normal form of ``cfg.py`` (ambiguity, left and right
recursion) by following every LR(0) action at once, and its configurations are interned stacks,
so equal parser states are the *same object* and every cache downstream can key on identity.
Epsilon-free productions guarantee reductions never grow a stack, so the reduction closure of a
stack is finite; a visited set handles unit cycles.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

from grammars.automata.cfg import TerminalCFG, is_terminal, terminal_index
from grammars.errors import LimitExceeded
from grammars.limits import Limits

__all__ = ["LR0Automaton", "StackNode", "Transitions", "Parser"]


@dataclass(frozen=True)
class LRState:
    shifts: dict  # symbol -> kernel frozenset (goto target, interned lazily)
    reductions: tuple[int, ...]  # production indices
    accepts: bool  # contains the augmented item S' -> S .


class LR0Automaton:
    """LR(0) item sets over the normalised CFG, created on first use.

    Item = (production index, dot). The augmented production is index ``len(productions)``.
    """

    def __init__(self, cfg: TerminalCFG):
        self.cfg = cfg
        self.lhs = [p.lhs for p in cfg.productions] + [-1]
        self.rhs = [p.rhs for p in cfg.productions] + [(cfg.start,)]
        self.augmented = len(cfg.productions)
        by_lhs: dict[int, list[int]] = {}
        for i, p in enumerate(cfg.productions):
            by_lhs.setdefault(p.lhs, []).append(i)
        self._by_lhs = by_lhs
        self._first_items: dict[int, frozenset[int]] = {}
        self._closure_cache: dict[int, dict[int, frozenset]] = {}
        self._kernels: dict[frozenset, int] = {}
        self._states: list[LRState] = []
        self._goto: dict[tuple[int, int], int] = {}
        self._terminal_targets: dict[int, tuple[tuple[int, int], ...]] = {}
        self._lock = threading.Lock()
        self.initial = self._intern(frozenset({(self.augmented, 0)}))

    def _start_productions(self, nt: int) -> frozenset[int]:
        """All productions reachable from ``nt`` through leftmost nonterminals (closure seeds)."""
        cached = self._first_items.get(nt)
        if cached is not None:
            return cached
        seen_nt = {nt}
        stack = [nt]
        prods: set[int] = set()
        while stack:
            cur = stack.pop()
            for p in self._by_lhs.get(cur, ()):
                prods.add(p)
                rhs = self.rhs[p]
                if rhs and not is_terminal(rhs[0]) and rhs[0] not in seen_nt:
                    seen_nt.add(rhs[0])
                    stack.append(rhs[0])
        result = frozenset(prods)
        self._first_items[nt] = result
        return result

    def _closure_shifts(self, nt: int) -> dict[int, frozenset]:
        """What closing over ``nt`` adds to an item set: per next symbol, the items (q, 1) of the
        productions it starts that shift it (productions are epsilon-free, so it adds no
        reduction). Memoised: item sets that close over the same nonterminal (every state of an
        object waits for its members) merge these maps instead of re-deriving every item."""
        cached = self._closure_cache.get(nt)
        if cached is None:
            groups: dict[int, list] = {}
            for q in self._start_productions(nt):
                groups.setdefault(self.rhs[q][0], []).append((q, 1))
            cached = self._closure_cache[nt] = {sym: frozenset(items) for sym, items in groups.items()}
        return cached

    def _intern(self, kernel: frozenset) -> int:
        idx = self._kernels.get(kernel)
        if idx is not None:
            return idx
        with self._lock:
            idx = self._kernels.get(kernel)
            if idx is not None:
                return idx
            shifts: dict[int, set | frozenset] = {}
            reductions = []
            accepts = False
            closed: list[int] = []
            for p, dot in kernel:
                rhs = self.rhs[p]
                if dot < len(rhs):
                    sym = rhs[dot]
                    own = shifts.get(sym)
                    if own is None:
                        shifts[sym] = {(p, dot + 1)}
                    else:
                        own.add((p, dot + 1))
                    if not is_terminal(sym) and sym not in closed:
                        closed.append(sym)
                elif p == self.augmented:
                    accepts = True
                else:
                    reductions.append(p)
            for nt in closed:
                for sym, items in self._closure_shifts(nt).items():
                    have = shifts.get(sym)
                    if have is None:
                        shifts[sym] = items  # shared until another item joins it
                    elif have is not items:
                        shifts[sym] = have | items
            state = LRState({s: frozenset(k) for s, k in shifts.items()}, tuple(sorted(reductions)), accepts)
            self._states.append(state)
            idx = len(self._states) - 1
            self._kernels[kernel] = idx
            return idx

    def state(self, idx: int) -> LRState:
        return self._states[idx]

    def terminal_targets(self, state: int) -> tuple[tuple[int, int], ...]:
        """(terminal index, goto state) for every terminal ``state`` can shift, cached per state."""
        cached = self._terminal_targets.get(state)
        if cached is None:
            cached = tuple(
                (terminal_index(sym), self.goto(state, sym)) for sym in self._states[state].shifts if is_terminal(sym)
            )
            self._terminal_targets[state] = cached
        return cached

    def goto(self, state: int, symbol: int) -> int:
        key = (state, symbol)
        target = self._goto.get(key)
        if target is None:
            target = self._intern(self._states[state].shifts[symbol])
            self._goto[key] = target
        return target

    @property
    def n_states(self) -> int:
        return len(self._states)


class StackNode:
    """One parser stack, as an interned persistent list: (LR state, parent stack).

    Identity is equality: the parser interns nodes, so two equal stacks are one object.
    """

    __slots__ = ("state", "parent", "depth", "transitions", "shifted", "__weakref__")

    def __init__(self, state: int, parent: "StackNode | None"):
        self.state = state
        self.parent = parent
        self.depth = 0 if parent is None else parent.depth + 1
        self.transitions: Transitions | None = None
        self.shifted: dict[int, tuple[StackNode, ...]] | None = None

    def __repr__(self) -> str:
        states = []
        node: StackNode | None = self
        while node is not None:
            states.append(node.state)
            node = node.parent
        return f"StackNode({states[::-1]})"


@dataclass(frozen=True)
class Transitions:
    """What a stack can do next: the terminals it can shift and whether it accepts.

    ``shifts`` maps a terminal to the (reduced stack, goto state) pairs that shifting it pushes;
    the pushed stacks are built only when asked (``Parser.shift``), since most terminals a stack
    could take are never completed.
    """

    shifts: dict = field(default_factory=dict)  # terminal index -> tuple[(StackNode, state), ...]
    accepts: bool = False


class Parser:
    """Shared by all matchers of one compiled grammar; thread-safe (dict operations are atomic)."""

    def __init__(self, cfg: TerminalCFG, limits: Limits):
        self.cfg = cfg
        self.limits = limits
        # no start symbol: the language is {""} (cfg.start_nullable) or empty; no LR automaton
        self.lr = None if cfg.start < 0 else LR0Automaton(cfg)
        self._nodes: dict[tuple[int, int], StackNode] = {}
        self._rhs_len = [len(r) for r in self.lr.rhs] if self.lr else []
        self.root = StackNode(self.lr.initial if self.lr else 0, None)

    def push(self, parent: StackNode, state: int) -> StackNode:
        key = (state, id(parent))
        node = self._nodes.get(key)
        if node is not None and node.parent is parent:
            return node
        if len(self._nodes) >= self.limits.max_cache_entries:
            self._nodes.clear()  # identities of old nodes stay valid; only sharing is lost
        node = self._nodes.setdefault(key, StackNode(state, parent))  # atomic under the GIL
        if node.parent is not parent:  # a stale entry whose parent id was reused
            node = StackNode(state, parent)
            self._nodes[key] = node
        return node

    def shift(self, stack: StackNode, terminal: int) -> tuple[StackNode, ...]:
        """The stacks after ``stack`` shifts ``terminal`` (empty if it cannot), memoised on the node."""
        shifted = stack.shifted
        if shifted is None:
            shifted = stack.shifted = {}
        hit = shifted.get(terminal)
        if hit is None:
            hit = tuple(self.push(base, state) for base, state in self.transitions(stack).shifts.get(terminal, ()))
            shifted[terminal] = hit
        return hit

    def transitions(self, stack: StackNode) -> Transitions:
        """All terminals ``stack`` can shift after any sequence of reductions (memoised on the node)."""
        cached = stack.transitions
        if cached is not None:
            return cached
        if self.lr is None:
            result = Transitions({}, stack.parent is None and self.cfg.start_nullable)
            stack.transitions = result
            return result
        lr = self.lr
        rhs_len = self._rhs_len
        lhs = lr.lhs
        shifts: dict[int, dict[tuple[StackNode, int], None]] = {}  # ordered sets of (node, goto state)
        accepts = False
        seen = {id(stack)}
        work = [stack]
        while work:
            node = work.pop()
            st = lr.state(node.state)
            if st.accepts:
                accepts = True
            for terminal, target in lr.terminal_targets(node.state):
                bucket = shifts.get(terminal)
                if bucket is None:
                    bucket = shifts[terminal] = {}
                bucket[(node, target)] = None
            for p in st.reductions:
                base = node
                for _ in range(rhs_len[p]):
                    base = base.parent
                reduced = self.push(base, lr.goto(base.state, lhs[p]))
                if id(reduced) not in seen:
                    seen.add(id(reduced))
                    work.append(reduced)
                    if len(seen) > self.limits.max_parser_stacks:
                        raise LimitExceeded("max_parser_stacks", self.limits.max_parser_stacks)
        result = Transitions({t: tuple(v) for t, v in shifts.items()}, accepts)
        stack.transitions = result
        return result
