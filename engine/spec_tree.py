"""Token trees for constrained speculative decoding: several continuations verified in one target pass.

A chain draft is lost at its first rejected token; a tree keeps alternatives where the draft is
unsure, so one target call can accept along whichever branch the target prefers (SpecInfer,
Miao et al. 2024). The decoder loop is ``engine.speculative.speculative_decode``; a source that
has ``propose_tree`` (``DraftTree`` here, ``engine.jacobi.JacobiDraft``) takes this path. The
primitives chains and trees share — ``Draft`` and the masked distributions drafts are drawn and
verified with — live here too, so that ``engine.speculative`` builds on this module.

**A tree** (``TokenTree``) lists nodes parents first; node ``j`` holds a token, its parent (``-1``:
the context) and ``q``, the law it was drawn from given its path and its earlier siblings
(``None``: a deterministic proposal, a point mass). Children are tried in node order.

**Drafting.** The grammar's forced run is drafted first as a chain (free); the source's tree
hangs below it. ``DraftTree(lm, width=, branch_below=, max_nodes=)`` grows the tree one level
per draft-model call (``tree_logits`` over the tree so far, which ``HFCausalLM`` answers by
feeding only the new level; other models score the frontier's paths): every frontier node
gets one child, then the nodes whose masked draft distribution has its top probability below
``branch_below`` get up to ``width − 1`` more, most probable paths first, until ``max_nodes``.
Greedy drafts take the top tokens of the masked draft logits; sampled drafts draw the children
*without replacement* from the masked draft distribution ``q`` (child ``i`` from ``q`` with the
earlier siblings removed and renormalised, which is the ``q`` it carries). Every node is then
checked on a forked matcher (``draft_tree``): an invalid deterministic node is dropped with its
subtree; an invalid sampled node is kept as a *ghost* (``pruned``): it takes no row of the
target pass, but the acceptance rule still counts its draw (it is rejected with certainty:
``p`` is 0 on it). Nodes below an EOS are dropped.

**Verification** (``verify_tree``): the target's logits after the context and after every live
node come from one ``engine.lm.tree_logits`` call (``HFCausalLM``: one forward pass with a tree
attention mask; other models: ``next_logits`` over the paths). The walk starts at the root; at
a node with target distribution ``p`` (the mask of the state along the accepted path, then
``process_logits``), children ``x_1, x_2, …`` are tried in order: ``x_i`` is accepted with
probability ``min(1, p(x_i)/q_i(x_i))``; after a rejection ``p ← normalize(max(0, p − q_i))``
(a point mass ``q_i`` removes ``x_i`` from ``p``). The walk descends into the accepted child;
when every child is rejected the token is drawn from the current ``p``; at a leaf a bonus token
is drawn from ``p``. Greedy: the walk follows the child equal to the target's constrained argmax
and emits the argmax where none is. A lone forced child is accepted without reading logits.

Why it is exact (multi-draft recursive rejection, as in SpecInfer's multi-step speculative
sampling): suppose that, given everything before it, ``x_i ~ q_i`` — the law the node carries.
Then the token emitted at a node is distributed as ``p``: by induction over the children, with
``R_i`` the procedure from child ``i`` on, ``P(R_i = y) = min(p(y), q_i(y)) + P(reject)·p'(y)``,
where ``P(reject) = 1 − Σ min(p, q_i) = Σ max(0, p − q_i)`` is exactly the normaliser of
``p' = normalize(max(0, p − q_i))`` and ``R_{i+1}`` emits ``p'`` by the induction hypothesis, so
``P(R_i = y) = min(p, q_i)(y) + max(0, p − q_i)(y) = p(y)``; with no child left the draw is
``p`` itself. The hypothesis holds for the three kinds of children here: deterministic ones
(``q_i`` a point mass), draws without replacement (``q_i`` = ``q`` minus the earlier draws), and
ghosts (their draw happened and is rejected with certainty, exactly what the rule does with
``p(x) = 0``). It needs the *number* of children and the law of each draw to be fixed before the
draw from information other than that draw and what is drawn after it: ``DraftTree`` decides
each level's child counts from the previous levels before drawing the level, with fresh
randomness. Descending into an accepted child, its own children were drawn given its path only,
so the argument repeats one level down: the emitted sequence is token-by-token masked sampling
from the target, as for chains. A chain is the tree with one child per node, and the rule is
then the usual one.

Cost: the decoder's check is a matcher fork and one ``try_advance`` per node (the check and the
move in one transition lookup; the last child of a node advances its parent's state in place, so
a chain needs no fork);
``draft_s`` counts the source, ``tree_check_s`` on ``SpeculativeOutput`` the check.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from engine.lm import LanguageModel, tree_logits
from grammars import allocate_token_bitmask
from samplers import (
    NoAllowedToken,
    SamplingParams,
    apply_token_bitmask_inplace,
    sample_categorical,
)
from samplers._numeric import uniforms
from samplers.base import process_logits

__all__ = ["DraftTree", "DraftedTree", "TokenTree", "TreeNode", "Verification", "draft_tree", "verify_tree"]


#: the longest forced run drafted in one round (beyond ``k``)
_MAX_FORCED = 64


# --- drafts and the distributions they are verified with (shared with engine.speculative) -------


@dataclass(frozen=True)
class Draft:
    """One drafted token and the distribution it was drawn from (``q``: probabilities over the
    logits width; ``None``: a deterministic proposal, a point mass on ``token``). ``forced``: the
    grammar's only allowed token (accepted without verification)."""

    token: int
    q: torch.Tensor | None = None
    forced: bool = False


def _fit(logits: torch.Tensor, width: int) -> torch.Tensor:
    """A 1-D float row of exactly ``width`` columns (a draft model's output layer may differ in
    padding: extra columns are padding, missing ones are never allowed)."""
    row = logits.detach().float().reshape(-1)
    if row.shape[0] == width:
        return row.clone()
    if row.shape[0] > width:
        return row[:width].clone()
    pad = torch.full((width - row.shape[0],), float("-inf"), dtype=row.dtype, device=row.device)
    return torch.cat([row, pad])


def _masked_logits(logits: torch.Tensor, matcher, width: int) -> torch.Tensor:
    words = allocate_token_bitmask(1, width)
    matcher.fill_mask(words, 0)
    masked = _fit(logits, width)
    apply_token_bitmask_inplace(masked, words[0])
    return masked


def _distribution(masked: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """float64 probabilities from masked logits (``NoAllowedToken`` when everything is ``-inf``)."""
    if torch.isneginf(masked).all():
        raise NoAllowedToken("every token is masked out in this state")
    return torch.softmax(process_logits(masked, params).double(), dim=-1).cpu()


def _greedy(masked: torch.Tensor) -> int:
    best = int(torch.argmax(masked))
    if masked[best] == float("-inf"):
        raise NoAllowedToken("every token is masked out in this state")
    return best


# --- token trees ---------------------------------------------------------------------------------


@dataclass(slots=True)
class TreeNode:
    """One drafted token: ``parent`` (``-1``: the context), ``q`` (the law of its draw given its
    path and earlier siblings; ``None``: deterministic), ``forced`` (the grammar's only allowed
    token), ``pruned`` (invalid, kept as a ghost draw: never verified, always rejected)."""

    token: int
    parent: int = -1
    q: torch.Tensor | None = None
    forced: bool = False
    pruned: bool = False


@dataclass
class TokenTree:
    """Drafted nodes, parents before children; siblings in the order they are tried."""

    nodes: list[TreeNode] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.nodes)

    def add(self, token: int, parent: int = -1, q: torch.Tensor | None = None, *, forced: bool = False,
            pruned: bool = False) -> int:
        """Append a node; its index."""
        n = len(self.nodes)
        if not -1 <= parent < n:
            raise ValueError(f"parent {parent} is not an earlier node of this tree ({n} nodes)")
        self.nodes.append(TreeNode(int(token), int(parent), q, forced, pruned))
        return n

    def children(self) -> dict[int, list[int]]:
        """Every node's children (``-1``: the context's), in order."""
        out: dict[int, list[int]] = {-1: []}
        for j, node in enumerate(self.nodes):
            out.setdefault(j, [])
            out[node.parent].append(j)
        return out

    def path(self, node: int) -> list[int]:
        """The tokens from the context down to ``node`` (``[]`` for ``-1``)."""
        tokens = []
        while node >= 0:
            tokens.append(self.nodes[node].token)
            node = self.nodes[node].parent
        return tokens[::-1]

    def depth(self, node: int) -> int:
        """Tokens on the path to ``node`` (0 for the context)."""
        d = 0
        while node >= 0:
            d, node = d + 1, self.nodes[node].parent
        return d

    def main_path(self) -> list[int]:
        """The first-child chain from the context: the nodes a chain draft would hold."""
        children, node, out = self.children(), -1, []
        while children[node]:
            node = children[node][0]
            out.append(node)
        return out

    @classmethod
    def chain(cls, drafts: list[Draft]) -> TokenTree:
        """A chain draft as a tree (one child per node)."""
        tree = cls()
        for i, d in enumerate(drafts):
            tree.add(d.token, i - 1, d.q, forced=d.forced)
        return tree


@dataclass(frozen=True)
class Verification:
    """What one target call saw, for sources that learn from it (``observe_verification``):
    ``context`` before the round, the verified ``tree`` (forced run first; ghosts included),
    the target's raw ``logits`` after each scored node (``-1``: after the context), the
    ``accepted`` nodes from the root down and the ``committed`` tokens (accepted, then the
    corrected or bonus token)."""

    context: list[int]
    tree: TokenTree
    logits: dict[int, torch.Tensor]
    accepted: list[int]
    committed: list[int]


# --- a draft model's tree -----------------------------------------------------------------------


@dataclass
class DraftTree:
    """A draft model proposing a token tree: one child per node, up to ``width`` where the masked
    draft distribution's top probability is below ``branch_below``, at most ``max_nodes`` nodes
    and ``k`` levels (see the module docstring). ``calls`` counts the draft model's calls."""

    lm: LanguageModel
    width: int = 2
    branch_below: float = 0.6
    max_nodes: int = 16
    calls: int = 0

    def __post_init__(self) -> None:
        for name in ("width", "max_nodes"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        h = self.branch_below
        if isinstance(h, bool) or not isinstance(h, (int, float)) or not 0.0 <= h <= 1.0:
            raise ValueError(f"branch_below must be a probability in [0, 1], got {h!r}")

    def propose(self, context, matcher, k, params, generator, vocab) -> list[Draft]:
        """The chain protocol: the tree's first-child path (the first child is drawn from the full
        masked ``q``, so each is an ordinary draft)."""
        tree = self.propose_tree(context, matcher, k, params, generator, vocab)
        return [Draft(tree.nodes[j].token, tree.nodes[j].q, tree.nodes[j].forced) for j in tree.main_path()]

    def propose_tree(self, context, matcher, k, params, generator, vocab) -> TokenTree:
        width, greedy = vocab.logits_width, params.temperature == 0
        tree = TokenTree()
        frontier = [(-1, matcher, 1.0)]  # node, its state (owned), the draft's probability of its path
        for _ in range(k):
            room = self.max_nodes - len(tree)
            if not frontier or room <= 0:
                break
            frontier.sort(key=lambda f: -f[2])
            nxt, expand = [], []
            for node, state, prob in frontier[:room]:
                if state.is_terminated():
                    continue
                forced = state.forced_tokens(1)
                if forced:  # the only allowed token: a free child
                    state.advance(forced[0])
                    nxt.append((tree.add(forced[0], node, forced=True), state, prob))
                else:
                    expand.append((node, state, prob))
            room = self.max_nodes - len(tree)
            expand = expand[:room]
            if expand:
                rows = self._frontier_logits(context, tree, [node for node, _, _ in expand])
                self.calls += 1
                laws = []
                for (node, state, _), row in zip(expand, rows):
                    masked = _masked_logits(row, state, width)
                    try:
                        laws.append((masked, _distribution(masked, params if not greedy else SamplingParams())))
                    except NoAllowedToken:
                        laws.append(None)
                counts = [1 if law is not None else 0 for law in laws]
                room -= sum(counts)
                for i, law in enumerate(laws):  # then the branches, most probable paths first
                    if room <= 0:
                        break
                    if law is not None and float(law[1].max()) < self.branch_below:
                        extra = min(self.width - 1, room)
                        counts[i] += extra
                        room -= extra
                for (node, state, prob), law, count in zip(expand, laws, counts):
                    if count:
                        nxt += self._children(tree, node, state, prob, law, count, greedy, generator)
            frontier = nxt
        return tree

    def _frontier_logits(self, context: list[int], tree: TokenTree, frontier: list[int]) -> list[torch.Tensor]:
        """The draft's logits after each frontier node: a model with ``tree_logits`` scores the
        tree so far (``HFCausalLM`` feeds only the level added since its last call, one row);
        any other model scores the frontier's paths with ``next_logits``."""
        if not callable(getattr(self.lm, "tree_logits", None)):
            return list(self.lm.next_logits([context + tree.path(node) for node in frontier]))
        rows = self.lm.tree_logits(context, [n.parent for n in tree.nodes], [n.token for n in tree.nodes])
        return [rows[1 + node] for node in frontier]

    @staticmethod
    def _children(tree, node, state, prob, law, count, greedy, generator) -> list:
        """Draw ``count`` children of ``node`` (top tokens, or without replacement) and add them."""
        masked, q = law
        drawn: list[tuple[int, torch.Tensor | None]] = []
        if greedy:
            first = _greedy(masked)
            drawn.append((first, None))
            if count > 1:  # the runners-up (a partial sort: the vocabulary is large)
                values, order = torch.topk(masked, min(count + 1, masked.shape[0]))
                for value, t in zip(values.tolist(), order.tolist()):
                    if len(drawn) >= count or value == float("-inf"):
                        break
                    if t != first:
                        drawn.append((t, None))
        else:
            rest = q.clone()
            for _ in range(count):
                total = float(rest.sum())
                if not total > 0.0:
                    break  # every token the draft allows is drawn already
                law_i = rest / total
                t = sample_categorical(law_i, generator)
                drawn.append((t, law_i))
                rest = rest.clone()
                rest[t] = 0.0
        out = []
        for i, (t, q_i) in enumerate(drawn):
            child_state = state if i == len(drawn) - 1 else state.fork()
            child_state.advance(t)
            weight = float(q[t]) if q is not None else 1.0
            out.append((tree.add(t, node, q_i), child_state, prob * weight))
        return out


# --- the decoder's side: check, verify ------------------------------------------------------------


@dataclass
class DraftedTree:
    """One round's checked tree (forced run first) and its costs: ``proposed`` source nodes in
    ``seconds``; ``invalid`` nodes pruned by the check (with their subtrees), ``check_s`` the
    seconds spent checking, ``source_nodes`` the source's nodes that reached verification."""

    tree: TokenTree
    proposed: int = 0
    invalid: int = 0
    seconds: float = 0.0
    check_s: float = 0.0
    source_nodes: int = 0


def draft_tree(source, context, matcher, k, room, params, generator, vocab) -> DraftedTree:
    """The forced run (free, within ``room``), then the source's tree of at most ``k`` levels
    below it, every node checked on a fork of ``matcher`` (see the module docstring)."""
    fork = matcher.fork()
    out = DraftedTree(TokenTree())
    tail = -1
    for t in fork.forced_tokens(min(room, _MAX_FORCED)):
        tail = out.tree.add(t, tail, forced=True)
        fork.advance(t)
    base = len(out.tree)
    k = min(k, room - base)
    if k <= 0 or fork.is_terminated():
        return out
    start = time.perf_counter()
    proposal = source.propose_tree(context + out.tree.path(tail), fork.fork(), k, params, generator, vocab)
    checked = time.perf_counter()
    out.seconds = checked - start
    out.proposed = len(proposal)
    last_child = {node.parent: j for j, node in enumerate(proposal.nodes)}
    states = {-1: fork}  # proposal node -> its state while it still has children to check
    placed = {-1: tail}  # proposal node -> its index in the checked tree (absent: dropped)
    depth = {-1: 0}
    eos = vocab.eos_token_ids
    for j, node in enumerate(proposal.nodes):
        parent = node.parent
        state = states.get(parent)
        if parent not in placed or state is None or depth[parent] >= k:
            continue  # below a dropped, ghost, EOS or too deep node
        last = last_child[parent] == j
        if last:
            del states[parent]
        token = int(node.token)
        forced = bool(node.forced) and state.forced_tokens(1) == [token]  # trusted only when it is
        child = state if last else state.fork()
        if not child.try_advance((token,)):  # the check and the move in one transition lookup
            out.invalid += 1
            if node.q is not None:  # a sampled draw: the rule still counts it (always rejected)
                out.tree.add(token, placed[parent], node.q, pruned=True)
            continue
        placed[j] = out.tree.add(token, placed[parent], node.q, forced=forced)
        depth[j] = depth[parent] + 1
        out.source_nodes += 1
        if token not in eos and not child.is_terminated():
            states[j] = child
    out.check_s = time.perf_counter() - checked
    return out


def verify_tree(target_lm, context, matcher, tree: TokenTree, width, params, generator, out
                ) -> tuple[list[int], bool, Verification]:
    """The tokens this round commits (accepted nodes, then the corrected or bonus token), whether
    a drafted child was rejected, and what the target saw. Counts into ``out`` (a
    ``SpeculativeOutput``) the accepted and forced tokens."""
    live = [j for j, node in enumerate(tree.nodes) if not node.pruned]
    index = {j: i for i, j in enumerate(live)}
    parents = [index[tree.nodes[j].parent] if tree.nodes[j].parent >= 0 else -1 for j in live]
    rows = tree_logits(target_lm, context, parents, [tree.nodes[j].token for j in live])
    logits = {-1: rows[0]} | {j: rows[1 + i] for i, j in enumerate(live)}
    children = tree.children()
    state = matcher.fork()
    greedy = params.temperature == 0
    node, accepted, committed = -1, [], []

    def done(rejected: bool) -> tuple[list[int], bool, Verification]:
        return committed, rejected, Verification(list(context), tree, logits, accepted, committed)

    while True:
        kids = children[node]
        if len(kids) == 1 and tree.nodes[kids[0]].forced:
            nxt = kids[0]
            out.forced_tokens += 1
        else:
            masked = _masked_logits(logits[node], state, width)
            if greedy:
                best = _greedy(masked)
                nxt = next((c for c in kids if tree.nodes[c].token == best and not tree.nodes[c].pruned), None)
                if nxt is None:
                    committed.append(best)
                    return done(bool(kids))
            else:
                p = _distribution(masked, params)
                nxt = None
                for c in kids:
                    child = tree.nodes[c]
                    x = child.token
                    qx = 1.0 if child.q is None else float(child.q[x])
                    ratio = float(p[x]) / qx if qx > 0 else 0.0
                    if not child.pruned and (ratio >= 1.0 or float(uniforms(1, generator)[0]) < ratio):
                        nxt = c
                        break
                    p = _residual(p, child)
                if nxt is None:
                    committed.append(sample_categorical(p, generator))
                    return done(bool(kids))
        token = tree.nodes[nxt].token
        out.accepted += 1
        accepted.append(nxt)
        committed.append(token)
        state.advance(token)
        node = nxt
        if state.is_terminated():  # EOS accepted: no bonus
            return done(False)


def _residual(p: torch.Tensor, child: TreeNode) -> torch.Tensor:
    """``normalize(max(0, p − q))`` after ``child`` is rejected (``q`` a point mass when
    ``child.q`` is None); ``p`` itself where that vanishes (``p == q`` up to rounding: then the
    rejection had probability 0 and only rounding produced it)."""
    if child.q is None:
        residual = p.clone()
        residual[child.token] = 0.0
    else:
        residual = torch.clamp(p - child.q.to(p.dtype), min=0.0)
    total = float(residual.sum())
    return residual / total if total > 0.0 else p
