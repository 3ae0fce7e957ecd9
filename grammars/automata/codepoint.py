"""DFAs over Unicode code points with interval transitions, and their products.

Small automata for languages that the JSON Schema front end must reason about before any byte
DFA exists: key languages of ``patternProperties``/``propertyNames`` (intersections and
differences of patterns and names), ``pattern`` tested on concrete strings, finite pattern
languages listed, and a product written back as a regular expression in corral's dialect.
Built from the IR (``grammars.ir``) by a Thompson NFA and subset construction, then minimised.
Past its size bounds it raises ``LimitExceeded``; callers say which keyword that was.
"""

from __future__ import annotations

from bisect import bisect_left
from itertools import pairwise
from typing import Any

from grammars.errors import LimitExceeded, UnsupportedGrammarError
from grammars.ir import Alt, Chars, Expr, Literal, Repeat, Seq

__all__ = ["CodePointDFA", "MAX_CP", "MAX_DFA_STATES", "MAX_REGEX_CHARS", "MAX_REGEX_STATES"]

#: states of one code-point DFA
MAX_DFA_STATES = 4000
#: length of a regular expression written back from a DFA
MAX_REGEX_CHARS = 200_000
#: states of a DFA written back as a regular expression (its groups nest about this deep)
MAX_REGEX_STATES = 64

MAX_CP = 0x10FFFF


class CodePointDFA:
    """A DFA over Unicode code points with interval transitions (partial: missing means reject).

    ``trans[s]`` is a sorted list of disjoint ``(lo, hi, target)``; state 0 is the start.
    Small by design: it holds key and pattern languages, not whole grammars.
    """

    __slots__ = ("trans", "accept")

    def __init__(self, trans: list[list[tuple[int, int, int]]], accept: list[bool]):
        self.trans = trans
        self.accept = accept

    @classmethod
    def universal(cls) -> "CodePointDFA":
        return cls([[(0, MAX_CP, 0)]], [True])

    @classmethod
    def of_strings(cls, strings) -> "CodePointDFA":
        trans: list[dict[int, int]] = [{}]
        accept = [False]
        for s in strings:
            state = 0
            for ch in s:
                nxt = trans[state].get(ord(ch))
                if nxt is None:
                    nxt = len(trans)
                    trans.append({})
                    accept.append(False)
                    trans[state][ord(ch)] = nxt
                state = nxt
            accept[state] = True
        return cls([sorted((cp, cp, t) for cp, t in row.items()) for row in trans], accept)

    @classmethod
    def of(cls, expr: Expr) -> "CodePointDFA":
        nfa = _NFA()
        start, final = nfa.build(expr)
        return nfa.determinize(start, final).minimized()

    def matches(self, text: str) -> bool:
        state = 0
        for ch in text:
            cp = ord(ch)
            row = self.trans[state]
            i = bisect_left(row, (cp + 1,)) - 1
            if i < 0 or row[i][1] < cp:
                return False
            state = row[i][2]
        return self.accept[state]

    def finite_strings(self, limit: int) -> list[str] | None:
        """Every accepted string, when there are at most ``limit`` of them; else ``None``.

        A cycle through a state that can still reach acceptance means infinitely many strings.
        """
        live = [bool(a) for a in self.accept]
        changed = True
        while changed:  # states from which an accepting state is reachable
            changed = False
            for s, row in enumerate(self.trans):
                if not live[s] and any(live[t] for _, _, t in row):
                    live[s] = changed = True
        if not live[0]:
            return []
        out: list[str] = []
        on_path = [False] * len(self.trans)

        def visit(state: int, prefix: str) -> bool:
            if on_path[state]:
                return False  # a live cycle
            if self.accept[state]:
                out.append(prefix)
                if len(out) > limit:
                    return False
            on_path[state] = True
            for lo, hi, target in self.trans[state]:
                if not live[target]:
                    continue
                if hi - lo >= limit:
                    return False
                for cp in range(lo, hi + 1):
                    if not visit(target, prefix + chr(cp)):
                        return False
            on_path[state] = False
            return True

        return out if visit(0, "") else None

    def product(self, other: "CodePointDFA", mode: str) -> "CodePointDFA":
        """``and`` (both accept) or ``diff`` (self accepts, other does not)."""
        index: dict[tuple[int, int], int] = {(0, 0): 0}
        pairs = [(0, 0)]
        trans: list[list[tuple[int, int, int]]] = []
        accept: list[bool] = []
        i = 0
        while i < len(pairs):
            p, q = pairs[i]
            i += 1
            if len(pairs) > MAX_DFA_STATES:
                raise LimitExceeded("code_point_dfa_states", MAX_DFA_STATES, "key language too large")
            a_acc = self.accept[p]
            b_acc = q >= 0 and other.accept[q]
            accept.append(a_acc and b_acc if mode == "and" else a_acc and not b_acc)
            row: list[tuple[int, int, int]] = []
            for lo, hi, p2, q2 in _merge_rows(self.trans[p], other.trans[q] if q >= 0 else []):
                if p2 < 0 or (mode == "and" and q2 < 0):
                    continue
                key = (p2, q2)
                if key not in index:
                    index[key] = len(pairs)
                    pairs.append(key)
                row.append((lo, hi, index[key]))
            trans.append(row)
        return CodePointDFA(trans, accept).minimized()

    def minimized(self) -> "CodePointDFA":
        """Trimmed (every state can accept) and minimal, start state 0; may be empty."""
        n = len(self.trans)
        rev: list[set[int]] = [set() for _ in range(n)]
        for s, row in enumerate(self.trans):
            for _, _, t in row:
                rev[t].add(s)
        live = {s for s in range(n) if self.accept[s]}
        stack = list(live)
        while stack:
            for p in rev[stack.pop()]:
                if p not in live:
                    live.add(p)
                    stack.append(p)
        if 0 not in live:
            return CodePointDFA([[]], [False])
        rows = {s: [(lo, hi, t) for lo, hi, t in self.trans[s] if t in live] for s in live}
        block = {s: int(self.accept[s]) for s in live}
        while True:
            sigs: dict = {}
            new = {}
            for s in sorted(live):
                sig = (block[s], _coalesce(tuple((lo, hi, block[t]) for lo, hi, t in rows[s])))
                new[s] = sigs.setdefault(sig, len(sigs))
            if len(sigs) == len(set(block.values())):
                block = new
                break
            block = new
        order: dict[int, int] = {}
        queue = [block[0]]
        order[block[0]] = 0
        rep = {}
        for s in live:
            rep.setdefault(block[s], s)
        trans: list = []
        accept: list = []
        k = 0
        while k < len(queue):
            b = queue[k]
            k += 1
            s = rep[b]
            row = []
            for lo, hi, t in _coalesce(tuple((lo, hi, block[t]) for lo, hi, t in rows[s])):
                if t not in order:
                    order[t] = len(queue)
                    queue.append(t)
                row.append((lo, hi, order[t]))
            trans.append(row)
            accept.append(self.accept[s])
        return CodePointDFA(trans, accept)

    @property
    def is_empty(self) -> bool:
        return not any(self.accept)

    def to_regex(self) -> str | None:
        """A regular expression (corral's dialect, no anchors) for the language; None if empty."""
        if self.is_empty:
            return None
        n = len(self.trans)
        if n > MAX_REGEX_STATES:  # the written pattern would nest about n groups deep
            raise LimitExceeded("regex_states", MAX_REGEX_STATES, f"key language needs {n} automaton states (limit {MAX_REGEX_STATES})")
        start, final = n, n + 1
        edges: dict[tuple[int, int], Any] = {(start, 0): _EPS}
        for s, row in enumerate(self.trans):
            if self.accept[s]:
                edges[(s, final)] = _EPS
            for lo, hi, t in row:
                ranges = Chars(((lo, hi),)).ranges  # code points strings can hold (no surrogates)
                if ranges:
                    edges[(s, t)] = _r_alt(edges.get((s, t)), ("set", ranges))
        remaining = set(range(n))
        while remaining:
            ins: dict[int, list[int]] = {k: [] for k in remaining}
            outs: dict[int, list[int]] = {k: [] for k in remaining}
            for i, j in edges:
                if j in remaining and i != j:
                    ins[j].append(i)
                if i in remaining and i != j:
                    outs[i].append(j)
            k = min(remaining, key=lambda s: (len(ins[s]) * len(outs[s]), s))
            remaining.discard(k)
            loop = edges.pop((k, k), None)
            middle = _r_star(loop)
            into = [(i, edges.pop((i, k))) for i in ins[k]]
            out_of = [(j, edges.pop((k, j))) for j in outs[k]]
            for i, a in into:
                for j, b in out_of:
                    edges[(i, j)] = _r_alt(edges.get((i, j)), _r_cat(a, middle, b))
        result = edges.get((start, final))
        if result is None:
            return None
        text = _render(result)
        if len(text) > MAX_REGEX_CHARS:
            raise LimitExceeded("regex_chars", MAX_REGEX_CHARS, "key language too large to write as a pattern")
        return text


def _merge_rows(a: list, b: list):
    """Sweep two sorted interval rows: yields (lo, hi, target_a or -1, target_b or -1)."""
    points = sorted({x for lo, hi, _ in a for x in (lo, hi + 1)} | {x for lo, hi, _ in b for x in (lo, hi + 1)})
    ia = ib = 0
    for lo, nxt in pairwise(points):
        hi = nxt - 1
        while ia < len(a) and a[ia][1] < lo:
            ia += 1
        while ib < len(b) and b[ib][1] < lo:
            ib += 1
        ta = a[ia][2] if ia < len(a) and a[ia][0] <= lo else -1
        tb = b[ib][2] if ib < len(b) and b[ib][0] <= lo else -1
        if ta >= 0 or tb >= 0:
            yield lo, hi, ta, tb


def _coalesce(row: tuple) -> tuple:
    out: list = []
    for lo, hi, t in row:
        if out and out[-1][2] == t and out[-1][1] + 1 == lo:
            out[-1] = (out[-1][0], hi, t)
        else:
            out.append((lo, hi, t))
    return tuple(out)


class _NFA:
    def __init__(self) -> None:
        self.eps: list[list[int]] = []
        self.edges: list[list[tuple[tuple, int]]] = []

    def new(self) -> int:
        self.eps.append([])
        self.edges.append([])
        if len(self.eps) > 20 * MAX_DFA_STATES:
            raise LimitExceeded("code_point_nfa_states", 20 * MAX_DFA_STATES, "pattern too large for key algebra")
        return len(self.eps) - 1

    def build(self, expr: Expr) -> tuple[int, int]:
        s, e = self.new(), self.new()
        if isinstance(expr, Chars):
            if expr.ranges:
                self.edges[s].append((expr.ranges, e))
        elif isinstance(expr, Literal):
            cur = s
            for ch in expr.text:
                nxt = self.new()
                self.edges[cur].append((((ord(ch), ord(ch)),), nxt))
                cur = nxt
            self.eps[cur].append(e)
        elif isinstance(expr, Seq):
            cur = s
            for item in expr.items:
                a, b = self.build(item)
                self.eps[cur].append(a)
                cur = b
            self.eps[cur].append(e)
        elif isinstance(expr, Alt):
            for item in expr.items:
                a, b = self.build(item)
                self.eps[s].append(a)
                self.eps[b].append(e)
        elif isinstance(expr, Repeat):
            cur = s
            for _ in range(expr.min):
                a, b = self.build(expr.item)
                self.eps[cur].append(a)
                cur = b
            if expr.max is None:
                a, b = self.build(expr.item)
                self.eps[cur].append(a)
                self.eps[b].append(cur)
            else:
                for _ in range(expr.max - expr.min):
                    a, b = self.build(expr.item)
                    self.eps[cur].append(a)
                    self.eps[cur].append(e)
                    cur = b
            self.eps[cur].append(e)
        else:
            raise UnsupportedGrammarError(f"unexpected regex node {type(expr).__name__}")
        return s, e

    def _closure(self, states) -> frozenset:
        out = set(states)
        stack = list(states)
        while stack:
            for t in self.eps[stack.pop()]:
                if t not in out:
                    out.add(t)
                    stack.append(t)
        return frozenset(out)

    def determinize(self, start: int, final: int) -> CodePointDFA:
        first = self._closure([start])
        index = {first: 0}
        sets = [first]
        trans: list = []
        accept: list = []
        i = 0
        while i < len(sets):
            current = sets[i]
            i += 1
            if len(sets) > MAX_DFA_STATES:
                raise LimitExceeded("code_point_dfa_states", MAX_DFA_STATES, "pattern too large for key algebra")
            accept.append(final in current)
            moves = [(ranges, t) for s in current for ranges, t in self.edges[s]]
            points = sorted({x for ranges, _ in moves for lo, hi in ranges for x in (lo, hi + 1)})
            targets: list[set[int]] = [set() for _ in points]
            for ranges, t in moves:
                for lo, hi in ranges:
                    for k in range(bisect_left(points, lo), bisect_left(points, hi + 1)):
                        targets[k].add(t)
            row = []
            for k in range(len(points) - 1):
                if not targets[k]:
                    continue
                nxt = self._closure(targets[k])
                if nxt not in index:
                    index[nxt] = len(sets)
                    sets.append(nxt)
                row.append((points[k], points[k + 1] - 1, index[nxt]))
            trans.append(list(_coalesce(tuple(row))))
        return CodePointDFA(trans, accept)


# --- regex ASTs for state elimination: ("eps",), ("set", ranges), ("cat", items), ("alt", items), ("star", x)

_EPS = ("eps",)


def _r_alt(a, b):
    if a is None:
        return b
    if b is None:
        return a
    items = []
    for x in (a, b):
        items.extend(x[1] if x[0] == "alt" else (x,))
    sets = [x for x in items if x[0] == "set"]
    others = []
    for x in items:
        if x[0] != "set" and x not in others:
            others.append(x)
    if len(sets) > 1:
        merged = Chars(tuple(r for s in sets for r in s[1])).ranges
        sets = [("set", merged)]
    items = sets + others
    return items[0] if len(items) == 1 else ("alt", tuple(items))


def _r_cat(*xs):
    items = []
    for x in xs:
        if x is None:
            return None
        if x == _EPS:
            continue
        items.extend(x[1] if x[0] == "cat" else (x,))
    if not items:
        return _EPS
    return items[0] if len(items) == 1 else ("cat", tuple(items))


def _r_star(x):
    if x is None or x == _EPS:
        return _EPS
    if x[0] == "star":
        return x
    return ("star", x)


def _render(root) -> str:
    """Regex text of an AST, without recursion (state elimination nests deeply)."""
    text: dict[int, str] = {}
    stack = [(root, False)]
    while stack:
        node, ready = stack.pop()
        if id(node) in text:
            continue
        kind = node[0]
        children = node[1] if kind in ("cat", "alt") else (node[1],) if kind == "star" else ()
        if not ready and children:
            stack.append((node, True))
            stack.extend((child, False) for child in children if id(child) not in text)
            continue
        if kind == "eps":
            out = ""
        elif kind == "set":
            out = _render_set(node[1])
        elif kind == "star":
            out = _group(node[1], text, ("cat", "alt", "star")) + "*"
        elif kind == "cat":
            out = "".join(_group(child, text, ("alt",)) for child in node[1])
        else:  # alternation; an epsilon member makes the whole group optional
            members = [child for child in node[1] if child != _EPS]
            body = "|".join(text[id(child)] for child in members)
            out = f"(?:{body})?" if len(members) < len(node[1]) else body
        text[id(node)] = out
    return text[id(root)]


def _group(child, text: dict, kinds: tuple) -> str:
    """A child's text, in a non-capturing group when its kind binds looser than the parent."""
    out = text[id(child)]
    needs = child[0] in kinds and not (child[0] == "alt" and out.startswith("(?:") and out.endswith(")?"))
    return f"(?:{out})" if needs else out


def _render_set(ranges) -> str:
    ranges = Chars(tuple(ranges)).ranges  # drops surrogates
    if len(ranges) == 1 and ranges[0][0] == ranges[0][1]:
        return _escape(ranges[0][0])
    body = "".join(_escape(lo) if lo == hi else f"{_escape(lo)}-{_escape(hi)}" for lo, hi in ranges)
    return f"[{body}]"


def _escape(cp: int) -> str:
    ch = chr(cp)
    if ch.isascii() and (ch.isalnum() or ch == "_"):
        return ch
    return f"\\u{cp:04X}" if cp <= 0xFFFF else f"\\U{cp:08X}"
