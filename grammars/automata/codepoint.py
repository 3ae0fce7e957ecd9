"""DFAs over Unicode code points with interval transitions, and their products.

Small automata for languages that the JSON Schema front end must reason about before any byte
DFA exists: key languages of ``patternProperties``/``propertyNames`` (intersections and
differences of patterns and names), ``pattern`` tested on concrete strings, finite pattern
languages listed, and a product written back as a regular expression in corral's dialect.
Built from the byte DFA of an IR expression (``byte_dfa.compile_regular``, the one NFA builder),
read back one UTF-8 character at a time, then minimised.
Past its size bounds it raises ``LimitExceeded``; callers say which keyword that was.
"""

from __future__ import annotations

from bisect import bisect_left
from itertools import pairwise
from typing import Any

import numpy as np

from grammars.automata.byte_dfa import ByteDFA, _reduce, compile_regular
from grammars.errors import LimitExceeded
from grammars.ir import Chars, Expr

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
    def of_words(cls, words, max_states: int) -> "CodePointDFA":
        """The minimal DFA of a finite set of strings, built in time linear in their total length.

        Daciuk et al.'s incremental construction over the sorted words: only the last word's
        path is unminimised at any moment; each finished suffix state is replaced by an
        equivalent state already registered, or registered itself. No recursion (a word may be
        a quarter of a megabyte long). Every registered state is a distinct state of the
        result, so passing ``max_states`` of them raises ``LimitExceeded`` at once, before the
        rest is built. Start state 0; the empty set gives the empty language.
        """
        ordered = sorted(set(words))
        if len(ordered) == 1:  # one word (an object's key): its trie, a chain, is the minimal DFA
            word = ordered[0]
            if len(word) > max_states:
                raise LimitExceeded("max_dfa_states", max_states,
                                    f"the automaton of this string needs more than {max_states} states")
            return cls.of_strings(ordered)
        edges: list[dict[int, int]] = [{}]
        final = [False]
        register: dict[tuple, int] = {}
        path: list[int] = [0]  # states along the previous word (path[i] after i characters)
        previous = ""

        def settle(down_to: int) -> None:
            """Replace or register the states of ``path`` deeper than ``down_to``, deepest first."""
            for depth in range(len(path) - 1, down_to, -1):
                child, parent = path[depth], path[depth - 1]
                signature = (final[child], tuple(edges[child].items()))
                existing = register.get(signature)
                if existing is None:
                    if len(register) >= max_states:
                        raise LimitExceeded("max_dfa_states", max_states,
                                            f"the automaton of these {len(ordered)} strings needs more than {max_states} states")
                    register[signature] = child
                else:
                    edges[parent][ord(previous[depth - 1])] = existing
                    edges[child] = {}  # dropped: the registered twin stands for it
                path.pop()

        for word in ordered:
            common = 0
            limit = min(len(word), len(previous))
            while common < limit and word[common] == previous[common]:
                common += 1
            settle(common)
            del path[common + 1:]
            for ch in word[common:]:
                state = len(edges)
                edges.append({})
                final.append(False)
                edges[path[-1]][ord(ch)] = state
                path.append(state)
            final[path[-1]] = True
            previous = word
        settle(0)
        return cls._compacted(edges, final)

    @classmethod
    def _compacted(cls, edges: list[dict[int, int]], final: list[bool]) -> "CodePointDFA":
        """The states reachable from state 0, renumbered in breadth-first order."""
        index = {0: 0}
        order = [0]
        for state in order:
            for target in edges[state].values():
                if target not in index:
                    index[target] = len(order)
                    order.append(target)
        trans = [sorted((cp, cp, index[t]) for cp, t in edges[s].items()) for s in order]
        out = cls(trans, [final[s] for s in order])
        return out if any(out.accept) else cls([[]], [False])

    @classmethod
    def of(cls, expr: Expr) -> "CodePointDFA":
        """The language of a regular IR expression (compiled as a byte DFA, read back per code point)."""
        return cls.of_byte_dfa(compile_regular(expr))

    @classmethod
    def of_byte_dfa(cls, dfa: ByteDFA) -> "CodePointDFA":
        """The same language read one code point at a time (``dfa`` accepts UTF-8 text only, as
        every byte DFA compiled from the IR does)."""
        if dfa.is_empty_language:
            return cls([[]], [False])
        decoder = _Utf8Decoder(np.asarray(dfa.table))
        index = {dfa.start: 0}
        order = [dfa.start]
        trans: list[list[tuple[int, int, int]]] = []
        for state in order:  # grows while it is read: breadth-first over character boundaries
            row = []
            for lo, hi, target in decoder.row(state):
                if target not in index:
                    if len(order) >= MAX_DFA_STATES:
                        raise LimitExceeded("code_point_dfa_states", MAX_DFA_STATES, "pattern too large for key algebra")
                    index[target] = len(order)
                    order.append(target)
                row.append((lo, hi, index[target]))
            trans.append(_coalesce(tuple(row)))
        return cls([list(r) for r in trans], [bool(dfa.accepting[q]) for q in order]).minimized()

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
        """``and`` (both accept), ``diff`` (self accepts, other does not) or ``or`` (either
        accepts). A side that has died is state -1: it accepts nothing and stays dead."""
        if mode not in ("and", "diff", "or"):
            raise ValueError(f"unknown product mode {mode!r}")
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
            a_acc = p >= 0 and self.accept[p]
            b_acc = q >= 0 and other.accept[q]
            accept.append(a_acc and b_acc if mode == "and" else a_acc and not b_acc if mode == "diff" else a_acc or b_acc)
            row: list[tuple[int, int, int]] = []
            for lo, hi, p2, q2 in _merge_rows(self.trans[p] if p >= 0 else [], other.trans[q] if q >= 0 else []):
                if (p2 < 0 and mode != "or") or (mode == "and" and q2 < 0):
                    continue
                key = (p2, q2)
                if key not in index:
                    index[key] = len(pairs)
                    pairs.append(key)
                row.append((lo, hi, index[key]))
            trans.append(row)
        return CodePointDFA(trans, accept).minimized()

    def minimized(self) -> "CodePointDFA":
        """Trimmed (every state can accept) and minimal, start state 0; may be empty.

        The interval rows become a table over the intervals every row's bounds cut the code
        points into, minimised and numbered breadth-first (over intervals in code-point order)
        by the byte DFAs' compiled kernel, and read back as coalesced interval rows."""
        n = len(self.trans)
        bounds = sorted({x for row in self.trans for lo, hi, _ in row for x in (lo, hi + 1)})
        if n == 0 or len(bounds) < 2:
            return CodePointDFA([[]], [bool(n and self.accept[0])])  # no transitions: {""} or nothing
        k = len(bounds) - 1
        table = np.full((n, k), -1, dtype=np.int32)
        for s, row in enumerate(self.trans):
            for lo, hi, t in row:
                table[s, bisect_left(bounds, lo):bisect_left(bounds, hi + 1)] = t
        out, accept = _reduce(table, np.asarray(self.accept, dtype=np.bool_), 0, np.arange(k, dtype=np.int64))
        if out.shape[0] == 0:
            return CodePointDFA([[]], [False])
        starts = np.asarray(bounds[:-1], dtype=np.int64)
        ends = np.asarray(bounds[1:], dtype=np.int64) - 1
        trans: list = []
        for row in out:
            # runs of one target over adjacent intervals (intervals are adjacent by construction)
            cut = np.flatnonzero(np.diff(row)) + 1
            first = np.concatenate(([0], cut))
            last = np.concatenate((cut, [k])) - 1
            live = row[first] >= 0
            trans.append(list(zip(starts[first[live]].tolist(), ends[last[live]].tolist(), row[first[live]].tolist())))
        return CodePointDFA(trans, accept.tolist())

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


#: UTF-8 forms of multi-byte code points: (lead bytes, second-byte range, further continuation
#: bytes, payload mask of the lead). Shortest forms only, no surrogates: what byte DFAs accept.
_UTF8_FORMS = (
    ((0xC2, 0xDF), (0x80, 0xBF), 0, 0x1F),
    ((0xE0, 0xE0), (0xA0, 0xBF), 1, 0x0F),
    ((0xE1, 0xEC), (0x80, 0xBF), 1, 0x0F),
    ((0xED, 0xED), (0x80, 0x9F), 1, 0x0F),
    ((0xEE, 0xEF), (0x80, 0xBF), 1, 0x0F),
    ((0xF0, 0xF0), (0x90, 0xBF), 2, 0x07),
    ((0xF1, 0xF3), (0x80, 0xBF), 2, 0x07),
    ((0xF4, 0xF4), (0x80, 0x8F), 2, 0x07),
)


class _Utf8Decoder:
    """Reads a byte DFA's transitions as code-point intervals, one character at a time.

    From a state at a character boundary, every valid UTF-8 sequence leads to a state; runs of
    bytes with the same target give intervals of code points. What the continuation bytes of a
    state spell is memoised relative to 0 and shifted into place.
    """

    def __init__(self, table: np.ndarray):
        self.table = table
        self._tails: dict[tuple[int, int], tuple] = {}

    def _runs(self, state: int, lo: int, hi: int) -> list[tuple[int, int, int]]:
        """(first byte, last byte, target) for runs of ``lo..hi`` with one live target."""
        row = self.table[state, lo:hi + 1]
        cut = np.flatnonzero(np.diff(row)) + 1
        starts = np.concatenate(([0], cut))
        ends = np.concatenate((cut, [row.shape[0]])) - 1
        return [(lo + int(a), lo + int(b), int(row[a])) for a, b in zip(starts, ends) if row[a] >= 0]

    def _tail(self, state: int, lo: int, hi: int, rest: int) -> tuple:
        """Code-point offsets (relative to 0) spelled by one continuation byte in ``lo..hi`` and
        ``rest`` more, with the state they reach: ((first, last, target), ...)."""
        key = (state, lo, hi, rest) if (lo, hi) != (0x80, 0xBF) else (state, rest)
        hit = self._tails.get(key)
        if hit is not None:
            return hit
        out: list[tuple[int, int, int]] = []
        width = 1 << (6 * rest)
        for first, last, target in self._runs(state, lo, hi):
            a, b = (first & 0x3F) * width, (last & 0x3F) * width
            if rest == 0:
                out.append((a, b, target))
                continue
            below = self._tail(target, 0x80, 0xBF, rest - 1)
            if len(below) == 1 and below[0][:2] == (0, width - 1):  # every continuation alike
                out.append((a, b + width - 1, below[0][2]))
                continue
            for byte in range(first, last + 1):
                base = (byte & 0x3F) * width
                out.extend((base + x, base + y, t) for x, y, t in below)
        hit = _coalesce(tuple(out))
        self._tails[key] = hit
        return hit

    def row(self, state: int) -> tuple:
        """Every code point read from ``state`` as ((lo, hi, target), ...), ascending."""
        out = list(self._runs(state, 0x00, 0x7F))
        for (lead_lo, lead_hi), (lo, hi), rest, payload in _UTF8_FORMS:
            width = 1 << (6 * (rest + 1))
            for first, last, middle in self._runs(state, lead_lo, lead_hi):
                for byte in range(first, last + 1):
                    base = (byte & payload) * width
                    out.extend((base + x, base + y, t) for x, y, t in self._tail(middle, lo, hi, rest))
        return _coalesce(tuple(out))


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
