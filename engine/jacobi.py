"""Jacobi / lookahead drafting: the target drafts for itself from its own verification passes.

No draft model: every target call already computes the target's next-token logits at each
verified position, also past the point where verification stopped. Lookahead decoding (Fu et
al. 2024) turns such by-products into drafts in two ways, and ``JacobiDraft`` uses both:

* **Fixed-point guesses** (Jacobi iteration). When a drafted child is rejected, the target's
  predictions along that rejected branch (its first-child chain) were made one token off: the
  prediction after the rejected token guesses the token after the corrected one, and so on. The
  next round drafts those guesses first — an iteration that converges to the target's greedy
  continuation wherever one wrong token does not change what follows (closing brackets, a key's
  tail, boilerplate).
* **An n-gram pool**: for every verified position, the target's argmax after it is remembered
  under the last ``1 .. ngram − 1`` tokens before it (most recent first, ``pool_size`` per key);
  the committed text (prompt + output) is indexed the same way, which makes prompt lookup a
  special case. A tree node looks its last tokens up, longest key first.

``propose_tree`` grows a deterministic token tree (``engine.spec_tree``): at each node the
candidates are the fixed-point guess (on the guessed chain only) then the pool's continuations,
without repeats and only those the node's matcher allows; every frontier node gets its first
candidate, then up to ``width − 1`` more while ``max_nodes`` lasts, level by level up to ``k``.
The decoder checks every node again on a forked matcher and verifies the tree in one target pass
(lookahead decoding's verification branch doubles as its Jacobi window here: the drafts are the
guesses, their logits the next guesses; there is no separate lookahead branch).
``observe_verification`` is the hook the decoder calls after every target call.

Lossless: every proposal is a deterministic function of what the decoder already committed and
saw (``q`` a point mass), so the tree rule of ``engine.spec_tree`` keeps the output law exactly
masked sampling from the target (greedy: its constrained argmax path). ``draft_model="jacobi"``
(or ``"lookahead"``) in ``generate``; one instance per request (it carries the pool and guesses).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from engine.spec_tree import Draft, TokenTree, Verification

__all__ = ["JacobiDraft"]


@dataclass
class JacobiDraft:
    """Drafts from the target's own last verification (fixed-point guesses) and an n-gram pool
    of its predictions and of the text (see the module docstring)."""

    ngram: int = 3
    width: int = 2
    max_nodes: int = 16
    pool_size: int = 4
    _pool: dict[tuple[int, ...], list[int]] = field(default_factory=dict, repr=False)
    _indexed: list[int] = field(default_factory=list, repr=False)
    _guesses: list[int] = field(default_factory=list, repr=False)
    _guess_context: list[int] = field(default_factory=list, repr=False)

    def __post_init__(self) -> None:
        for name, least in (("ngram", 2), ("width", 1), ("max_nodes", 1), ("pool_size", 1)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < least:
                raise ValueError(f"{name} must be an int >= {least}, got {value!r}")

    # --- the pool -------------------------------------------------------------------------------

    def _remember(self, key: tuple[int, ...], token: int) -> None:
        seen = self._pool.setdefault(key, [])
        if seen and seen[0] == token:
            return
        if token in seen:
            seen.remove(token)
        seen.insert(0, token)
        del seen[self.pool_size:]

    def _remember_after(self, tokens: list[int], token: int) -> None:
        """``token`` follows ``tokens``: remember it under their last 1 .. ngram − 1 tokens."""
        for n in range(1, min(self.ngram - 1, len(tokens)) + 1):
            self._remember(tuple(tokens[-n:]), token)

    def _index(self, context: list[int]) -> None:
        """Index the text's n-grams not indexed yet (the whole context when it is a new one)."""
        old = self._indexed
        start = len(old) if len(old) <= len(context) and context[:len(old)] == old else 0
        for i in range(max(start, 1), len(context)):
            self._remember_after(context[max(0, i - self.ngram + 1):i], context[i])
        self._indexed = list(context)

    def candidates(self, tokens: list[int]) -> list[int]:
        """The pool's continuations of ``tokens``, longest key first, without repeats."""
        out: list[int] = []
        for n in range(min(self.ngram - 1, len(tokens)), 0, -1):
            for t in self._pool.get(tuple(tokens[-n:]), ()):
                if t not in out:
                    out.append(t)
        return out

    # --- the hook -------------------------------------------------------------------------------

    def observe_verification(self, seen: Verification) -> None:
        """Learn from a target call: its argmax after every verified position goes to the pool,
        and the predictions along the rejected branch become the next round's guesses."""
        tree, context = seen.tree, seen.context
        argmax = {node: int(torch.argmax(row)) for node, row in seen.logits.items()}
        for node, token in argmax.items():
            self._remember_after(context[-(self.ngram - 1):] + tree.path(node), token)
        self._guesses = []
        end = seen.accepted[-1] if seen.accepted else -1
        children = tree.children()
        kids = [c for c in children.get(end, []) if not tree.nodes[c].pruned]
        if len(seen.committed) > len(seen.accepted) and kids:  # rejected there: follow the first branch
            node = kids[0]
            while node in argmax:
                self._guesses.append(argmax[node])
                live = [c for c in children[node] if not tree.nodes[c].pruned]
                if not live:
                    break
                node = live[0]
        self._guess_context = context + list(seen.committed)

    # --- drafting -------------------------------------------------------------------------------

    def propose(self, context, matcher, k, params, generator, vocab) -> list[Draft]:
        """The chain protocol: the tree's first-child path."""
        tree = self.propose_tree(context, matcher, k, params, generator, vocab)
        return [Draft(tree.nodes[j].token) for j in tree.main_path()]

    def propose_tree(self, context, matcher, k, params, generator, vocab) -> TokenTree:
        context = list(context)
        self._index(context)
        guesses = self._guesses if context == self._guess_context else []
        tree = TokenTree()
        tail = context[-(self.ngram - 1):]
        frontier = [(-1, matcher, tail, True)]  # node, its state (owned), its last tokens, on the guesses
        for depth in range(k):
            room = self.max_nodes - len(tree)
            if not frontier or room <= 0:
                break
            options = []
            for node, state, last, guessed in frontier:
                if state.is_terminated():
                    options.append([])
                    continue
                cands = ([guesses[depth]] if guessed and depth < len(guesses) else []) + self.candidates(last)
                picked: list[tuple[int, object]] = []  # (token, the state after it)
                for t in dict.fromkeys(cands):
                    child = state.fork()
                    if child.try_advance((t,)):  # allowed: the child's state comes with the check
                        picked.append((t, child))
                        if len(picked) == self.width:
                            break
                options.append(picked)
            counts = [min(1, len(o)) for o in options]
            room -= sum(counts)
            if room < 0:  # more frontier nodes than room: the first ones (guesses first) keep theirs
                for i in range(len(counts) - 1, -1, -1):
                    if room >= 0:
                        break
                    room += counts[i]
                    counts[i] = 0
            for i, o in enumerate(options):
                extra = min(len(o) - counts[i], max(room, 0)) if counts[i] else 0
                counts[i] += extra
                room -= extra
            nxt = []
            for (node, _, last, guessed), picked, count in zip(frontier, options, counts):
                for t, child in picked[:count]:
                    on_guess = guessed and depth < len(guesses) and t == guesses[depth]
                    nxt.append((tree.add(t, node), child, (last + [t])[-(self.ngram - 1):], on_guess))
            frontier = nxt
        return tree
