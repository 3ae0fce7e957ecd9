"""Budget-aware closing: how many tokens it takes to finish from a matcher state.

A length-limited constrained generation should never stop mid-value when it could have closed
in time. The decoder asks ``ClosingPlanner.tokens_to_close(matcher)`` — an upper bound on the
tokens needed to reach an accepting state *plus one for EOS* — and, when the remaining budget
gets close to it, only accepts sampled tokens after which a completion still fits
(``engine.decoding``).

How the bound is found (bounded, cached, never raises for a grammar it cannot solve):

1. Best-first (uniform-cost) search over *bytes*: the vocabulary's single-byte tokens
   (printable ASCII, tab and newline by default) on a fork of the matcher, deduplicating states
   by ``Matcher.freeze()``. Bytes cost 1, except bytes that open nesting, whose cost doubles
   with the nesting depth of the path, and the backslash: where any JSON value may go, the
   number of distinct nested prefixes grows exponentially with their length, and these
   weights keep the search on flat continuations (see ``_shortest_bytes``). It expands at most
   ``max_states`` states, so it always terminates.
2. If that finds nothing, a depth-first walk that tries closing characters first (quotes,
   brackets, digits, then letters) finds *a* completion, not a short one, within the same
   bound; failing both, the answer is ``None`` (unknown) and the decoder does not steer.
3. The completion bytes are tokenized greedily against the matcher — longest vocabulary token
   that is a prefix of the rest *and* allowed by the matcher — which always succeeds (the
   single-byte path is allowed) and gives a token sequence that is itself a valid completion.

So the answer is an *upper bound* on the true minimum (restricting the alphabet, weighting bytes
or tokenizing greedily can only make it longer) and it is *achievable*: ``completion(m)`` returns the tokens.
That is the property the decoder needs — steering with an achievable bound keeps the invariant
"a completion fits in the remaining budget" from the moment it first holds. Results are cached
per state (``freeze()``), including every state along a found completion, in a bounded LRU.
"""

from __future__ import annotations

import heapq
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

from grammars import TokenVocabulary, allocate_token_bitmask

__all__ = ["ClosingPlanner", "Completion"]

#: Bytes the search may use: printable ASCII plus tab and newline. Any valid completion is an
#: upper bound, so a smaller alphabet only costs tightness, and it keeps the branching low.
DEFAULT_ALPHABET = bytes(range(32, 127)) + b"\t\n"


#: A hinted completion is trusted only while it leaves this many tokens of the budget unused;
#: closer to the limit the search runs, since a loose bound could wrongly say "cannot close".
HINT_SLACK = 8


@dataclass(frozen=True)
class Completion:
    """A way to finish: ``tokens`` lead to an accepting state; ``cost`` adds one for EOS."""

    tokens: tuple[int, ...]

    @property
    def cost(self) -> int:
        return len(self.tokens) + 1


class ClosingPlanner:
    """Shortest-completion search for matchers of one vocabulary; owns a bounded cache.

    One planner may serve every matcher of every grammar compiled for ``vocab`` (cache keys are
    the matchers' frozen states, which differ between grammars). Not thread-safe.
    """

    def __init__(
        self,
        vocab: TokenVocabulary,
        *,
        max_states: int = 4000,
        alphabet: bytes = DEFAULT_ALPHABET,
        cache_size: int = 4096,
        successor_cache: int = 50_000,
        max_token_len: int = 32,
    ):
        self.vocab = vocab
        self.max_states = int(max_states)
        self._cache: OrderedDict = OrderedDict()
        self._cache_size = int(cache_size)
        self._successor_memo: OrderedDict = OrderedDict()
        self._successor_cache = int(successor_cache)
        pieces: dict[bytes, int] = {}
        special = vocab.special_token_ids
        for tid, piece in enumerate(vocab.token_bytes):
            if piece and tid not in special and len(piece) <= max_token_len:
                pieces.setdefault(piece, tid)
        self._pieces = pieces
        self._longest = max((len(p) for p in pieces), default=1)
        self._byte_tokens = [(b, pieces[bytes([b])]) for b in alphabet if bytes([b]) in pieces]
        self._dfs_tokens = sorted(self._byte_tokens, key=lambda bt: _preference(bt[0]))
        self._mask = allocate_token_bitmask(1, vocab.logits_width)
        self.searches = 0
        self.hinted = 0

    # --- queries ---------------------------------------------------------------------------

    def tokens_to_close(self, matcher, *, hints: Sequence[bytes] = (), budget: int | None = None) -> int | None:
        """Tokens needed to finish from ``matcher``'s state, EOS included; ``None`` if unknown.

        0 when the matcher is terminated (EOS already consumed). ``hints`` and ``budget`` as for
        ``completion``. Does not change the matcher.
        """
        if matcher.is_terminated():
            return 0
        found = self.completion(matcher, hints=hints, budget=budget)
        return None if found is None else found.cost

    def completion(self, matcher, *, hints: Sequence[bytes] = (), budget: int | None = None) -> Completion | None:
        """An achievable completion from ``matcher``'s state (tokens, EOS not included), or None.

        ``hints``: candidate completion texts, typically the one found for the previous state
        (inside a string, appending a letter leaves it valid; after a token that starts it, its
        rest is). The first hint the matcher accepts to the end is returned without a search —
        unless ``budget`` is given and it (plus EOS) comes within ``HINT_SLACK`` tokens of it:
        close to the limit a tight bound matters, and the search runs. A hint is an upper bound
        like any completion; only searched results are cached.
        """
        if matcher.is_accepting():
            return Completion(())
        key = matcher.freeze()
        if key in self._cache:
            self._cache.move_to_end(key)
            return self._cache[key]
        for text in hints:
            if not text:
                continue
            found = self._tokenize(matcher.fork(), bytes(text), remember=False)
            if found is not None and (budget is None or found.cost + HINT_SLACK <= budget):
                self.hinted += 1
                return found
        probe = matcher.fork()
        text = self._shortest_bytes(probe)
        if text is None:
            text = self._greedy_bytes(probe)
        result = None if text is None else self._tokenize(probe, text)
        if result is None:
            self._remember(key, None)
        return result

    # --- internals -------------------------------------------------------------------------

    def _remember(self, key, value: Completion | None) -> None:
        self._cache[key] = value
        self._cache.move_to_end(key)
        while len(self._cache) > self._cache_size:
            self._cache.popitem(last=False)

    def _allowed_bytes(self, probe, candidates: list[tuple[int, int]]) -> list[tuple[int, int]]:
        probe.fill_mask(self._mask, 0)
        words = self._mask[0]
        return [(b, t) for b, t in candidates if (int(words[t >> 5]) >> (t & 31)) & 1]

    def _shortest_bytes(self, probe) -> bytes | None:
        """Uniform-cost search over single-byte tokens from ``probe``'s state; ``probe`` is restored.

        Bytes cost 1, except the backslash (8) and bytes that open nesting (``[``, ``{``, ``(``),
        which cost ``4 * 2**depth`` at bracket depth ``depth`` of the path so far. Uniform costs
        drown wherever any JSON value may go (``additionalProperties``, untyped values): the
        number of distinct nested prefixes grows exponentially with their length. The weights
        keep the search on flat continuations and nest only where the grammar needs it; the
        result is still a valid completion, so still an upper bound.

        Successor lists are memoised per state across searches (``successor_cache`` states, LRU),
        so the searches of one generation, which explore largely the same states, mostly walk
        the memo instead of the matcher.
        """
        self.searches += 1
        root = probe.freeze()
        best: dict = {root: 0}
        # state -> (single-byte tokens from the root, their bytes, lexical context after them)
        paths: dict = {root: ([], b"", _Context())}
        heap: list = [(0, 0, root, False)]
        order = 1
        expanded = 0
        while heap and expanded < self.max_states:
            cost, _, state, accepting = heapq.heappop(heap)
            if cost > best[state]:
                continue  # a stale entry
            path, text, context = paths[state]
            if accepting:
                return text
            expanded += 1
            successors = self._successors(state, probe, path)
            if successors is None:  # pragma: no cover - a path that was accepted once replays
                return None
            for byte, token, nxt, nxt_accepting in successors:
                step, after = context.step(byte)
                new_cost = cost + step
                if new_cost >= best.get(nxt, new_cost + 1):
                    continue
                best[nxt] = new_cost
                paths[nxt] = (path + [token], text + bytes([byte]), after)
                heapq.heappush(heap, (new_cost, order, nxt, nxt_accepting))
                order += 1
        return None

    def _successors(self, state, probe, path: list[int]) -> list[tuple[int, int, object, bool]] | None:
        """(byte, token, next state, next is accepting) for every allowed single-byte token.

        From the memo, or by replaying ``path`` on ``probe`` (which sits at the search root and is
        restored) and trying each allowed byte.
        """
        hit = self._successor_memo.get(state)
        if hit is not None:
            self._successor_memo.move_to_end(state)
            return hit
        replayed = probe.try_advance(path)
        if replayed != len(path):  # pragma: no cover
            probe.rollback(replayed)
            return None
        out = []
        try:
            for byte, token in self._allowed_bytes(probe, self._byte_tokens):
                probe.advance(token)
                out.append((byte, token, probe.freeze(), probe.is_accepting()))
                probe.rollback(1)
        finally:
            probe.rollback(len(path))
        self._successor_memo[state] = out
        while len(self._successor_memo) > self._successor_cache:
            self._successor_memo.popitem(last=False)
        return out

    def _greedy_bytes(self, probe) -> bytes | None:
        """Depth-first, closing characters first (quotes, brackets, digits, then letters), with
        the full alphabet and a visited set: not shortest, but finds *a* completion where the
        breadth-first phase ran out of states. ``probe`` is restored."""
        seen = {probe.freeze()}
        stack: list[list[tuple[int, int]]] = [self._allowed_bytes(probe, self._dfs_tokens)]
        text = bytearray()
        expanded = 0
        try:
            while stack and expanded < self.max_states:
                options = stack[-1]
                if not options:  # dead end: back up one byte
                    stack.pop()
                    if text:
                        probe.rollback(1)
                        del text[-1]
                    continue
                byte, token = options.pop(0)
                probe.advance(token)
                state = probe.freeze()
                if state in seen:
                    probe.rollback(1)
                    continue
                seen.add(state)
                expanded += 1
                text.append(byte)
                if probe.is_accepting():
                    return bytes(text)
                stack.append(self._allowed_bytes(probe, self._dfs_tokens))
            return None
        finally:
            probe.rollback(len(text))

    def _tokenize(self, probe, text: bytes, *, remember: bool = True) -> Completion | None:
        """Greedy longest-allowed-token segmentation of ``text`` from ``probe``'s state.

        Caches the completion of every state passed on the way; ``probe`` is restored.
        """
        tokens: list[int] = []
        states = []
        pos = 0
        try:
            while pos < len(text):
                states.append(probe.freeze())
                for length in range(min(self._longest, len(text) - pos), 0, -1):
                    token = self._pieces.get(text[pos : pos + length])
                    if token is not None and probe.allows(token):
                        probe.advance(token)
                        tokens.append(token)
                        pos += length
                        break
                else:  # a hint that does not fit here (searched texts always do)
                    return None
            if not probe.is_accepting():
                return None
        finally:
            probe.rollback(len(tokens))
        if remember:
            for i, state in enumerate(states):
                self._remember(state, Completion(tuple(tokens[i:])))
        return Completion(tuple(tokens))


@dataclass(frozen=True)
class _Context:
    """Bracket depth of a search path, for the search's byte costs. A lexical heuristic: it
    does not know whether the path starts inside a string (the search may start anywhere), so
    brackets count wherever they are; that only makes a few completions look dearer."""

    depth: int = 0

    def step(self, byte: int) -> tuple[int, _Context]:
        if byte in _OPENERS:
            return 4 << min(self.depth, 16), _Context(self.depth + 1)
        if byte in _CLOSERS:
            return 1, _Context(max(0, self.depth - 1))
        return _FLAT_COST.get(byte, 1), self


#: Backslashes open escapes (JSON's \uXXXX alone spans thousands of states) and are rarely
#: what closing needs.
_FLAT_COST = {0x5C: 8}
_OPENERS = frozenset(b"[{(")
_CLOSERS = frozenset(b"]})")


def _preference(byte: int) -> int:
    """Search order of the depth-first phase: characters that tend to close constructs first."""
    for rank, group in enumerate((b'"', b"}])", b"0123456789", b",:", b"abcdefghijklmnopqrstuvwxyz",
                                  b"ABCDEFGHIJKLMNOPQRSTUVWXYZ", b" ")):
        if byte in group:
            return rank
    return 7 + (byte == 0x5C)
