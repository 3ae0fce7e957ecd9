"""A law-checking kit for anything that claims the Matcher contract (STYLE.md example 1).

Kept out of the production classes: tests (and users writing their own backends) call
``MatcherLaws(matcher, vocab).check_all()`` at interesting states. Each law raises
``AssertionError`` with the token and the law that broke.

Laws:
- mask, ``allows`` and ``try_advance`` agree on every token id of the logits width;
- ``fill_mask`` is pure (calling it twice gives the same words and leaves the state unchanged);
- ``advance`` then ``rollback(1)`` restores the mask;
- ``fork`` is independent of its origin;
- ``rejection`` agrees with the mask, and every token in a rejected set is rejected;
- EOS is allowed iff ``is_accepting()``; padded ids are never allowed;
- a forced token is the only allowed token, all along the run ``forced_tokens`` returns;
- the tokens of ``shortest_completion`` are each allowed in turn and end in an accepting state.

Every law uses only the ``grammars.TokenMatcher`` contract, so it holds for every matcher kind.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from grammars.bitmask import allocate_token_bitmask, unpack_bits

__all__ = ["MatcherLaws", "allowed_tokens"]


def allowed_tokens(matcher, logits_width: int) -> np.ndarray:
    """Boolean vector of the tokens ``matcher``'s mask allows."""
    words = allocate_token_bitmask(1, logits_width)
    matcher.fill_mask(words, 0)
    return unpack_bits(words[0], logits_width)


@dataclass
class MatcherLaws:
    matcher: object
    vocab: object
    #: check ``allows``/``try_advance`` on this many random token ids plus as many allowed ones
    #: (all ids when None); EOS is always checked.
    sample: int | None = None
    seed: int = 0

    def check_all(self) -> np.ndarray:
        """Run every law at the matcher's current state; returns the allowed vector."""
        allowed = self.check_mask_is_pure()
        self.check_mask_agrees(allowed)
        self.check_eos(allowed)
        self.check_rollback_restores(allowed)
        self.check_fork_independent(allowed)
        self.check_token_checks(allowed)
        self.check_forced_tokens(allowed)
        self.check_shortest_completion()
        return allowed

    # --- individual laws ---------------------------------------------------------------------

    def check_mask_is_pure(self) -> np.ndarray:
        width = self.vocab.logits_width
        state_before = self.matcher.freeze()
        first = allowed_tokens(self.matcher, width)
        second = allowed_tokens(self.matcher, width)
        assert np.array_equal(first, second), "fill_mask is not deterministic"
        assert self.matcher.freeze() == state_before, "fill_mask changed the matcher state"
        assert not first[len(self.vocab) :].any(), "a padded id beyond the vocabulary is allowed"
        return first

    def check_mask_agrees(self, allowed: np.ndarray) -> None:
        for token in self._tokens_to_check(allowed):
            by_allows = self.matcher.allows(token)
            probe = self.matcher.fork()
            by_advance = probe.try_advance([token]) == 1
            assert allowed[token] == by_allows == by_advance, (
                f"token {token} ({self._show(token)}): mask={allowed[token]} allows={by_allows} "
                f"try_advance={by_advance}"
            )

    def check_token_checks(self, allowed: np.ndarray) -> None:
        for token in self._tokens_to_check(allowed):
            result = self.matcher.check(token)
            shown = f"token {token} ({self._show(token)})"
            assert result.allowed == bool(allowed[token]), f"{shown}: mask={allowed[token]} but check={result}"
            assert (self.matcher.rejection(token) is None) == result.allowed, f"{shown}: rejection disagrees with check"
            if not result.allowed:
                assert token in result.rejected, f"{shown} is missing from its rejected set"
            else:
                assert token in result.accepted, f"{shown} is allowed but missing from its accepted set"
            wrong = result.rejected[allowed[result.rejected]].tolist()
            assert not wrong, f"checking {shown} rejects allowed {wrong[:5]}"
            wrong = result.accepted[~allowed[result.accepted]].tolist()
            assert not wrong, f"checking {shown} accepts rejected {wrong[:5]}"

    def check_eos(self, allowed: np.ndarray) -> None:
        accepting = self.matcher.is_accepting()
        for eos in self.vocab.eos_token_ids:
            assert bool(allowed[eos]) == accepting, f"EOS {eos} allowed={allowed[eos]} but is_accepting={accepting}"

    def check_rollback_restores(self, allowed: np.ndarray) -> None:
        candidates = np.flatnonzero(allowed)
        if candidates.shape[0] == 0:
            return
        token = int(candidates[len(candidates) // 2])
        consumed = self.matcher.num_consumed
        self.matcher.advance(token)
        self.matcher.rollback(1)
        assert self.matcher.num_consumed == consumed
        again = allowed_tokens(self.matcher, self.vocab.logits_width)
        assert np.array_equal(again, allowed), f"advance({token}) + rollback(1) changed the mask"

    def check_fork_independent(self, allowed: np.ndarray) -> None:
        candidates = [t for t in np.flatnonzero(allowed) if int(t) not in self.vocab.eos_token_ids]
        if not candidates:
            return
        fork = self.matcher.fork()
        fork.advance(int(candidates[0]))
        after = allowed_tokens(self.matcher, self.vocab.logits_width)
        assert np.array_equal(after, allowed), "advancing a fork changed the original matcher"
        assert fork.num_consumed == self.matcher.num_consumed + 1

    def check_forced_tokens(self, allowed: np.ndarray, max_tokens: int = 16) -> None:
        forced = self.matcher.forced_tokens(max_tokens)
        probe = self.matcher.fork()
        here = allowed
        for i, token in enumerate(forced):
            only = np.flatnonzero(here).tolist()
            assert only == [token], f"forced token {i} ({self._show(token)}) but the mask allows {only[:5]}"
            probe.advance(token)
            here = allowed_tokens(probe, self.vocab.logits_width)
        assert self.matcher.forced_tokens(max_tokens) == forced, "forced_tokens changed the matcher state"
        if len(forced) < max_tokens and not probe.is_accepting():
            assert np.count_nonzero(here) != 1, f"forced run stops after {len(forced)} tokens at a forced token"

    def check_shortest_completion(self) -> None:
        completion = self.matcher.shortest_completion()
        if completion is None:
            assert self.matcher.is_terminated() or not self.matcher.is_accepting(), (
                "no shortest completion from an accepting state")
            return
        probe = self.matcher.fork()
        for i, token in enumerate(completion):
            assert probe.allows(token), f"completion token {i} ({self._show(token)}) is not allowed"
            probe.advance(token)
        assert probe.is_accepting(), f"the shortest completion {list(completion)[:8]} does not end accepting"
        if self.matcher.is_accepting():
            assert completion == (), "an accepting matcher's shortest completion is not empty"

    # --- helpers -----------------------------------------------------------------------------

    def _tokens_to_check(self, allowed: np.ndarray) -> Sequence[int]:
        width = self.vocab.logits_width
        if self.sample is None or self.sample >= width:
            return range(width)
        rng = np.random.default_rng(self.seed)
        picked = set(rng.choice(width, size=self.sample, replace=False).tolist())
        allowed_ids = np.flatnonzero(allowed)
        if allowed_ids.shape[0] > self.sample:
            allowed_ids = rng.choice(allowed_ids, size=self.sample, replace=False)
        picked.update(int(t) for t in allowed_ids)
        picked.update(self.vocab.eos_token_ids)
        return sorted(picked)

    def _show(self, token: int) -> str:
        if token < len(self.vocab):
            return repr(self.vocab.token_bytes[token])
        return "<padding>"
