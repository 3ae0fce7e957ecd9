"""Regular IR expressions compiled to minimal (up to a size), trimmed byte-level DFAs in numpy tables.

Pipeline (``compile_regular``):

1. Thompson NFA over *byte ranges*: ``Chars`` become UTF-8 byte-range sequences (``utf8.py``,
   suffix-shared so a complemented class is a handful of states), ``Literal`` its UTF-8 bytes,
   ``Repeat`` unrolls into copies (cloned, not rebuilt) chained so that the optional tail of
   ``x{m,n}`` is nested (``x(x(x)?)?``) and epsilon closures stay small; ``{m,}`` is ``m``
   copies with a back edge on the last one.
2. Byte classes: the bytes are partitioned by every range boundary in the NFA, and subset
   construction runs over the ``k`` classes instead of 256 bytes.
3. Trim (drop states that cannot reach an accepting state), minimise (Valmari's O(m log n)
   partition refinement, which works directly on partial transition functions), renumber
   canonically (BFS from the start over bytes 0..255), then expand the class table to
   ``[n_states, 256]``.

Equal languages therefore give byte-identical tables and equal ``key``.

The empty language is the DFA with 0 states and ``start == -1`` (``is_empty_language``).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, replace
from functools import cached_property
from typing import Sequence

import numpy as np

from ..errors import LimitExceeded, UnsupportedGrammarError
from ..ir import Alt, Chars, Expr, Literal, Ref, Repeat, Seq
from ..limits import Limits
from .utf8 import utf8_ranges

__all__ = ["DEAD", "ByteDFA", "compile_regular", "nonempty", "union", "concat", "intersect", "minimize"]

#: the "no state" value in tables and the result of stepping out of the language
DEAD = -1

#: DFAs up to this many states are minimised (so equal languages share one ``key`` and one set of
#: cached trie walks); bigger ones — long counters such as ``maxLength: 1024`` crossed with a
#: format — are only trimmed, because the pure-Python minimiser took 16 s on 14k states.
MINIMIZE_MAX_STATES = 2000


# ------------------------------------------------------------------------------------------
# the automaton


@dataclass(frozen=True, eq=False)
class ByteDFA:
    """A trimmed, canonically numbered DFA over bytes, minimal up to ``MINIMIZE_MAX_STATES`` states.

    ``table[state, byte]`` is the next state or ``-1`` (dead). Every state is reachable from
    ``start`` and can reach an accepting state, so ``state != -1`` means "this prefix can still
    be completed to a match". States are numbered in BFS order from ``start`` (= 0) over bytes
    0..255, so two DFAs for the same language have identical tables and the same ``key``.

    The empty language is represented with 0 states and ``start == -1``.
    Arrays are read-only; instances compare by identity (use ``key`` for language equality).
    """

    table: np.ndarray
    accepting: np.ndarray
    start: int

    def __post_init__(self) -> None:
        table = np.ascontiguousarray(self.table, dtype=np.int32)
        accepting = np.ascontiguousarray(self.accepting, dtype=bool)
        if table.ndim != 2 or table.shape[1] != 256:
            raise ValueError(f"table must have shape [n_states, 256], got {table.shape}")
        if accepting.shape != (table.shape[0],):
            raise ValueError("accepting must have shape [n_states]")
        if table.shape[0] == 0:
            if self.start != DEAD:
                raise ValueError("a DFA with no states must have start == -1")
        elif not 0 <= self.start < table.shape[0]:
            raise ValueError("start out of range")
        if table.flags.writeable:
            if table is self.table:
                table = table.copy()
            table.setflags(write=False)
        if accepting.flags.writeable:
            if accepting is self.accepting:
                accepting = accepting.copy()
            accepting.setflags(write=False)
        object.__setattr__(self, "table", table)
        object.__setattr__(self, "accepting", accepting)
        object.__setattr__(self, "start", int(self.start))

    # -- shape -------------------------------------------------------------------------

    @property
    def n_states(self) -> int:
        return int(self.table.shape[0])

    @property
    def is_empty_language(self) -> bool:
        return self.table.shape[0] == 0

    @property
    def accepts_empty(self) -> bool:
        return self.start >= 0 and bool(self.accepting[self.start])

    @cached_property
    def key(self) -> bytes:
        """Digest of (start, table, accepting): equal languages give equal keys.

        (Guaranteed for DFAs of at most ``MINIMIZE_MAX_STATES`` states, which are minimised.)
        """
        h = hashlib.blake2b(digest_size=20)
        h.update(np.array([self.start, self.n_states], dtype=np.int64).tobytes())
        h.update(self.table.tobytes())
        h.update(np.packbits(self.accepting).tobytes())
        return h.digest()

    @cached_property
    def _flat(self) -> memoryview:
        return memoryview(self.table.reshape(-1))

    @cached_property
    def _acc(self) -> list[bool]:
        return self.accepting.tolist()

    # -- running ------------------------------------------------------------------------

    def step(self, state: int, byte: int) -> int:
        """The state after ``byte`` (0..255, not checked) from ``state`` (``-1`` from ``-1``)."""
        if state < 0:
            return DEAD
        return self._flat[(state << 8) | byte]

    def run(self, data: bytes, state: int | None = None) -> int:
        """The state after all of ``data`` from ``state`` (default: start); ``-1`` if dead."""
        s = self.start if state is None else state
        if s < 0:
            return DEAD
        flat = self._flat
        for b in data:
            s = flat[(s << 8) | b]
            if s < 0:
                return DEAD
        return s

    def matches(self, data: bytes) -> bool:
        """Whether ``data`` as a whole is in the language."""
        s = self.run(data)
        return s >= 0 and self._acc[s]

    def is_accepting(self, state: int) -> bool:
        return state >= 0 and self._acc[state]

    def __reduce__(self):
        # the cached memoryview cannot be pickled; rebuild from the arrays
        return (ByteDFA, (np.asarray(self.table), np.asarray(self.accepting), self.start))

    def __repr__(self) -> str:
        return f"ByteDFA(n_states={self.n_states}, accepts_empty={self.accepts_empty}, key={self.key.hex()[:12]})"


_EMPTY_TABLE = np.zeros((0, 256), dtype=np.int32)


def _empty_dfa() -> ByteDFA:
    return ByteDFA(_EMPTY_TABLE, np.zeros(0, dtype=bool), DEAD)


# ------------------------------------------------------------------------------------------
# NFA over byte ranges


class _NFA:
    """Thompson NFA: per state a list of epsilon targets and a list of (lo, hi, target) byte edges.

    Every fragment built by ``build`` occupies a contiguous block of fresh states and has no
    edges leaving that block, so it can be cloned by offset.
    """

    __slots__ = ("eps", "edges", "limit", "limits")

    def __init__(self, limits: Limits):
        self.eps: list[list[int]] = []
        self.edges: list[list[tuple[int, int, int]]] = []
        self.limits = limits
        self.limit = limits.max_nfa_states

    def _overflow(self) -> LimitExceeded:
        return LimitExceeded(
            "max_nfa_states",
            self.limit,
            f"the NFA of this regular expression needs more than max_nfa_states={self.limit} states "
            "(large bounded repetition?)",
        )

    def new(self) -> int:
        n = len(self.eps)
        if n >= self.limit:
            raise self._overflow()
        self.eps.append([])
        self.edges.append([])
        return n

    def clone(self, lo: int, hi: int) -> int:
        """Copy states ``lo..hi-1`` (a closed fragment); returns the offset of the copy."""
        off = len(self.eps) - lo
        if off + hi > self.limit:
            raise self._overflow()
        eps, edges = self.eps, self.edges
        for s in range(lo, hi):
            e = eps[s]
            eps.append([t + off for t in e] if e else [])
            g = edges[s]
            edges.append([(a, b, t + off) for a, b, t in g] if g else [])
        return off

    # -- fragments -----------------------------------------------------------------------

    def nothing(self) -> tuple[int, int]:
        return self.new(), self.new()

    def build(self, expr: Expr) -> tuple[int, int]:
        if isinstance(expr, Literal):
            return self._literal(expr.text)
        if isinstance(expr, Chars):
            return self._chars(expr.ranges)
        if isinstance(expr, Seq):
            if not expr.items:
                s = self.new()
                return s, s
            frags = [self.build(item) for item in expr.items]
            eps = self.eps
            for (_, end), (start, _) in zip(frags, frags[1:]):
                eps[end].append(start)
            return frags[0][0], frags[-1][1]
        if isinstance(expr, Alt):
            if not expr.items:
                return self.nothing()
            s = self.new()
            frags = [self.build(item) for item in expr.items]
            e = self.new()
            eps = self.eps
            for fs, fe in frags:
                eps[s].append(fs)
                eps[fe].append(e)
            return s, e
        if isinstance(expr, Repeat):
            return self._repeat(expr.item, expr.min, expr.max)
        if isinstance(expr, Ref):
            raise UnsupportedGrammarError(
                f"rule reference {expr.name!r} inside a regular expression: references are not "
                "regular; inline them before compile_regular"
            )
        if isinstance(expr, ByteDFA):
            return self.dfa(expr)
        raise TypeError(f"not an IR expression: {expr!r}")

    def _literal(self, text: str) -> tuple[int, int]:
        try:
            data = text.encode("utf-8")
        except UnicodeEncodeError:
            # a lone surrogate has no UTF-8 encoding: like Chars, it matches nothing
            return self.nothing()
        s = cur = self.new()
        edges = self.edges
        for b in data:
            nxt = self.new()
            edges[cur].append((b, b, nxt))
            cur = nxt
        return s, cur

    def _chars(self, ranges) -> tuple[int, int]:
        seqs: list[list[tuple[int, int]]] = []
        for lo, hi in ranges:
            seqs.extend(utf8_ranges(lo, hi))
        if not seqs:
            return self.nothing()
        start = self.new()
        end = self.new()
        edges = self.edges
        suffix: dict[tuple, int] = {}  # shared suffix states: reading seq[i:] leads to end
        for sq in seqs:
            target = end
            for i in range(len(sq) - 1, 0, -1):
                key = tuple(sq[i:])
                st = suffix.get(key)
                if st is None:
                    st = self.new()
                    edges[st].append((sq[i][0], sq[i][1], target))
                    suffix[key] = st
                target = st
            edges[start].append((sq[0][0], sq[0][1], target))
        return start, end

    def _repeat(self, item: Expr, mn: int, mx: int | None) -> tuple[int, int]:
        if mx == 0:
            s = self.new()
            return s, s
        if (mx is None or mx > 1) and _nullable(item):
            # x{m,n} == x'{0,n} and x{m,} == x'* where x' = x minus the empty string: without
            # this, every copy of a nullable x could be skipped and epsilon closures (hence subset
            # construction) would grow with the number of copies.
            sub_limits = replace(self.limits, max_nfa_states=max(0, self.limit - len(self.eps)))
            body = nonempty(compile_regular(item, sub_limits))
            if body.is_empty_language:
                s = self.new()
                return s, s
            item, mn = body, 0
        copies = max(mn, 1) if mx is None else mx
        base = len(self.eps)
        fs, fe = self.build(item)
        top = len(self.eps)
        size = top - base
        if top + size * (copies - 1) + 2 > self.limit:
            raise self._overflow()
        frags = [(fs, fe)]
        for _ in range(copies - 1):
            off = self.clone(base, top)
            frags.append((fs + off, fe + off))
        eps = self.eps
        for (_, end), (start, _) in zip(frags[: mn - 1], frags[1:mn]):
            eps[end].append(start)
        if mx is None:
            if mn == 0:
                loop = self.new()
                eps[loop].append(fs)
                eps[fe].append(loop)
                return loop, loop
            last_s, last_e = frags[mn - 1]
            eps[last_e].append(last_s)  # x+ on the last mandatory copy
            return fs, last_e
        if mn == mx:
            return fs, frags[mn - 1][1]
        exit_ = self.new()
        if mn == 0:
            start = cur = self.new()
        else:
            start, cur = fs, frags[mn - 1][1]
        for s, e in frags[mn:]:
            eps[cur].append(exit_)
            eps[cur].append(s)
            cur = e
        eps[cur].append(exit_)
        return start, exit_

    def dfa(self, dfa: ByteDFA) -> tuple[int, int]:
        """A fragment equivalent to a ByteDFA (byte runs with the same target become one edge)."""
        if dfa.is_empty_language:
            return self.nothing()
        n = dfa.n_states
        base = len(self.eps)
        if base + n + 1 > self.limit:
            raise self._overflow()
        for _ in range(n):
            self.new()
        end = self.new()
        table = dfa.table
        # runs of equal targets along each row
        change = np.ones((n, 257), dtype=bool)
        change[:, 1:256] = table[:, 1:] != table[:, :-1]
        rows, starts = np.nonzero(change[:, :256])
        ends = np.empty_like(starts)
        ends[:-1] = starts[1:] - 1
        same_row = np.zeros(len(rows), dtype=bool)
        same_row[:-1] = rows[1:] == rows[:-1]
        ends = np.where(same_row, ends, 255)
        tgts = table[rows, starts]
        keep = tgts >= 0
        edges = self.edges
        for q, a, b, t in zip(rows[keep].tolist(), starts[keep].tolist(), ends[keep].tolist(), tgts[keep].tolist()):
            edges[base + q].append((a, b, base + t))
        eps = self.eps
        for q in np.nonzero(dfa.accepting)[0].tolist():
            eps[base + q].append(end)
        return base + dfa.start, end


def _nullable(expr) -> bool:
    if isinstance(expr, Literal):
        return expr.text == ""
    if isinstance(expr, Chars):
        return False
    if isinstance(expr, Seq):
        return all(_nullable(item) for item in expr.items)
    if isinstance(expr, Alt):
        return any(_nullable(item) for item in expr.items)
    if isinstance(expr, Repeat):
        return expr.min == 0 or _nullable(expr.item)
    if isinstance(expr, ByteDFA):
        return expr.accepts_empty
    return False  # Ref: reported by build


# ------------------------------------------------------------------------------------------
# subset construction over byte classes


def _determinize(nfa: _NFA, start: int, final: int, max_states: int):
    """Subset construction. Returns (class table [n, k] int32, accepting [n] bool, byte_to_class)."""
    eps, edges = nfa.eps, nfa.edges
    n_nfa = len(eps)

    # byte classes from every range boundary
    bounds = {0, 256}
    for g in edges:
        for lo, hi, _ in g:
            bounds.add(lo)
            bounds.add(hi + 1)
    blist = sorted(bounds)
    k = len(blist) - 1
    index_of = {b: i for i, b in enumerate(blist)}
    byte_to_class = np.repeat(np.arange(k, dtype=np.intp), np.diff(np.array(blist)))

    # class-range edges; "important" states have byte edges (or are the final state)
    cedges: list = [None] * n_nfa
    important = [False] * n_nfa
    for s, g in enumerate(edges):
        if g:
            cedges[s] = [(index_of[lo], index_of[hi + 1], t) for lo, hi, t in g]
            important[s] = True
    important[final] = True

    def closure(seeds) -> frozenset:
        seen = set(seeds)
        stack = list(seen)
        pop, push, add = stack.pop, stack.append, seen.add
        while stack:
            for t in eps[pop()]:
                if t not in seen:
                    add(t)
                    push(t)
        return frozenset([s for s in seen if important[s]])

    first = closure((start,))
    dstates: list[frozenset] = [first]
    index: dict[frozenset, int] = {first: 0}
    moved: dict[frozenset, int] = {}
    rows: list[list[int]] = []
    accepting: list[bool] = []
    i = 0
    while i < len(dstates):
        S = dstates[i]
        i += 1
        accepting.append(final in S)
        row = [DEAD] * k
        gs = [cedges[s] for s in S if cedges[s] is not None]
        if gs:
            if len(gs) == 1 and len(gs[0]) == 1:
                c0, c1, t = gs[0][0]
                groups = [(c0, c1, (t,))]
            else:
                groups = _sweep(gs)
            for c0, c1, targets in groups:
                key = frozenset(targets)
                d = moved.get(key)
                if d is None:
                    cl = closure(key)
                    d = index.get(cl) if cl else DEAD  # empty set: nothing can follow
                    if d is None:
                        d = len(dstates)
                        if d >= max_states:
                            raise LimitExceeded(
                                "max_dfa_states",
                                max_states,
                                f"the DFA of this regular expression needs more than "
                                f"max_dfa_states={max_states} states",
                            )
                        index[cl] = d
                        dstates.append(cl)
                    moved[key] = d
                if d >= 0:
                    for c in range(c0, c1):
                        row[c] = d
        rows.append(row)
    table = np.array(rows, dtype=np.int32).reshape(len(rows), k)
    return table, np.array(accepting, dtype=bool), byte_to_class


def _sweep(gs) -> list[tuple[int, int, tuple]]:
    """Merge class-range edges [(c0, c1_exclusive, target)] into runs with a constant target set."""
    events: dict[int, list] = {}
    for g in gs:
        for c0, c1, t in g:
            ev = events.get(c0)
            if ev is None:
                events[c0] = ev = [[], []]
            ev[0].append(t)
            ev = events.get(c1)
            if ev is None:
                events[c1] = ev = [[], []]
            ev[1].append(t)
    active: dict[int, int] = {}
    out = []
    prev = None
    for c in sorted(events):
        if active and prev is not None:
            out.append((prev, c, tuple(active)))
        adds, removes = events[c]
        for t in removes:
            n = active[t] - 1
            if n:
                active[t] = n
            else:
                del active[t]
        for t in adds:
            active[t] = active.get(t, 0) + 1
        prev = c
    return out


# ------------------------------------------------------------------------------------------
# trim, minimise, canonical numbering


def _coaccessible(table: np.ndarray, accepting: np.ndarray) -> np.ndarray:
    n = table.shape[0]
    qs, cs = np.nonzero(table >= 0)
    hs = table[qs, cs]
    order = np.argsort(hs, kind="stable")
    preds = qs[order].tolist()
    bnd = np.searchsorted(hs[order], np.arange(n + 1)).tolist()
    co = accepting.tolist()
    stack = [q for q in range(n) if co[q]]
    while stack:
        q = stack.pop()
        for p in preds[bnd[q] : bnd[q + 1]]:
            if not co[p]:
                co[p] = True
                stack.append(p)
    return np.array(co, dtype=bool)


class _Partition:
    """Refinable partition (Valmari & Lehtinen): elements grouped in E, sets are slices F..P."""

    __slots__ = ("z", "E", "L", "S", "F", "P", "M", "W")

    def __init__(self, n: int):
        self.z = 1 if n else 0
        self.E = list(range(n))
        self.L = list(range(n))
        self.S = [0] * n
        self.F = [0] * (n + 1)
        self.P = [0] * (n + 1)
        self.P[0] = n
        self.M = [0] * (n + 1)
        self.W: list[int] = []

    def mark(self, e: int) -> None:
        S, L, E, M = self.S, self.L, self.E, self.M
        s = S[e]
        i = L[e]
        j = self.F[s] + M[s]
        f = E[j]
        E[i] = f
        L[f] = i
        E[j] = e
        L[e] = j
        if not M[s]:
            self.W.append(s)
        M[s] += 1

    def split(self) -> None:
        W, M, F, P, E, S = self.W, self.M, self.F, self.P, self.E, self.S
        while W:
            s = W.pop()
            j = F[s] + M[s]
            if j == P[s]:
                M[s] = 0
                continue
            z = self.z
            if M[s] <= P[s] - j:
                F[z] = F[s]
                P[z] = F[s] = j
            else:
                P[z] = P[s]
                F[z] = P[s] = j
            for i in range(F[z], P[z]):
                S[E[i]] = z
            M[s] = M[z] = 0
            self.z = z + 1


def _minimize(table: np.ndarray, accepting: np.ndarray) -> tuple[int, list[int]]:
    """Valmari's partial-DFA minimisation. Needs every state co-accessible. Returns (blocks, block_of)."""
    n, k = table.shape
    qs, cs = np.nonzero(table >= 0)
    m = len(qs)
    T = qs.tolist()
    H = table[qs, cs].tolist()
    B = _Partition(n)
    for q in np.nonzero(accepting)[0].tolist():
        B.mark(q)
    B.split()
    if m == 0:
        return B.z, B.S
    # cords: transitions grouped by label
    C = _Partition(m)
    by_label = np.argsort(cs, kind="stable")
    C.E = by_label.tolist()
    labels = cs[by_label]
    cut = (np.nonzero(labels[1:] != labels[:-1])[0] + 1).tolist()
    firsts = [0] + cut
    pasts = cut + [m]
    C.z = len(firsts)
    C.F[: C.z] = firsts
    C.P[: C.z] = pasts
    CL = [0] * m
    CS = [0] * m
    for c, (f, p) in enumerate(zip(firsts, pasts)):
        for i in range(f, p):
            t = C.E[i]
            CL[t] = i
            CS[t] = c
    C.L, C.S = CL, CS
    # incoming transitions per state
    order = np.argsort(table[qs, cs], kind="stable")
    A = order.tolist()
    Fa = np.searchsorted(np.asarray(H)[order], np.arange(n + 1)).tolist()

    b, c = 1, 0
    BE, BF, BP = B.E, B.F, B.P
    CE, CF, CP = C.E, C.F, C.P
    bmark, cmark = B.mark, C.mark
    while c < C.z:
        for i in range(CF[c], CP[c]):
            bmark(T[CE[i]])
        B.split()
        c += 1
        while b < B.z:
            for i in range(BF[b], BP[b]):
                q = BE[i]
                for j in range(Fa[q], Fa[q + 1]):
                    cmark(A[j])
            C.split()
            b += 1
    return B.z, B.S


def _finish(table: np.ndarray, accepting: np.ndarray, start: int, byte_to_class: np.ndarray) -> ByteDFA:
    """Class-level DFA (any states) -> trimmed, minimal, canonically numbered ByteDFA."""
    if start < 0 or table.shape[0] == 0:
        return _empty_dfa()
    co = _coaccessible(table, accepting)
    if not co[start]:
        return _empty_dfa()
    if not co.all():
        keep = np.nonzero(co)[0]
        remap = np.full(table.shape[0] + 1, DEAD, dtype=np.int32)  # remap[-1] stays -1
        remap[keep] = np.arange(len(keep), dtype=np.int32)
        table = remap[table[keep]]
        accepting = accepting[keep]
        start = int(remap[start])
    if table.shape[0] <= MINIMIZE_MAX_STATES:
        nb, block_of = _minimize(table, accepting)
    else:  # trimmed is enough for correctness; minimising only improves cache sharing
        nb, block_of = table.shape[0], list(range(table.shape[0]))
    block = np.append(np.asarray(block_of, dtype=np.int32), np.int32(DEAD))  # block[-1] == -1
    reps = np.full(nb, 0, dtype=np.intp)
    reps[block[:-1]] = np.arange(table.shape[0])
    qt = block[table[reps]]
    qacc = accepting[reps]
    qstart = int(block[start])

    # canonical BFS over bytes 0..255: visit classes in order of their first byte
    k = qt.shape[1]
    first_byte = np.full(k, 256, dtype=np.intp)
    np.minimum.at(first_byte, byte_to_class, np.arange(256))
    corder = np.argsort(first_byte, kind="stable")
    perm = qt[:, corder]
    rq, rc = np.nonzero(perm >= 0)
    tg = perm[rq, rc].tolist()
    rb = np.searchsorted(rq, np.arange(nb + 1)).tolist()
    new = [DEAD] * nb
    new[qstart] = 0
    order = [qstart]
    for q in order:
        for t in tg[rb[q] : rb[q + 1]]:
            if new[t] < 0:
                new[t] = len(order)
                order.append(t)
    newa = np.array(new + [DEAD], dtype=np.int32)
    oa = np.array(order, dtype=np.intp)
    ct = newa[qt[oa]]
    full = np.ascontiguousarray(ct[:, byte_to_class], dtype=np.int32)
    acc = np.ascontiguousarray(qacc[oa], dtype=bool)
    full.setflags(write=False)  # fresh arrays: freeze them here so ByteDFA need not copy
    acc.setflags(write=False)
    return ByteDFA(full, acc, 0)


# ------------------------------------------------------------------------------------------
# public API


def compile_regular(expr: Expr, limits: Limits = Limits()) -> ByteDFA:
    """Compile a regular IR expression (no ``Ref``) to its minimal, trimmed byte DFA.

    ``Chars`` match one code point encoded as UTF-8 (only valid, shortest-form encodings).
    Raises ``UnsupportedGrammarError`` (a ``ValueError``) on ``Ref`` and ``LimitExceeded`` when the
    NFA exceeds ``limits.max_nfa_states`` or the DFA ``limits.max_dfa_states``.
    ``ByteDFA`` values may also appear inside the expression tree as pre-compiled pieces.
    """
    nfa = _NFA(limits)
    start, final = nfa.build(expr)
    table, accepting, b2c = _determinize(nfa, start, final, limits.max_dfa_states)
    return _finish(table, accepting, 0, b2c)


def _byte_classes(table: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Columns of a byte table grouped into classes: (class table [n, k], byte_to_class [256])."""
    if table.shape[0] == 0:
        return table[:, :1], np.zeros(256, dtype=np.intp)
    cols, inverse = np.unique(table, axis=1, return_inverse=True)
    return np.ascontiguousarray(cols), inverse.reshape(-1)


def nonempty(dfa: ByteDFA) -> ByteDFA:
    """The language of ``dfa`` without the empty string (minimal, canonical)."""
    if not dfa.accepts_empty:
        return dfa
    cls, b2c = _byte_classes(dfa.table)
    n = dfa.n_states
    table = np.vstack([cls, cls[dfa.start : dfa.start + 1]])
    accepting = np.append(np.asarray(dfa.accepting, dtype=bool), False)
    return _finish(table, accepting, n, b2c)


def union(dfas: Sequence[ByteDFA], limits: Limits = Limits()) -> ByteDFA:
    """The union of the languages of ``dfas`` (minimal, canonical)."""
    dfas = list(dfas)
    if not dfas:
        return _empty_dfa()
    if len(dfas) == 1:
        return dfas[0]
    nfa = _NFA(limits)
    s, e = nfa.build(Alt(tuple(dfas)))  # type: ignore[arg-type]
    table, accepting, b2c = _determinize(nfa, s, e, limits.max_dfa_states)
    return _finish(table, accepting, 0, b2c)


def concat(a: ByteDFA, b: ByteDFA, limits: Limits = Limits()) -> ByteDFA:
    """The concatenation of two DFA languages (minimal, canonical)."""
    nfa = _NFA(limits)
    s, e = nfa.build(Seq((a, b)))  # type: ignore[arg-type]
    table, accepting, b2c = _determinize(nfa, s, e, limits.max_dfa_states)
    return _finish(table, accepting, 0, b2c)


def intersect(a: ByteDFA, b: ByteDFA, limits: Limits = Limits()) -> ByteDFA:
    """The intersection of two DFA languages (canonical; minimal up to ``MINIMIZE_MAX_STATES``).

    Built as the reachable product.

    The product runs over the joint byte classes of both tables, one BFS layer at a time.
    Raises ``LimitExceeded`` when more than ``limits.max_dfa_states`` pairs are reachable.
    """
    if a.is_empty_language or b.is_empty_language:
        return _empty_dfa()
    ca, ba = _byte_classes(a.table)
    _, bb = _byte_classes(b.table)
    _, reps, b2c = np.unique(ba * 256 + bb, return_index=True, return_inverse=True)
    b2c = b2c.reshape(-1)
    del ca
    ta = a.table[:, reps]
    tb = b.table[:, reps]
    k = len(reps)
    nb = b.n_states
    index: dict[int, int] = {a.start * nb + b.start: 0}
    pa = [a.start]
    pb = [b.start]
    rows: list[np.ndarray] = []
    frontier = 0
    while frontier < len(pa):
        fa = np.asarray(pa[frontier:], dtype=np.int64)
        fb = np.asarray(pb[frontier:], dtype=np.int64)
        frontier = len(pa)
        xa = ta[fa]
        xb = tb[fb]
        codes = np.where((xa < 0) | (xb < 0), -1, xa.astype(np.int64) * nb + xb)
        uniq, inverse = np.unique(codes, return_inverse=True)
        ids = np.empty(len(uniq), dtype=np.int32)
        for i, code in enumerate(uniq.tolist()):
            if code < 0:
                ids[i] = DEAD
                continue
            d = index.get(code)
            if d is None:
                d = len(pa)
                if d >= limits.max_dfa_states:
                    raise LimitExceeded(
                        "max_dfa_states",
                        limits.max_dfa_states,
                        f"the intersection of two DFAs needs more than max_dfa_states={limits.max_dfa_states} states",
                    )
                index[code] = d
                pa.append(code // nb)
                pb.append(code % nb)
            ids[i] = d
        rows.append(ids[inverse.reshape(codes.shape)])
    table = np.vstack(rows).reshape(len(pa), k)
    accepting = a.accepting[np.asarray(pa)] & b.accepting[np.asarray(pb)]
    return _finish(table, accepting, 0, b2c)


def minimize(dfa: ByteDFA) -> ByteDFA:
    """The trimmed, canonically numbered DFA of ``dfa``'s language (minimal up to ``MINIMIZE_MAX_STATES``).

    For tables built directly (e.g. a residue counter) rather than by ``compile_regular``: the
    ``ByteDFA`` constructor checks shapes only, so such a table may have dead or equivalent states.
    """
    if dfa.is_empty_language:
        return dfa
    cls, b2c = _byte_classes(dfa.table)
    return _finish(np.asarray(cls), np.asarray(dfa.accepting, dtype=bool), dfa.start, b2c)
