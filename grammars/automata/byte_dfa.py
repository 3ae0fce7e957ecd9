"""Regular IR expressions compiled to minimal, trimmed byte-level DFAs in numpy tables.

Pipeline (``compile_regular``):

1. Thompson NFA over *byte ranges*: ``Chars`` become UTF-8 byte-range sequences (``utf8.py``,
   suffix-shared so a complemented class is a handful of states), ``Literal`` its UTF-8 bytes,
   ``Repeat`` unrolls into copies (cloned, not rebuilt) chained so that the optional tail of
   ``x{m,n}`` is nested (``x(x(x)?)?``) and epsilon closures stay small; ``{m,}`` is ``m``
   copies with a back edge on the last one.
2. Byte classes: the bytes are partitioned by every range boundary in the NFA, and subset
   construction runs over the ``k`` classes instead of 256 bytes.
3. Trim (drop states that cannot reach an accepting state), minimise (Valmari's O(m log n)
   partition refinement, which works directly on partial transition functions; numba-compiled,
   so a 20k-state DFA takes milliseconds), renumber
   canonically (BFS from the start over bytes 0..255), then expand the class table to
   ``[n_states, 256]``.

Equal languages therefore give byte-identical tables and equal ``key``.

The empty language is the DFA with 0 states and ``start == -1`` (``is_empty_language``).
"""

from __future__ import annotations

import hashlib
from bisect import bisect_left
from dataclasses import dataclass, replace
from functools import cached_property
from typing import Callable, Iterable, Sequence

import numpy as np
from numba import njit

from ..errors import LimitExceeded, UnsupportedGrammarError
from ..ir import Alt, Chars, Expr, Literal, Ref, Repeat, Seq
from ..limits import Limits
from ..memo import shared_automata
from .frames import Frame, run_frames
from .subset import subset_construction
from .utf8 import utf8_ranges

__all__ = [
    "DEAD",
    "ByteDFA",
    "byte_classes",
    "compile_regular",
    "compile_graph",
    "shared_regular",
    "nonempty",
    "union",
    "concat",
    "intersect",
    "difference",
    "minimize",
    "from_transitions",
    "load_kernels",
    "predecessors",
]

#: the "no state" value in tables and the result of stepping out of the language
DEAD = -1

# ------------------------------------------------------------------------------------------
# the automaton


@dataclass(frozen=True, eq=False)
class ByteDFA:
    """A trimmed, canonically numbered DFA over bytes, minimal.

    ``table[state, byte]`` is the next state or ``-1`` (dead). Every state is reachable from
    ``start`` and can reach an accepting state, so ``state != -1`` means "this prefix can still
    be completed to a match". States are numbered in BFS order from ``start`` (= 0) over bytes
    0..255, so two DFAs for the same language have identical tables and the same ``key``.

    The empty language is represented with 0 states and ``start == -1``.
    Arrays are read-only. Instances are values: equal and hashed by ``key`` (the canonical form
    makes equal languages identical tables), so an expression embedding a DFA built again by
    another compile is the same cache key (``grammars.memo``).
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

    def __eq__(self, other: object) -> bool:
        if self is other:
            return True
        if not isinstance(other, ByteDFA):
            return NotImplemented
        return self.key == other.key

    def __hash__(self) -> int:
        return hash(self.key)

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
        """Digest of the canonical table and accepting states: equal languages give equal keys.

        Hashed in class form (distinct columns, numbered by first byte, plus the byte-to-class
        map), a fraction of the full table's bytes; ``_finish`` sets it from the classes it
        already has, so only tables built elsewhere pay for ``byte_classes`` here.
        """
        if self.is_empty_language:
            return _language_key(self.start, self.table[:, :0], np.zeros(256, dtype=np.intp), self.accepting)
        cls, b2c = byte_classes(self.table)
        return _language_key(self.start, cls, b2c, self.accepting)

    @cached_property
    def _flat(self) -> memoryview:
        return memoryview(self.table.reshape(-1))

    @cached_property
    def _acc(self) -> list[bool]:
        return self.accepting.tolist()

    @cached_property
    def _runs(self) -> tuple[np.ndarray, np.ndarray, list[int]]:
        """(runs per state, the runs as flat (lo, hi, target) triples in state order, accepting
        states): the byte runs with one live target that an NFA fragment of this DFA needs,
        computed once per DFA and handed to subset construction as arrays."""
        counts, flat = _byte_runs(self.table)
        return counts, flat, np.nonzero(self.accepting)[0].tolist()

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
#: instance-dictionary flag ``_finish`` sets on the DFAs it builds: minimal and canonical already
#: (the constructor accepts any table; a pickled copy loses the flag and is minimised again)
_MINIMAL = "_minimal"


def _empty_dfa() -> ByteDFA:
    return ByteDFA(_EMPTY_TABLE, np.zeros(0, dtype=bool), DEAD)


def _language_key(start: int, class_table: np.ndarray, byte_to_class: np.ndarray, accepting: np.ndarray) -> bytes:
    """``ByteDFA.key`` from a canonical class form: the table's distinct columns in order of
    their first byte and each byte's class (as ``byte_classes`` returns them).

    The table is hashed in ``_key_form``'s compact form (16-bit entries where they fit): without
    the CPU's SHA extensions SHA-256 runs at ~200 MB/s, and hashing a key automaton's whole
    class table took longer than building it."""
    n = class_table.shape[0]
    form = _key_form(np.ascontiguousarray(class_table, dtype=np.int32))
    wide = n >= 1 << 15
    h = hashlib.sha256()
    h.update(np.array([start, n, class_table.shape[1], wide], dtype=np.int64).tobytes())
    h.update(form if wide else form.astype(np.int16))
    h.update(np.ascontiguousarray(byte_to_class, dtype=np.int16))
    h.update(np.packbits(accepting).tobytes())
    return h.digest()[:20]


@njit(cache=True, nogil=True)
def _key_form(class_table):  # pragma: no cover - jitted
    """The class table as ``_language_key`` hashes it: a flag, then either each state's number
    of live transitions followed by every live (class, target) pair in state order (flag 1), or
    the table itself (flag 0), whichever is shorter. Key automata are chains: a few percent of
    their entries are live."""
    n, k = class_table.shape
    live = 0
    for q in range(n):
        for c in range(k):
            if class_table[q, c] >= 0:
                live += 1
    if n + 2 * live >= n * k:
        out = np.empty(1 + n * k, np.int32)
        out[0] = 0
        for q in range(n):
            for c in range(k):
                out[1 + q * k + c] = class_table[q, c]
        return out
    out = np.empty(1 + n + 2 * live, np.int32)
    out[0] = 1
    j = 1 + n
    for q in range(n):
        count = 0
        for c in range(k):
            t = class_table[q, c]
            if t >= 0:
                out[j] = c
                out[j + 1] = t
                j += 2
                count += 1
        out[1 + q] = count
    return out


@njit(cache=True, nogil=True)
def _byte_runs(table):  # pragma: no cover - jitted
    """Maximal runs of bytes with one live target: (runs per state, flat (lo, hi, target) triples)."""
    n = table.shape[0]
    counts = np.zeros(n, np.int64)
    for q in range(n):
        prev = -1
        for b in range(256):
            t = table[q, b]
            if t != prev and t >= 0:
                counts[q] += 1
            prev = t
    flat = np.empty(3 * counts.sum(), np.int64)
    j = 0
    for q in range(n):
        b = 0
        while b < 256:
            t = table[q, b]
            e = b
            while e < 255 and table[q, e + 1] == t:
                e += 1
            if t >= 0:
                flat[j] = b
                flat[j + 1] = e
                flat[j + 2] = t
                j += 3
            b = e + 1
    return counts, flat


@njit(cache=True, nogil=True)
def _canonical_classes(class_table, byte_to_class):  # pragma: no cover - jitted
    """Merge equal columns of a class table (``_column_classes``) and number the merged classes
    by first byte: the form ``byte_classes`` gives for the expanded table, from ``k`` columns
    instead of 256."""
    column_class, reps = _column_classes(class_table)
    rank = np.full(reps.shape[0], -1, np.int64)
    order = np.empty(reps.shape[0], np.int64)
    m = 0
    out_b2c = np.empty(256, np.int64)
    for b in range(256):
        g = column_class[byte_to_class[b]]
        if rank[g] < 0:
            rank[g] = m
            order[m] = reps[g]
            m += 1
        out_b2c[b] = rank[g]
    n = class_table.shape[0]
    out = np.empty((n, m), np.int32)
    for q in range(n):
        for j in range(m):
            out[q, j] = class_table[q, order[j]]
    return out, out_b2c


# ------------------------------------------------------------------------------------------
# NFA over byte ranges


class _NFA:
    """Thompson NFA: per state a list of epsilon targets and a list of (lo, hi, target) byte edges.

    Every fragment built by ``build`` occupies a contiguous block of fresh states and has no
    edges leaving that block, so it can be cloned by offset. A state's byte edges are final once
    its fragment is built, so clones *share* edge lists: the targets of ``edges[s]`` are
    relative to ``offset[s]``. An embedded DFA's states have no edge list: ``blocks`` holds
    (first state, DFA) for each, sorted by first state, and subset construction reads their
    edges from the DFA's run arrays (most edges of a terminal are in such blocks, and a Python
    list per state and per run would cost more than the determinisation).
    """

    __slots__ = ("eps", "edges", "offset", "blocks", "limit", "limits", "sub", "known", "built", "nullable")

    def __init__(self, limits: Limits, sub: "Callable[[Expr], ByteDFA] | None" = None,
                 known: "Callable[[Expr], ByteDFA | None] | None" = None):
        self.eps: list[list[int]] = []
        self.edges: list[list[tuple[int, int, int]]] = []
        self.offset: list[int] = []
        self.blocks: list[tuple[int, ByteDFA]] = []
        #: small sequences and alternatives already built, as replayable snapshots
        self.built: dict[Expr, tuple] = {}
        self.limits = limits
        self.limit = limits.max_nfa_states
        self.sub = sub
        self.known = known
        #: ``_nullable`` of repeated items, by identity (the value keeps the item alive)
        self.nullable: dict[int, tuple[Expr, bool]] = {}

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
        self.offset.append(0)
        return n

    def clone(self, lo: int, hi: int) -> int:
        """Copy states ``lo..hi-1`` (a closed fragment); returns the offset of the copy."""
        off = len(self.eps) - lo
        if off + hi > self.limit:
            raise self._overflow()
        self.eps.extend([[t + off for t in e] if e else [] for e in self.eps[lo:hi]])
        self.edges.extend(self.edges[lo:hi])
        self.offset.extend([o + off for o in self.offset[lo:hi]])
        self.blocks.extend([(b + off, d) for b, d in self._blocks_within(lo, hi)])
        return off

    def _blocks_within(self, lo: int, hi: int) -> list[tuple[int, ByteDFA]]:
        blocks = self.blocks
        return blocks[bisect_left(blocks, (lo,)) : bisect_left(blocks, (hi,))]

    # -- fragments -----------------------------------------------------------------------

    def nothing(self) -> tuple[int, int]:
        return self.new(), self.new()

    def build(self, expr: Expr, root: bool = False) -> tuple[int, int]:
        """The fragment of ``expr``; below the ``root``, repetitions come from ``sub`` when given.

        A sequence or alternative below the root that ``known`` already has a DFA for (a member
        compiled as a terminal, met again behind a comma) is embedded as that DFA. A small one
        met again (the encodings of one character recur in every key that contains it) is
        copied from a snapshot of its first build. Expressions may nest deeper than Python's
        recursion limit: the walk runs as frames (``run_frames``).
        """
        leaf = self._leaf(expr, root)
        return leaf if leaf is not None else run_frames(self._build(expr, root))

    def _leaf(self, expr: Expr, root: bool) -> tuple[int, int] | None:
        """The fragment of ``expr`` when building it walks nothing below it; else None."""
        if isinstance(expr, Literal):
            return self._literal(expr.text)
        if isinstance(expr, Chars):
            return self._chars(expr.ranges)
        if isinstance(expr, (Seq, Alt)):
            return None
        if isinstance(expr, Repeat):
            if self.sub is not None and not root and _worth_sharing(expr):  # embed its cached DFA
                return self.dfa(self.sub(expr))
            return None
        if isinstance(expr, Ref):
            raise UnsupportedGrammarError(
                f"rule reference {expr.name!r} inside a regular expression: references are not "
                "regular; inline them before compile_regular"
            )
        if isinstance(expr, ByteDFA):
            return self.dfa(expr)
        raise TypeError(f"not an IR expression: {expr!r}")

    def _build(self, expr: Expr, root: bool = False) -> Frame:  # -> tuple[int, int]
        leaf = self._leaf(expr, root)
        if leaf is not None:
            return leaf
        if isinstance(expr, Repeat):
            return (yield self._repeat(expr.item, expr.min, expr.max))
        if self.known is not None and not root:
            dfa = self.known(expr)
            if dfa is not None:
                return self.dfa(dfa)
        snap = self.built.get(expr)
        if snap is not None:
            return self._replay(snap)
        lo = len(self.eps)
        start, end = yield self._compound(expr)  # type: ignore[arg-type]
        hi = len(self.eps)
        if hi - lo <= _SNAPSHOT_STATES:  # before any parent adds epsilon edges leaving the block
            self.built[expr] = (lo, [list(e) for e in self.eps[lo:hi]], self.edges[lo:hi], self.offset[lo:hi],
                                self._blocks_within(lo, hi), start, end)
        return start, end

    def _replay(self, snap: tuple) -> tuple[int, int]:
        lo, eps, edges, offset, blocks, start, end = snap
        off = len(self.eps) - lo
        if len(self.eps) + len(eps) > self.limit:
            raise self._overflow()
        self.eps.extend([[t + off for t in e] if e else [] for e in eps])
        self.edges.extend(edges)
        self.offset.extend([o + off for o in offset])
        self.blocks.extend([(b + off, d) for b, d in blocks])
        return start + off, end + off

    def _items(self, items: tuple) -> Frame:  # -> list[tuple[int, int]]
        frags = []
        for item in items:
            frag = self._leaf(item, False)
            frags.append(frag if frag is not None else (yield self._build(item)))
        return frags

    def _compound(self, expr: Seq | Alt) -> Frame:  # -> tuple[int, int]
        if isinstance(expr, Seq):
            if not expr.items:
                s = self.new()
                return s, s
            frags = yield from self._items(expr.items)
            eps = self.eps
            for (_, end), (start, _) in zip(frags, frags[1:]):
                eps[end].append(start)
            return frags[0][0], frags[-1][1]
        if not expr.items:
            return self.nothing()
        s = self.new()
        frags = yield from self._items(expr.items)
        e = self.new()
        eps = self.eps
        for fs, fe in frags:
            eps[s].append(fs)
            eps[fe].append(e)
        return s, e

    def _literal(self, text: str) -> tuple[int, int]:
        try:
            data = text.encode("utf-8")
        except UnicodeEncodeError:
            # a lone surrogate has no UTF-8 encoding: like Chars, it matches nothing
            return self.nothing()
        base, n = len(self.eps), len(data)
        if base + n + 1 > self.limit:
            raise self._overflow()
        self.eps.extend([[] for _ in range(n + 1)])
        self.edges.extend([[(b, b, base + i + 1)] for i, b in enumerate(data)])
        self.edges.append([])
        self.offset.extend([0] * (n + 1))
        return base, base + n

    def _chars(self, ranges) -> tuple[int, int]:
        """A character class: its UTF-8 automaton, built once per class (``_utf8_class``) and laid
        down here with relative edges, so a class met in every key and string costs one copy."""
        count, edges = _utf8_class(ranges)
        base = len(self.eps)
        if base + count > self.limit:
            raise self._overflow()
        self.eps.extend([[] for _ in range(count)])
        self.edges.extend(edges)  # shared, never mutated: only fresh states get edges appended
        self.offset.extend([base] * count)
        return base, base + 1

    def _is_nullable(self, item: Expr) -> bool:
        hit = self.nullable.get(id(item))
        if hit is None:
            hit = self.nullable[id(item)] = (item, _nullable(item))
        return hit[1]

    def _repeat(self, item: Expr, mn: int, mx: int | None) -> Frame:  # -> tuple[int, int]
        if mx == 0:
            s = self.new()
            return s, s
        if (mx is None or mx > 1) and self._is_nullable(item):
            # x{m,n} == x'{0,n} and x{m,} == x'* where x' = x minus the empty string: without
            # this, every copy of a nullable x could be skipped and epsilon closures (hence subset
            # construction) would grow with the number of copies.
            if self.sub is not None:
                body = nonempty(self.sub(item))
            else:
                sub_limits = replace(self.limits, max_nfa_states=max(0, self.limit - len(self.eps)))
                body = nonempty((yield _compile(item, sub_limits, None, None)))
            if body.is_empty_language:
                s = self.new()
                return s, s
            item, mn = body, 0
        copies = max(mn, 1) if mx is None else mx
        base = len(self.eps)
        leaf = self._leaf(item, False)
        fs, fe = leaf if leaf is not None else (yield self._build(item))
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
        """A fragment equivalent to a ByteDFA: a block of its states, whose edges (byte runs with
        one target) subset construction takes from the DFA, and an end state."""
        if dfa.is_empty_language:
            return self.nothing()
        n = dfa.n_states
        base = len(self.eps)
        if base + n + 1 > self.limit:
            raise self._overflow()
        finals = dfa._runs[2]
        self.edges.extend([_IN_BLOCK] * n)
        self.edges.append([])
        self.offset.extend([base] * n)
        self.offset.append(0)
        self.blocks.append((base, dfa))
        eps: list[list[int]] = [[] for _ in range(n + 1)]
        end = base + n
        for q in finals:
            eps[q].append(end)
        self.eps.extend(eps)
        return base + dfa.start, end


#: the edge list of a state inside an embedded DFA's block (``_NFA.blocks`` has its edges)
_IN_BLOCK: tuple = ()

#: sequences and alternatives whose fragment has at most this many states are replayed when met again
_SNAPSHOT_STATES = 64

#: ``_utf8_class`` memo: character classes recur across every schema (string bodies, key characters)
_UTF8_CLASSES: dict[tuple, tuple[int, list[list[tuple[int, int, int]]]]] = {}
_UTF8_CLASSES_MAX = 4096


def _utf8_class(ranges: tuple) -> tuple[int, list[list[tuple[int, int, int]]]]:
    """(state count, edges per state with targets relative to the first state): the automaton of
    one code point in ``ranges`` as UTF-8 bytes, from state 0 to state 1, suffixes shared."""
    hit = _UTF8_CLASSES.get(ranges)
    if hit is not None:
        return hit
    seqs: list[list[tuple[int, int]]] = []
    for lo, hi in ranges:
        seqs.extend(utf8_ranges(lo, hi))
    edges: list[list[tuple[int, int, int]]] = [[], []]  # 0: start, 1: end (no edges when empty)
    suffix: dict[tuple, int] = {}  # shared suffix states: reading seq[i:] leads to the end
    for sq in seqs:
        target = 1
        for i in range(len(sq) - 1, 0, -1):
            key = tuple(sq[i:])
            st = suffix.get(key)
            if st is None:
                st = len(edges)
                edges.append([(sq[i][0], sq[i][1], target)])
                suffix[key] = st
            target = st
        edges[0].append((sq[0][0], sq[0][1], target))
    if len(_UTF8_CLASSES) >= _UTF8_CLASSES_MAX:
        _UTF8_CLASSES.clear()
    out = (len(edges), edges)
    _UTF8_CLASSES[ranges] = out
    return out


def _worth_sharing(expr: Repeat) -> bool:
    """Repetitions that unroll into copies or loop over a compound item: compiled once as ``sub``."""
    return (expr.max is not None and expr.max > 1) or (expr.max is None and not isinstance(expr.item, (Chars, Literal)))


def _nullable(expr) -> bool:
    """Whether ``expr`` matches the empty string; post-order with an explicit stack (an
    expression may nest deeper than Python's recursion limit)."""
    done: dict[int, bool] = {}
    stack: list[tuple[object, bool]] = [(expr, False)]
    while stack:
        e, ready = stack.pop()
        if id(e) in done:
            continue
        if isinstance(e, Literal):
            done[id(e)] = e.text == ""
        elif isinstance(e, Repeat) and e.min == 0:
            done[id(e)] = True
        elif isinstance(e, (Seq, Alt, Repeat)):
            kids = (e.item,) if isinstance(e, Repeat) else e.items
            if not ready:
                stack.append((e, True))
                stack.extend((k, False) for k in kids if id(k) not in done)
                continue
            values = [done[id(k)] for k in kids]
            done[id(e)] = any(values) if isinstance(e, Alt) else all(values)
        elif isinstance(e, ByteDFA):
            done[id(e)] = e.accepts_empty
        else:
            done[id(e)] = False  # Chars; Ref: reported by build
    return done[id(expr)]


# ------------------------------------------------------------------------------------------
# subset construction over byte classes


def _determinize(nfa: _NFA, start: int, final: int, max_states: int):
    """Subset construction. Returns (class table [n, k] int32, accepting [n] bool, byte_to_class)."""
    out = subset_construction(nfa.eps, nfa.edges, nfa.offset, [(b, *d._runs[:2]) for b, d in nfa.blocks], start, final,
                              max_states)
    if out is None:
        raise LimitExceeded(
            "max_dfa_states",
            max_states,
            f"the DFA of this regular expression needs more than max_dfa_states={max_states} states",
        )
    return out


# ------------------------------------------------------------------------------------------
# trim, minimise, canonical numbering


#: rows of a partition array (``_partition``): elements grouped by set, each element's location
#: in that row, each element's set, each set's first and past locations, its marked count, and
#: the worklist of touched sets
_E, _L, _S, _F, _P, _M, _W = range(7)


@njit(cache=True, nogil=True)
def _partition(size, n_elements):  # pragma: no cover - jitted
    """One set holding elements ``0..n_elements-1``, room for ``size`` elements and sets.

    One 2-D array rather than seven: numba counts references on every array passed to a call,
    and ``_mark`` runs once per transition: seven arrays made the refinement ~3x slower."""
    part = np.zeros((7, size + 1), np.int64)
    for e in range(n_elements):
        part[_E, e] = e
        part[_L, e] = e
    part[_P, 0] = n_elements
    return part


@njit(cache=True, nogil=True)
def _mark(part, e, wtop):  # pragma: no cover - jitted
    """Move element ``e`` into the marked part of its set; returns the new top of the worklist."""
    s = part[_S, e]
    i = part[_L, e]
    j = part[_F, s] + part[_M, s]
    f = part[_E, j]
    part[_E, i] = f
    part[_L, f] = i
    part[_E, j] = e
    part[_L, e] = j
    if part[_M, s] == 0:
        part[_W, wtop] = s
        wtop += 1
    part[_M, s] += 1
    return wtop


@njit(cache=True, nogil=True)
def _split(part, wtop, z):  # pragma: no cover - jitted
    """Split every touched set into its marked and unmarked parts; returns the new set count."""
    while wtop > 0:
        wtop -= 1
        s = part[_W, wtop]
        j = part[_F, s] + part[_M, s]
        if j == part[_P, s]:
            part[_M, s] = 0
            continue
        if part[_M, s] <= part[_P, s] - j:
            part[_F, z] = part[_F, s]
            part[_P, z] = j
            part[_F, s] = j
        else:
            part[_P, z] = part[_P, s]
            part[_F, z] = j
            part[_P, s] = j
        for i in range(part[_F, z], part[_P, z]):
            part[_S, part[_E, i]] = z
        part[_M, s] = 0
        part[_M, z] = 0
        z += 1
    return z


@njit(cache=True, nogil=True)
def _valmari(n, T, final_states, by_label, label_first, label_past, cz, A, Fa):  # pragma: no cover - jitted
    """Valmari & Lehtinen's partition refinement over blocks (states) and cords (transitions).

    ``T[t]`` is the source of transition ``t``; ``by_label``/``label_first``/``label_past``/``cz``
    the transitions grouped by label (the initial cords); ``A[Fa[q]:Fa[q+1]]`` the transitions
    into ``q``. Returns (block count, block of state).
    """
    m = T.shape[0]
    blocks = _partition(n, n)
    bz = 1 if n > 0 else 0
    wtop = 0
    for q in final_states:
        wtop = _mark(blocks, q, wtop)
    bz = _split(blocks, wtop, bz)
    if m == 0:
        return bz, blocks[_S, :n].copy()
    cords = _partition(m, 0)  # the initial sets, the transitions grouped by label, filled below
    for c in range(cz):
        cords[_F, c] = label_first[c]
        cords[_P, c] = label_past[c]
        for i in range(label_first[c], label_past[c]):
            t = by_label[i]
            cords[_E, i] = t
            cords[_L, t] = i
            cords[_S, t] = c
    b = 1
    c = 0
    while c < cz:
        wtop = 0
        for i in range(cords[_F, c], cords[_P, c]):
            wtop = _mark(blocks, T[cords[_E, i]], wtop)
        bz = _split(blocks, wtop, bz)
        c += 1
        while b < bz:
            wtop = 0
            for i in range(blocks[_F, b], blocks[_P, b]):
                q = blocks[_E, i]
                for j in range(Fa[q], Fa[q + 1]):
                    wtop = _mark(cords, A[j], wtop)
            cz = _split(cords, wtop, cz)
            b += 1
    return bz, blocks[_S, :n].copy()


@njit(cache=True, nogil=True)
def _refine(n, acc, t_class, tails, incoming, head_count, label_count):  # pragma: no cover - jitted
    """``_valmari`` on trimmed transitions (classes ``t_class``, sources ``tails``, grouped by
    head in ``incoming``/``head_count``; ``label_count[c + 1]`` transitions of class ``c``):
    the transitions grouped by label into the initial cords, then the refinement."""
    m = t_class.shape[0]
    k = label_count.shape[0] - 1
    for c in range(k):
        label_count[c + 1] += label_count[c]
    lfill = label_count[:-1].copy()
    by_label = np.empty(m, np.int64)
    for i in range(m):
        c = t_class[i]
        by_label[lfill[c]] = i
        lfill[c] += 1
    firsts = np.zeros(m + 1, np.int64)
    pasts = np.zeros(m + 1, np.int64)
    cz = 0
    for c in range(k):
        if label_count[c + 1] > label_count[c]:
            firsts[cz] = label_count[c]
            pasts[cz] = label_count[c + 1]
            cz += 1
    finals = np.nonzero(acc)[0].astype(np.int64)
    return _valmari(n, tails, finals, by_label, firsts, pasts, cz, incoming, head_count)


@njit(cache=True, nogil=True)
def _acyclic_blocks(n, acc, t_start, t_class, t_to, tails, incoming, head_count):  # pragma: no cover - jitted
    """Revuz's minimisation of an acyclic DFA: (block count, block of state), or (-1, _) when
    the DFA has a cycle.

    States are merged bottom-up, successors first (Kahn's order on the reversed edges): two
    states are equivalent iff they agree on accepting and on every (class, successor's block)
    pair, and with successors already in blocks that is one hash lookup per state. Linear, where
    partition refinement sorts; terminals built of bounded repetitions and key automata are
    acyclic."""
    remaining = np.empty(n, np.int64)
    order = np.empty(n, np.int64)
    top = 0
    for q in range(n):
        remaining[q] = t_start[q + 1] - t_start[q]
        if remaining[q] == 0:
            order[top] = q
            top += 1
    block = np.full(n, -1, np.int64)
    n_slots = 4
    while n_slots < 2 * n:
        n_slots *= 2
    mask = np.uint64(n_slots - 1)
    slots = np.full(n_slots, -1, np.int64)  # a block's representative state
    rep_hash = np.empty(n, np.uint64)
    nb = 0
    head = 0
    while head < top:
        q = order[head]
        head += 1
        h = np.uint64(0xCBF29CE484222325) ^ np.uint64(acc[q])
        for i in range(t_start[q], t_start[q + 1]):
            h = (h ^ np.uint64(t_class[i])) * np.uint64(0x100000001B3)
            h = (h ^ np.uint64(block[t_to[i]])) * np.uint64(0x100000001B3)
        slot = (h ^ (h >> np.uint64(29))) & mask
        found = -1
        while True:
            r = slots[slot]
            if r < 0:
                break
            if rep_hash[r] == h and acc[r] == acc[q] and t_start[r + 1] - t_start[r] == t_start[q + 1] - t_start[q]:
                same = True
                j = t_start[r]
                for i in range(t_start[q], t_start[q + 1]):
                    if t_class[i] != t_class[j] or block[t_to[i]] != block[t_to[j]]:
                        same = False
                        break
                    j += 1
                if same:
                    found = r
                    break
            slot = (slot + np.uint64(1)) & mask
        if found >= 0:
            block[q] = block[found]
        else:
            block[q] = nb
            nb += 1
            slots[slot] = q
            rep_hash[q] = h
        for j in range(head_count[q], head_count[q + 1]):
            p = tails[incoming[j]]
            remaining[p] -= 1
            if remaining[p] == 0:
                order[top] = p
                top += 1
    if top < n:
        return -1, block
    return nb, block


@njit(cache=True, nogil=True)
def predecessors(table):  # pragma: no cover - jitted
    """Reverse edges of a (class) table in CSR form: the predecessors of state ``t`` are
    ``preds[start[t]:start[t + 1]]``, once per edge into ``t``."""
    n, k = table.shape
    start = np.zeros(n + 1, np.int64)
    for q in range(n):
        for c in range(k):
            t = table[q, c]
            if t >= 0:
                start[t + 1] += 1
    for q in range(n):
        start[q + 1] += start[q]
    fill = start[:-1].copy()
    preds = np.empty(start[n], np.int64)
    for q in range(n):
        for c in range(k):
            t = table[q, c]
            if t >= 0:
                preds[fill[t]] = q
                fill[t] += 1
    return start, preds


@njit(cache=True, nogil=True)
def _reduce(table, accepting, start, corder):  # pragma: no cover - jitted
    """Trim, minimise and canonically renumber a class-level DFA in one compiled pass.

    ``corder`` lists the byte classes in order of their first byte, so the breadth-first
    numbering follows bytes 0..255. Returns (class table, accepting) with the start as state 0;
    0 states when the language is empty.

    The table is read twice, to count its live transitions and to list them (a few per state:
    terminals and key automata are mostly chains), and every later step runs over that list
    instead of ``n x k`` cells; each row's classes are listed in ``corder`` order, so the
    numbering reads them as they are. An acyclic automaton (a key, a terminal of bounded repetitions) is minimised
    bottom-up (``_acyclic_blocks``), any other by partition refinement (``_refine``).
    """
    n, k = table.shape
    # the live transitions, by source, classes in ``corder`` order: counted, then listed
    out_start = np.zeros(n + 1, np.int64)
    for q in range(n):
        live = 0
        for c in range(k):
            if table[q, c] >= 0:
                live += 1
        out_start[q + 1] = out_start[q] + live
    m_all = out_start[n]
    e_class = np.empty(m_all, np.int64)
    e_to = np.empty(m_all, np.int64)
    in_count = np.zeros(n + 1, np.int64)
    j = 0
    for q in range(n):
        for x in range(k):
            c = corder[x]
            t = table[q, c]
            if t >= 0:
                e_class[j] = c
                e_to[j] = t
                in_count[t + 1] += 1
                j += 1
    # co-accessible states: reverse edges, then a search from the accepting states
    for q in range(n):
        in_count[q + 1] += in_count[q]
    fill = in_count[:-1].copy()
    preds = np.empty(m_all, np.int64)
    for q in range(n):
        for j in range(out_start[q], out_start[q + 1]):
            t = e_to[j]
            preds[fill[t]] = q
            fill[t] += 1
    co = accepting.copy()
    stack = np.empty(n, np.int64)
    top = 0
    for q in range(n):
        if co[q]:
            stack[top] = q
            top += 1
    while top > 0:
        top -= 1
        q = stack[top]
        for j in range(in_count[q], in_count[q + 1]):
            p = preds[j]
            if not co[p]:
                co[p] = True
                stack[top] = p
                top += 1
    if not co[start]:
        return np.zeros((0, k), np.int32), np.zeros(0, np.bool_)
    # trim: the transitions between co-accessible states, renumbered
    remap = np.full(n, -1, np.int64)
    m_states = 0
    for q in range(n):
        if co[q]:
            remap[q] = m_states
            m_states += 1
    acc = np.zeros(m_states, np.bool_)
    t_start = np.zeros(m_states + 1, np.int64)
    t_class = np.empty(m_all, np.int64)
    t_to = np.empty(m_all, np.int64)
    label_count = np.zeros(k + 1, np.int64)
    head_count = np.zeros(m_states + 1, np.int64)
    m = 0
    for q in range(n):
        r = remap[q]
        if r < 0:
            continue
        acc[r] = accepting[q]
        for j in range(out_start[q], out_start[q + 1]):
            t = remap[e_to[j]]
            if t >= 0:
                t_class[m] = e_class[j]
                t_to[m] = t
                label_count[e_class[j] + 1] += 1
                head_count[t + 1] += 1
                m += 1
        t_start[r + 1] = m
    n = m_states
    # transitions grouped by head (incoming lists): a counting sort
    for q in range(n):
        head_count[q + 1] += head_count[q]
    hfill = head_count[:-1].copy()
    tails = np.empty(m, np.int64)
    incoming = np.empty(m, np.int64)
    for q in range(n):
        for i in range(t_start[q], t_start[q + 1]):
            tails[i] = q
            t = t_to[i]
            incoming[hfill[t]] = i
            hfill[t] += 1
    nb, block = _acyclic_blocks(n, acc, t_start, t_class, t_to, tails, incoming, head_count)
    if nb < 0:  # a cycle: partition refinement
        nb, block = _refine(n, acc, t_class[:m], tails, incoming, head_count, label_count)
    # quotient, numbered breadth-first from the start over classes in byte order
    reps = np.zeros(nb, np.int64)
    for q in range(n):
        reps[block[q]] = q
    new = np.full(nb, -1, np.int64)
    order = np.empty(nb, np.int64)
    qstart = block[remap[start]]
    new[qstart] = 0
    order[0] = qstart
    size = 1
    head = 0
    while head < size:
        b = order[head]
        head += 1
        r = reps[b]
        for i in range(t_start[r], t_start[r + 1]):
            bt = block[t_to[i]]
            if new[bt] < 0:
                new[bt] = size
                order[size] = bt
                size += 1
    out = np.full((size, k), -1, np.int32)  # blocks unreachable from the start are dropped
    out_acc = np.zeros(size, np.bool_)
    for i in range(size):
        r = reps[order[i]]
        out_acc[i] = acc[r]
        for j in range(t_start[r], t_start[r + 1]):
            out[i, t_class[j]] = new[block[t_to[j]]]
    return out, out_acc


@njit(cache=True, nogil=True)
def _finish_kernel(table, accepting, start, byte_to_class):  # pragma: no cover - jitted
    """``_reduce`` with the classes ordered by first byte, then the expanded byte table and the
    canonical class form ``key`` hashes, in one compiled call."""
    k = table.shape[1]
    first_byte = np.full(k, 256, np.int64)
    for b in range(255, -1, -1):
        first_byte[byte_to_class[b]] = b
    corder = np.argsort(first_byte, kind="mergesort")
    ct, acc = _reduce(table, accepting, start, corder)
    n = ct.shape[0]
    full = np.empty((n, 256), np.int32)
    for q in range(n):
        for b in range(256):
            full[q, b] = ct[q, byte_to_class[b]]
    classes, class_of_byte = _canonical_classes(ct, byte_to_class)
    return full, acc, classes, class_of_byte


def _finish(table: np.ndarray, accepting: np.ndarray, start: int, byte_to_class: np.ndarray) -> ByteDFA:
    """Class-level DFA (any states) -> trimmed, minimal, canonically numbered ByteDFA."""
    if start < 0 or table.shape[0] == 0:
        return _empty_dfa()
    full, acc, classes, class_of_byte = _finish_kernel(
        np.ascontiguousarray(table, dtype=np.int32), np.ascontiguousarray(accepting, dtype=np.bool_), int(start),
        np.asarray(byte_to_class, dtype=np.int64))
    if full.shape[0] == 0:
        return _empty_dfa()
    full.setflags(write=False)  # fresh arrays: freeze them here so ByteDFA need not copy
    acc.setflags(write=False)
    dfa = ByteDFA(full, acc, 0)
    # fill the cached ``key`` from the classes at hand (cheaper than classifying 256 columns)
    dfa.__dict__["key"] = _language_key(0, classes, class_of_byte, acc)
    dfa.__dict__[_MINIMAL] = True
    return dfa


# ------------------------------------------------------------------------------------------
# public API


def compile_regular(expr: Expr, limits: Limits = Limits(), sub: Callable[[Expr], ByteDFA] | None = None,
                    known: Callable[[Expr], ByteDFA | None] | None = None) -> ByteDFA:
    """Compile a regular IR expression (no ``Ref``) to its minimal, trimmed byte DFA.

    ``Chars`` match one code point encoded as UTF-8 (only valid, shortest-form encodings).
    Raises ``UnsupportedGrammarError`` (a ``ValueError``) on ``Ref`` and ``LimitExceeded`` when the
    NFA exceeds ``limits.max_nfa_states`` or the DFA ``limits.max_dfa_states``.
    ``ByteDFA`` values may also appear inside the expression tree as pre-compiled pieces.

    ``sub`` (a memoised ``compile_regular``, as ``Compiler`` passes) compiles the repetitions
    below the root: the flexible whitespace or string body that recurs in every terminal of a
    grammar is then determinised once and embedded as a small DFA, not unrolled again.
    ``known`` (a cache lookup) gives the DFAs already compiled for sequences and alternatives
    below the root, embedded instead of rebuilt.
    """
    if isinstance(expr, ByteDFA):  # a pre-compiled piece standing alone: no NFA round trip
        return minimize(expr)
    if sub is not None:
        _shared_pieces_first(expr, sub, known)
    return run_frames(_compile(expr, limits, sub, known))


def shared_regular(expr: Expr, limits: Limits | None = None) -> ByteDFA:
    """``compile_regular`` through the process-wide automata table (``grammars.memo``): the DFA
    of an expression any compiler or front end built before under the same ``limits`` is
    returned as it is, and the repetitions and pieces inside a new one come from the table too.
    """
    limits = limits or Limits()
    key = ("regular", expr, limits)
    dfa = shared_automata().get(key)
    if dfa is None:
        dfa = compile_regular(expr, limits, lambda e: shared_regular(e, limits), lambda e: known_regular(e, limits))
        shared_automata().put(key, dfa)
    return dfa


def known_regular(expr: Expr, limits: Limits | None = None) -> ByteDFA | None:
    """The DFA ``shared_regular`` holds for ``expr`` under ``limits``, or None."""
    return shared_automata().get(("regular", expr, limits or Limits()))


def compile_graph(n_states: int, arcs: Iterable[tuple[int, Expr, int]], accepting: Iterable[int],
                  limits: Limits | None = None, start: int = 0) -> ByteDFA:
    """The minimal byte DFA of a regular language given as a graph: states ``0..n_states-1``,
    ``arcs`` ``(source, expression, target)`` whose expressions are regular IR (no ``Ref``), the
    language the paths from ``start`` to an ``accepting`` state spell.

    An automaton over other symbols (a code-point DFA whose transitions are character classes)
    is compiled this way with each symbol's byte encodings on its arcs: one NFA, one subset
    construction, one minimisation, where writing it as an expression would need state
    elimination, which can grow the expression exponentially.
    """
    limits = limits or Limits()
    nfa = _NFA(limits)
    nodes = [nfa.new() for _ in range(n_states)]
    final = nfa.new()
    for source, expr, target in arcs:
        first, last = nfa.build(expr, True)
        nfa.eps[nodes[source]].append(first)
        nfa.eps[last].append(nodes[target])
    for state in accepting:
        nfa.eps[nodes[state]].append(final)
    table, accepting_out, b2c = _determinize(nfa, nodes[start], final, limits.max_dfa_states)
    return _finish(table, accepting_out, 0, b2c)


def _compile(expr: Expr, limits: Limits, sub: Callable[[Expr], ByteDFA] | None,
             known: Callable[[Expr], ByteDFA | None] | None) -> Frame:  # -> ByteDFA
    """``compile_regular`` as a frame: a repetition of a nullable item compiles the item first,
    in the same walk."""
    nfa = _NFA(limits, sub, known)
    start, final = yield nfa._build(expr, True)
    table, accepting, b2c = _determinize(nfa, start, final, limits.max_dfa_states)
    return _finish(table, accepting, 0, b2c)


def _shared_pieces_first(expr: Expr, sub: Callable[[Expr], ByteDFA],
                         known: Callable[[Expr], ByteDFA | None] | None) -> None:
    """Ask ``sub`` for every piece that building ``expr`` will ask it for, innermost first.

    ``sub`` (the compiler's memoised ``compile_regular``) compiles a piece with its own NFA,
    whose pieces it asks ``sub`` for in turn: nested repetitions would nest those calls, a few
    Python frames per level. Compiled innermost first, each call finds the pieces below it
    cached, so the stack stays flat however deep the expression. The walk mirrors ``_NFA``'s
    (the same pieces, in the order their compilations finish) and stops where a piece is
    already cached (``known``), so nested calls walk only their own level."""

    def cached(e: Expr) -> bool:
        return known is not None and known(e) is not None

    seen: set[int] = set()
    keep: list[Expr] = []  # keeps the ids in ``seen`` unique

    def visit(e: Expr, root: bool) -> Frame:
        if isinstance(e, (Seq, Alt)):
            if not root:
                if id(e) in seen or cached(e):
                    return
                seen.add(id(e))
                keep.append(e)
            for item in e.items:
                if isinstance(item, (Seq, Alt, Repeat)):
                    yield visit(item, False)
        elif isinstance(e, Repeat):
            if not root and _worth_sharing(e):
                if id(e) not in seen and not cached(e):
                    seen.add(id(e))
                    keep.append(e)
                    yield visit(e, True)  # what ``sub(e)`` builds
                    sub(e)
                return
            if e.max == 0:
                return
            if (e.max is None or e.max > 1) and _nullable(e.item):
                if not cached(e.item):
                    yield visit(e.item, True)
                    sub(e.item)
                return
            if isinstance(e.item, (Seq, Alt, Repeat)):
                yield visit(e.item, False)

    run_frames(visit(expr, True))


def byte_classes(table: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Columns of a byte table grouped into classes: (class table [n, k], byte_to_class [256]).

    Classes are numbered by first byte. Bytes with equal columns behave alike in every state,
    so any per-byte computation can run over the ``k`` classes instead.
    """
    if table.shape[0] == 0:
        return table[:, :1], np.zeros(256, dtype=np.intp)
    b2c, reps = _column_classes(np.ascontiguousarray(table, dtype=np.int32))
    return np.ascontiguousarray(table[:, reps]), b2c.astype(np.intp)


@njit(cache=True, nogil=True)
def _column_classes(table):  # pragma: no cover - jitted
    """(class of each column, first column of each class): equal columns share a class. For a
    byte table the columns are the 256 bytes; for a class table, the classes.

    Columns are hashed in row order (the table is row-major: reading a column touches one cache
    line per state) and grouped by hash; one more row-order pass checks each column against its
    class's first. A hash collision between unequal columns, which that pass finds, regroups
    with every column compared in full.
    """
    n, width = table.shape
    hashes = np.full(width, np.uint64(0xCBF29CE484222325))
    for q in range(n):
        for b in range(width):
            hashes[b] = (hashes[b] ^ np.uint64(table[q, b] + 1)) * np.uint64(0x100000001B3)
    b2c, reps = _group_columns(table, hashes, False)
    for q in range(n):
        for b in range(width):
            if table[q, b] != table[q, reps[b2c[b]]]:
                return _group_columns(table, hashes, True)
    return b2c, reps


@njit(cache=True, nogil=True)
def _group_columns(table, hashes, compare):  # pragma: no cover - jitted
    """Columns grouped by hash (and, with ``compare``, by the columns themselves), classes
    numbered by first column."""
    width = table.shape[1]
    b2c = np.empty(width, np.int64)
    reps = np.empty(width, np.int64)
    k = 0
    for b in range(width):
        found = -1
        for c in range(k):
            r = reps[c]
            if hashes[r] != hashes[b]:
                continue
            same = True
            if compare:
                for q in range(table.shape[0]):
                    if table[q, r] != table[q, b]:
                        same = False
                        break
            if same:
                found = c
                break
        if found < 0:
            found = k
            reps[k] = b
            k += 1
        b2c[b] = found
    return b2c, reps[:k].copy()


def nonempty(dfa: ByteDFA) -> ByteDFA:
    """The language of ``dfa`` without the empty string (minimal, canonical)."""
    if not dfa.accepts_empty:
        return dfa
    cls, b2c = byte_classes(dfa.table)
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
    """The intersection of two DFA languages (minimal, canonical).

    Built as the reachable product, one BFS layer at a time over the joint byte classes of
    both tables. Raises ``LimitExceeded`` when more than ``limits.max_dfa_states`` pairs are
    reachable.
    """
    if a.is_empty_language or b.is_empty_language:
        return _empty_dfa()
    return _product(a, b, False, limits)


def difference(a: ByteDFA, b: ByteDFA, limits: Limits = Limits()) -> ByteDFA:
    """The strings of ``a`` that are not in ``b`` (minimal, canonical).

    The reachable product with ``b`` completed by a sink state, so once ``b`` dies the product
    follows ``a`` alone: "every JSON string except these keys" costs the size of the keys' trie
    plus the size of ``a``, where a complement written as an expression costs their product.
    """
    if a.is_empty_language or b.is_empty_language:
        return a
    return _product(a, b, True, limits)


def _product(a: ByteDFA, b: ByteDFA, minus: bool, limits: Limits) -> ByteDFA:
    """Reachable product of ``a`` and ``b``: accepting where both accept (``minus``: ``a`` but not ``b``)."""
    _, ba = byte_classes(a.table)
    _, bb = byte_classes(b.table)
    _, reps, b2c = np.unique(ba * 256 + bb, return_index=True, return_inverse=True)
    b2c = b2c.reshape(-1)
    ta = np.ascontiguousarray(a.table[:, reps])
    tb = np.ascontiguousarray(b.table[:, reps])
    cap = min(limits.max_dfa_states, 2 * (ta.shape[0] + tb.shape[0]) + 64)  # most products are near a + b
    while True:
        table, pa, pb, ok = _product_kernel(ta, tb, a.start, b.start, minus, cap)
        if ok:
            break
        if cap >= limits.max_dfa_states:
            raise LimitExceeded(
                "max_dfa_states",
                limits.max_dfa_states,
                f"the product of two DFAs needs more than max_dfa_states={limits.max_dfa_states} states",
            )
        cap = min(limits.max_dfa_states, 4 * cap)
    in_b = np.append(np.asarray(b.accepting, dtype=bool), False)[pb]  # pb == -1: b has died
    accepting = a.accepting[pa] & (~in_b if minus else in_b)
    return _finish(table, accepting, 0, b2c)


@njit(cache=True, nogil=True)
def _product_kernel(ta, tb, a_start, b_start, minus, cap):  # pragma: no cover - jitted
    """Breadth-first reachable pairs over shared classes; with ``minus`` a dead ``b`` is a sink.

    Pairs are interned in an open-addressing table keyed by ``a * nb + b``. Returns (table [n, k],
    a state per pair, b state per pair (-1: b has died), ok); ``ok`` is False past ``cap`` pairs
    (the caller retries with more, or refuses past ``max_dfa_states``). The arrays are sized
    once: growing them inside the loop made numba reload them on every step, 8x slower.
    """
    k = ta.shape[1]
    nb = tb.shape[0] + 1  # b index nb - 1 stands for "b has died"
    pa = np.empty(cap, np.int64)
    pb = np.empty(cap, np.int64)
    table = np.full((cap, k), -1, np.int32)
    n_slots = 2
    while n_slots < 2 * cap:
        n_slots *= 2
    slots = np.full(n_slots, -1, np.int64)
    mask = n_slots - 1
    pa[0] = a_start
    pb[0] = b_start
    slots[((a_start * nb + b_start) * 0x9E3779B1) & mask] = 0
    size = 1
    i = 0
    while i < size:
        x, y = pa[i], pb[i]
        for c in range(k):
            xa = ta[x, c]
            if xa < 0:
                continue
            yb = tb[y, c] if y < nb - 1 else -1
            if yb < 0:
                if not minus:
                    continue
                yb = nb - 1
            code = xa * nb + yb
            slot = (code * 0x9E3779B1) & mask
            d = -1
            while slots[slot] >= 0:
                e = slots[slot]
                if pa[e] * nb + pb[e] == code:
                    d = e
                    break
                slot = (slot + 1) & mask
            if d < 0:
                if size == cap:
                    return table[:0], pa[:0], pb[:0], False
                d = size
                slots[slot] = d
                pa[d] = xa
                pb[d] = yb
                size += 1
            table[i, c] = d
        i += 1
    pb_out = pb[:size].copy()
    for j in range(size):
        if pb_out[j] == nb - 1:
            pb_out[j] = -1
    return table[:size].copy(), pa[:size].copy(), pb_out, True


def from_transitions(n_states: int, src: Sequence[int], byte: Sequence[int], dst: Sequence[int],
                     accepting: Sequence[int], start: int = 0) -> ByteDFA:
    """The minimal ByteDFA of a deterministic automaton given as transition lists (``src --byte-->
    dst``), for automata built directly rather than through an NFA (a trie of literals).

    Bytes that occur on no transition share one class, so minimisation runs over the bytes used
    instead of all 256. Each (src, byte) pair must occur at most once.
    """
    src_a = np.asarray(src, dtype=np.int64)
    byte_a = np.asarray(byte, dtype=np.int64)
    used = np.unique(byte_a)
    byte_to_class = np.zeros(256, dtype=np.intp)
    byte_to_class[used] = np.arange(1, len(used) + 1)
    table = np.full((n_states, len(used) + 1), -1, dtype=np.int32)
    table[src_a, byte_to_class[byte_a]] = np.asarray(dst, dtype=np.int32)
    acc = np.zeros(n_states, dtype=bool)
    acc[np.asarray(accepting, dtype=np.int64)] = True
    return _finish(table, acc, start, byte_to_class)


def load_kernels() -> ByteDFA:
    """Run every compiled kernel once on tiny inputs (numba loads machine code on first call,
    ~0.1 s each: setup time, not a first compile's). Returns a small DFA for further warm-ups."""
    d = compile_regular(Seq((Literal("ab"), Repeat(Chars(((0x61, 0x63),)), 0, 3))))
    e = compile_regular(Seq((Literal("a"), d)), sub=lambda x: compile_regular(x))
    intersect(d, e)
    difference(d, e)
    nonempty(minimize(ByteDFA(np.array(d.table), np.array(d.accepting), 0)))
    from_transitions(2, [0], [0x61], [1], [1])
    # called from Python too (code-point DFAs' minimisation), a signature of its own
    _reduce(np.full((1, 1), -1, np.int32), np.ones(1, np.bool_), 0, np.arange(1, dtype=np.int64))
    return e


def minimize(dfa: ByteDFA) -> ByteDFA:
    """The trimmed, canonically numbered DFA of ``dfa``'s language (minimal).

    For tables built directly (e.g. a residue counter) rather than by ``compile_regular``: the
    ``ByteDFA`` constructor checks shapes only, so such a table may have dead or equivalent states.
    A DFA this module's minimisation produced is returned as it is: a front end embeds its
    products (a string with patterns and length bounds, 10^4-10^5 states) in the IR, and one
    that stands alone as a terminal would otherwise be minimised again.
    """
    if dfa.is_empty_language or dfa.__dict__.get(_MINIMAL, False):
        return dfa
    cls, b2c = byte_classes(dfa.table)
    return _finish(np.asarray(cls), np.asarray(dfa.accepting, dtype=bool), dfa.start, b2c)
