"""ASAp — adaptive sampling with approximate expected futures (Park et al., NeurIPS 2024, arXiv 2405.21047).

Grammar-constrained decoding (GCD) samples ``P(t | w)·m_w(t)`` renormalised per step, where
``m_w(t) = 1[w·t can still be completed in L]``. The grammar-conditioned model instead needs

    Q(t | w) = P(t | w)·c(w·t) / c(w),     c(u) = Σ_s P(s | u)·1[u·s ∈ L]

(``c`` = expected future grammaticality, EFG). ASAp keeps a trie of every prefix it has sampled
for one (prompt, grammar) key, with an estimate ``ĉ(u) ≥ c(u)`` per node:

* an unexplored prefix has ``ĉ = 1`` (optimistic; then ASAp behaves as GCD);
* a node ``v`` where a mask was computed has
  ``ĉ(v) = Σ_{allowed t} P(t | v)·ĉ(v·t)`` — masked-out tokens count 0, unexplored allowed children
  count their probability times 1, explored children their own estimate;
* an EOS child is a leaf with ``ĉ = 1`` (EOS is allowed only in an accepting state).

Sampling at ``v`` uses ``P(t | v)·ĉ(v·t)`` over the allowed tokens, renormalised (log-space:
``log p + log ĉ``). After each sample the estimates along the sampled path are recomputed bottom-up
(``backpropagate``). Estimates only decrease, stay ``≥ c`` (each is a sum of over-approximations),
and on every prefix with positive probability converge to ``c``, so the sampler converges to
``Q(y) ∝ P(y)·1[y ∈ L]``.

Storage (the paper's reference code loops over all allowed tokens in Python; this does not):
per node only the allowed mass ``A(v) = Σ_{allowed} P(t|v)`` and the *deficit*
``D(v) = Σ_{explored children u} P(u|v)·(1 − ĉ(u))``, so ``ĉ(v) = A(v) − D(v)``; per explored child
its probability and estimate. Scoring a step is one pass over the logits plus a scatter over the
explored children; the update after a sample is O(depth). ``P`` is the model after
``process_logits`` on the *unmasked* logits.

The algorithm is the pure functions ``asap_weights`` / ``expected_future`` / ``backpropagate``
over ``AsapTrie``; ``ASAp`` is the ``TokenSampler`` wiring, one trie per ``start(key)`` key, kept
across calls so repeated sampling for one key converges. Its state is picklable and has
``state_dict()`` / ``load_state_dict()``.

Budget-aware closing. Near the end of a token budget the decoding loop narrows the matcher
(``samplers.narrowing.NarrowedMatcher``): only tokens after which the text can still be finished
in time are admitted. For ASAp that is a constraint like the grammar — ``L_B``, the texts that
the narrowing lets through — and every token of the sequence is still drawn here, so the trie
stays a record of the run. The narrowed mask costs a check per allowed token, so ASAp keeps the
grammar's mask as its (over-approximating) mask and learns the narrowing lazily: a drawn token
the narrowing refuses is a child with no future, recorded with ``ĉ = 0`` (``kill``: its mass
``P(t|v)`` joins the parent's deficit), and the draw is repeated without it; after ``lazy_checks``
refusals the exact narrowed mask is computed and every refused allowed token is recorded at
once. Each draw is therefore ``∝ P(t|v)·ĉ(v·t)`` over the admitted tokens — ASAp's rule with
``ĉ = 0`` for the refused ones — and every estimate stays ``≥ c_B`` (1 for what is unexplored,
0 only for what is refused), so ASAp converges to ``P(y)·1[y ∈ L_B]``. The narrowing depends on
the budget, so state learnt under one budget must not be used under another: the engine keys
runs by (prompt, grammar, budget).
"""

from __future__ import annotations

import math
from array import array
from collections import OrderedDict
from dataclasses import asdict
from typing import Hashable, Sequence

import numpy as np
import torch

from samplers._numeric import allowed_mask, as_float64, cumsum, inverse_cdf, scores
from samplers.base import Draw, NoAllowedToken, SamplingParams
from samplers.masked import masked_draw
from samplers.narrowing import NarrowedMatcher

__all__ = ["ASAp", "AsapTrie", "asap_weights", "expected_future", "backpropagate"]

_STATE_VERSION = 1


class AsapTrie:
    """The trie of sampled prefixes for one key, as flat columns indexed by node id (root = 0).

    Columns: ``parent``, ``token`` (edge from the parent), ``prob`` (``P(token | parent prefix)``),
    ``mass`` (allowed mass ``A``; NaN until the node's mask was seen), ``deficit`` (``D``) and
    ``chat`` (``ĉ`` as last propagated). Children are found through per-node dicts.
    """

    __slots__ = ("parent", "token", "prob", "mass", "deficit", "chat", "_children")

    def __init__(self) -> None:
        self.parent = array("q", [-1])
        self.token = array("q", [-1])
        self.prob = array("d", [1.0])
        self.mass = array("d", [math.nan])
        self.deficit = array("d", [0.0])
        self.chat = array("d", [1.0])
        self._children: dict[int, dict[int, int]] = {}

    def __len__(self) -> int:
        return len(self.parent)

    def is_expanded(self, node: int) -> bool:
        return not math.isnan(self.mass[node])

    def children(self, node: int) -> dict[int, int]:
        """``{token: child node}`` of ``node`` (do not mutate)."""
        return self._children.get(node, {})

    def child(self, node: int, token: int, prob: float) -> int:
        """The child of ``node`` along ``token``, created (with ``ĉ = 1``) if new."""
        kids = self._children.get(node)
        if kids is None:
            kids = self._children[node] = {}
        hit = kids.get(token)
        if hit is not None:
            return hit
        new = len(self.parent)
        self.parent.append(node)
        self.token.append(token)
        self.prob.append(prob)
        self.mass.append(math.nan)
        self.deficit.append(0.0)
        self.chat.append(1.0)
        kids[token] = new
        return new

    def kill(self, node: int, token: int, prob: float) -> None:
        """Record that ``token`` has no future after ``node`` (``ĉ = 0``): a refused draw.

        The child is created if new and marked expanded with zero mass, so ``backpropagate`` keeps
        it at 0; its drop in estimate, ``P(token)·ĉ_old``, joins ``node``'s deficit at once.
        """
        child = self.child(node, token, prob)
        old = self.chat[child]
        if old > 0.0:
            self.deficit[node] += self.prob[child] * old
        self.chat[child] = 0.0
        self.mass[child] = 0.0

    def lookup(self, tokens: Sequence[int]) -> int | None:
        """The node of a token prefix, or None if it was never sampled."""
        node = 0
        for t in tokens:
            node = self._children.get(node, {}).get(int(t))
            if node is None:
                return None
        return node

    def child_estimates(self, node: int) -> tuple[list[int], list[float]]:
        """Tokens of ``node``'s explored children whose estimate is below 1, and those estimates."""
        kids = self._children.get(node)
        if not kids:
            return [], []
        chat = self.chat
        pairs = [(t, chat[c]) for t, c in kids.items() if chat[c] < 1.0]
        return [t for t, _ in pairs], [c for _, c in pairs]

    def estimate(self, tokens: Sequence[int]) -> float:
        """``ĉ`` of a prefix (1 for prefixes never sampled)."""
        node = self.lookup(tokens)
        return 1.0 if node is None else self.chat[node]

    # --- persistence -------------------------------------------------------------------------

    def state_dict(self) -> dict[str, np.ndarray]:
        """The columns as numpy arrays (children are rebuilt from ``parent``/``token``)."""
        return {
            "parent": np.frombuffer(self.parent, dtype=np.int64).copy(),
            "token": np.frombuffer(self.token, dtype=np.int64).copy(),
            "prob": np.frombuffer(self.prob, dtype=np.float64).copy(),
            "mass": np.frombuffer(self.mass, dtype=np.float64).copy(),
            "deficit": np.frombuffer(self.deficit, dtype=np.float64).copy(),
            "chat": np.frombuffer(self.chat, dtype=np.float64).copy(),
        }

    @classmethod
    def from_state_dict(cls, state: dict) -> "AsapTrie":
        trie = cls()
        columns = {name: np.asarray(state[name]) for name in ("parent", "token", "prob", "mass", "deficit", "chat")}
        n = {len(v) for v in columns.values()}
        if len(n) != 1 or n == {0} or columns["parent"][0] != -1:
            raise ValueError("malformed ASAp trie state: columns differ in length or the root is missing")
        trie.parent = array("q", columns["parent"].astype(np.int64).tolist())
        trie.token = array("q", columns["token"].astype(np.int64).tolist())
        trie.prob = array("d", columns["prob"].astype(np.float64).tolist())
        trie.mass = array("d", columns["mass"].astype(np.float64).tolist())
        trie.deficit = array("d", columns["deficit"].astype(np.float64).tolist())
        trie.chat = array("d", columns["chat"].astype(np.float64).tolist())
        for node in range(1, len(trie.parent)):
            trie._children.setdefault(trie.parent[node], {})[trie.token[node]] = node
        return trie

    def __getstate__(self):
        return self.state_dict()

    def __setstate__(self, state):
        other = AsapTrie.from_state_dict(state)
        for name in self.__slots__:
            setattr(self, name, getattr(other, name))


# --- the algorithm -----------------------------------------------------------------------------


def asap_weights(
    probs: np.ndarray, allowed: np.ndarray, child_tokens: Sequence[int], child_chat: Sequence[float]
) -> np.ndarray:
    """Unnormalised ASAp step weights ``p(t)·ĉ(v·t)`` (float64), zero where not allowed.

    ``probs``: (unnormalised) model probabilities over the logits width, unmasked; ``allowed``:
    bool mask; ``child_tokens``/``child_chat``: explored children with their estimates (the others
    count 1). Before the children correction the sum is the allowed mass ``A`` (in ``probs`` units).
    Sampling ``∝`` these weights is sampling ``∝ exp(log p + log ĉ)``.
    """
    weights = np.asarray(probs, dtype=np.float64) * np.asarray(allowed, dtype=bool)
    if len(child_tokens):
        weights[np.asarray(child_tokens, dtype=np.int64)] *= np.asarray(child_chat, dtype=np.float64)
    return weights


def expected_future(mass: float, deficit: float, previous: float = 1.0) -> float:
    """``ĉ = A − D`` clamped to ``[0, previous]`` (estimates never increase; float drift is clipped)."""
    return min(max(mass - deficit, 0.0), previous)


def backpropagate(trie: AsapTrie, path: Sequence[int]) -> None:
    """Recompute ``ĉ`` bottom-up along ``path`` (node ids root→leaf of one sample).

    Each node's estimate is ``A − D`` if its mask was seen (else it stays 1); a change
    ``ĉ_old → ĉ_new`` of a child ``u`` adds ``P(u)·(ĉ_old − ĉ_new)`` to its parent's deficit.
    Only nodes on the path can have changed since the last update, so this is O(depth).
    """
    chat, deficit, mass, prob, parent = trie.chat, trie.deficit, trie.mass, trie.prob, trie.parent
    for node in reversed(path):
        if math.isnan(mass[node]):
            continue  # never expanded: still 1 (e.g. the EOS leaf)
        new = expected_future(mass[node], deficit[node], chat[node])
        up = parent[node]
        if up >= 0 and new != chat[node]:
            deficit[up] += prob[node] * (chat[node] - new)
        chat[node] = new


# --- the TokenSampler adapter ----------------------------------------------------------------


def _unnormalised_probs(scores: torch.Tensor) -> tuple[np.ndarray, float]:
    """``exp(scores - max)`` as float64 numpy, and its sum (so ``p = probs / total``)."""
    probs = as_float64(scores)
    top = float(probs.max()) if probs.shape[0] else float("-inf")
    if math.isnan(top):
        raise ValueError("logits contain NaN")
    if top == float("-inf"):
        return np.zeros_like(probs), 0.0
    np.subtract(probs, top, out=probs)
    np.exp(probs, out=probs)
    return probs, float(probs.sum())


class _AsapRun:
    """One sequence: descends the key's trie along the drawn tokens; updates it at ``finish``."""

    #: what the decoding loop checks before it fast-forwards past a sampler (see ``ASAp``)
    draws_every_token = True

    def __init__(self, sampler: "ASAp", trie: AsapTrie):
        self.sampler = sampler
        self.trie = trie
        self.path = [0]
        self._base: int | None = None
        self._done = False

    def draw(self, logits: torch.Tensor, matcher, generator: torch.Generator | None) -> Draw:
        """A token ``∝ P(t)·ĉ(v·t)`` over the allowed (for a ``NarrowedMatcher``: admitted) tokens."""
        if self._done:
            raise RuntimeError("this ASAp run is finished; call sampler.start(key) for a new sequence")
        if matcher.is_terminated():
            raise NoAllowedToken("the grammar allows no token in this state (EOS was consumed)")
        self._check_in_step(matcher)
        trie, node = self.trie, self.path[-1]
        width = logits.shape[-1]
        probs, total_probs = _unnormalised_probs(scores(logits, self.sampler.params))
        narrowed = matcher if isinstance(matcher, NarrowedMatcher) else None
        allowed = allowed_mask(matcher if narrowed is None else narrowed.base, width)
        tokens, chats = trie.child_estimates(node)
        weights = asap_weights(probs, allowed, tokens, chats)
        if not trie.is_expanded(node):
            # A = Σ_allowed p: the corrected total plus what the corrections removed
            removed = sum(float(probs[t]) * (1.0 - c) for t, c in zip(tokens, chats))
            total = float(weights.sum())
            trie.mass[node] = (total + removed) / total_probs if total_probs > 0 else 0.0
        prob_of = (lambda t: float(probs[t]) / total_probs) if total_probs > 0 else (lambda t: 0.0)
        token = None
        if narrowed is not None:
            token = self._admitted(narrowed, node, weights, prob_of, generator)
        elif weights.sum() > 0.0:
            token = inverse_cdf(cumsum(weights), weights, generator)
        if token is None:
            # No allowed token has positive probability under the processed model (top-k/top-p,
            # temperature 0): fall back to masked sampling; the estimate of this node is 0.
            token = masked_draw(logits, matcher, self.sampler.params, generator)
        self.path.append(trie.child(node, token, prob_of(token)))
        return Draw(token=token)

    def _check_in_step(self, matcher) -> None:
        """The trie path must follow the matcher: every consumed token drawn here, no other."""
        consumed = getattr(matcher, "num_consumed", None)
        if consumed is None:
            return
        if self._base is None:
            self._base = consumed - (len(self.path) - 1)
        elif consumed - self._base != len(self.path) - 1:
            raise RuntimeError(
                "ASAp must draw every token of the sequence: the matcher consumed "
                f"{consumed - self._base} tokens since start but this run drew {len(self.path) - 1} "
                "(no jump-forward or forced tokens with ASAp)"
            )

    def _admitted(self, matcher: NarrowedMatcher, node: int, weights: np.ndarray, prob_of,
                  generator: torch.Generator | None) -> int | None:
        """Draw ``∝ weights`` among the tokens ``matcher`` admits, recording refused ones as dead.

        Lazily first (ask about the drawn token only), then, after ``matcher.lazy_checks``
        refusals, with the exact narrowed mask. ``None`` when no admitted token has weight.
        """
        for _ in range(matcher.lazy_checks):
            cdf = cumsum(weights)
            if not float(cdf[-1]) > 0.0:
                return None
            token = inverse_cdf(cdf, weights, generator)
            if matcher.admits(token):
                return token
            self.trie.kill(node, token, prob_of(token))
            weights[token] = 0.0
        admitted = allowed_mask(matcher, weights.shape[0])
        for token in np.flatnonzero((weights > 0.0) & ~admitted).tolist():
            self.trie.kill(node, token, prob_of(token))
        weights[~admitted] = 0.0
        if not float(weights.sum()) > 0.0:
            return None
        return inverse_cdf(cumsum(weights), weights, generator)

    def finish(self, tokens: list[int], completed: bool) -> None:
        """Propagate the new estimates up the sampled path (sound whether or not it completed)."""
        if self._done:
            return
        self._done = True
        backpropagate(self.trie, self.path)


class ASAp:
    """Grammar-aligned sampling (ASAp) as a ``TokenSampler``; see the module docstring.

    ``start(key)`` returns a run over the trie of ``key`` (created on first use); the decoding
    loop must draw *every* token through the run (no jump-forward) and call ``finish`` — the
    estimates are updated there. ``max_keys`` bounds the number of tries kept (least recently
    used dropped first; ``None``: unbounded). Not thread-safe.

    Persistence: ``state_dict()`` / ``load_state_dict(state)`` (plain dicts of numpy arrays, keys
    as given), or ``pickle`` the sampler.
    """

    #: The decoding loop must hand every token of a sequence to ``draw`` (no jump-forward): the
    #: trie records the path drawn. ``engine`` refuses ``fast_forward=True`` with ASAp up front.
    draws_every_token = True

    def __init__(self, params: SamplingParams = SamplingParams(), *, max_keys: int | None = None):
        if max_keys is not None and max_keys < 1:
            raise ValueError(f"max_keys must be >= 1 or None, got {max_keys}")
        self.params = params
        self.max_keys = max_keys
        self._tries: OrderedDict[Hashable, AsapTrie] = OrderedDict()

    def start(self, key: Hashable = None) -> _AsapRun:
        """A run for one sequence of ``key`` (prompt token ids + grammar identity)."""
        trie = self._tries.get(key)
        if trie is None:
            trie = self._tries[key] = AsapTrie()
            if self.max_keys is not None and len(self._tries) > self.max_keys:
                self._tries.popitem(last=False)
        else:
            self._tries.move_to_end(key)
        return _AsapRun(self, trie)

    def trie(self, key: Hashable) -> AsapTrie | None:
        """The trie of ``key``, or None if ``key`` was never started."""
        return self._tries.get(key)

    def keys(self) -> list[Hashable]:
        return list(self._tries)

    def state_dict(self) -> dict:
        """Everything learnt, as ``{"version", "params", "max_keys", "tries": [(key, trie_state)]}``."""
        return {
            "version": _STATE_VERSION,
            "params": asdict(self.params),
            "max_keys": self.max_keys,
            "tries": [(key, trie.state_dict()) for key, trie in self._tries.items()],
        }

    def load_state_dict(self, state: dict) -> None:
        """Replace the tries (and params) by those of ``state`` (from ``state_dict``)."""
        if state.get("version") != _STATE_VERSION:
            raise ValueError(f"unsupported ASAp state version {state.get('version')!r} (expected {_STATE_VERSION})")
        self.params = SamplingParams(**state["params"])
        self.max_keys = state.get("max_keys")
        self._tries = OrderedDict((key, AsapTrie.from_state_dict(trie)) for key, trie in state["tries"])

    def __repr__(self) -> str:
        nodes = sum(len(t) for t in self._tries.values())
        return f"ASAp(keys={len(self._tries)}, nodes={nodes}, params={self.params})"
