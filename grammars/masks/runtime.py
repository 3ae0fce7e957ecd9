"""The shared engine behind every Matcher of one compiled grammar: states, steps and masks.

A match state is a frozenset of *configurations* ``(stack, terminal, dfa_state)``: the parser
stack is waiting for ``terminal``, whose lexeme is in progress in ``dfa_state`` (the DFA start
state when nothing of it is consumed yet). The marker ``ACCEPT`` says the text so far is a
complete sentence. Whenever a terminal's DFA reaches an accepting state the lexeme *may* end
there, so both continuations are kept — lexing is non-deterministic and therefore exact for
character-level grammars.

A stack is a node of the parser's graph-structured stack, standing for every parse through it.
Configurations whose stacks share (top state, terminal, dfa_state) are merged into one node over
the union of their parents (``_merged``): a state holds at most one configuration per such
triple however ambiguous the grammar, and the same parses give the same state whichever order
they were found in.

Masks (docs/ARCHITECTURE.md, "The mask engine"). For a configuration ``(stack, T, s)`` the allowed tokens are
- *inside*: tokens whose bytes keep T's DFA alive from s — a function of (T, s) only, cached
  and shared by every grammar of the same Compiler;
- *boundary*: tokens that end T somewhere inside and continue in the successor configurations
  — a function of (T, s, successor set), cached per grammar. The successor set is interned
  (stacks are hash-consed), so repeated parser contexts hit the cache.
A mask is then the OR of a few cached bitmasks; the whole mask is memoised per state as well.

Every call that parses (``consume``, ``dead_end``, ``mask``) runs under the parser's
``StepClock`` (``Limits.max_step_seconds``); a ``LimitExceeded`` leaves only complete values in
the caches, since each memo is written after its value is whole.
"""

from __future__ import annotations


import numpy as np

from grammars.automata.cfg import TerminalCFG
from grammars.automata.lr import Parser, StackNode
from grammars.bitmask import mask_words, pack_bool
from grammars.errors import LimitExceeded
from grammars.limits import Limits
from grammars.masks.token_walk import PathWalk, WalkCache, tokens_to_words
from grammars.memo import BoundedCache
from grammars.vocab.trie import TokenTrie

__all__ = ["ACCEPT", "MatchState", "GrammarRuntime", "BoundedCache"]

Config = tuple  # (StackNode | None, terminal index, dfa state)
MatchState = frozenset  # frozenset[Config]; hashable snapshot of a matcher

#: The configuration meaning "the input so far is a complete sentence".
ACCEPT: Config = (None, -1, -1)


class GrammarRuntime:
    """Stateless-per-sequence services for matchers: stepping, consuming tokens, masks."""

    def __init__(
        self,
        cfg: TerminalCFG,
        trie: TokenTrie,
        token_bytes: tuple[bytes, ...],
        eos_token_ids: frozenset[int],
        logits_width: int,
        walks: WalkCache,
        limits: Limits,
    ):
        self.cfg = cfg
        self.trie = trie
        self.token_bytes = token_bytes
        self.limits = limits
        self.logits_width = logits_width
        self.words = mask_words(logits_width)
        self.parser = Parser(cfg, limits)
        self.dfas = cfg.terminals
        self._tables = [d.table for d in self.dfas]
        self._accepting = [d.accepting for d in self.dfas]
        self._walks = walks
        eos = np.zeros(logits_width, dtype=bool)
        eos[[t for t in eos_token_ids if 0 <= t < logits_width]] = True
        self.eos_mask = pack_bool(eos, logits_width)
        self.zero_mask = pack_bool(np.zeros(0, dtype=bool), logits_width)
        self.eos_token_ids = eos_token_ids
        cap = limits.max_cache_entries
        # keyed by id(stack); the stack is stored with the value to guard against id reuse
        self._complete_memo: dict[tuple[int, int], tuple[StackNode, MatchState]] = {}
        self._fresh_memo: dict[int, tuple[StackNode, MatchState]] = {}
        self._consume_memo = BoundedCache(cap)
        self._mask_memo = BoundedCache(min(cap, 4096))  # 16 KB a mask at 128k tokens
        self._projected_memo = BoundedCache(min(cap, 4096))
        self._boundary_memo = BoundedCache(min(cap, 4096))
        self._collect_memo = BoundedCache(min(cap, 4096))
        self._dead_start_memo = BoundedCache(min(cap, 1024))
        root_configs = set(self._fresh(self.parser.root))
        if cfg.start_nullable:
            root_configs.add(ACCEPT)
        self.initial: MatchState = frozenset(root_configs)

    # --- parser glue -----------------------------------------------------------------------

    def _fresh(self, stack: StackNode) -> MatchState:
        """Configurations of a stack that has just shifted a terminal: every next terminal at its start.

        A terminal shifted from one node of ``stack``'s reductions is held with that node (the
        stack *as reduced*), not with ``stack``: shifting from it gives the same stacks, and after
        a member of a left-recursive list that node is the same object whatever the list held,
        so equal futures give equal match states and share every memo. A terminal shifted from
        several nodes (an ambiguity not yet resolved) stays with ``stack``: one configuration,
        not one per node.
        """
        hit = self._fresh_memo.get(id(stack))
        if hit is not None and hit[0] is stack:
            return hit[1]
        trans = self.parser.transitions(stack)
        configs = set()
        for t, pairs in trans.shifts.items():
            node = pairs[0][0]
            if any(other is not node for other, _ in pairs):
                node = stack
            configs.add((node, t, self.dfas[t].start))
        if trans.accepts:
            configs.add(ACCEPT)
        result = frozenset(configs)
        if len(self._fresh_memo) > self.limits.max_cache_entries:
            self._fresh_memo.clear()
        self._fresh_memo[id(stack)] = (stack, result)
        return result

    def complete(self, stack: StackNode, terminal: int) -> MatchState:
        """Configurations after the lexeme of ``terminal`` ends on ``stack``."""
        key = (id(stack), terminal)
        hit = self._complete_memo.get(key)
        if hit is not None and hit[0] is stack:
            return hit[1]
        shifted = self.parser.shift(stack, terminal)
        if len(shifted) == 1:
            result = self._fresh(shifted[0])  # one closure's configurations: merged already
        else:
            out: set = set()
            for nxt in shifted:
                out |= self._fresh(nxt)
            result = self._merged(out)
        if len(self._complete_memo) > self.limits.max_cache_entries:
            self._complete_memo.clear()
        self._complete_memo[key] = (stack, result)
        return result

    def _merged(self, configs: set) -> MatchState:
        """``configs`` with those that share (top state, terminal, dfa state) merged into one
        configuration over the union of their stacks' parents: the same linear stacks and the
        same future, in one node (what keeps a state's size independent of the ambiguity)."""
        if len(configs) < 2:
            return frozenset(configs)
        keys = {(stack.state, t, s) for stack, t, s in configs if stack is not None}
        if len(keys) == len(configs) - (ACCEPT in configs):
            return frozenset(configs)
        groups: dict[tuple[int, int, int], list[StackNode]] = {}
        for stack, t, s in configs:
            if stack is not None:
                groups.setdefault((stack.state, t, s), []).append(stack)
        out = {(self.parser.merge(stacks), t, s) for (_, t, s), stacks in groups.items()}
        if ACCEPT in configs:
            out.add(ACCEPT)
        return frozenset(out)

    # --- stepping --------------------------------------------------------------------------

    def step(self, state: MatchState, byte: int) -> MatchState:
        out: set = set()  # bounded work but for the closures of complete(), which check the clock
        for config in state:
            stack, t, s = config
            if stack is None:
                continue
            nxt = int(self._tables[t][s, byte])
            if nxt < 0:
                continue
            out.add((stack, t, nxt))
            if self._accepting[t][nxt]:
                out |= self.complete(stack, t)
        result = self._merged(out)
        if len(result) > self.limits.max_configurations:
            raise LimitExceeded("max_configurations", self.limits.max_configurations)
        return result

    def consume(self, state: MatchState, token: int) -> MatchState:
        """State after the bytes of text token ``token``; empty when the token is not allowed."""
        hit = self._consume_memo.get((state, token))
        if hit is not None:
            return hit
        with self.parser.clock:
            return self._walk_token(state, token)

    def dead_end(self, state: MatchState, token: int) -> list[MatchState] | None:
        """``None`` when text token ``token`` may follow ``state``; otherwise the states its walk
        went through before the byte that is dead: ``path[d]`` after its first ``d`` bytes
        (``path[0]`` is ``state``; the last one is where its next byte cannot follow)."""
        if self._consume_memo.get((state, token)):
            return None
        path: list[MatchState] = []
        with self.parser.clock:
            return None if self._walk_token(state, token, path) else path

    def _walk_token(self, state: MatchState, token: int, path: list[MatchState] | None = None) -> MatchState:
        """The state after the token's bytes (empty once one cannot follow), memoised; ``path``
        collects the non-empty states the walk went through, ``state`` first."""
        cur = state
        for byte in self.token_bytes[token]:
            if path is not None:
                path.append(cur)
            cur = self.step(cur, byte)
            if not cur:
                break
        self._consume_memo.put((state, token), cur)
        return cur

    def dead_start(self, state: MatchState) -> np.ndarray:
        """Ids of the text tokens whose first byte cannot follow ``state`` (read-only, memoised:
        every rejection at a state rules these out, see ``Matcher.check``)."""
        hit = self._dead_start_memo.get(state)
        if hit is None:
            hit = self.trie.tokens_continuing_root(~self.next_bytes(state))
            hit.setflags(write=False)
            self._dead_start_memo.put(state, hit)
        return hit

    def next_bytes(self, state: MatchState) -> np.ndarray:
        """bool[256]: the bytes after which ``state`` is still alive (``step`` is non-empty)."""
        out = np.zeros(256, dtype=bool)
        for stack, t, s in state:
            if stack is not None:
                out |= self._tables[t][s] >= 0
        return out

    def cached_mask(self, state: MatchState) -> np.ndarray | None:
        return self._mask_memo.get(state)

    # --- masks -----------------------------------------------------------------------------

    def mask(self, state: MatchState) -> np.ndarray:
        """Packed allowed-token words for ``state`` (read-only; EOS included when accepting).

        Memoised twice: by the state itself, and by its *walk projection* — DFA states replaced by
        their walk classes (``WalkCache.walk_class``), which the mask depends on only. The second
        memo makes position 10 and position 40 of a ``maxLength: 1000`` string one entry.
        """
        hit = self._mask_memo.get(state)
        if hit is not None:
            return hit
        groups: dict[tuple[int, int], tuple[int, list[StackNode]]] = {}  # (t, class) -> (a state, stacks)
        accepting = False
        for stack, t, s in state:
            if stack is None:
                accepting = True
                continue
            cls = int(self._walks.walk_class(self.dfas[t])[s])
            group = groups.get((t, cls))
            if group is None:
                groups[(t, cls)] = (s, [stack])
            else:
                group[1].append(stack)
        projection = (accepting, frozenset((t, cls, stack) for (t, cls), (_, stacks) in groups.items() for stack in stacks))
        result = self._projected_memo.get(projection)
        if result is None:
            with self.parser.clock:
                result = self._compute_mask(groups, accepting)
            self._projected_memo.put(projection, result)
        self._mask_memo.put(state, result)
        return result

    def _compute_mask(self, groups: dict, accepting: bool) -> np.ndarray:
        parts: list[np.ndarray] = []
        for (t, cls), (s, stacks) in groups.items():
            inside = self._walks.root(self.dfas[t], s)
            parts.append(inside.mask)
            if inside.children_total:
                seen: set[int] = set()
                for stack in stacks:
                    succ = self.complete(stack, t)
                    if id(succ) in seen or not succ:
                        continue
                    seen.add(id(succ))
                    parts.append(self._boundary(t, cls, succ, inside))
        if accepting:
            parts.append(self.eos_mask)
        if not parts:
            return self.zero_mask
        if len(parts) == 1:
            return parts[0]
        result = np.bitwise_or(parts[0], parts[1])
        for part in parts[2:]:
            np.bitwise_or(result, part, out=result)
        result.setflags(write=False)
        return result

    def _boundary(self, terminal: int, walk_class: int, succ: MatchState, inside: PathWalk) -> np.ndarray:
        """Tokens that finish ``terminal`` inside themselves and go on validly from ``succ``.

        A function of the root walk (so of the state's walk class) and the successor configurations.
        """
        key = (terminal, walk_class, succ)
        hit = self._boundary_memo.get(key)
        if hit is not None:
            return hit
        collected: dict[int, np.ndarray] = {}
        self._collect(inside, succ, collected)  # non-empty arrays only
        if collected:
            result = tokens_to_words(np.concatenate(list(collected.values())), self.words)
            result.setflags(write=False)
        else:
            result = self.zero_mask
        self._boundary_memo.put(key, result)
        return result

    def _collect(self, walk: PathWalk, configs: MatchState, out: dict[int, np.ndarray]) -> None:
        """Add the tokens that continue ``walk`` through ``configs`` (recursively across lexemes)
        to ``out``, keyed by the id of their array: an array reached along several parser paths
        is kept once, so the list stays as long as the distinct walks, not the paths.

        Memoised by (where ``walk`` ends, ``configs``): boundaries that miss their own memo (a
        new parser context around the same lexeme) still meet the same nested pairs, about a
        third of the calls on MaskBench files.
        """
        key = (walk.nodes_key(), configs)
        hit = self._collect_memo.get(key)
        if hit is not None:
            out.update((id(array), array) for array in hit)
            return
        self.parser.clock.check()
        found: dict[int, np.ndarray] = {}
        groups: dict[tuple[int, int], list[StackNode]] = {}
        for stack, t, s in configs:
            if stack is not None:
                groups.setdefault((t, s), []).append(stack)
        for (t, s), stacks in groups.items():
            child = self._walks.extend(walk, self.dfas[t], s)
            if child.tokens.shape[0]:
                found[id(child.tokens)] = child.tokens
            if child.children_total:  # some token goes on after this lexeme: ask the parser what may follow
                seen: set[int] = set()
                for stack in stacks:
                    succ = self.complete(stack, t)
                    if succ and id(succ) not in seen:
                        seen.add(id(succ))
                        self._collect(child, succ, found)
        found_tuple = tuple(found.values())
        self._collect_memo.put(key, found_tuple)
        out.update(found)
