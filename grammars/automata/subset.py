"""Subset construction over byte classes, compiled with numba.

Every terminal, key language and pattern of a grammar goes through here, so it dominates
compile time: the pure-Python version spent ~30 ms on a typical JSON member terminal. The NFA
arrives as flat arrays (CSR epsilon and class-range edges); DFA states are sorted arrays of
*important* NFA states (those with byte edges, and the final state) kept in one growing buffer
and interned through an open-addressing hash table.
"""

from __future__ import annotations

from itertools import chain

import numpy as np
from numba import njit

__all__ = ["subset_construction"]

_NONE = np.zeros(0, np.int64)
#: ``_subset``'s outcomes: done, past ``max_states``, or run again with room for more states or
#: more set members
SUBSET_OK, SUBSET_TOO_BIG, SUBSET_MORE_STATES, SUBSET_MORE_MEMBERS = 0, 1, 2, 3

_FNV_PRIME = np.uint64(0x100000001B3)
_FNV_BASIS = np.uint64(0xCBF29CE484222325)


@njit(cache=True, nogil=True)
def _hash(buf, lo, hi):  # pragma: no cover - jitted
    h = _FNV_BASIS
    for i in range(lo, hi):
        h = (h ^ np.uint64(buf[i])) * _FNV_PRIME
    return h ^ (h >> np.uint64(29))


@njit(cache=True, nogil=True)
def _closure(seeds, n_seeds, eps_start, eps_to, important, stamp, mark, stack, out):  # pragma: no cover - jitted
    """Important states of the epsilon closure of ``seeds[:n_seeds]``, sorted into ``out``; returns the count."""
    top = 0
    n = 0
    for i in range(n_seeds):
        s = seeds[i]
        if stamp[s] != mark:
            stamp[s] = mark
            stack[top] = s
            top += 1
    while top > 0:
        top -= 1
        s = stack[top]
        if important[s]:
            out[n] = s
            n += 1
        for j in range(eps_start[s], eps_start[s + 1]):
            t = eps_to[j]
            if stamp[t] != mark:
                stamp[t] = mark
                stack[top] = t
                top += 1
    out[:n].sort()
    return n


@njit(cache=True, nogil=True)
def _subset(n_nfa, start, final, k, eps_start, eps_to, important, edge_start, e_lo, e_hi, e_to,
            max_states, cap, buf_cap):  # pragma: no cover - jitted
    """Returns (table [n, k] int32, accepting [n] bool, status): ``SUBSET_OK``, ``SUBSET_TOO_BIG``
    past ``max_states``, or ``SUBSET_MORE_STATES`` / ``SUBSET_MORE_MEMBERS`` when more than ``cap``
    states or ``buf_cap`` set members are needed (the caller retries with more).

    Every array is sized once: an array grown (reassigned) inside the loop makes numba reload it
    and count its references on each access, several times slower."""
    stamp = np.zeros(n_nfa, np.int64)
    stack = np.empty(n_nfa, np.int64)
    scratch = np.empty(n_nfa, np.int64)
    mark = 1
    # interned sets: members in buf[off[d]:off[d + 1]]
    buf = np.empty(buf_cap, np.int64)
    off = np.zeros(cap + 1, np.int64)
    hashes = np.empty(cap, np.uint64)
    n_slots = 2
    while n_slots < 2 * cap:  # at most half full
        n_slots *= 2
    slots = np.full(n_slots, -1, np.int64)
    mask = np.uint64(n_slots - 1)
    table = np.full((cap, k), -1, np.int32)
    accepting = np.zeros(cap, np.bool_)
    # per-class buckets of move targets: at most every edge's classes at once
    count = np.zeros(k + 1, np.int64)
    fill = np.zeros(k, np.int64)
    most = 0
    for e in range(e_lo.shape[0]):
        most += e_hi[e] - e_lo[e]
    bucket = np.empty(max(most, 1), np.int64)

    n_states = 0
    seeds = np.empty(1, np.int64)
    seeds[0] = start
    # the start state
    n = _closure(seeds, 1, eps_start, eps_to, important, stamp, mark, stack, scratch)
    mark += 1
    if n > buf_cap:
        return table[:0], accepting[:0], SUBSET_MORE_MEMBERS
    buf[:n] = scratch[:n]
    off[1] = n
    h = _hash(buf, 0, n)
    hashes[0] = h
    slots[h & mask] = 0
    n_states = 1

    i = 0
    while i < n_states:
        lo_i, hi_i = off[i], off[i + 1]
        # bucket sizes per class
        count[:] = 0
        total = 0
        has_final = False
        for p in range(lo_i, hi_i):
            s = buf[p]
            if s == final:
                has_final = True
            for e in range(edge_start[s], edge_start[s + 1]):
                for c in range(e_lo[e], e_hi[e]):
                    count[c + 1] += 1
                total += e_hi[e] - e_lo[e]
        accepting[i] = has_final
        for c in range(k):
            count[c + 1] += count[c]
        for c in range(k):
            fill[c] = count[c]
        for p in range(lo_i, hi_i):
            s = buf[p]
            for e in range(edge_start[s], edge_start[s + 1]):
                t = e_to[e]
                for c in range(e_lo[e], e_hi[e]):
                    bucket[fill[c]] = t
                    fill[c] += 1
        prev_c = -1
        for c in range(k):
            b0, b1 = count[c], count[c + 1]
            if b0 == b1:
                continue
            if prev_c >= 0 and count[prev_c + 1] - count[prev_c] == b1 - b0:
                same = True
                pb = count[prev_c]
                for x in range(b1 - b0):
                    if bucket[pb + x] != bucket[b0 + x]:
                        same = False
                        break
                if same:  # adjacent classes with the same moves: same target state
                    table[i, c] = table[i, prev_c]
                    prev_c = c
                    continue
            prev_c = c
            n = _closure(bucket[b0:b1], b1 - b0, eps_start, eps_to, important, stamp, mark, stack, scratch)
            mark += 1
            if n == 0:
                continue  # nothing can follow: dead
            h = _hash(scratch, 0, n)
            slot = h & mask
            d = -1
            while True:
                cand = slots[slot]
                if cand < 0:
                    break
                if hashes[cand] == h and off[cand + 1] - off[cand] == n:
                    eq = True
                    base = off[cand]
                    for x in range(n):
                        if buf[base + x] != scratch[x]:
                            eq = False
                            break
                    if eq:
                        d = cand
                        break
                slot = (slot + np.uint64(1)) & mask
            if d < 0:
                if n_states >= max_states:
                    return table[:0], accepting[:0], SUBSET_TOO_BIG
                if n_states >= cap:
                    return table[:0], accepting[:0], SUBSET_MORE_STATES
                d = n_states
                if off[d] + n > buf_cap:
                    return table[:0], accepting[:0], SUBSET_MORE_MEMBERS
                n_states += 1
                buf[off[d] : off[d] + n] = scratch[:n]
                off[d + 1] = off[d] + n
                hashes[d] = h
                slots[slot] = d
            table[i, c] = d
        i += 1
    return table[:n_states].copy(), accepting[:n_states].copy(), SUBSET_OK


@njit(cache=True, nogil=True)
def _subset_of_lists(n_nfa, start, final, eps_len, eps_to, edge_len, flat, offset, block_first, block_size,
                     block_counts, block_flat, max_states):  # pragma: no cover - jitted
    """CSR offsets, absolute edge targets and byte classes from the flattened lists and the
    blocks' run arrays, then ``_subset``: one compiled call instead of a dozen small numpy ones
    per terminal."""
    in_block = np.zeros(n_nfa, np.bool_)
    edge_len = edge_len.copy()
    i = 0
    for b in range(block_first.shape[0]):
        for q in range(block_first[b], block_first[b] + block_size[b]):
            in_block[q] = True
            edge_len[q] = block_counts[i]
            i += 1
    eps_start = np.zeros(n_nfa + 1, np.int64)
    edge_start = np.zeros(n_nfa + 1, np.int64)
    for s in range(n_nfa):
        eps_start[s + 1] = eps_start[s] + eps_len[s]
        edge_start[s + 1] = edge_start[s] + edge_len[s]
    m = edge_start[n_nfa]
    # (lo, hi, relative target) triples in state order: list states from ``flat``, block states
    # from ``block_flat``
    triples = np.empty(3 * m, np.int64)
    p = 0
    for s in range(n_nfa):
        if not in_block[s]:
            for j in range(3 * edge_start[s], 3 * edge_start[s + 1]):
                triples[j] = flat[p]
                p += 1
    p = 0
    for b in range(block_first.shape[0]):
        q0 = block_first[b]
        for j in range(3 * edge_start[q0], 3 * edge_start[q0 + block_size[b]]):
            triples[j] = block_flat[p]
            p += 1
    flat = triples
    # byte classes: a boundary at every range start and past every range end
    boundary = np.zeros(257, np.bool_)
    boundary[0] = True
    for j in range(m):
        boundary[flat[3 * j]] = True
        boundary[flat[3 * j + 1] + 1] = True
    class_at = np.empty(257, np.int64)
    k = -1
    for b in range(257):
        if boundary[b]:
            k += 1
        class_at[b] = k
    byte_to_class = class_at[:256].copy()
    e_lo = np.empty(m, np.int64)
    e_hi = np.empty(m, np.int64)
    e_to = np.empty(m, np.int64)
    important = np.zeros(n_nfa, np.bool_)
    for s in range(n_nfa):
        if edge_len[s] > 0:
            important[s] = True
        for j in range(edge_start[s], edge_start[s + 1]):
            e_lo[j] = class_at[flat[3 * j]]
            e_hi[j] = class_at[flat[3 * j + 1] + 1]
            e_to[j] = flat[3 * j + 2] + offset[s]
    important[final] = True
    if not boundary[256]:  # the last class runs to byte 255
        k += 1
    # per-state arrays start at about the NFA's size (a terminal's DFA is rarely larger), set
    # members at four per NFA state; a call that needs more is run again with four times more
    cap = 64
    while cap < n_nfa and cap < 1024:
        cap *= 2
    cap = min(cap, max_states + 1)
    buf_cap = max(cap, 4 * n_nfa)
    while True:
        table, accepting, status = _subset(n_nfa, start, final, k, eps_start, eps_to, important, edge_start, e_lo,
                                           e_hi, e_to, max_states, cap, buf_cap)
        if status == SUBSET_MORE_STATES:
            cap = min(4 * cap, max_states + 1)
        elif status == SUBSET_MORE_MEMBERS:
            buf_cap *= 4
        else:
            return table, accepting, byte_to_class, status == SUBSET_OK


def subset_construction(eps: list[list[int]], edges: list[list[tuple[int, int, int]]], offset: list[int],
                        blocks: list[tuple[int, np.ndarray, np.ndarray]], start: int, final: int,
                        max_states: int):
    """Determinise a Thompson NFA given as per-state epsilon targets and (lo, hi, target) byte edges,
    the targets of state ``s`` relative to ``offset[s]``.

    ``blocks`` lists runs of consecutive states whose edges are given as arrays instead (an
    embedded DFA's): (first state, edges per state, flat (lo, hi, target) triples), sorted by
    first state; the edge lists of those states are empty.

    Returns (class table [n, k] int32, accepting [n] bool, byte_to_class [256]) or None when more
    than ``max_states`` DFA states are needed. DFA state 0 is the start.
    """
    n_nfa = len(eps)
    eps_len = np.fromiter(map(len, eps), dtype=np.int64, count=n_nfa)
    edge_len = np.fromiter(map(len, edges), dtype=np.int64, count=n_nfa)
    eps_to = np.fromiter(chain.from_iterable(eps), dtype=np.int64)
    flat = np.fromiter(chain.from_iterable(chain.from_iterable(edges)), dtype=np.int64)
    if blocks:
        block_first = np.fromiter((b for b, _, _ in blocks), dtype=np.int64, count=len(blocks))
        block_size = np.fromiter((len(counts) for _, counts, _ in blocks), dtype=np.int64, count=len(blocks))
        block_counts = np.concatenate([counts for _, counts, _ in blocks])
        block_flat = np.concatenate([flat for _, _, flat in blocks])
    else:
        block_first = block_size = block_counts = block_flat = _NONE
    table, accepting, byte_to_class, ok = _subset_of_lists(
        n_nfa, start, final, eps_len, eps_to, edge_len, flat, np.fromiter(offset, dtype=np.int64, count=n_nfa),
        block_first, block_size, block_counts, block_flat, max_states)
    if not ok:
        return None
    return table, accepting, byte_to_class.astype(np.intp)
