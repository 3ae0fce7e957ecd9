"""Shortest completions, exact in bytes, from the grammar's structure (``CompletionTables``).

What ``Matcher.shortest_completion`` and budget-aware closing stand on: from any match state,
the fewest bytes (and tokens) that reach an accepting state.
"""

from __future__ import annotations

import heapq
import weakref
from itertools import count

import numpy as np

from grammars.automata.cfg import is_terminal, terminal_index
from grammars.errors import LimitExceeded
from grammars.masks.runtime import BoundedCache, GrammarRuntime, MatchState
from grammars.vocab.spelling import Spelling

__all__ = ["CompletionTables"]

#: Byte preference among equally short completions: closing characters, digits, then letters,
#: so completions read naturally ("0", '""', "}"); every choice has the same length.
_BYTE_ORDER = np.array(
    list(b'"}]),:0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ -_.')
    + [b for b in range(32, 127) if b not in b'"}]),:0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ -_.']
    + list(range(128, 256)) + list(range(32)) + [127],
    dtype=np.int64,
)
_BYTE_LIST = _BYTE_ORDER.tolist()
_SMALL_FRONTIER = 16
#: DFAs up to this many states get a full distance table (cheap to build, O(1) lookups).
_TABLE_DFA_STATES = 4096
_INF = float("inf")
_GOAL = object()


class CompletionTables:
    """Shortest completions for one grammar runtime, from the grammar's structure.

    Why not search texts: where any JSON value may go the number of distinct prefixes grows
    exponentially with their length, so a byte-level search drowns exactly where closing matters.
    The structure gives the answer directly:

    * every terminal DFA state has a distance to acceptance (BFS over its table);
    * every nonterminal has a minimal yield (Knuth's generalisation of Dijkstra over productions);
    * a parser stack finishes by completing one of its top state's *kernel* items
      ``A -> α . β`` (|α| >= 1): cost ``minyield(β)``, after which the stack is one |α| levels
      down with ``goto(·, A)`` pushed. A node of the graph-structured stack stands for several
      linear stacks, so |α| levels down is a set of base nodes, and each gives its own move (to
      ``goto(b, A)`` over ``b`` alone): the cheapest over the set is the cheapest over the
      linear stacks. Closure items are never cheaper than the kernel item that put them there,
      and the root finishes with ``minyield(start)``. Moves only go down to older nodes, so a
      Dijkstra over nodes from any node visits at most (LR states) x (nodes below it).

    A matcher state is a set of configurations ``(stack, terminal, dfa_state)``: finishing the
    lexeme costs the DFA distance, then the stacks that shift the terminal take over. The texts
    concatenate the chosen lexemes and yields; the runtime follows every parse at once, so the
    text reaches an accepting state. Built lazily, one per runtime (weakly keyed), shared by
    all its matchers; answers are memoised per stack and per match state.
    """

    _by_runtime: "weakref.WeakKeyDictionary[GrammarRuntime, CompletionTables]" = weakref.WeakKeyDictionary()
    _spellings: dict[int, tuple[object, object, Spelling]] = {}

    @classmethod
    def of(cls, runtime: GrammarRuntime) -> "CompletionTables":
        tables = cls._by_runtime.get(runtime)
        if tables is None:
            tables = cls._by_runtime[runtime] = cls(runtime)
        return tables

    def __init__(self, runtime: GrammarRuntime):
        self.rt = runtime
        self.parser = runtime.parser
        self.lr = runtime.parser.lr
        self.dfas = runtime.dfas
        self._lexeme: dict[tuple[int, int], bytes] = {}
        self._dist: dict[int, np.ndarray | None] = {}
        self._moves: dict[int, list[tuple[int, int, int]]] = {}
        self._suffix: dict[tuple[int, int], int] = {}
        self._yields: dict[int, bytes] = {}
        self._stacks: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        self._texts = BoundedCache(4096)
        self._tokens = BoundedCache(4096)
        self._nt_cost: list[float] = []
        self._nt_best: list[int] = []
        if self.lr is not None:
            self._min_yields()

    # --- per match state -----------------------------------------------------------------------

    def text(self, state: MatchState) -> bytes | None:
        """The shortest completion of ``state``; ``None`` past a limit, remembered only for the
        limits that do not depend on time (the next call may well finish in time)."""
        hit = self._texts.get(state)
        if hit is None:
            try:
                with self.parser.clock:
                    hit = (self._shortest_text(state),)
            except LimitExceeded as exc:
                if exc.limit == "max_step_seconds":
                    return None
                hit = (None,)
            self._texts.put(state, hit)
        return hit[0]

    def tokens(self, state: MatchState, text_ok: np.ndarray) -> tuple[int, ...] | None:
        hit = self._tokens.get(state)
        if hit is None:
            text = self.text(state)
            hit = (None if text is None else self._tokenize(state, text, text_ok),)
            self._tokens.put(state, hit)
        return hit[0]

    def _shortest_text(self, state: MatchState) -> bytes | None:
        if self.lr is None:
            return None
        options: dict[tuple[object, int], tuple[int, int]] = {}  # (stack, terminal) -> (bytes to end it, dfa state)
        for stack, t, s in state:
            d = self._distance(t, s)
            key = (stack, t)
            if key not in options or d < options[key][0]:
                options[key] = (d, s)
        best, chosen = _INF, None
        for (stack, t), (d, s) in sorted(options.items(), key=lambda kv: kv[1][0]):
            if d >= best:
                break
            for nxt in self.parser.shift(stack, t):
                found = self._stack_completion(nxt)
                if found is not None and d + found[0] < best:
                    best, chosen = d + found[0], (t, s, found[1])
        if chosen is None:
            return None
        t, s, rest = chosen
        return self._lexeme_from(t, s) + rest

    # --- stacks --------------------------------------------------------------------------------

    def _stack_completion(self, start) -> tuple[int, bytes] | None:
        """(cost, text) to accept from a stack that has just shifted a terminal; memoised."""
        if start in self._stacks:
            return self._stacks[start]
        order = count()
        best = {start: 0}
        back: dict = {start: None}  # node -> (previous node, production, dot)
        heap: list = [(0, next(order), start, None)]
        result = None
        while heap:
            cost, _, node, via = heapq.heappop(heap)
            if node is _GOAL:
                result = self._reconstruct(via, back)
                break
            if cost > best[node]:
                continue
            self.parser.clock.check()
            if node is not start and node in self._stacks:  # solved before: jump to the goal
                known = self._stacks[node]
                if known is not None:
                    heapq.heappush(heap, (cost + known[0], next(order), _GOAL, (node, None, known[1])))
                continue
            for step, p, dot, target in self._node_moves(node):
                total = cost + step
                if target is _GOAL:
                    heapq.heappush(heap, (total, next(order), _GOAL, (node, (p, dot), b"")))
                elif total < best.get(target, _INF):
                    best[target] = total
                    back[target] = (node, p, dot)
                    heapq.heappush(heap, (total, next(order), target, None))
        self._stacks[start] = result
        return result

    def _node_moves(self, node):
        """(cost, production, dot, target stack or _GOAL) for each way to finish an item of ``node``."""
        lr = self.lr
        if not node.parents:  # the root: derive the start symbol
            yield int(self._nt_cost[self.parser.cfg.start]), lr.augmented, 0, _GOAL
            return
        for step, p, dot in self._state_moves(node.state):
            if p == lr.augmented:
                yield step, p, dot, _GOAL
                continue
            for base in self.parser.bases(node, dot):
                if lr.lhs[p] in lr.state(base.state).shifts:  # always, for a stack the parser built
                    yield step, p, dot, self.parser.push(base, lr.goto(base.state, lr.lhs[p]))

    def _state_moves(self, q: int) -> list[tuple[int, int, int]]:
        """(minyield of the rest, production, dot) for every item of LR state ``q`` with dot >= 1."""
        moves = self._moves.get(q)
        if moves is None:
            lr = self.lr
            st = lr.state(q)
            items = {(p, d - 1) for kernel in st.shifts.values() for p, d in kernel if d >= 2}
            items.update((p, len(lr.rhs[p])) for p in st.reductions)
            if st.accepts:
                items.add((lr.augmented, 1))
            moves = sorted((self._suffix_cost(p, d), p, d) for p, d in items)
            self._moves[q] = moves
        return moves

    def _reconstruct(self, via, back) -> tuple[int, bytes]:
        """The text from the start to the goal; every node on the way gets its (optimal) suffix."""
        node, move, tail = via
        suffix = (self._suffix_text(*move) if move is not None else b"") + tail
        while True:
            if node not in self._stacks:
                self._stacks[node] = (len(suffix), suffix)
            entry = back[node]
            if entry is None:
                return len(suffix), suffix
            node, p, dot = entry
            suffix = self._suffix_text(p, dot) + suffix

    # --- yields --------------------------------------------------------------------------------

    def _min_yields(self) -> None:
        """Minimal yield length and a production achieving it for every nonterminal (Knuth 1977)."""
        cfg = self.parser.cfg
        n = len(cfg.nonterminal_names)
        lhs, rhs = self.lr.lhs, self.lr.rhs
        cost = [_INF] * n
        best = [-1] * n
        waiting = []
        partial = []
        users: dict[int, list[int]] = {}
        heap: list = []
        for p in range(len(cfg.productions)):
            base = 0
            nts = 0
            for sym in rhs[p]:
                if is_terminal(sym):
                    base += self._min_lexeme(terminal_index(sym))
                else:
                    nts += 1
                    users.setdefault(sym, []).append(p)
            waiting.append(nts)
            partial.append(base)
            if nts == 0:
                heapq.heappush(heap, (base, p))
        while heap:
            c, p = heapq.heappop(heap)
            a = lhs[p]
            if cost[a] != _INF:
                continue
            cost[a], best[a] = c, p
            for q in users.get(a, ()):
                partial[q] += c
                waiting[q] -= 1
                if waiting[q] == 0:
                    heapq.heappush(heap, (partial[q], q))
        self._nt_cost, self._nt_best = cost, best

    def _symbol_cost(self, sym: int) -> int:
        return self._min_lexeme(terminal_index(sym)) if is_terminal(sym) else int(self._nt_cost[sym])

    def _suffix_cost(self, p: int, dot: int) -> int:
        key = (p, dot)
        c = self._suffix.get(key)
        if c is None:
            c = self._suffix[key] = sum(self._symbol_cost(sym) for sym in self.lr.rhs[p][dot:])
        return c

    def _suffix_text(self, p: int, dot: int) -> bytes:
        return b"".join(self._yield(sym) for sym in self.lr.rhs[p][dot:])

    def _yield(self, sym: int) -> bytes:
        """A shortest text of ``sym``; iterative, since derivations may nest deeply."""
        if is_terminal(sym):
            t = terminal_index(sym)
            return self._lexeme_from(t, self.dfas[t].start)
        done = self._yields
        stack = [sym]
        while stack:
            a = stack[-1]
            if a in done:
                stack.pop()
                continue
            missing = [s for s in self.lr.rhs[self._nt_best[a]] if not is_terminal(s) and s not in done]
            if missing:
                stack.extend(missing)  # Knuth's order makes the best derivations acyclic
                continue
            done[a] = b"".join(self._yield(s) if is_terminal(s) else done[s] for s in self.lr.rhs[self._nt_best[a]])
            stack.pop()
        return done[sym]

    # --- terminals -----------------------------------------------------------------------------

    def _min_lexeme(self, t: int) -> int:
        return self._distance(t, self.dfas[t].start)

    def _distance(self, t: int, s: int) -> int:
        """Bytes from state ``s`` of terminal ``t``'s DFA to acceptance."""
        dist = self._distances(t)
        return int(dist[s]) if dist is not None else len(self._lexeme_from(t, s))

    def _distances(self, t: int) -> np.ndarray | None:
        """Every state's distance to acceptance (reverse BFS), for DFAs of at most
        ``_TABLE_DFA_STATES`` states; ``None`` for bigger ones, which search forward per state."""
        if t in self._dist:
            return self._dist[t]
        dfa = self.dfas[t]
        table = np.asarray(dfa.table)
        n = table.shape[0]
        dist = None
        if n <= _TABLE_DFA_STATES:
            dist = np.full(n, -1, dtype=np.int64)
            live = table >= 0
            src = np.nonzero(live)[0]
            dst = table[live]
            order = np.argsort(dst, kind="stable")
            preds = src[order]
            starts = np.searchsorted(dst[order], np.arange(n + 1))
            frontier = np.flatnonzero(np.asarray(dfa.accepting))
            dist[frontier] = 0
            level = 0
            while frontier.size:
                level += 1
                lens = starts[frontier + 1] - starts[frontier]
                total = int(lens.sum())
                if not total:
                    break
                offsets = np.repeat(starts[frontier] - np.cumsum(lens) + lens, lens) + np.arange(total)
                frontier = np.unique(preds[offsets])
                frontier = frontier[dist[frontier] < 0]
                dist[frontier] = level
        self._dist[t] = dist
        return dist

    def _lexeme_from(self, t: int, s: int) -> bytes:
        """A shortest byte string from state ``s`` of terminal ``t``'s DFA to acceptance.

        Forward breadth-first search stopping at the first level that holds an accepting state:
        lexemes are short where closing happens, while the DFAs of long strings or big enums have
        tens of thousands of states. Small levels run in plain Python, wide ones vectorised.
        Ties go to the earlier byte of ``_BYTE_ORDER``.
        """
        key = (t, s)
        text = self._lexeme.get(key)
        if text is not None:
            return text
        dfa = self.dfas[t]
        table = np.asarray(dfa.table)
        dist = self._distances(t)
        if dist is not None:  # walk down the distances
            out = bytearray()
            cur = s
            while dist[cur] > 0:
                row = table[cur].tolist()
                want = dist[cur] - 1
                for byte in _BYTE_LIST:
                    v = row[byte]
                    if v >= 0 and dist[v] == want:
                        out.append(byte)
                        cur = v
                        break
            text = self._lexeme[key] = bytes(out)
            return text
        accepting = np.asarray(dfa.accepting)
        parents: dict[int, tuple[int, int]] = {}
        frontier = np.array([s], dtype=np.int64)
        seen = np.zeros(table.shape[0], dtype=bool)
        seen[s] = True
        while frontier.size <= _SMALL_FRONTIER:  # plain Python is faster on the usual tiny frontiers
            level = frontier.tolist()
            hit = next((u for u in level if accepting[u]), None)
            if hit is not None:
                return self._remember_lexeme(key, s, hit, parents)
            nxt = []
            for u in level:
                row = table[u].tolist()
                for byte in _BYTE_LIST:
                    v = row[byte]
                    if v >= 0 and not seen[v]:
                        seen[v] = True
                        parents[v] = (u, byte)
                        nxt.append(v)
            if not nxt:  # pragma: no cover - trimmed DFAs always reach acceptance
                raise LimitExceeded("dfa_completion", 0)
            frontier = np.array(nxt, dtype=np.int64)
        while True:
            hits = frontier[accepting[frontier]]
            if hits.size:
                return self._remember_lexeme(key, s, int(hits[0]), parents)
            rows = table[frontier][:, _BYTE_ORDER]  # [frontier, 256], bytes in preference order
            flat = rows.ravel()
            valid = np.flatnonzero(flat >= 0)
            targets, first = np.unique(flat[valid], return_index=True)
            fresh = ~seen[targets]
            targets, first = targets[fresh], valid[first[fresh]]
            if not targets.size:  # pragma: no cover - trimmed DFAs always reach acceptance
                raise LimitExceeded("dfa_completion", 0)
            order = np.argsort(first, kind="stable")  # keep preference order in the next frontier
            targets, first = targets[order], first[order]
            seen[targets] = True
            for v, idx in zip(targets.tolist(), first.tolist()):
                parents[v] = (int(frontier[idx // 256]), int(_BYTE_ORDER[idx % 256]))
            frontier = targets

    def _remember_lexeme(self, key: tuple[int, int], s: int, cur: int, parents: dict) -> bytes:
        out = bytearray()
        while cur != s:
            cur, byte = parents[cur]
            out.append(byte)
        text = self._lexeme[key] = bytes(reversed(out))
        return text

    # --- tokens --------------------------------------------------------------------------------

    def _tokenize(self, state: MatchState, text: bytes, text_ok: np.ndarray) -> tuple[int, ...] | None:
        """Fewest text tokens spelling ``text``. A token is allowed wherever its bytes continue
        the text: the state after a byte string does not depend on how it is split into tokens."""
        return self._spelling(text_ok).fewest(text)

    def _spelling(self, text_ok: np.ndarray) -> Spelling:
        """The text tokens by their bytes; shared by every grammar of a vocabulary."""
        token_bytes = self.rt.token_bytes
        key = id(text_ok)
        hit = self._spellings.get(key)
        if hit is None or hit[0] is not text_ok or hit[1] is not token_bytes:
            spelling = Spelling.of(token_bytes, np.flatnonzero(text_ok[: len(token_bytes)]).tolist())
            if len(self._spellings) > 8:
                self._spellings.clear()
            hit = self._spellings[key] = (text_ok, token_bytes, spelling)
        return hit[2]
