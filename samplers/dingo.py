"""DINGO for regular constraints: the best (or a sampled) block of a diffusion LM over a token DFA.

DINGO (Suresh et al., NeurIPS 2025) replaces the decoder of every step of a masked-diffusion
LM: given independent per-position distributions ``v_1 … v_d`` over the vocabulary for a block
of ``d`` canvas positions, it returns the block that maximises ``Π_i v_i[t_i]`` among the blocks
a regular constraint still allows. ``dingo_map`` is that decoder (Viterbi over positions × DFA
states, exact); ``dingo_sample`` draws a block exactly from the same product distribution
restricted to the valid blocks (forward filtering, backward sampling).

**The lattice.** The constraint is a ``grammars.TokenDFA`` (``CompiledGrammar.as_dfa()``). Its
text tokens move a state to the state their bytes reach. EOS is modelled as the diffusion canvas
uses it — the tail after the output is filled with EOS: EOS may be placed only from an accepting
state and leads to an absorbing **ended** state (``ENDED``, the same value as
``DFAMatcher.state`` after EOS, ``grammars.masks.token_dfa.TERMINATED``) whose only token is EOS,
so once a position holds EOS every later position does too. A block may start in the ended state
(``start_state=ENDED``, when an earlier block ended) and then is all EOS. Several EOS ids are one
choice per position (the most likely / sampled among them); ids past the vocabulary never occur.

**Masked positions** (``keep_masked``) stay masked this step: such a position takes the "any
token" transition (to every state some allowed token reaches, the ended state included from an
accepting state), contributes 0 to the log-probability and is ``-1`` in the result.

**The end-state budget.** The canvas has ``remaining`` positions after the block, so the block
must end in a state from which an accepting one is reachable within ``remaining`` tokens
(``remaining=0``: the end state is accepting, or ended). The fewest tokens to acceptance from
every state (``DingoTables.dist``, a backward breadth-first search over token transitions) also
prunes the lattice: a state that cannot reach acceptance in the positions left is dropped.

**No valid block** raises ``NoValidBlock`` (a ``samplers.NoAllowedToken``): no block of this
length satisfies the constraint from the start state within the budget, or every one that does
has probability zero (``-inf`` log-probabilities). Its message says which.

**Precomputation** (``prepare(dfa)``, cached per DFA, thread-safe): the text transitions of every
state reachable from the start (one trie walk each, ``TokenDFA.transitions``), then the tokens are
partitioned into **classes** — tokens that move every state alike (EOS tokens are one class) —
so that the lattice is a dense table ``next[state, class]``, small even for 128K vocabularies.
Classes come from a 64-bit hash of each token's column of next states, verified exactly (a
collision, never seen, refines the partition). A block then costs:

* one gather of each unmasked position's log-probabilities over the ``L`` live tokens (tokens some
  state allows) and a segmented max with its argmax (``dingo_map``), or log-sum-exp with one
  token drawn per class by inverse CDF (``dingo_sample``), per class: ``O(L)`` per position;
* Viterbi: per position, ``O(E + P)`` numpy work over the ``E`` (state, class) edges and ``P``
  (state, next state) pairs, then ``O(d·P/|Q|)`` to backtrack. Per step (one block of ``d``
  positions): ``O(d·(L + E + P))``, vectorised (no per-state Python loop); the paper's bound
  ``O(d·|Q|·(|Q| + |V|))`` is the case where no two tokens share a class. Measured on Llama 3's
  128,256 tokens: ``python -m jsonschemabench dingo`` (``jsonschemabench/dingo_bench.py``).

**Exact sampling with masked positions.** A block with masked positions may have several lattice
paths (a masked position can go to several states), so summing over paths would weight a block by
its number of paths. ``dingo_sample`` therefore runs the forward pass over *sets* of states (the
subset construction, built lazily and kept per ``DingoTables`` for later calls; without masked
positions every set is a single state and a step is the plain state lattice, vectorised over the
pairs), where each block has exactly one path. The number of sets can grow with the masking
pattern (a 320-state ``multipleOf`` DFA met ~13,000 sets over a few 128-position blocks; a
98-state object schema ~2,200); live sets per position are bounded by ``MAX_LIVE_SUBSETS``
(``LimitExceeded`` past it). A new set costs ``O(|set|·classes)`` numpy work once. Viterbi needs
no sets: the best path is a best block either way.

With masked positions, the block's end state depends on what they become; ``end_state`` is then
one state the block can end in that meets the budget (``dingo_map``: the best path's;
``dingo_sample``: the member of the sampled set nearest to acceptance).
"""

from __future__ import annotations

import math
import numbers
import threading
import time
import weakref
from dataclasses import dataclass, field

import numpy as np
import torch

from grammars.errors import LimitExceeded, NoAllowedToken
from grammars.masks.token_dfa import TERMINATED, TokenDFA
from samplers._numeric import uniforms

__all__ = [
    "ENDED",
    "MAX_LIVE_SUBSETS",
    "DingoTables",
    "NoValidBlock",
    "dingo_map",
    "dingo_sample",
    "prepare",
]

#: The absorbing state after EOS (``DFAMatcher.state`` after EOS): only EOS follows.
ENDED = TERMINATED
#: ``dingo_sample``: most sets of DFA states alive at one position before ``LimitExceeded``.
MAX_LIVE_SUBSETS = 65536

_NEG_INF = float("-inf")
_ROWS_PER_CHUNK = 16  # positions gathered at once (16 x 128K float32 = 8 MB)
_UNREACHABLE = np.iinfo(np.int64).max // 4


class NoValidBlock(NoAllowedToken):
    """``dingo_map``/``dingo_sample`` found no valid block: none of this length satisfies the
    constraint from the start state within the end-state budget, or all of those have zero
    probability. A ``NoAllowedToken`` (hence ``MatchError`` and ``RuntimeError``)."""


@dataclass(frozen=True, eq=False)
class DingoTables:
    """The precomputed lattice of one ``TokenDFA`` (``prepare``); internal state ``i`` is DFA state
    ``states[i]``, and internal ``n = len(states)`` is the ended state. Arrays are read-only.

    ``dist[i]``: fewest tokens from ``i`` to acceptance (``_UNREACHABLE`` if none). ``perm``: the
    live tokens grouped by class (ascending ids within one), class ``k`` being
    ``perm[class_starts[k]:class_ends[k]]``.
    ``next[i, k]``: internal state after a token of class ``k`` (``-1``: not allowed). Pairs
    (``pair_src``, ``pair_dst``) are the distinct (state, next state) moves, sorted by
    destination, each with its classes ``edge_class[pair_starts[p]:pair_starts[p + 1]]``;
    ``dst_states``/``dst_starts`` group the pairs by destination.
    """

    states: np.ndarray  # (no reference to the DFA: the cache is keyed by it, weakly)
    index: np.ndarray  # DFA state -> internal index, -1 if not covered
    accepting: np.ndarray
    dist: np.ndarray
    perm: np.ndarray
    class_starts: np.ndarray
    class_ends: np.ndarray
    next: np.ndarray
    edge_class: np.ndarray
    pair_src: np.ndarray
    pair_dst: np.ndarray
    pair_starts: np.ndarray
    dst_states: np.ndarray
    dst_starts: np.ndarray
    src_order: np.ndarray  # the pairs sorted by (source, destination) ...
    src_bounds: np.ndarray  # ... state i's being src_order[src_bounds[i]:src_bounds[i + 1]]
    succ: tuple  # per internal state: sorted unique successors (the "any token" move)
    seconds: float
    _subsets: list = field(default_factory=list, repr=False)  # dingo_sample's set registry

    @property
    def n_states(self) -> int:
        """Covered DFA states plus the ended state."""
        return int(self.next.shape[0])

    @property
    def n_classes(self) -> int:
        """Token classes (tokens that move every state alike)."""
        return int(self.next.shape[1])

    @property
    def n_live_tokens(self) -> int:
        """Tokens some covered state allows (EOS included when some state accepts)."""
        return int(self.perm.shape[0])

    @property
    def ended(self) -> int:
        """The internal index of the ended state."""
        return int(self.states.shape[0])

    def internal(self, state: int) -> int:
        """The internal index of DFA state ``state`` (or ``ENDED``); -1 if not covered."""
        if state == ENDED:
            return self.ended
        return int(self.index[state])

    def external(self, i: int) -> int:
        """The DFA state (or ``ENDED``) of internal index ``i``."""
        return ENDED if i == self.ended else int(self.states[i])


_cache: weakref.WeakKeyDictionary[TokenDFA, DingoTables] = weakref.WeakKeyDictionary()
_cache_lock = threading.Lock()


def prepare(dfa: TokenDFA, start_state: int | None = None) -> DingoTables:
    """The lattice tables of ``dfa`` covering every state reachable from its start (and from
    ``start_state``); built once per DFA and cached (thread-safe). Costs one trie walk per
    reachable state (``TokenDFA.transitions``) plus ``O(|Q|·|V|)`` numpy work for the classes."""
    if not isinstance(dfa, TokenDFA):
        raise TypeError(f"dfa must be a grammars.TokenDFA (CompiledGrammar.as_dfa()), got {type(dfa).__name__}")
    start = _check_state(dfa, dfa.start if start_state is None else start_state)
    with _cache_lock:
        tables = _cache.get(dfa)
    if tables is not None and (start == ENDED or tables.index[start] >= 0):
        return tables
    roots = {dfa.start} if start == ENDED else {dfa.start, start}
    if tables is not None:
        roots.update(int(s) for s in tables.states)
    tables = _build(dfa, sorted(roots))
    with _cache_lock:
        old = _cache.get(dfa)
        if old is None or old.states.shape[0] < tables.states.shape[0]:
            _cache[dfa] = tables
    return tables


def _check_state(dfa: TokenDFA, state: object) -> int:
    if isinstance(state, (bool, np.bool_)) or not isinstance(state, (int, np.integer)):
        raise TypeError(f"start_state must be an int (a DFA state or ENDED), got {type(state).__name__} {state!r}")
    state = int(state)
    if state != ENDED and not 0 <= state < dfa.n_states:
        raise ValueError(f"start_state {state} is not a state of this DFA (0..{dfa.n_states - 1}, or ENDED={ENDED})")
    return state


def _readonly(*arrays: np.ndarray) -> None:
    for a in arrays:
        a.setflags(write=False)


def _build(dfa: TokenDFA, roots: list[int]) -> DingoTables:
    t0 = time.perf_counter()
    width = int(dfa.logits_width)
    # 1. states reachable from the roots, with their text transitions (one trie walk each)
    index = np.full(dfa.n_states, -1, dtype=np.int64)
    order: list[int] = []
    rows: list[tuple[np.ndarray, np.ndarray]] = []
    for r in roots:
        if index[r] < 0:
            index[r] = len(order)
            order.append(r)
    head = 0
    while head < len(order):
        tokens, nxt = dfa.transitions(order[head])
        rows.append((tokens, nxt))
        new = np.unique(nxt)
        new = new[index[new] < 0]
        for s in new.tolist():
            index[s] = len(order)
            order.append(s)
        head += 1
    n = len(order)
    ended = n
    states = np.asarray(order, dtype=np.int64)
    accepting = np.zeros(n + 1, dtype=bool)
    accepting[:n] = dfa.accepting[states]
    accepting[ended] = True
    eos = np.array(sorted(t for t in dfa.eos_token_ids if 0 <= t < width), dtype=np.int64)
    # every state's moves as (tokens, internal next states); EOS: accepting -> ended, ended -> ended
    moves: list[tuple[np.ndarray, np.ndarray]] = []
    for i, (tokens, nxt) in enumerate(rows):
        tok, dst = tokens.astype(np.int64), index[nxt]
        if eos.size:  # EOS ids are never text (DFAMatcher reads them as EOS first)
            text = ~np.isin(tok, eos)
            tok, dst = tok[text], dst[text]
        if accepting[i] and eos.size:
            tok = np.concatenate([tok, eos])
            dst = np.concatenate([dst, np.full(eos.size, ended, dtype=np.int64)])
        moves.append((tok, dst))
    moves.append((eos, np.full(eos.size, ended, dtype=np.int64)))
    # 2. token classes: tokens with the same column of next states (hashed, then verified exactly)
    live = np.zeros(width, dtype=bool)
    for tok, _ in moves:
        live[tok] = True
    live_tokens = np.flatnonzero(live)
    pos = np.full(width, -1, dtype=np.int64)
    pos[live_tokens] = np.arange(live_tokens.size)
    mult = _multipliers(n + 1)
    h = np.zeros(live_tokens.size, dtype=np.uint64)
    with np.errstate(over="ignore"):
        for i, (tok, dst) in enumerate(moves):
            h[pos[tok]] += (dst.astype(np.uint64) + np.uint64(1)) * mult[i]
    _, labels = np.unique(h, return_inverse=True)
    labels = labels.reshape(-1).astype(np.int64)
    while True:  # exactness: every token of a class must move every state alike
        reps = _first_of_each(labels)
        nxt_table = np.empty((n + 1, reps.size), dtype=np.int32)
        for i, (tok, dst) in enumerate(moves):
            col = np.full(live_tokens.size, -1, dtype=np.int64)  # state i's next state per live token
            col[pos[tok]] = dst
            if not np.array_equal(col, col[reps[labels]]):
                break  # a hash collision (never seen): refine by this state's column, start over
            nxt_table[i] = col[reps]
        else:
            break
        _, labels = np.unique(labels * (n + 2) + (col + 1), return_inverse=True)
        labels = labels.reshape(-1).astype(np.int64)
    n_classes = reps.size
    by_class = np.argsort(labels, kind="stable")
    perm = live_tokens[by_class]
    counts = np.bincount(labels, minlength=n_classes)
    class_ends = np.cumsum(counts)
    class_starts = class_ends - counts
    # 3. edges (state, class) grouped into pairs (state, next state), pairs sorted by destination
    src, cls = np.nonzero(nxt_table >= 0)
    dst = nxt_table[src, cls].astype(np.int64)
    o = np.lexsort((cls, src, dst))
    src, cls, dst = src[o], cls[o], dst[o]
    new_pair = np.ones(src.size, dtype=bool)
    new_pair[1:] = (src[1:] != src[:-1]) | (dst[1:] != dst[:-1])
    pair_starts = np.flatnonzero(new_pair)
    pair_src, pair_dst = src[pair_starts], dst[pair_starts]
    new_dst = np.ones(pair_dst.size, dtype=bool)
    new_dst[1:] = pair_dst[1:] != pair_dst[:-1]
    dst_starts = np.flatnonzero(new_dst)
    dst_states = pair_dst[dst_starts]
    # 4. fewest tokens to acceptance: backward BFS over the pairs
    dist = np.full(n + 1, _UNREACHABLE, dtype=np.int64)
    dist[accepting] = 0
    frontier = accepting.copy()
    level = 0
    while frontier.any():
        level += 1
        hit = np.zeros(n + 1, dtype=bool)
        hit[pair_src[frontier[pair_dst]]] = True
        frontier = hit & (dist == _UNREACHABLE)
        dist[frontier] = level
    src_order = np.lexsort((pair_dst, pair_src))
    ss, sd = pair_src[src_order], pair_dst[src_order]
    src_bounds = np.searchsorted(ss, np.arange(n + 2))
    succ = tuple(sd[src_bounds[i]:src_bounds[i + 1]] for i in range(n + 1))
    _readonly(states, index, accepting, dist, perm, class_starts, class_ends, nxt_table, cls,
              pair_src, pair_dst, pair_starts, dst_states, dst_starts, src_order, src_bounds, *succ)
    return DingoTables(
        states=states, index=index, accepting=accepting, dist=dist, perm=perm,
        class_starts=class_starts, class_ends=class_ends, next=nxt_table, edge_class=cls,
        pair_src=pair_src, pair_dst=pair_dst, pair_starts=pair_starts, dst_states=dst_states,
        dst_starts=dst_starts, src_order=src_order, src_bounds=src_bounds, succ=succ, seconds=time.perf_counter() - t0,
    )


def _multipliers(count: int) -> np.ndarray:
    """Odd 64-bit multipliers, one per state, for hashing tokens' columns of next states."""
    return np.random.default_rng(0x5EED).integers(1, 2**63, size=count, dtype=np.uint64) | np.uint64(1)


def _first_of_each(labels: np.ndarray) -> np.ndarray:
    """For labels ``0..k-1``: the first index holding each."""
    first = np.full(int(labels.max()) + 1 if labels.size else 0, labels.size, dtype=np.int64)
    np.minimum.at(first, labels, np.arange(labels.size, dtype=np.int64))
    return first


# --- arguments ----------------------------------------------------------------------------------


def _as_matrix(log_probs: object, width: int) -> np.ndarray:
    if isinstance(log_probs, torch.Tensor):
        t = log_probs.detach().to("cpu")
        if t.dtype not in (torch.float32, torch.float64):
            t = t.float()
        arr = t.numpy()
    elif isinstance(log_probs, np.ndarray):
        arr = log_probs
        if arr.dtype not in (np.float32, np.float64):
            if not np.issubdtype(arr.dtype, np.floating) and not np.issubdtype(arr.dtype, np.integer):
                raise TypeError(f"log_probs must be a float tensor or array, got dtype {arr.dtype}")
            arr = arr.astype(np.float64)
    else:
        raise TypeError(f"log_probs must be a torch.Tensor or numpy.ndarray, got {type(log_probs).__name__}")
    if arr.ndim != 2:
        raise ValueError(f"log_probs must be 2-D [positions, logits_width], got shape {tuple(arr.shape)}")
    if arr.shape[1] < width:
        raise ValueError(f"log_probs has {arr.shape[1]} columns, fewer than the vocabulary's logits width {width}")
    return arr


def _as_mask(keep_masked: object, d: int) -> np.ndarray:
    if keep_masked is None:
        return np.zeros(d, dtype=bool)
    if isinstance(keep_masked, torch.Tensor):
        keep_masked = keep_masked.detach().to("cpu").numpy()
    mask = np.asarray(keep_masked)
    if mask.dtype != np.bool_:
        raise TypeError(f"keep_masked must be booleans, got dtype {mask.dtype}")
    if mask.shape != (d,):
        raise ValueError(f"keep_masked must have one entry per position ({d}), got shape {mask.shape}")
    return mask


def _check_remaining(remaining: object) -> int:
    if isinstance(remaining, (bool, np.bool_)) or not isinstance(remaining, (int, np.integer)):
        raise TypeError(f"remaining must be an int, got {type(remaining).__name__} {remaining!r}")
    if remaining < 0:
        raise ValueError(f"remaining must be >= 0, got {remaining}")
    return min(int(remaining), 1 << 48)  # past any distance, and far below the unreachable mark


def _setup(dfa, log_probs, start_state, keep_masked, remaining):
    tables = prepare(dfa, start_state)
    start = tables.internal(_check_state(dfa, dfa.start if start_state is None else start_state))
    lp = _as_matrix(log_probs, int(dfa.logits_width))
    masked = _as_mask(keep_masked, lp.shape[0])
    return tables, start, lp, masked, _check_remaining(remaining)


def _class_scores(tables: DingoTables, lp: np.ndarray, rows: np.ndarray, *, lse: bool, scale: float = 1.0,
                  u: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Per ``rows`` position and class: the max (``lse=False``) or log-sum-exp (``lse=True``) of
    ``lp * scale`` over the class's tokens, float64 ``[len(rows), n_classes]``, and a token per
    position and class: the argmax (lowest id on ties), or with ``lse`` one drawn in proportion
    to ``exp(lp * scale)`` by inverse CDF with uniform ``u[row, class]`` (one pass over each row
    serves every class; a class of zero mass gets an arbitrary token of its own). NaN or ``+inf``
    at an allowed token is a ``ValueError``."""
    out = np.empty((rows.size, tables.n_classes), dtype=np.float64)
    picks = np.zeros((rows.size, tables.n_classes), dtype=np.int64)
    if tables.n_classes == 0:
        return out, picks
    starts, ends = tables.class_starts, tables.class_ends
    sizes = ends - starts
    at = 0
    for a, b in _runs(rows, _ROWS_PER_CHUNK):
        g = np.take(lp[a:b], tables.perm, axis=1)  # in lp's dtype (float32 or float64)
        if scale != 1.0:
            g *= g.dtype.type(scale)
        mx = np.maximum.reduceat(g, starts, axis=1)
        if np.isnan(mx).any() or np.isposinf(mx).any():
            raise ValueError("log_probs holds NaN or +inf at an allowed token")
        if lse:
            safe = np.where(np.isfinite(mx), mx, 0).astype(g.dtype, copy=False)
            g -= np.repeat(safe, sizes, axis=1)
            gt = torch.from_numpy(g)  # (torch's exp is several times numpy's on 128K rows)
            torch.exp(gt, out=gt)
            total = np.add.reduceat(g, starts, axis=1).astype(np.float64)
            with np.errstate(divide="ignore"):
                out[at:at + b - a] = safe + np.log(total)
            cum = g.astype(np.float64)
            np.cumsum(cum, axis=1, out=cum)  # float64: a class's mass is >= 1 where its max is finite
            for j in range(b - a):
                c = cum[j]
                base = np.where(starts > 0, c[starts - 1], 0.0)
                target = base + u[at + j] * (c[ends - 1] - base)
                idx = np.minimum(np.searchsorted(c, target, side="right"), ends - 1)
                picks[at + j] = tables.perm[idx]
        else:
            out[at:at + b - a] = mx
            hit = np.flatnonzero((g == np.repeat(mx, sizes, axis=1)).ravel())
            first = hit[np.searchsorted(hit, (np.arange(b - a)[:, None] * g.shape[1] + starts).ravel())]
            picks[at:at + b - a] = tables.perm[(first % g.shape[1]).reshape(b - a, -1)]
        at += b - a
    return out, picks


def _runs(rows: np.ndarray, most: int) -> list[tuple[int, int]]:
    """Ascending ``rows`` as slices ``[a, b)`` of consecutive rows, at most ``most`` long."""
    if rows.size == 0:
        return []
    cut = np.flatnonzero(np.diff(rows) != 1) + 1
    out = []
    for run in np.split(rows, cut):
        for c in range(0, run.size, most):
            out.append((int(run[c]), int(run[min(c + most, run.size) - 1]) + 1))
    return out


def _lse_segments(g: np.ndarray, mx: np.ndarray, starts: np.ndarray, sizes: np.ndarray) -> np.ndarray:
    """Log-sum-exp of ``g`` over column segments (``starts``, ``sizes``) given their maxima ``mx``."""
    safe = np.where(np.isfinite(mx), mx, 0).astype(g.dtype, copy=False)
    shifted = g - np.repeat(safe, sizes, axis=1)
    with np.errstate(under="ignore"):
        np.exp(shifted, out=shifted)
    total = np.add.reduceat(shifted, starts, axis=1)
    with np.errstate(divide="ignore"):
        return safe.astype(np.float64) + np.log(total.astype(np.float64))


def _structurally_valid(tables: DingoTables, start: int, d: int, remaining: int) -> bool:
    """Whether some block of ``d`` tokens (ignoring probabilities) meets the budget."""
    reach = np.zeros(tables.n_states, dtype=bool)
    reach[start] = True
    for i in range(d):
        nxt = np.zeros_like(reach)
        nxt[tables.pair_dst[reach[tables.pair_src]]] = True
        reach = nxt & (tables.dist <= d - i - 1 + remaining)
    return bool((reach & (tables.dist <= remaining)).any())


def _no_block(tables: DingoTables, start: int, d: int, remaining: int) -> NoValidBlock:
    where = f"from state {tables.external(start)} with {d} positions and remaining={remaining}"
    if _structurally_valid(tables, start, d, remaining):
        return NoValidBlock(f"every valid block {where} has probability zero")
    return NoValidBlock(f"no block {where} satisfies the constraint")


# --- MAP ----------------------------------------------------------------------------------------


def dingo_map(dfa: TokenDFA, log_probs, *, start_state: int | None = None, keep_masked=None,
              remaining: int = 0) -> tuple[list[int], float, int]:
    """The most probable valid block under independent per-position distributions (DINGO).

    ``log_probs``: ``[positions, logits_width]`` tensor or array of per-position log-probabilities
    (unnormalised logits give the same block; ``log_prob`` is then the sum of the chosen entries).
    ``start_state``: the DFA state before the block (default ``dfa.start``; ``ENDED`` after EOS).
    ``keep_masked``: booleans per position; a masked position takes any allowed token, adds 0 and
    is ``-1`` in the result. ``remaining``: canvas positions after the block; the block must end
    where acceptance is reachable within that many tokens.

    Returns ``(tokens, log_prob, end_state)``: the argmax block (ties: lowest class, then lowest
    token id, along the lowest-numbered path), ``Σ log_probs[i, tokens[i]]`` over unmasked
    positions (float64), and the state after the block (``ENDED`` once EOS is placed). Raises
    ``NoValidBlock`` when no valid block has positive probability; ``TypeError``/``ValueError``
    for bad arguments. Cost: see the module docstring, ``O(d·(L + E + P))`` per call.
    """
    tables, start, lp, masked, remaining = _setup(dfa, log_probs, start_state, keep_masked, remaining)
    d = lp.shape[0]
    n = tables.n_states
    rows = np.flatnonzero(~masked)
    class_max, best = _class_scores(tables, lp, rows, lse=False)
    # per position and pair (state, next state): the best class's score (0 at masked positions)
    pair_score = np.zeros((d, tables.pair_src.size), dtype=np.float64)
    if rows.size and tables.edge_class.size:
        pair_score[rows] = np.maximum.reduceat(class_max[:, tables.edge_class], tables.pair_starts, axis=1)
    w = np.full((d + 1, n), _NEG_INF, dtype=np.float64)
    w[0, start] = 0.0
    dist = tables.dist
    for i in range(d):
        row = w[i + 1]
        if tables.pair_src.size:
            cand = w[i, tables.pair_src] + pair_score[i]
            row[tables.dst_states] = np.maximum.reduceat(cand, tables.dst_starts)
        row[dist > d - i - 1 + remaining] = _NEG_INF
    final = w[d].copy()
    final[dist > remaining] = _NEG_INF
    state = int(np.argmax(final))
    if not final[state] > _NEG_INF:
        raise _no_block(tables, start, d, remaining)
    end_state = tables.external(state)
    tokens = [-1] * d
    total = 0.0
    row_of = np.full(d, -1, dtype=np.int64)
    row_of[rows] = np.arange(rows.size)
    for i in range(d - 1, -1, -1):
        lo = int(np.searchsorted(tables.dst_states, state))
        a = int(tables.dst_starts[lo])
        b = int(tables.dst_starts[lo + 1]) if lo + 1 < tables.dst_starts.size else tables.pair_src.size
        cand = w[i, tables.pair_src[a:b]] + pair_score[i, a:b]
        p = a + int(np.argmax(cand))
        if not masked[i]:
            classes = _pair_classes(tables, p)
            k = int(classes[int(np.argmax(class_max[row_of[i], classes]))])
            tokens[i] = int(best[row_of[i], k])
            total += float(lp[i, tokens[i]])
        state = int(tables.pair_src[p])
    return tokens, total, end_state


# --- sampling -----------------------------------------------------------------------------------


class _Grow:
    """An append-only int64 array with amortised growth (``data[:size]`` is the content)."""

    __slots__ = ("data", "size")

    def __init__(self, fill: int = 0, cap: int = 64):
        self.data = np.full(cap, fill, dtype=np.int64)
        self.size = 0

    def extend(self, values: np.ndarray) -> int:
        """Append ``values``; returns where they start."""
        at = self.size
        need = at + values.size
        if need > self.data.size:
            grown = np.empty(max(need, 2 * self.data.size), dtype=np.int64)
            grown[:at] = self.data[:at]
            self.data = grown
        self.data[at:need] = values
        self.size = need
        return at


class _Subsets:
    """Sets of internal states met by ``dingo_sample`` (the lazily built subset lattice), shared by
    every call on one ``DingoTables``; append-only (ids stay valid), thread-safe (writers hold a
    lock), and replaced by a fresh one once it holds ``MAX_REGISTERED`` sets (calls in flight keep
    the old one).

    Set ``i < n`` (``n`` = the tables' states) is the single state ``{i}``, whose moves are the
    tables' pairs. A bigger set's moves at unmasked positions are *groups*: the classes that take
    it to one set, set ``s``'s being groups ``move_lo[s] .. move_lo[s] + move_count[s] - 1``, group
    ``g`` going to set ``group_dst[g]`` with classes ``classes[class_lo[g] .. class_lo[g] +
    class_count[g] - 1]``. ``any_of(ids)``: the sets a masked position leads to (-1: none);
    ``min_dist[s]``: the fewest tokens to acceptance from a member.
    """

    MAX_REGISTERED = 1 << 18

    def __init__(self, tables: DingoTables):
        self.t = tables
        n = tables.n_states
        self.members: list[np.ndarray] = [np.array([q], dtype=np.int64) for q in range(n)]
        self.ids: dict[bytes, int] = {self.key(m): q for q, m in enumerate(self.members)}
        self.min_dist = _Grow(0, max(64, 2 * n))
        self.min_dist.extend(tables.dist)
        self.any_set = _Grow(-2, max(64, 2 * n))  # -2: not computed yet
        self.any_set.extend(np.full(n, -2, dtype=np.int64))
        self.move_lo = _Grow(0, max(64, 2 * n))
        self.move_lo.extend(np.zeros(n, dtype=np.int64))
        self.move_count = _Grow(-1, max(64, 2 * n))  # -1: not computed yet (singletons: never)
        self.move_count.extend(np.full(n, -1, dtype=np.int64))
        self.group_dst, self.class_lo, self.class_count, self.classes = _Grow(), _Grow(), _Grow(), _Grow()
        self._succ: np.ndarray | None = None  # [n, n] bool successor matrix, built on first use
        self._lock = threading.RLock()

    def __len__(self) -> int:
        return len(self.members)

    def key(self, members: np.ndarray) -> bytes:
        """The dictionary key of a set: its membership bits, packed."""
        bits = np.zeros(self.t.n_states, dtype=bool)
        bits[members] = True
        return np.packbits(bits).tobytes()

    def id(self, members: np.ndarray, key: bytes | None = None) -> int:
        """The id of the set ``members`` (sorted unique internal states), registered if new."""
        if key is None:
            key = self.key(members)
        s = self.ids.get(key)
        if s is None:
            with self._lock:
                s = self.ids.get(key)
                if s is None:
                    s = len(self.members)
                    self.min_dist.extend(np.array([self.t.dist[members].min()]))
                    self.any_set.extend(np.array([-2]))
                    self.move_lo.extend(np.array([0]))
                    self.move_count.extend(np.array([-1]))
                    self.members.append(members)
                    self.ids[key] = s  # published last
        return s

    def any_of(self, ids: np.ndarray) -> np.ndarray:
        """Per set in ``ids``, the set a masked position leads to (-1: none)."""
        out = self.any_set.data[ids]
        todo = np.flatnonzero(out == -2)
        if todo.size:
            with self._lock:
                if self._succ is None and self.t.n_states <= 4096:
                    succ = np.zeros((self.t.n_states, self.t.n_states), dtype=bool)
                    succ[self.t.pair_src, self.t.pair_dst] = True
                    self._succ = succ
                for j in todo.tolist():
                    s = int(ids[j])
                    if self._succ is not None:
                        nxt = np.flatnonzero(self._succ[self.members[s]].any(axis=0))
                    else:
                        nxt = np.unique(np.concatenate([self.t.succ[q] for q in self.members[s].tolist()]))
                    out[j] = self.id(nxt) if nxt.size else -1
                    self.any_set.data[s] = out[j]
        return out

    def ensure_moves(self, ids: np.ndarray) -> None:
        """Compute the groups of every set in ``ids`` (none of them a single state) not known yet."""
        todo = ids[self.move_count.data[ids] < 0]
        if todo.size:
            with self._lock:
                for s in todo.tolist():
                    if self.move_count.data[s] < 0:
                        self._moves(s)

    def _moves(self, s: int) -> None:
        n = self.t.n_states
        cols = self.t.next[self.members[s]]
        live = np.flatnonzero((cols >= 0).any(axis=0))
        dsts: list[int] = []
        counts = np.zeros(0, dtype=np.int64)
        classes = np.zeros(0, dtype=np.int64)
        if live.size:
            sub = cols[:, live]
            image = np.zeros((live.size, n), dtype=bool)  # per live class: the set it reaches
            qs, ks = np.nonzero(sub >= 0)
            image[ks, sub[qs, ks]] = True
            packed = np.ascontiguousarray(np.packbits(image, axis=1))
            keys = packed.view(np.dtype((np.void, packed.shape[1]))).reshape(-1)
            _, first, inv = np.unique(keys, return_index=True, return_inverse=True)
            inv = inv.reshape(-1)
            for f in first.tolist():
                key = packed[f].tobytes()
                d = self.ids.get(key)
                dsts.append(d if d is not None else self.id(np.flatnonzero(image[f]), key))
            classes = live[np.argsort(inv, kind="stable")]
            counts = np.bincount(inv, minlength=first.size)
        lo = self.classes.extend(classes)
        starts = lo + np.cumsum(counts) - counts
        g = self.group_dst.extend(np.array(dsts, dtype=np.int64))
        self.class_lo.extend(starts)
        self.class_count.extend(counts)
        self.move_lo.data[s] = g
        self.move_count.data[s] = len(dsts)  # published last


def _subsets(tables: DingoTables) -> _Subsets:
    """The shared set registry of ``tables`` (a fresh one past ``_Subsets.MAX_REGISTERED``)."""
    holder = tables._subsets
    with _cache_lock:
        if not holder or len(holder[0]) > _Subsets.MAX_REGISTERED:
            holder[:] = [_Subsets(tables)]
        return holder[0]


def _ranges(lo: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """The concatenated index ranges ``[lo[j], lo[j] + counts[j])``."""
    total = int(counts.sum())
    if total == 0:
        return np.zeros(0, dtype=np.int64)
    offsets = np.cumsum(counts) - counts
    return np.repeat(lo - offsets, counts) + np.arange(total)


def _logsumexp_by(keys: np.ndarray, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Unique ``keys`` and the log-sum-exp of ``values`` per key."""
    uniq, inv = np.unique(keys, return_inverse=True)
    mx = np.full(uniq.size, _NEG_INF)
    np.maximum.at(mx, inv, values)
    safe = np.where(np.isfinite(mx), mx, 0.0)
    tot = np.zeros(uniq.size)
    np.add.at(tot, inv, np.exp(values - safe[inv]))
    with np.errstate(divide="ignore"):
        return uniq, safe + np.log(tot)


def _draw(logw: np.ndarray, u: float) -> int:
    """Index drawn with probability proportional to ``exp(logw)`` (some entry finite)."""
    if logw.size == 1:
        return 0
    w = np.exp(logw - logw.max())
    c = w.cumsum()
    j = int(c.searchsorted(u * c[-1], side="right"))  # lands on a positive weight unless rounding
    return j if j < c.size else int(np.flatnonzero(w)[-1])  # pushed it past the end


@dataclass
class _Step:
    """One position of the forward pass: the live sets before it and the candidate moves — source
    (index into ``before``), destination set, log-weight, and where their classes are: pair
    ``pair`` of the tables, or group ``group`` of the set registry (-1 where not that kind)."""

    before: np.ndarray
    src: np.ndarray
    dst: np.ndarray
    weight: np.ndarray
    pair: np.ndarray | None = None
    group: np.ndarray | None = None


def _pair_classes(tables: DingoTables, p: int) -> np.ndarray:
    end = int(tables.pair_starts[p + 1]) if p + 1 < tables.pair_starts.size else tables.edge_class.size
    return tables.edge_class[int(tables.pair_starts[p]):end]


def dingo_sample(dfa: TokenDFA, log_probs, *, start_state: int | None = None, keep_masked=None,
                 remaining: int = 0, temperature: float = 1.0,
                 generator: torch.Generator | None = None) -> tuple[list[int], float, int]:
    """An exact sample of a valid block from the per-position product distribution (tempered).

    Same arguments and result as ``dingo_map``; the block is drawn with probability proportional
    to ``Π_i exp(log_probs[i, t_i] / temperature)`` over the unmasked positions, among the valid
    blocks (masked positions are ``-1`` and count once per block, however many ways they can be
    filled). ``log_prob`` is the untempered ``Σ log_probs[i, t_i]``. ``temperature=0`` is
    ``dingo_map``. ``generator``: a ``torch.Generator`` (on any device) for the uniforms; the
    result is a fixed function of its state. Raises ``NoValidBlock`` when no valid block has
    positive probability, ``LimitExceeded`` past ``MAX_LIVE_SUBSETS`` sets of states at a position.

    Forward filtering (log-sum-exp over the lattice of sets of states, pruned by the budget) then
    backward sampling: a set, then per position its predecessor, the class and the token. A step
    is vectorised over the live sets' moves: the tables' pairs for single states (the only sets
    without masked positions), the set registry's groups for bigger sets (built on first use, at
    ``O(|set|·classes)`` each, and kept for later calls).
    """
    if isinstance(temperature, bool) or not isinstance(temperature, numbers.Real):
        raise TypeError(f"temperature must be a number, got {type(temperature).__name__} {temperature!r}")
    if not (math.isfinite(temperature) and temperature >= 0):
        raise ValueError(f"temperature must be a finite number >= 0, got {temperature}")
    if temperature == 0:
        return dingo_map(dfa, log_probs, start_state=start_state, keep_masked=keep_masked, remaining=remaining)
    tables, start, lp, masked, remaining = _setup(dfa, log_probs, start_state, keep_masked, remaining)
    d = lp.shape[0]
    n = tables.n_states
    scale = 1.0 / float(temperature)
    rows = np.flatnonzero(~masked)
    u = uniforms(2 * d + 1 + rows.size * tables.n_classes, generator)
    class_lse, drawn = _class_scores(tables, lp, rows, lse=True, scale=scale,
                                     u=u[2 * d + 1:].reshape(rows.size, tables.n_classes))
    pair_lse = np.zeros((rows.size, tables.pair_src.size))
    if rows.size and tables.edge_class.size:
        vals = class_lse[:, tables.edge_class]
        sizes = np.diff(np.append(tables.pair_starts, tables.edge_class.size))
        pair_lse = _lse_segments(vals, np.maximum.reduceat(vals, tables.pair_starts, axis=1),
                                 tables.pair_starts, sizes)
    row_of = np.full(d, -1, dtype=np.int64)
    row_of[rows] = np.arange(rows.size)
    sets = _subsets(tables)
    ids = np.array([start], dtype=np.int64)  # set id of {start}
    alpha = np.zeros(1)
    steps: list[_Step] = []
    for i in range(d):
        budget = d - i - 1 + remaining
        if masked[i]:
            step = _Step(ids, np.arange(ids.size), sets.any_of(ids), alpha.copy())
        else:
            r = row_of[i]
            single = np.flatnonzero(ids < n)
            lo = tables.src_bounds[ids[single]]
            cnt = tables.src_bounds[ids[single] + 1] - lo
            pairs = tables.src_order[_ranges(lo, cnt)]
            src = [np.repeat(single, cnt)]
            dst = [tables.pair_dst[pairs]]
            weight = [pair_lse[r, pairs]]
            pair = [pairs]
            group = [np.full(pairs.size, -1, dtype=np.int64)]
            multi = np.flatnonzero(ids >= n)
            if multi.size:  # bigger sets: their groups, scored by log-sum-exp over the classes
                sets.ensure_moves(ids[multi])
                cnt = sets.move_count.data[ids[multi]]
                groups = _ranges(sets.move_lo.data[ids[multi]], cnt)
                src.append(np.repeat(multi, cnt))
                dst.append(sets.group_dst.data[groups])
                pair.append(np.full(groups.size, -1, dtype=np.int64))
                group.append(groups)
                if groups.size:
                    n_cls = sets.class_count.data[groups]
                    vals = class_lse[r, sets.classes.data[_ranges(sets.class_lo.data[groups], n_cls)]][None, :]
                    g_start = np.cumsum(n_cls) - n_cls
                    weight.append(_lse_segments(vals, np.maximum.reduceat(vals, g_start, axis=1),
                                                g_start, n_cls)[0])
            src_all = np.concatenate(src)
            step = _Step(ids, src_all, np.concatenate(dst), alpha[src_all] + np.concatenate(weight),
                         np.concatenate(pair), np.concatenate(group))
        keep = step.dst >= 0
        keep[keep] = sets.min_dist.data[step.dst[keep]] <= budget
        keep &= step.weight > _NEG_INF
        idx = np.flatnonzero(keep)
        step.src, step.dst, step.weight = step.src[idx], step.dst[idx], step.weight[idx]
        if step.pair is not None:
            step.pair, step.group = step.pair[idx], step.group[idx]
        steps.append(step)
        ids, alpha = _logsumexp_by(step.dst, step.weight)
        if ids.size > MAX_LIVE_SUBSETS:
            raise LimitExceeded("dingo_live_subsets", MAX_LIVE_SUBSETS,
                                f"more than {MAX_LIVE_SUBSETS} sets of DFA states alive at position {i}")
        if ids.size == 0:
            break
    if ids.size:
        ok = sets.min_dist.data[ids] <= remaining
        ids, alpha = ids[ok], alpha[ok]
    if ids.size == 0 or not np.isfinite(alpha).any():
        raise _no_block(tables, start, d, remaining)
    cur = int(ids[_draw(alpha, u[0])])
    members = sets.members[cur]
    end = members[np.lexsort((members, tables.dist[members]))][0]  # one end state meeting the budget
    end_state = tables.external(int(end))
    tokens = [-1] * d
    total = 0.0
    for i in range(d - 1, -1, -1):
        step = steps[i]
        cands = np.flatnonzero(step.dst == cur)
        c = int(cands[_draw(step.weight[cands], u[1 + 2 * i])])
        if not masked[i]:
            if step.pair[c] >= 0:
                classes = _pair_classes(tables, int(step.pair[c]))
            else:
                g = int(step.group[c])
                lo = int(sets.class_lo.data[g])
                classes = sets.classes.data[lo:lo + int(sets.class_count.data[g])]
            k = int(classes[_draw(class_lse[row_of[i], classes], u[2 + 2 * i])])
            t = int(drawn[row_of[i], k])
            tokens[i] = t
            total += float(lp[i, t])
        cur = int(step.before[step.src[c]])  # the set before position i
    return tokens, total, end_state
