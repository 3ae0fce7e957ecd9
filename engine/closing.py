"""Budget-aware closing: how many tokens it takes to finish from a matcher state.

A length-limited constrained generation should never stop mid-value when it could have closed
in time. The decoder asks ``ClosingPlanner.tokens_to_close(matcher)`` — the tokens needed to
reach an accepting state *plus one for EOS* — and, when the remaining budget gets close to it,
only admits tokens after which a completion still fits (``engine.decoding``).

``BudgetClosing`` states that rule as a condition on the next token, and ``narrow(matcher)``
hands it to samplers as a ``samplers.NarrowedMatcher``: the closing is then one more constraint
each sampler draws from by its own rules (masked sampling renormalises over the admitted tokens,
AWRS and SMC weigh them, ASAp records the refused ones in its trie), never an override of a
sampler's choice behind its back. The condition at a state ``s`` with ``r`` tokens left, EOS
included: when the shortest completion from ``s`` fits ``r`` (and ``r`` is within the horizon,
if one is set), a token ``t`` is admitted when the completion from ``s·t`` fits ``r − 1``, and
the first token of ``s``'s own shortest completion always is — so the admitted set is never
empty and following it closes in time. Otherwise (an impossible budget) everything is admitted.
It depends on the state and the position only, so forks, retries and learnt state agree.

The answer comes from ``grammars.Matcher.shortest_completion``: the fewest *bytes* that finish,
found exactly from the grammar's structure (no text search, so no state budget to run out of
where any JSON value may go), spelled in the fewest tokens. The token count is therefore an
*achievable* upper bound on the true minimum — exact for byte-level vocabularies — which is what
the decoder needs: steering with an achievable bound keeps the invariant "a completion fits in
the remaining budget" from the moment it first holds.

Matchers without ``shortest_completion`` (custom matcher types) get ``None`` (unknown): the
decoder then does not steer them.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

from grammars import TokenVocabulary
from samplers.narrowing import NarrowedMatcher

__all__ = ["ClosingPlanner", "Completion", "BudgetClosing"]


@dataclass(frozen=True)
class Completion:
    """A way to finish: ``tokens`` lead to an accepting state; ``cost`` adds one for EOS."""

    tokens: tuple[int, ...]

    @property
    def cost(self) -> int:
        return len(self.tokens) + 1


class ClosingPlanner:
    """Shortest completions for matchers of one vocabulary, with a bounded per-state cache.

    One planner may serve every matcher of every grammar compiled for ``vocab`` (cache keys are
    the matchers' frozen states, which differ between grammars). Not thread-safe. ``searches``
    counts the states it had to ask a matcher about (cache misses).
    """

    def __init__(self, vocab: TokenVocabulary, *, cache_size: int = 4096):
        self.vocab = vocab
        self._cache: OrderedDict = OrderedDict()
        self._cache_size = int(cache_size)
        self.searches = 0
        #: every byte is a token: a text of n bytes takes at most n tokens (``fits`` skips tokenizing)
        self._bytes_are_tokens = _spells_every_byte(vocab)

    def fits(self, matcher, budget: int) -> bool | None:
        """Whether a completion plus EOS fits in ``budget`` tokens; ``None`` if unknown.

        The same answer as ``tokens_to_close(matcher) <= budget``, cheaper where the shortest
        text is short enough that its byte count already fits (the decoder asks every step).
        """
        if matcher.is_terminated():
            return True
        if matcher.is_accepting():
            return budget >= 1
        if self._bytes_are_tokens:
            text_of = getattr(matcher, "shortest_completion_text", None)
            text = text_of() if text_of is not None else None
            if text is not None and len(text) + 1 <= budget:
                return True
        found = self.completion(matcher)
        return None if found is None else found.cost <= budget

    def tokens_to_close(self, matcher) -> int | None:
        """Tokens needed to finish from ``matcher``'s state, EOS included; ``None`` if unknown.

        0 when the matcher is terminated (EOS already consumed). Does not change the matcher.
        """
        if matcher.is_terminated():
            return 0
        found = self.completion(matcher)
        return None if found is None else found.cost

    def completion(self, matcher) -> Completion | None:
        """The shortest completion from ``matcher``'s state (tokens, EOS not included), or None."""
        if matcher.is_accepting():
            return Completion(())
        key = matcher.freeze()
        if key in self._cache:
            self._cache.move_to_end(key)
            return self._cache[key]
        self.searches += 1
        finder = getattr(matcher, "shortest_completion", None)
        tokens = finder() if finder is not None else None
        found = None if tokens is None else Completion(tuple(tokens))
        self._cache[key] = found
        while len(self._cache) > self._cache_size:
            self._cache.popitem(last=False)
        return found


class BudgetClosing:
    """Budget-aware closing as a condition on the next token (see the module docstring).

    ``limit``: the ``num_consumed`` at which the budget is spent (a matcher's count at the start
    plus ``max_tokens``); ``horizon``: steer only once at most this many tokens are left
    (``None``: from the first step). Not thread-safe (the planner is not).
    """

    def __init__(self, planner: ClosingPlanner, limit: int, *, horizon: int | None = None, lazy_checks: int = 16):
        self.planner = planner
        self.limit = int(limit)
        self.horizon = horizon
        self.lazy_checks = int(lazy_checks)

    def remaining(self, matcher) -> int:
        """Tokens left in the budget at ``matcher``'s position, EOS included."""
        return self.limit - matcher.num_consumed

    def steers(self, matcher) -> bool:
        """Whether closing narrows the next token here: the completion fits and the horizon is reached."""
        remaining = self.remaining(matcher)
        if self.horizon is not None and remaining > self.horizon:
            return False
        return bool(self.planner.fits(matcher, remaining))

    def admits(self, matcher, token: int) -> bool:
        """Whether ``token`` (allowed by ``matcher``, not EOS) keeps a completion within the budget."""
        if not self.steers(matcher):
            return True
        found = self.planner.completion(matcher)
        if found is not None and found.tokens and found.tokens[0] == token:
            return True  # the planner's own way to close: always admitted, so something always is
        remaining = self.remaining(matcher)
        matcher.advance(token)
        try:
            return bool(self.planner.fits(matcher, remaining - 1))
        finally:
            matcher.rollback(1)

    def narrow(self, matcher) -> NarrowedMatcher:
        """``matcher`` under this condition, for a sampler's draw (or a whole SMC run)."""
        return NarrowedMatcher(matcher, self.admits, self.planner.vocab, lazy_checks=self.lazy_checks)


_SPELLS_EVERY_BYTE: dict[tuple[int, frozenset], tuple[object, bool]] = {}


def _spells_every_byte(vocab: TokenVocabulary) -> bool:
    """Whether all 256 single bytes are non-special tokens; cached per vocabulary (a scan of it)."""
    key = (id(vocab.token_bytes), frozenset(vocab.special_token_ids))
    hit = _SPELLS_EVERY_BYTE.get(key)
    if hit is None or hit[0] is not vocab.token_bytes:
        special = vocab.special_token_ids
        spelled = {piece for tid, piece in enumerate(vocab.token_bytes) if len(piece) == 1 and tid not in special}
        if len(_SPELLS_EVERY_BYTE) > 8:
            _SPELLS_EVERY_BYTE.clear()
        hit = _SPELLS_EVERY_BYTE[key] = (vocab.token_bytes, len(spelled) == 256)
    return hit[1]
