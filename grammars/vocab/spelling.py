"""Spelling a byte string in vocabulary tokens: in the fewest, or in exactly ``n``.

Constrained decoders meet texts they have to turn into tokens themselves: a matcher's shortest
completion (closing a length-limited generation) and a witness fill of a diffusion canvas's
masked run, which must occupy exactly the positions it closes — each position holds one token,
none may be empty. The tokenizer's own segmentation is the wrong tool for both: it gives one
count, and it may not be defined on a fragment (half a UTF-8 character).

Both are dynamic programs over byte offsets. ``pieces`` maps bytes to the (lowest) usable token
that spells them; ``prefixes`` holds every prefix of every piece, so the scan from an offset stops
as soon as no token can continue it — the cost is ``O(len(text) · longest token)`` dictionary
lookups, far less in practice.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from grammars.vocab.vocabulary import TokenVocabulary

__all__ = ["Spelling"]

_BY_VOCABULARY: dict[TokenVocabulary, Spelling] = {}
_LOCK = threading.Lock()


@dataclass(frozen=True, eq=False)
class Spelling:
    """The usable tokens of a vocabulary, indexed by their bytes."""

    pieces: dict[bytes, int]
    prefixes: frozenset[bytes]

    @classmethod
    def of(cls, token_bytes: Sequence[bytes], usable: Iterable[int]) -> Spelling:
        """Tokens ``usable`` (ids into ``token_bytes``; empty ones skipped), the lowest id first."""
        pieces: dict[bytes, int] = {}
        for tid in sorted(usable):
            piece = token_bytes[tid]
            if piece:
                pieces.setdefault(piece, tid)
        prefixes = frozenset(piece[:k] for piece in pieces for k in range(1, len(piece) + 1))
        return cls(pieces, prefixes)

    @classmethod
    def of_vocabulary(cls, vocab: TokenVocabulary) -> Spelling:
        """Every non-special token of ``vocab``; cached per vocabulary (a scan of it)."""
        with _LOCK:
            hit = _BY_VOCABULARY.get(vocab)
        if hit is None:
            special = vocab.special_token_ids
            hit = cls.of(vocab.token_bytes, (i for i in range(len(vocab.token_bytes)) if i not in special))
            with _LOCK:
                if len(_BY_VOCABULARY) >= 8:
                    _BY_VOCABULARY.clear()
                _BY_VOCABULARY[vocab] = hit
        return hit

    def _spans(self, text: bytes, i: int):
        """(end, token) of every usable token spelling ``text[i:end]``, shortest first."""
        for j in range(i + 1, len(text) + 1):
            piece = text[i:j]
            if piece not in self.prefixes:  # no token starts with it: no longer one either
                return
            token = self.pieces.get(piece)
            if token is not None:
                yield j, token

    def fewest(self, text: bytes) -> tuple[int, ...] | None:
        """The fewest tokens spelling ``text`` (``()`` for ``b""``); ``None`` when none do."""
        n = len(text)
        fewest = [0] + [1 << 60] * n
        choice: list[tuple[int, int] | None] = [None] * (n + 1)  # (start, token) of the last token
        for i in range(n):
            if fewest[i] >= 1 << 60:
                continue
            for j, token in self._spans(text, i):
                if fewest[i] + 1 < fewest[j]:
                    fewest[j] = fewest[i] + 1
                    choice[j] = (i, token)
        if n and choice[n] is None:
            return None
        tokens = []
        j = n
        while j > 0:
            j, token = choice[j]
            tokens.append(token)
        return tuple(reversed(tokens))

    def exactly(self, text: bytes, count: int) -> tuple[int, ...] | None:
        """``count`` tokens spelling ``text``, the longest token first wherever there is a choice;
        ``None`` when no segmentation has that many."""
        if count < 0:
            return None
        n = len(text)
        keep = (1 << (count + 1)) - 1
        # counts[i]: bit c set when text[i:] can be spelled in exactly c tokens (c <= count)
        counts = [0] * n + [1]
        for i in range(n - 1, -1, -1):
            reach = 0
            for j, _ in self._spans(text, i):
                reach |= counts[j] << 1
            counts[i] = reach & keep
        if not counts[0] >> count & 1:
            return None
        tokens: list[int] = []
        i, need = 0, count
        while need:
            end, token = max((j, t) for j, t in self._spans(text, i) if counts[j] >> (need - 1) & 1)
            tokens.append(token)
            i, need = end, need - 1
        return tuple(tokens)
