"""Walking the vocabulary trie through byte DFAs: the only code that touches every token.

Two kernels, compiled with numba (cached on disk) because a profile showed numpy's per-level
overhead dominating: the Llama-3 trie is 128 levels deep with ~2,400 nodes in long unary chains
below depth 24, so a level-by-level numpy walk costs ~11 ms while these cost ~0.25 ms (root)
and a few µs (small sub-walks).

- ``root walk``: the DFA from one state over the whole trie. Three shapes, picked by how much of
  the trie the live first bytes reach: a depth-first sub walk from the root (keywords,
  punctuation), a preorder pass that jumps over dead subtrees and costs only what it visits
  (whitespace, numbers, key literals: a few µs), or one linear pass in breadth-first node order
  (a node's state is its parent's state stepped by the node's byte; string bodies, ~0.65 ms on
  Llama 3, unless a token slice makes them small).
- ``sub walk``: the DFA from one state over the subtries below a set of nodes (the places where
  a previous lexeme may end), depth-first, emitting token ids directly.

``PathWalk`` caches these by *lexical path* — the sequence of (terminal DFA, state) pairs a token
passes through — which does not depend on the parser. Parser-dependent work (which paths are
allowed) then costs dictionary lookups and ORs, not walks.
"""

from __future__ import annotations

import hashlib
import itertools
from dataclasses import dataclass
from threading import Lock

import numpy as np
from numba import njit

from grammars.automata.byte_dfa import byte_classes, load_kernels, predecessors
from grammars.bitmask import mask_words
from grammars.masks.token_slices import default_slices
from grammars.vocab.trie import TokenTrie, bfs_states

__all__ = ["PathWalk", "WalkCache", "tokens_to_words", "bounded_equivalence"]


@njit(cache=True, nogil=True)
def _child_byte_summary(child_start, child_count, node_byte, nodes):  # pragma: no cover - jitted
    """The bytes on edges leaving ``nodes`` (a 256-bit set as four words) and how many edges."""
    words = np.zeros(4, np.uint64)
    total = 0
    for i in range(nodes.shape[0]):
        c0 = child_start[nodes[i]]
        n = child_count[nodes[i]]
        total += n
        for c in range(c0, c0 + n):
            b = node_byte[c]
            words[b >> 6] |= np.uint64(1) << np.uint64(b & 63)
    return words, total


@njit(cache=True, nogil=True)
def _node_bitset(nodes, n_nodes):  # pragma: no cover - jitted
    bits = np.zeros((n_nodes + 63) // 64, np.uint64)
    for i in range(nodes.shape[0]):
        node = nodes[i]
        bits[node >> 6] |= np.uint64(1) << np.uint64(node & 63)
    return bits


@njit(cache=True, nogil=True)
def _pack_alive(states, token_node, n_words):  # pragma: no cover - jitted
    """Packed int32 mask of the tokens whose node has a live state (one word at a time)."""
    n_tok = token_node.shape[0]
    words = np.zeros(n_words, np.int64)
    for w in range(n_words):
        acc = 0
        base = w * 32
        for j in range(32):
            tok = base + j
            if tok < n_tok and states[token_node[tok]] >= 0:
                acc |= 1 << j
        words[w] = acc
    return words.astype(np.uint32).view(np.int32)


@njit(cache=True, nogil=True)
def _root_walk(pre_node, pre_parent, pre_byte, pre_end, tok_start, tok_count, node_tokens, flat, accepting, state,
               n_words):  # pragma: no cover - jitted
    """Packed mask of tokens alive from the root in ``state``, and the nodes where the DFA accepts.

    One pass over the trie in preorder (``TokenTrie.preorder``) that jumps over every subtree
    whose first node is dead: a whitespace state visits the space-led part of the trie, not all
    of it. Work and memory touched are proportional to the nodes visited (buffers are allocated
    without filling, tokens are set from the visited nodes): a key literal's walk visits a few
    dozen nodes, where filling a state per node and reading one per token cost ~0.1 ms each.
    A helper call or buffer growth inside the node loop made an earlier version 5x slower.
    """
    n = pre_node.shape[0]
    states = np.empty(n, np.int32)  # by preorder position; only visited entries are read
    states[0] = state
    accepted = np.empty(n, np.int64)
    words = np.zeros(n_words, np.uint32)
    n_acc = 0
    i = 1
    while i < n:
        nxt = flat[states[pre_parent[i]] * 256 + pre_byte[i]]
        if nxt < 0:
            i = pre_end[i]
            continue
        states[i] = nxt
        node = pre_node[i]
        if accepting[nxt]:
            accepted[n_acc] = node
            n_acc += 1
        first = tok_start[node]
        for k in range(first, first + tok_count[node]):
            tok = node_tokens[k]
            words[tok >> 5] |= np.uint32(1) << np.uint32(tok & 31)
        i += 1
    if n_acc * 16 < n:  # few accepting nodes: sort them
        out_accept = accepted[:n_acc].copy()
        out_accept.sort()
    else:  # many: a flag per node is cheaper than sorting
        flags = np.zeros(n, np.bool_)
        for j in range(n_acc):
            flags[accepted[j]] = True
        out_accept = np.flatnonzero(flags)
    return words.view(np.int32), out_accept


@njit(cache=True, nogil=True)
def _linear_walk(parent, node_byte, token_node, flat, accepting, state, n_words):  # pragma: no cover - jitted
    """``_root_walk`` as one linear pass over every node in breadth-first order: faster than the
    preorder jumps when little of the trie is dead (a string body), since the states are then
    written in the order ``_pack_alive`` reads them."""
    states, accept = bfs_states(parent, node_byte, flat, accepting, state, 1)  # slot n: non-text tokens
    return _pack_alive(states, token_node, n_words), accept


@njit(cache=True, nogil=True)
def _sub_walk(child_start, child_count, node_byte, node_parent, edges_by_byte, edge_byte_start, tok_start, tok_count,
              node_tokens, flat, accepting, state, parents, parent_bits, use_edges, capacity, dedup):  # pragma: no cover - jitted
    """Tokens kept alive below ``parents`` from ``state``, and nodes where the DFA accepts (sorted).

    The first byte is matched by scanning the parents' children, or (``use_edges``) by scanning
    the trie edges of the DFA's live first bytes and testing their parent in ``parent_bits``:
    the caller picks whichever touches fewer nodes (an identifier ends at ~100k nodes, but few
    of them are followed by ``(``). Outputs hold ``capacity`` entries; on overflow (nested
    parents visit a subtree once per parent) the third result is False and the caller retries
    with ``dedup``: a node met again in the state it was last met in is skipped with its whole
    subtree (same state, same subtree), and each token and accepting node is written once, so
    the outputs fit in the trie's size. Only then: on walks that fit, its per-node arrays and
    checks made masks slower overall.
    Buffers are sized up front: growing them inside the loop made the kernel several times slower.
    """
    initial = 0
    if use_edges:
        for b in range(256):
            if flat[state * 256 + b] >= 0:
                initial += edge_byte_start[b + 1] - edge_byte_start[b]
    else:
        for i in range(parents.shape[0]):
            initial += child_count[parents[i]]
    # depth-first: besides the first level, pending siblings are at most 256 per level of the path
    stack_node = np.empty(initial + 256 * 256, np.int64)
    stack_state = np.empty(initial + 256 * 256, np.int32)
    top = 0
    if use_edges:
        for b in range(256):
            if flat[state * 256 + b] < 0:
                continue
            for e in range(edge_byte_start[b], edge_byte_start[b + 1]):
                child = edges_by_byte[e]
                p = node_parent[child]
                if (parent_bits[p >> 6] >> np.uint64(p & 63)) & np.uint64(1):
                    stack_node[top] = child
                    stack_state[top] = state
                    top += 1
    else:
        for i in range(parents.shape[0]):
            p = parents[i]
            c0 = child_start[p]
            for c in range(c0, c0 + child_count[p]):
                stack_node[top] = c
                stack_state[top] = state
                top += 1
    out_tokens = np.empty(capacity, np.int64)
    out_accept = np.empty(capacity, np.int64)
    n_tok = 0
    n_acc = 0
    n_nodes = node_byte.shape[0] if dedup else 0
    last_state = np.full(n_nodes, -1, np.int32)  # the state a node was last met in; -1: never
    accepted = np.zeros(n_nodes, np.bool_)
    while top > 0:
        top -= 1
        node = stack_node[top]
        nxt = flat[stack_state[top] * 256 + node_byte[node]]
        if nxt < 0:
            continue
        t0 = tok_start[node]
        t1 = t0 + tok_count[node]
        if dedup:
            if last_state[node] == nxt:
                continue
            if last_state[node] >= 0:
                t1 = t0  # its tokens are written already
            last_state[node] = nxt
        if n_tok + (t1 - t0) > capacity or n_acc >= capacity:
            return out_tokens[:0], out_accept[:0], False
        for k in range(t0, t1):
            out_tokens[n_tok] = node_tokens[k]
            n_tok += 1
        if accepting[nxt] and not (dedup and accepted[node]):
            out_accept[n_acc] = node
            n_acc += 1
            if dedup:
                accepted[node] = True
        c0 = child_start[node]
        for c in range(c0, c0 + child_count[node]):
            stack_node[top] = c
            stack_state[top] = nxt
            top += 1
    accept = np.unique(out_accept[:n_acc]) if dedup else np.sort(out_accept[:n_acc])
    return out_tokens[:n_tok].copy(), accept, True


@njit(cache=True, nogil=True)
def tokens_to_words(tokens, n_words):  # pragma: no cover - jitted
    """Packed int32 mask with the bits of ``tokens`` set."""
    words = np.zeros(n_words, np.uint32)
    for i in range(tokens.shape[0]):
        tok = tokens[i]
        words[tok >> 5] |= np.uint32(1) << np.uint32(tok & 31)
    return words.view(np.int32)


def bounded_equivalence(table: np.ndarray, accepting: np.ndarray, rounds: int) -> np.ndarray:
    """Class ids of DFA states that agree on every string of at most ``rounds`` bytes.

    Moore's partition refinement stopped after ``rounds`` steps: after round r, two states share a
    class iff for each string w with |w| <= r, both die on w or neither does, and both accept
    after w or neither does. A trie walk sees strings no longer than the longest token, so states
    equal up to that length give identical walks — the thousand states of ``maxLength: 1000``
    collapse to about one per remaining count below the longest token.
    """
    columns, _ = byte_classes(table)
    classes = _moore(np.ascontiguousarray(columns, dtype=np.int32), np.ascontiguousarray(accepting, dtype=np.bool_),
                     int(rounds))
    classes.setflags(write=False)
    return classes


@njit(cache=True, nogil=True)
def _signature(columns, classes, q):  # pragma: no cover - jitted
    k = columns.shape[1]
    h = np.uint64(0x9E3779B97F4A7C15)
    for c in range(k):
        t = columns[q, c]
        v = classes[t] + 1 if t >= 0 else 0
        h = (h ^ np.uint64(v)) * np.uint64(0x100000001B3)
    return h


@njit(cache=True, nogil=True)
def _same_successors(columns, classes, a, b):  # pragma: no cover - jitted
    for c in range(columns.shape[1]):
        x = columns[a, c]
        y = columns[b, c]
        if (classes[x] if x >= 0 else -1) != (classes[y] if y >= 0 else -1):
            return False
    return True


@njit(cache=True, nogil=True)
def _moore(columns, accepting, rounds):  # pragma: no cover - jitted
    """``bounded_equivalence`` on a class table: Moore's rounds, each touching only the states
    whose successors changed class in the previous round.

    A state none of whose successors moved keeps the signature it had, hence stays with the
    untouched members of its class; so each round re-signs only the predecessors of the states
    that moved and splits their classes. Classes live as contiguous runs of one permutation
    (a refinable partition), candidates are moved to the front of their run, grouped by
    signature (sorted by hash, compared exactly), and every group but the one the untouched
    members share (or the largest, when none is untouched) becomes a new class. On a ``maxLength`` counter, where a round moves a few
    states, this costs about one pass over the DFA instead of one per round.
    """
    n, k = columns.shape
    classes = np.zeros(n, np.int64)
    elems = np.empty(n, np.int64)
    loc = np.empty(n, np.int64)
    first = np.zeros(n + 1, np.int64)
    size = np.zeros(n + 1, np.int64)
    marked = np.zeros(n + 1, np.int64)
    n_accepting = 0
    for q in range(n):
        if accepting[q]:
            n_accepting += 1
    count = 2 if 0 < n_accepting < n else 1
    lo = 0
    hi = n - n_accepting if count == 2 else n
    for q in range(n):  # class 0: rejecting states (or all), class 1: accepting ones
        if count == 2 and accepting[q]:
            classes[q] = 1
            elems[hi] = q
            loc[q] = hi
            hi += 1
        else:
            elems[lo] = q
            loc[q] = lo
            lo += 1
    size[0] = n - n_accepting if count == 2 else n
    first[1] = size[0]
    size[1] = n_accepting if count == 2 else 0
    pred_start, preds = predecessors(columns)
    stamp = np.full(n, -1, np.int64)
    class_stamp = np.full(n + 1, -1, np.int64)
    candidates = np.empty(n, np.int64)
    changed = np.empty(n, np.int64)
    n_changed = 0
    touched = np.empty(n + 1, np.int64)
    hashes = np.empty(n, np.uint64)
    leader = np.empty(n, np.int64)
    group_size = np.zeros(n, np.int64)
    for r in range(rounds):
        n_cand = 0
        if r == 0:
            for q in range(n):
                candidates[q] = q
            n_cand = n
        else:
            for i in range(n_changed):
                t = changed[i]
                for j in range(pred_start[t], pred_start[t + 1]):
                    q = preds[j]
                    if stamp[q] != r:
                        stamp[q] = r
                        candidates[n_cand] = q
                        n_cand += 1
        if n_cand == 0:
            break
        n_touched = 0
        for i in range(n_cand):  # candidates to the front of their class's run
            q = candidates[i]
            cid = classes[q]
            if class_stamp[cid] != r:
                class_stamp[cid] = r
                marked[cid] = 0
                touched[n_touched] = cid
                n_touched += 1
            pos = first[cid] + marked[cid]
            other = elems[pos]
            elems[loc[q]] = other
            loc[other] = loc[q]
            elems[pos] = q
            loc[q] = pos
            marked[cid] += 1
            hashes[q] = _signature(columns, classes, q)
        # phase A (classes unchanged): each candidate's group leader, the untouched member when equal
        for i in range(n_touched):
            cid = touched[i]
            a = first[cid]
            m = marked[cid]
            keep = elems[a + m] if m < size[cid] else -1
            if keep >= 0:
                hashes[keep] = _signature(columns, classes, keep)
            segment = elems[a:a + m]
            order = np.argsort(hashes[segment], kind="mergesort")
            sorted_segment = segment[order].copy()
            j = 0
            while j < m:
                e = j
                h = hashes[sorted_segment[j]]
                while e < m and hashes[sorted_segment[e]] == h:
                    e += 1
                for x in range(j, e):  # within one hash: compare exactly with earlier leaders
                    q = sorted_segment[x]
                    found = -1
                    if keep >= 0 and hashes[keep] == h and _same_successors(columns, classes, q, keep):
                        found = keep
                    else:
                        for y in range(j, x):
                            p = sorted_segment[y]
                            if leader[p] == p and _same_successors(columns, classes, q, p):
                                found = p
                                break
                    leader[q] = q if found < 0 else found
                j = e
            if keep < 0:  # every member re-signed: the largest group keeps the class (only the others move)
                best = 0
                for x in range(m):
                    group_size[leader[sorted_segment[x]]] += 1
                for x in range(m):
                    ld = leader[sorted_segment[x]]
                    if group_size[ld] > best:
                        best = group_size[ld]
                        keep = ld
                for x in range(m):
                    group_size[leader[sorted_segment[x]]] = 0
            # order the run: new groups by leader, the kept group last (next to the untouched members)
            keys = np.empty(m, np.int64)
            for x in range(m):
                ld = leader[sorted_segment[x]]
                keys[x] = n if ld == keep else ld
            order2 = np.argsort(keys, kind="mergesort")
            for x in range(m):
                q = sorted_segment[order2[x]]
                elems[a + x] = q
                loc[q] = a + x
        # phase B: split
        n_changed = 0
        for i in range(n_touched):
            cid = touched[i]
            a = first[cid]
            m = marked[cid]
            # the kept group sits last in the run: the untouched members' (first of them right after
            # the run) or, when every member was re-signed, the last group's
            keep_leader = elems[a + m] if m < size[cid] else leader[elems[a + m - 1]]
            x = 0
            while x < m:
                q = elems[a + x]
                ld = leader[q]
                if ld == keep_leader:
                    break
                e = x
                while e < m and leader[elems[a + e]] == ld:
                    e += 1
                new = count
                count += 1
                first[new] = a + x
                size[new] = e - x
                for y in range(x, e):
                    s = elems[a + y]
                    classes[s] = new
                    changed[n_changed] = s
                    n_changed += 1
                x = e
            first[cid] = a + x
            size[cid] -= x
            marked[cid] = 0
        if n_changed == 0 or count == n:
            break
    return classes


#: Broad root walks of one DFA (not depth-first from a few subtrees) before
#: ``WalkCache.walk_class`` computes its bounded equivalence: ``WALK_CLASS_AFTER``, or one per
#: ``WALK_CLASS_STATES_PER_WALK`` states of a bigger DFA. Computing the classes costs ~1-3 µs a
#: state (byte classes, the run test, Moore's rounds: 30 ms for 9,000 states), a broad walk
#: 0.1-1 ms: waiting until the walks made cost about as much bounds the waste either way.
WALK_CLASS_AFTER = 4
WALK_CLASS_STATES_PER_WALK = 256

#: ``WalkCache.language_key`` looks at DFAs of at most this many states, and gives a key when at
#: most this many are reachable from the state (a string body and what closes it: ~10).
LANGUAGE_KEY_MAX_DFA = 4096
LANGUAGE_KEY_MAX_REACH = 64
_UNSET = object()

#: ``PathWalk.nodes_key`` hashes accept-node arrays up to this length.
NODES_KEY_MAX = 4096
_walk_ids = itertools.count()


@njit(cache=True, nogil=True)
def _reachable_form(flat, accepting, state, limit):  # pragma: no cover - jitted
    """The language from ``state`` in canonical form, as int32; empty when more than ``limit``
    states are reachable.

    The reachable states are numbered breadth-first, bytes in order, and each is written as its
    accepting flag, its number of runs and its runs: maximal byte ranges with one target, as
    (first byte, target's number or -1). A minimal DFA's reachable part written so is the same
    for the same language; runs keep the form (and what is hashed) a few ints a state, where
    full rows took 1 KB each.
    """
    n = accepting.shape[0]
    label = np.full(n, -1, np.int32)
    order = np.empty(limit, np.int64)
    form = np.empty(limit * 514, np.int32)
    order[0] = state
    label[state] = 0
    count = 1
    head = 0
    size = 0
    while head < count:
        q = order[head]
        head += 1
        form[size] = 1 if accepting[q] else 0
        runs_at = size + 1
        size += 2
        runs = 0
        prev = -2
        for b in range(256):
            t = flat[q * 256 + b]
            if t == prev:
                continue
            prev = t
            if t >= 0 and label[t] < 0:
                if count == limit:
                    return np.empty(0, np.int32)
                label[t] = count
                order[count] = t
                count += 1
            form[size] = b
            form[size + 1] = label[t] if t >= 0 else -1
            size += 2
            runs += 1
        form[runs_at] = runs
    return form[:size].copy()


@njit(cache=True, nogil=True)
def _runs_longer_than(flat, start, limit):  # pragma: no cover - jitted
    """Whether a path from ``start`` runs more than ``limit`` bytes without closing a cycle (the
    edges back into a path being walked are not followed).

    Walk classes merge the states that agree on every string of at most ``limit`` bytes, which
    takes a long run of states: a counter (``maxLength``), a long cycle. Without one, the states
    of a minimal DFA nearly always stay apart, and computing the classes is wasted: an object's
    key terminals (a key, whitespace runs, a number's digit loop: ~180-270 states) spent ~1 ms
    each on it, 150 ms in one mask of a 256-member object. A heuristic that only decides
    whether to look (states left apart are exact). Depth-first, longest run per state."""
    n = flat.shape[0] // 256
    depth = np.full(n, -1, np.int64)  # -1 unvisited, -2 on the stack, else the longest path
    stack = np.empty(n, np.int64)
    next_byte = np.zeros(n, np.int64)
    stack[0] = start
    depth[start] = -2
    top = 1
    while top > 0:
        q = stack[top - 1]
        b = next_byte[q]
        pushed = False
        while b < 256:
            t = flat[q * 256 + b]
            b += 1
            if t < 0:
                continue
            if depth[t] == -1:
                depth[t] = -2
                stack[top] = t
                top += 1
                pushed = True
                break
        next_byte[q] = b
        if pushed:
            continue
        longest = 0
        for c in range(256):
            t = flat[q * 256 + c]
            if t >= 0 and depth[t] >= 0 and depth[t] + 1 > longest:  # -2: an edge closing a cycle
                longest = depth[t] + 1
        if longest > limit:
            return True
        depth[q] = longest
        top -= 1
    return False


#: Walk classes are computed when rounds x states x byte classes stays under this many cells
#: (tens of milliseconds compiled); bigger DFAs key walks by exact state — correct, just less shared.
WALK_CLASS_BUDGET = 40_000_000


class PathWalk:
    """The result of walking one lexical path: tokens reachable and where the last lexeme may end.

    ``mask`` (packed) is set for root walks, ``tokens`` (ids) for sub-walks, which are small.
    ``child_byte_set`` (a 256-bit int) holds the bytes on edges leaving the accept nodes: a
    next lexeme whose first bytes are none of them cannot continue this path (the hot "can
    anything follow" test); ``children_total`` counts those edges, which sizes the scan.
    """

    __slots__ = ("mask", "tokens", "accept_nodes", "child_byte_set", "children_total", "_accept_bits", "_nodes_key")

    def __init__(self, mask, tokens, accept_nodes, child_byte_set: int, children_total: int):
        self.mask = mask
        self.tokens = tokens
        self.accept_nodes = accept_nodes
        self.child_byte_set = child_byte_set
        self.children_total = children_total
        self._accept_bits: np.ndarray | None = None
        self._nodes_key: object = None

    def nodes_key(self) -> object:
        """Equal for walks with equal accept nodes (what their extensions depend on), when small.

        Root walks from different states of one terminal often end at the same places (the
        closing quotes of a string body), so their extensions are shared through this key.
        """
        if self._nodes_key is None:
            nodes = self.accept_nodes
            if nodes.shape[0] <= NODES_KEY_MAX:
                self._nodes_key = hashlib.blake2b(nodes.tobytes(), digest_size=20).digest()
            else:  # hashing would cost more than it saves: this walk's own key
                self._nodes_key = next(_walk_ids)
        return self._nodes_key


class WalkCache:
    """Root walks per (DFA, state), and sub-walks per (where the parent walk ends, DFA, state).

    Root walks are keyed by walk class within a DFA and, for small sub-languages, by the language
    itself across DFAs (``language_key``); sub-walks by the parent's accept nodes and the walk
    class, so parents that end alike share their extensions (``PathWalk.nodes_key``). Sub-walks
    take no language key: the same parent nodes under another DFA with the same remaining
    language never came up (0 of ~45,000 cold sub-walks on MaskBench files and the GBNF
    grammars), while computing the key cost more than most sub-walks.

    Bounded by the bytes of the arrays it holds (a broad terminal's accept nodes alone can take
    ~1 MB): past ``max_bytes`` everything is dropped and rebuilt on demand. Shared by every
    grammar one ``Compiler`` builds for a vocabulary; thread-safe.
    """

    def __init__(self, trie: TokenTrie, logits_width: int, max_bytes: int = 256 << 20):
        self.trie = trie
        self.logits_width = logits_width
        self.max_bytes = max_bytes
        self._held_bytes = 0
        self._roots: dict = {}
        self._lock = Lock()
        self._words = mask_words(logits_width)
        self._live: dict = {}
        self._classes: dict = {}
        self._walked: dict = {}  # DFA key -> the states of its first root walks (see walk_class)
        self._singleton_ids = np.zeros(0, dtype=np.int64)
        self._language_keys: dict = {}
        self._children: dict = {}  # (parent walk's nodes_key, DFA key, walk class) -> PathWalk
        self._horizon = int(trie.node_depth.max())  # the longest token, in bytes
        # per byte: trie edges carrying it, and nodes below the root's child on it (children of
        # a node have distinct bytes): a state's live bytes dotted with these size its walks
        by_byte = np.zeros((2, 256), dtype=np.int64)
        by_byte[0] = np.diff(trie.edge_byte_start)
        first = slice(1, 1 + int(trie.child_count[0]))
        by_byte[1, trie.node_byte[first]] = trie.subtree_size[first]
        self._by_byte = by_byte
        self._slices = default_slices(trie, logits_width)
        self._load_kernels()

    def _walk_root(self, flat, accepting, state: int):
        pre_node, pre_parent, pre_byte, pre_end, _ = self.trie.preorder
        trie = self.trie
        return _root_walk(pre_node, pre_parent, pre_byte, pre_end, trie.node_tok_start, trie.node_tok_count,
                          trie.node_tokens, flat, accepting, state, self._words)

    def _load_kernels(self) -> None:
        """Call every kernel once on a dead one-state DFA: numba loads (or compiles) machine code
        on first call, ~0.1 s per kernel, which belongs to setup rather than to a first mask. Once
        per process: the calls themselves cost ~2 ms (whole-trie passes), a second ``Compiler``
        needs none of it."""
        global _kernels_loaded
        if _kernels_loaded:
            return
        dead = np.full(256, -1, dtype=np.int32)
        no = np.zeros(1, dtype=bool)
        for arr in (dead, no):  # read-only like ByteDFA tables: numba types include the flag
            arr.setflags(write=False)
        trie = self.trie
        self._walk_root(dead, no, 0)
        _linear_walk(trie.node_parent, trie.node_byte, trie.token_node, dead, no, 0, self._words)
        bits = _node_bitset(_ROOT, trie.n_nodes)
        self._kernel_sub_walk(dead, no, 0, _ROOT, bits, True, 1)
        _child_byte_summary(trie.child_start, trie.child_count, trie.node_byte, _ROOT)
        tokens_to_words(np.zeros(0, dtype=np.int64), self._words)
        _reachable_form(dead, no, 0, 2)
        _runs_longer_than(dead, 0, 1)
        small = load_kernels()  # the DFA construction kernels too: every compile needs them
        for token_slice in self._slices:
            token_slice.reach(small, small.start)
            token_slice.walk(small, small.start)
        bounded_equivalence(small.table, small.accepting, 2)
        _kernels_loaded = True

    def walk_class(self, dfa) -> np.ndarray:
        """Per DFA state, a class id such that states of one class give identical walks.

        Each state is its own class (ids ``-1 - state``) until the DFA's ``WALK_CLASS_AFTER``-th
        broad root walk (more for big DFAs); then bounded equivalence merges counter states (ids
        ``>= 0``, see ``_note_root_walk``). Most terminals are walked from a few states only, and
        the Moore rounds (up to the longest token's length) cost more than those walks; a
        ``maxLength`` string walked at every position pays them once. Narrow walks (keys,
        punctuation, digits: ~30 µs) do not count: on 300 MaskBench files, counting them made two
        thirds of the computations (~1 ms each) for DFAs whose later walks were all narrow. The two
        id ranges never meet, so keys made with either stay exact. This is on the mask path: one dictionary lookup.
        """
        classes = self._classes.get(dfa.key)
        if classes is None:
            classes = self._classes[dfa.key] = self._singletons(dfa.n_states)
        return classes

    def _note_root_walk(self, dfa, state: int) -> None:
        """Count a broad root walk of ``dfa`` from ``state``; at the ``WALK_CLASS_AFTER``-th, compute its
        walk classes and file the walks made so far under their classes too: keyed by state
        alone, they would be walked again (a long string's first positions, ~1 ms each)."""
        walked = self._walked.setdefault(dfa.key, [])
        n = dfa.n_states
        after = max(WALK_CLASS_AFTER, n // WALK_CLASS_STATES_PER_WALK)
        if len(walked) >= after:
            return
        walked.append(state)
        if len(walked) != after or n <= self._horizon:  # short DFAs merge little
            return
        if not _runs_longer_than(_flat(dfa), dfa.start, self._horizon):
            return  # no long run of states: nothing to merge
        columns = byte_classes(dfa.table)[0]
        if n * self._horizon * columns.shape[1] > WALK_CLASS_BUDGET:
            return  # huge DFAs cost too much: states stay their own classes
        classes = _moore(np.ascontiguousarray(columns, dtype=np.int32),
                         np.ascontiguousarray(dfa.accepting, dtype=np.bool_), self._horizon)
        classes.setflags(write=False)
        self._classes[dfa.key] = classes
        with self._lock:
            for earlier in walked[:-1]:
                walk = self._roots.get((dfa.key, -1 - earlier))
                if walk is not None:
                    self._roots[(dfa.key, int(classes[earlier]))] = walk

    def _singletons(self, n: int) -> np.ndarray:
        if self._singleton_ids.shape[0] < n:
            ids = -1 - np.arange(max(n, 2 * self._singleton_ids.shape[0]), dtype=np.int64)
            ids.setflags(write=False)
            self._singleton_ids = ids
        return self._singleton_ids[:n]

    def language_key(self, dfa, state: int) -> bytes | None:
        """Digest of the language from ``state`` when few states are reachable from it, else None.

        Walks depend only on that language, so this key shares them across DFAs: the body of a
        quoted string ends the same way in every terminal it closes, e.g. one per object key.
        A minimal DFA's states reachable from ``state``, numbered in breadth-first byte order,
        are a canonical form of the language (a different DFA size gives a different form).
        """
        memo = (dfa.key, state)
        key = self._language_keys.get(memo, _UNSET)
        if key is _UNSET:
            key = None
            if dfa.n_states <= LANGUAGE_KEY_MAX_DFA:
                form = _reachable_form(_flat(dfa), dfa.accepting, state, LANGUAGE_KEY_MAX_REACH)
                if form.shape[0]:
                    key = hashlib.sha256(form.tobytes()).digest()[:20]
            self._language_keys[memo] = key
        return key

    def root(self, dfa, state: int) -> PathWalk:
        """Walk ``dfa`` from ``state`` over the whole trie (the tokens that start a lexeme here)."""
        key = (dfa.key, int(self.walk_class(dfa)[state]))
        hit = self._roots.get(key)
        if hit is not None:
            return hit
        trie = self.trie
        reach = self._live_bytes(dfa, state).root_reach
        # a depth-first node costs ~20x a linear-pass node; such walks (keywords, punctuation) cost
        # ~30 µs, and sharing them by language saved less than the key costs
        narrow = reach * 20 < trie.n_nodes
        language = None if narrow else self.language_key(dfa, state)
        hit = self._roots.get(language) if language is not None else None
        if hit is not None:
            self._roots[key] = hit
            return hit
        if not narrow:
            self._note_root_walk(dfa, state)
        if narrow:  # few subtrees start with an allowed byte: walk only those
            tokens, accept = self._sub_walk(dfa, state, _ROOT, None)
            words = tokens_to_words(tokens, self._words)
        elif reach * 2 < trie.n_nodes:  # whitespace, numbers: jump over the dead subtrees
            words, accept = self._walk_root(_flat(dfa), dfa.accepting, state)
        else:  # most of the trie is alive: a string body, unless a slice makes it small
            for token_slice in self._slices:
                chars = token_slice.reach(dfa, state)
                if chars is not None:
                    words, accept = token_slice.walk(dfa, state, chars)
                    break
            else:
                words, accept = _linear_walk(trie.node_parent, trie.node_byte, trie.token_node, _flat(dfa),
                                             dfa.accepting, state, self._words)
        words.setflags(write=False)
        walk = PathWalk(words, None, accept, *self._child_bytes(accept))
        with self._lock:
            self._account(walk)
            self._roots[key] = walk
            classed = (dfa.key, int(self.walk_class(dfa)[state]))  # a new key if this walk set the classes
            if classed != key:
                self._roots[classed] = walk
            if language is not None:
                self._roots[language] = walk
        return walk

    def extend(self, walk: PathWalk, dfa, state: int) -> PathWalk:
        """Walk ``dfa`` from ``state`` below the places where ``walk``'s last lexeme may end."""
        nodes = walk.nodes_key()
        key = (nodes, dfa.key, int(self.walk_class(dfa)[state]))
        hit = self._children.get(key)
        if hit is not None:
            return hit
        live = self._live_bytes(dfa, state)
        if not walk.child_byte_set & live.byte_set:
            child = _EMPTY_WALK
        else:
            tokens, accept = self._sub_walk(dfa, state, walk.accept_nodes,
                                            walk if live.edges < walk.children_total else None)
            child = PathWalk(None, tokens, accept, *self._child_bytes(accept))
            with self._lock:
                self._account(child)
        with self._lock:
            self._children[key] = child
        return child

    def token_next_states(self, dfa, state: int) -> np.ndarray:
        """Per token, the state its bytes reach from ``state`` (-1: not allowed). Not cached here."""
        trie = self.trie
        states, _ = bfs_states(trie.node_parent, trie.node_byte, _flat(dfa), dfa.accepting, state, 1)
        return states[trie.token_node]  # the sentinel slot: tokens without a node

    # --- internals ---------------------------------------------------------------------------

    def _account(self, walk: PathWalk) -> None:
        """Count ``walk``'s arrays; drop every cached walk once over budget (caller holds the lock)."""
        size = walk.accept_nodes.nbytes + (walk.mask.nbytes if walk.mask is not None else walk.tokens.nbytes)
        if self._held_bytes + size > self.max_bytes:
            self._roots = {}
            self._children = {}
            self._language_keys = {}
            self._held_bytes = 0
        self._held_bytes += size

    def _live_bytes(self, dfa, state: int) -> "_LiveBytes":
        """The bytes a lexeme can start with from ``state``, and what they reach in the trie."""
        key = (dfa.key, state)
        live = self._live.get(key)
        if live is None:
            flags = dfa.table[state] >= 0
            edges, root_reach = (self._by_byte @ flags).tolist()
            live = self._live[key] = _LiveBytes(_bit_set(flags), edges, root_reach)
        return live

    def _child_bytes(self, nodes: np.ndarray) -> tuple[int, int]:
        """``PathWalk``'s (child_byte_set, children_total) for accept nodes ``nodes``."""
        if not nodes.shape[0]:  # most sub-walks: no lexeme ends inside a token
            return 0, 0
        trie = self.trie
        words, total = _child_byte_summary(trie.child_start, trie.child_count, trie.node_byte, nodes)
        w = words.tolist()
        return w[0] | w[1] << 64 | w[2] << 128 | w[3] << 192, int(total)

    def _sub_walk(self, dfa, state: int, parents: np.ndarray, by_edges: PathWalk | None):
        """Run the sub-walk kernel; ``by_edges`` (the parents' walk) selects the edge scan."""
        if by_edges is not None:
            if by_edges._accept_bits is None:
                by_edges._accept_bits = _node_bitset(parents, self.trie.n_nodes)
                with self._lock:
                    self._held_bytes += by_edges._accept_bits.nbytes
            bits = by_edges._accept_bits
        else:
            bits = _NO_BITS
        capacity = self.trie.n_nodes + 1
        dedup = False
        while True:
            tokens, accept, complete = self._kernel_sub_walk(_flat(dfa), dfa.accepting, state, parents, bits,
                                                             by_edges is not None, capacity, dedup)
            if complete:
                return tokens, accept
            if dedup:  # not expected: deduplicated outputs fit in the trie's size
                capacity *= 4
            dedup = True

    def _kernel_sub_walk(self, flat, accepting, state, parents, bits, use_edges, capacity, dedup=False):
        trie = self.trie
        return _sub_walk(trie.child_start, trie.child_count, trie.node_byte, trie.node_parent, trie.edges_by_byte,
                         trie.edge_byte_start, trie.node_tok_start, trie.node_tok_count, trie.node_tokens, flat,
                         accepting, state, parents, bits, use_edges, capacity, dedup)


@dataclass(frozen=True)
class _LiveBytes:
    """What ``WalkCache._live_bytes`` knows of one DFA state, memoised: it sizes every walk from it."""

    byte_set: int  # bytes with a live transition, as a 256-bit int
    edges: int  # trie edges carrying one of them (the edge scan of a sub-walk)
    root_reach: int  # trie nodes below the root's children on them (what a root walk may visit)


def _bit_set(flags: np.ndarray) -> int:
    """bool[256] -> int with bit b set where flags[b]."""
    return int.from_bytes(np.packbits(flags, bitorder="little").tobytes(), "little")


_ROOT = np.zeros(1, dtype=np.int64)
_kernels_loaded = False  # ``WalkCache._load_kernels`` has run in this process
_NO_BITS = np.zeros(1, dtype=np.uint64)
_EMPTY_WALK = PathWalk(None, np.empty(0, np.int64), np.empty(0, np.int64), 0, 0)


def _flat(dfa) -> np.ndarray:
    return dfa.table.reshape(-1)
