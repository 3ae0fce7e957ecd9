"""``NarrowedMatcher``: a matcher whose next tokens must also pass a condition, for samplers.

Budget-aware closing (``engine.closing``) is a constraint of its own: near the end of the token
budget only the tokens after which the text can still be finished in time may come next. The
decoding loop hands samplers the row's matcher narrowed by that condition, and every sampler then
draws from the narrowed constraint exactly as it draws from a grammar — its own rules, its own
weights, its own learnt state — instead of the loop overriding its choices behind its back.

The narrowed matcher keeps the ``TokenMatcher`` contract for the base language restricted by
``admits(base, token)``: ``allows``, ``check``, ``advance`` and ``try_advance`` ask the condition
about the one token, ``fill_mask`` asks it about every token the base mask allows (exact, but one
call per allowed token: thousands where a string body allows almost everything). So a sampler
that needs a mask should rather draw from the *base* mask and ask ``admits`` about the token it
drew, removing refused tokens and drawing again — rejection sampling, which gives exactly the
distribution renormalised over the admitted tokens — and compute the exact mask only after
``lazy_checks`` refusals. ``masked_draw`` (``samplers.masked``) and ``ASAp`` do this; AWRS needs
nothing special, since it only ever asks about single tokens.

The condition is called with ``base`` at the current state and a token ``base`` allows that is
not one of the vocabulary's EOS ids (EOS is allowed exactly when ``base`` accepts: narrowing
never stops a complete text from ending); it may advance and roll back ``base`` but must leave it
as it found it, and it must depend only on ``base``'s state and ``num_consumed``, so that forks
and repeated calls agree.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from grammars.bitmask import allocate_token_bitmask, unpack_bits
from grammars.contract import (
    TokenCheck,
    TokenMatcher,
    count,
    mask_row,
    token_id,
    token_ids,
)
from grammars.errors import TokenRejected
from grammars.vocab.vocabulary import TokenVocabulary

__all__ = ["NarrowedMatcher", "Admits"]

#: ``admits(base, token)``: whether ``token`` (allowed by ``base``, not EOS) may come next.
Admits = Callable[[object, int], bool]

_DEFAULT_LAZY_CHECKS = 16


class NarrowedMatcher:
    """``base``'s constraint restricted by ``admits``; a ``TokenMatcher`` (see the module docstring).

    ``vocab`` is the vocabulary ``base`` was built for (its EOS ids are never narrowed away; its
    logits width sizes masks). ``lazy_checks``: how many refused draws a sampler that draws from
    ``base``'s mask should accept before it computes the exact narrowed mask. ``refusals``
    counts the tokens ``admits`` refused (the decoding loop reports it as ``budget_steered``).
    Not thread-safe, as any matcher.
    """

    __slots__ = ("_base", "_admits", "_vocab", "lazy_checks", "refusals")

    def __init__(self, base, admits: Admits, vocab: TokenVocabulary, *, lazy_checks: int = _DEFAULT_LAZY_CHECKS):
        if not isinstance(base, TokenMatcher):
            raise TypeError(f"NarrowedMatcher: base must be a matcher (grammars.TokenMatcher), got {type(base).__name__}")
        if not callable(admits):
            raise TypeError(f"NarrowedMatcher: admits must be callable, got {type(admits).__name__}")
        if not isinstance(vocab, TokenVocabulary):
            raise TypeError(f"NarrowedMatcher: vocab must be a TokenVocabulary, got {type(vocab).__name__}")
        self._base = base
        self._admits = admits
        self._vocab = vocab
        self.lazy_checks = count(lazy_checks, "lazy_checks", "NarrowedMatcher")
        self.refusals = 0

    @property
    def base(self):
        """The matcher being narrowed (shared, not copied: it moves when this one moves)."""
        return self._base

    def admits(self, token: int) -> bool:
        """Whether the narrowing keeps ``token``, a token ``base`` allows (EOS always)."""
        token = token_id(token, "NarrowedMatcher.admits")
        if token in self._vocab.eos_token_ids:
            return True
        kept = bool(self._admits(self._base, token))
        self.refusals += not kept
        return kept

    # --- queries ------------------------------------------------------------------------------

    @property
    def num_consumed(self) -> int:
        """Tokens consumed so far (the base's)."""
        return self._base.num_consumed

    def freeze(self) -> object:
        """The base's snapshot with the position: the narrowing may depend on how far the text is."""
        return (self._base.freeze(), self._base.num_consumed)

    def fill_mask(self, out: np.ndarray, row: int = 0) -> None:
        """The base mask without the tokens ``admits`` refuses (one call per allowed token)."""
        self._base.fill_mask(out, row)
        target = mask_row(out, row, 0, "NarrowedMatcher.fill_mask").view(np.uint32)
        width = target.shape[0] * 32
        for token in np.flatnonzero(unpack_bits(target.view(np.int32), width)).tolist():
            if not self.admits(token):
                target[token >> 5] &= np.uint32(~(1 << (token & 31)) & 0xFFFFFFFF)

    def allows(self, token: int) -> bool:
        """``base.allows(token)`` and the narrowing keeps it."""
        return self._base.allows(token) and self.admits(token)

    def check(self, token: int) -> TokenCheck:
        """The base's rejected set when it rejects (rejected there, rejected here), else this token alone.

        The base's *accepted* set is dropped: the base allows those tokens, the narrowing might not.
        """
        result = self._base.check(token)
        if not result.allowed:
            return TokenCheck(False, result.rejected, result.accepted[:0])
        return TokenCheck.alone(token, self.admits(token))

    def rejection(self, token: int) -> np.ndarray | None:
        """``None`` when ``token`` may come next; otherwise ``check(token).rejected``."""
        result = self.check(token)
        return None if result.allowed else result.rejected

    def is_accepting(self) -> bool:
        """The base accepts: EOS is allowed (the narrowing never refuses it)."""
        return self._base.is_accepting()

    def is_terminated(self) -> bool:
        """EOS was consumed."""
        return self._base.is_terminated()

    def forced_tokens(self, max_tokens: int = 64) -> list[int]:
        """The run of tokens that are each the only one the narrowed mask allows (exact masks)."""
        limit = count(max_tokens, "max_tokens", "NarrowedMatcher.forced_tokens")
        probe = self.fork()
        forced: list[int] = []
        while len(forced) < limit and not probe.is_terminated() and not probe.is_accepting():
            words = allocate_token_bitmask(1, self._vocab.logits_width)
            probe.fill_mask(words, 0)
            allowed = np.flatnonzero(unpack_bits(words[0], self._vocab.logits_width))
            if allowed.shape[0] != 1:
                break
            forced.append(int(allowed[0]))
            probe.advance(int(allowed[0]))
        return forced

    def shortest_completion(self) -> tuple[int, ...] | None:
        """The base's shortest completion when the narrowing keeps each of its tokens, else ``None``."""
        tokens = self._base.shortest_completion()
        if tokens is None:
            return None
        probe = self.fork()
        for token in tokens:
            if not probe.allows(token):
                return None
            probe.advance(token)
        return tokens

    # --- moves --------------------------------------------------------------------------------

    def advance(self, token: int) -> None:
        """Consume ``token`` or raise ``TokenRejected`` (state unchanged) if either refuses it."""
        if not self._base.allows(token):
            raise TokenRejected(token_id(token, "NarrowedMatcher.advance"))
        if not self.admits(token):
            raise TokenRejected(int(token), "the narrowing of this matcher refuses it")
        self._base.advance(token)

    def try_advance(self, tokens: Sequence[int]) -> int:
        """Consume the longest allowed prefix of ``tokens``; every id is checked first."""
        consumed = 0
        for token in token_ids(tokens, "NarrowedMatcher.try_advance"):
            if not self.allows(token):
                break
            self._base.advance(token)
            consumed += 1
        return consumed

    def rollback(self, n: int = 1) -> None:
        """Undo the last ``n`` tokens (the base's ``rollback``)."""
        self._base.rollback(n)

    def fork(self) -> "NarrowedMatcher":
        """An independent copy: a fork of the base under the same condition."""
        return NarrowedMatcher(self._base.fork(), self._admits, self._vocab, lazy_checks=self.lazy_checks)

    def __repr__(self) -> str:
        return f"NarrowedMatcher({self._base!r}, refusals={self.refusals})"

