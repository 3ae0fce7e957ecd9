"""A lazily built LR(0) automaton and a non-deterministic parser over a graph-structured stack.

Why this parser: it accepts any CFG in the normal form of ``cfg.py`` (ambiguity, left and right
recursion) by following every LR(0) action at once. Parses are shared Tomita-style: a stack node
is an LR state over a *set* of parent nodes and stands for every linear stack through it, so an
ambiguous grammar keeps one node per (state, parent set) instead of one linear stack per parse,
and the work per lexeme end is polynomial in the text rather than exponential.

Nodes are immutable and interned by (state, parents), so equal parser states built the same way
are the *same object* and every cache downstream can key on identity. Epsilon-free productions
guarantee that every node's parents are older than it (a node spans at least one terminal), so a
reduction closure only adds edges from new nodes to old ones, each followed once (RNGLR's rule);
the closure is finite because edges are deduplicated, which also handles unit cycles.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

from grammars.automata.cfg import TerminalCFG, is_terminal, terminal_index
from grammars.errors import LimitExceeded
from grammars.limits import Limits

__all__ = ["LR0Automaton", "StackNode", "Transitions", "Parser", "StepClock"]


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
    """A node of the graph-structured stack: an LR state over a set of parent nodes.

    It stands for every linear stack ``[state] + s`` with ``s`` a linear stack of one of its
    parents (the root has none). Immutable, interned by ``Parser.node``: identity is equality,
    and the memo slots (``transitions``, ``shifted``, ``bases``) hold functions of the node only.
    Invariant (what reductions rely on): for each parent ``u``, ``goto(u.state, X) == state``
    where ``X`` is the symbol ``state`` is entered by, so a path down from a node spells the
    right-hand side of the production being reduced.
    """

    __slots__ = ("state", "parents", "parent", "transitions", "shifted", "bases", "__weakref__")

    def __init__(self, state: int, parents: frozenset[StackNode]):
        self.state = state
        self.parents = parents
        #: the sole parent, or None (the root, or a node where parses join): a linear stretch of
        #: the graph is walked through it without iterating sets
        self.parent: StackNode | None = next(iter(parents)) if len(parents) == 1 else None
        self.transitions: Transitions | None = None
        self.shifted: dict[int, tuple[StackNode, ...]] | None = None
        self.bases: dict[int, tuple[StackNode, ...]] | None = None

    def __repr__(self) -> str:
        return f"StackNode({self.state}, parents={len(self.parents)})"


@dataclass(frozen=True)
class Transitions:
    """What a stack can do next: the terminals it can shift and whether it accepts.

    ``shifts`` maps a terminal to the (reduced node, goto state) pairs that shifting it pushes;
    the pushed nodes are built only when asked (``Parser.shift``), since most terminals a stack
    could take are never completed.
    """

    shifts: dict = field(default_factory=dict)  # terminal index -> tuple[(StackNode, state), ...]
    accepts: bool = False


class StepClock:
    """The deadline of one matcher call (``Limits.max_step_seconds``), per thread.

    The runtime enters it around each call that may parse (``consume``, ``mask``, completions);
    nested entries share the outermost deadline. Loops that can run long call ``check``, which
    raises ``LimitExceeded("max_step_seconds")`` past it; outside any call it never raises.
    """

    __slots__ = ("seconds", "_local")

    def __init__(self, seconds: float):
        self.seconds = seconds
        self._local = threading.local()

    def __enter__(self) -> "StepClock":
        local = self._local
        depth = getattr(local, "depth", 0)
        if not depth:
            local.deadline = time.monotonic() + self.seconds
        local.depth = depth + 1
        return self

    def __exit__(self, *exc) -> None:
        self._local.depth -= 1

    def check(self) -> None:
        """Raise ``LimitExceeded`` when this thread's call has run past its deadline."""
        local = self._local
        if getattr(local, "depth", 0) and time.monotonic() > local.deadline:
            raise LimitExceeded("max_step_seconds", self.seconds)


#: Edges a reduction closure adds between clock checks.
_CHECK_EVERY = 256


class Parser:
    """Shared by all matchers of one compiled grammar; thread-safe (dict operations are atomic).

    ``work`` counts the elementary steps of reduction closures (an edge followed to a base node)
    and ``nodes_created`` the nodes interned, both over the parser's life: what tests read to
    see the work per token stay polynomial. They are statistics, not synchronised.
    """

    def __init__(self, cfg: TerminalCFG, limits: Limits):
        self.cfg = cfg
        self.limits = limits
        self.clock = StepClock(limits.max_step_seconds)
        # no start symbol: the language is {""} (cfg.start_nullable) or empty; no LR automaton
        self.lr = None if cfg.start < 0 else LR0Automaton(cfg)
        self._nodes: dict[tuple[int, frozenset], StackNode] = {}
        self._rhs_len = [len(r) for r in self.lr.rhs] if self.lr else []
        self._state_actions: dict[int, tuple] = {}
        self.work = 0
        self.nodes_created = 0
        self.root = StackNode(self.lr.initial if self.lr else 0, frozenset())

    # --- nodes -----------------------------------------------------------------------------

    def node(self, state: int, parents: frozenset[StackNode]) -> StackNode:
        """The interned node of ``state`` over ``parents`` (never empty: only the root has none)."""
        if len(parents) == 1:
            for parent in parents:
                return self.push(parent, state)
        key = (state, parents)
        node = self._nodes.get(key)
        return node if node is not None else self._new(key, state, parents)

    def push(self, parent: StackNode, state: int) -> StackNode:
        """The interned node of ``state`` over ``parent`` alone (keyed by the parent itself: the
        usual case, spared building a set to look it up)."""
        key = (state, parent)
        node = self._nodes.get(key)
        return node if node is not None else self._new(key, state, frozenset((parent,)))

    def _new(self, key: tuple, state: int, parents: frozenset[StackNode]) -> StackNode:
        if len(self._nodes) >= self.limits.max_cache_entries:
            self._nodes.clear()  # old nodes stay valid; only sharing with new ones is lost
        self.nodes_created += 1
        return self._nodes.setdefault(key, StackNode(state, parents))  # atomic under the GIL

    def merge(self, nodes: list[StackNode]) -> StackNode:
        """One node standing for the linear stacks of all ``nodes``, which share a top state."""
        if len(nodes) == 1:
            return nodes[0]
        parents = frozenset().union(*(n.parents for n in nodes))
        for n in nodes:
            if n.parents == parents:  # one of them already holds all: keep it (and its memos)
                return n
        return self.node(nodes[0].state, parents)

    def bases(self, node: StackNode, depth: int) -> tuple[StackNode, ...] | frozenset[StackNode]:
        """The nodes exactly ``depth`` levels below ``node``, along every path (memoised on the
        node where paths branch; a linear stretch is walked directly)."""
        while depth and node.parent is not None:
            node = node.parent
            depth -= 1
        if depth == 0:
            return (node,)
        if depth == 1:
            return node.parents
        memo = node.bases
        if memo is None:
            memo = node.bases = {}
        hit = memo.get(depth)
        if hit is None:
            level: dict[StackNode, None] = dict.fromkeys(node.parents)
            for _ in range(depth - 1):
                below: dict[StackNode, None] = {}
                for n in level:
                    below.update(dict.fromkeys(n.parents))
                self.work += len(level)
                level = below
            hit = memo[depth] = tuple(level)
        return hit

    # --- actions ---------------------------------------------------------------------------

    def shift(self, stack: StackNode, terminal: int) -> tuple[StackNode, ...]:
        """The nodes after ``stack`` shifts ``terminal`` (empty if it cannot): one per goto state,
        over every reduced node that shifts it to that state. Memoised on the node."""
        shifted = stack.shifted
        if shifted is None:
            shifted = stack.shifted = {}
        hit = shifted.get(terminal)
        if hit is None:
            pairs = self.transitions(stack).shifts.get(terminal, ())
            if len(pairs) == 1:  # the usual case: one node shifts it
                hit = (self.push(*pairs[0]),)
            else:
                sources: dict[int, list[StackNode]] = {}
                for base, state in pairs:
                    sources.setdefault(state, []).append(base)
                hit = tuple(self.node(state, frozenset(nodes)) for state, nodes in sources.items())
            shifted[terminal] = hit
        return hit

    def transitions(self, stack: StackNode) -> Transitions:
        """All terminals ``stack`` can shift after any sequence of reductions (memoised on the node)."""
        cached = stack.transitions
        if cached is not None:
            return cached
        if self.lr is None:
            result = Transitions({}, not stack.parents and self.cfg.start_nullable)
            stack.transitions = result
            return result
        shifts: dict[int, dict[tuple[StackNode, int], None]] = {}  # ordered sets of (node, goto state)
        accepts = False
        actions = self._actions
        for node in self._reduced(stack):
            state_accepts, _, targets = actions(node.state)
            accepts = accepts or state_accepts
            for terminal, target in targets:
                bucket = shifts.get(terminal)
                if bucket is None:
                    shifts[terminal] = {(node, target): None}
                else:
                    bucket[(node, target)] = None
        result = Transitions({t: tuple(v) for t, v in shifts.items()}, accepts)
        stack.transitions = result
        return result

    def _actions(self, state: int) -> tuple[bool, tuple[tuple[int, int], ...], tuple[tuple[int, int], ...]]:
        """(accepts, reductions as (levels below the first parent, nonterminal), (terminal,
        goto state) shifts) of an LR state: what a closure asks of each node, in one lookup."""
        hit = self._state_actions.get(state)
        if hit is None:
            lr = self.lr
            st = lr.state(state)
            reductions = tuple((self._rhs_len[p] - 1, lr.lhs[p]) for p in st.reductions)
            hit = self._state_actions[state] = (st.accepts, reductions, lr.terminal_targets(state))
        return hit

    def _reduced(self, stack: StackNode) -> list[StackNode]:
        """The reduction closure of ``stack`` as nodes, one per LR state: ``stack`` itself (or a
        node over more parents, if reductions reach its state again) and every node reductions push.

        Tomita's closure on the frontier: ``edges`` maps a state to the parents its node has
        gained so far; each new edge is followed once, along every path of each reduction.
        """
        goto, actions = self.lr.goto, self._actions
        edges: dict[int, dict[StackNode, None]] = {stack.state: dict.fromkeys(stack.parents)}
        work = [(stack.state, parent) for parent in stack.parents]
        added = len(work)
        steps = 0
        bound = self.limits.max_parser_stacks
        self.clock.check()
        while work:
            state, parent = work.pop()
            for depth, symbol in actions(state)[1]:
                base = parent
                while depth and base.parent is not None:  # the linear stretch of bases(), inline
                    base = base.parent
                    depth -= 1
                bases = self.bases(base, depth) if depth else (base,)
                steps += len(bases)
                for base in bases:
                    target = goto(base.state, symbol)
                    into = edges.get(target)
                    if into is None:
                        edges[target] = {base: None}
                    elif base in into:
                        continue
                    else:
                        into[base] = None
                    work.append((target, base))
                    added += 1
                    if added > bound:
                        raise LimitExceeded("max_parser_stacks", bound)
                    if not added % _CHECK_EVERY:
                        self.clock.check()
        self.work += steps
        nodes = []
        for state, parents in edges.items():
            if state == stack.state and len(parents) == len(stack.parents):
                nodes.append(stack)  # reductions gave it no new parent (they only ever add)
            elif len(parents) == 1:
                for parent in parents:
                    nodes.append(self.push(parent, state))
            else:
                nodes.append(self.node(state, frozenset(parents)))
        return nodes
