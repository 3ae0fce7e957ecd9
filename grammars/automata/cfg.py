"""Lower the character-level IR to a terminal-level CFG the parser runs on.

Regular pieces of rules become *terminals* (byte DFAs); the rest becomes productions over
terminals and nonterminals. Small regular rules are inlined into their users first
(``INLINE_BUDGET``); a run of consecutive regular items becomes one terminal, except that a piece
whose DFA is big (``ALONE_STATES``) stays a terminal of its own, shared by every context, and a
bounded repetition of a big item (``REPEATED_ITEM_STATES``) is lowered as a repetition of rules
rather than unrolled. A wholly regular grammar is one terminal (``TerminalCFG.is_single_terminal``,
what ``as_dfa`` needs). The lexing this implies is non-deterministic: the matcher tries every split
of the text into terminals (no maximal munch), so the language is exactly the character-level
one, e.g. ``ws ::= [ \\t\\n]*`` before a literal ``"\\n"`` works.

Normal form produced here, which the LR(0) parser relies on:
- terminals never match the empty string (a nullable regular piece becomes an optional symbol);
- no epsilon productions except through ``start_nullable`` (the empty string is in the language);
- every nonterminal is productive and reachable; equal terminal languages share one terminal id.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import combinations
from typing import Callable

from grammars.automata.frames import Frame, run_frames
from grammars.errors import EmptyLanguageError, GrammarError, LimitExceeded
from grammars.ir import (
    EMPTY,
    Alt,
    Expr,
    Grammar,
    Literal,
    Ref,
    Repeat,
    Seq,
    references,
    seq,
)
from grammars.limits import Limits

__all__ = ["TerminalCFG", "Production", "lower_grammar", "is_terminal", "terminal_index"]

#: A regular rule is inlined into its users when its expanded IR has at most this many nodes;
#: bigger ones stay nonterminals so one huge DFA is never built from many small rules.
INLINE_BUDGET = 1000
#: A piece of a regular run whose DFA has more states than this becomes a terminal of its own
#: (shared by every context) instead of being merged with its neighbours.
ALONE_STATES = 256
#: A bounded repetition of an item whose DFA has more states than this, big as a whole, is
#: lowered as a repetition of rules (``_Lowering._structural``), not unrolled into one terminal.
REPEATED_ITEM_STATES = 64
#: IR nodes a pre-compiled DFA counts per state in ``_size``. An expression has about 2.5 (a key)
#: to 10 (a string body, a format) nodes per state of its DFA, but a rule inlined with a DFA
#: copies it into every terminal of every alternative it lands in (an any-order object's
#: states), so DFAs count heavier than their expressions did: on the 600-file MaskBench sample,
#: 16-32 gave TTFM p50 19-21 ms and TBM p99 0.9-1.05 ms, 8 gave 24 ms, 4 (about the
#: expressions' own weight) 26 ms; counting a DFA as one node built 2,400-state terminals
DFA_STATE_NODES = 32
#: Alternatives are compiled to test their size only from this many IR nodes on.
ALONE_MIN_SIZE = 64
#: A production with more nullable symbols than this is split before epsilon elimination,
#: which otherwise emits 2**k variants.
MAX_NULLABLE_PER_PRODUCTION = 4


def is_terminal(symbol: int) -> bool:
    """Symbols are ints: nonterminals are >= 0, terminal ``i`` is encoded as ``~i`` (< 0)."""
    return symbol < 0


def terminal_index(symbol: int) -> int:
    return ~symbol


@dataclass(frozen=True)
class Production:
    lhs: int
    rhs: tuple[int, ...]


@dataclass(frozen=True, eq=False)
class TerminalCFG:
    """The normalised grammar: terminals as byte DFAs, productions over symbol ints."""

    terminals: tuple  # tuple[ByteDFA, ...]
    terminal_exprs: tuple[Expr, ...]
    productions: tuple[Production, ...]
    nonterminal_names: tuple[str, ...]
    start: int  # nonterminal; -1 when the language is {""} (start_nullable) or empty
    start_nullable: bool

    @property
    def accepts_nothing(self) -> bool:
        """The language is empty (only built when the caller allowed it)."""
        return self.start < 0 and not self.start_nullable

    @property
    def is_single_terminal(self) -> bool:
        """True when the language is one terminal (optionally plus ""): a regular constraint."""
        # every production a unit production over the one terminal: chains such as S -> A,
        # A -> T (what a nullable regular start lowers to) derive exactly T's language, as every
        # symbol is productive and reachable
        return (
            len(self.terminals) == 1
            and self.start >= 0
            and all(len(p.rhs) == 1 for p in self.productions)
        )


def lower_grammar(grammar: Grammar, limits: Limits, compile_dfa: Callable[[Expr], object], *,
                  allow_empty: bool = False) -> TerminalCFG:
    """IR grammar -> normalised terminal-level CFG. ``compile_dfa`` maps a regular Expr to a ByteDFA.

    A grammar that accepts no string raises ``EmptyLanguageError`` unless ``allow_empty``; then
    its CFG has no start symbol and no productions, and its matchers allow nothing.
    """
    return _Lowering(grammar, limits, compile_dfa, allow_empty).run()


class _Lowering:
    def __init__(self, grammar: Grammar, limits: Limits, compile_dfa: Callable[[Expr], object], allow_empty: bool):
        self.allow_empty = allow_empty
        self.rules = grammar.rule_map()
        self.start_name = grammar.start
        self.limits = limits
        self.compile_dfa = compile_dfa
        if self.start_name not in self.rules:
            raise GrammarError(f"start rule {self.start_name!r} is not defined")
        for name, expr in self.rules.items():
            for ref in self._refs(expr):
                if ref not in self.rules:
                    raise GrammarError(f"rule {name!r} refers to undefined rule {ref!r}")
        self.inlinable = self._find_inlinable()
        # a wholly regular grammar stays one terminal (its token DFA is what regex users get)
        self.split_runs = self.start_name not in self.inlinable
        self._expanded: dict[str, Expr] = {}
        self._expansions: dict[Expr, Expr] = {}
        self._regular: dict[int, tuple[Expr, bool]] = {}
        self.nt_names: list[str] = []
        self.nt_index: dict[object, int] = {}
        self.productions: list[Production] = []
        self.terminals: list[object] = []
        self.terminal_exprs: list[Expr] = []
        self.terminal_by_key: dict[bytes, int] = {}
        self.dfa_cache: dict[Expr, object] = {}
        self.symbol_cache: dict[Expr, int | None] = {}
        self._big_pieces: dict[Expr, bool] = {}
        self._runs_seen: dict[tuple[int, ...], tuple[tuple[Expr, ...], tuple[int, ...] | None]] = {}
        self._structural_pieces: dict[Expr, bool] = {}

    # --- which rules are regular and small enough to inline -------------------------------

    def _find_inlinable(self) -> set[str]:
        sizes: dict[str, int] = {}
        state: dict[str, int] = {}  # 0 visiting, 1 done
        inlinable: set[str] = set()

        def visit(name: str) -> Frame:  # a frame (``run_frames``): rules may nest thousands deep
            expr = self.rules[name]
            refs = self._refs(expr)
            ok = True
            for ref in refs:  # visit every reference
                if state.get(ref) == 1:
                    ok = ok and ref in inlinable
                elif state.get(ref) == 0:
                    ok = False  # recursion: not regular
                else:
                    state[ref] = 0
                    ok = (yield visit(ref)) and ok
            state[name] = 1
            if ok:  # sized only now: most rules of a big grammar refer to a rule that is not inlinable
                size = _size(expr, INLINE_BUDGET) + sum(sizes[ref] for ref in refs)  # only "within the budget?" matters
                sizes[name] = size
                if size <= INLINE_BUDGET:
                    inlinable.add(name)
            return name in inlinable

        for name in self.rules:
            if name not in state:
                state[name] = 0
                run_frames(visit(name))
        return inlinable

    def _refs(self, expr: Expr) -> tuple[str, ...]:
        """Names of the rules ``expr`` refers to (``ir.references``: cached on the nodes, so the
        big subtrees rules share, string encodings, are walked once per process)."""
        return references(expr)

    def _is_regular(self, expr: Expr) -> bool:
        """Memoised by identity (asked for every item of every alternative; an Expr key would
        run the nodes' Python ``__hash__``); the value keeps ``expr`` alive, so ids stay unique."""
        hit = self._regular.get(id(expr))
        if hit is None:
            hit = self._regular[id(expr)] = (expr, all(ref in self.inlinable for ref in self._refs(expr)))
        return hit[1]

    def _expand(self, expr: Expr) -> Expr:
        """Inline every (inlinable) reference, giving a Ref-free regular expression.

        Memoised, so one sub-expression expands to one object: cache lookups keyed by the
        expansion then compare by identity instead of walking equal trees.
        """
        done = self._expanded_now(expr)
        return done if done is not None else run_frames(self._expand_frame(expr))

    def _expanded_now(self, expr: Expr) -> Expr | None:
        """The expansion of ``expr`` when it needs no walk (a leaf, or memoised); else None."""
        if isinstance(expr, Ref):
            return self._expanded.get(expr.name)
        if not isinstance(expr, (Seq, Alt, Repeat)):
            return expr
        return self._expansions.get(expr)

    def _expand_frame(self, expr: Expr) -> Frame:
        if isinstance(expr, Ref):
            body = self.rules[expr.name]
            cached = self._expanded_now(body)
            if cached is None:
                cached = yield self._expand_frame(body)
            self._expanded[expr.name] = cached
            return cached
        if isinstance(expr, Repeat):
            item = self._expanded_now(expr.item)
            if item is None:
                item = yield self._expand_frame(expr.item)
            out = expr if item is expr.item else Repeat(item, expr.min, expr.max)
        else:
            parts: list[Expr] = []
            for e in expr.items:  # type: ignore[union-attr]
                part = self._expanded_now(e)
                parts.append(part if part is not None else (yield self._expand_frame(e)))
            items = tuple(parts)
            same = all(a is b for a, b in zip(items, expr.items))  # type: ignore[union-attr]
            out = expr if same else type(expr)(items)
        self._expansions[expr] = out
        return out

    # --- building symbols ------------------------------------------------------------------

    def _nonterminal(self, key: object, name: str) -> tuple[int, bool]:
        """Index for ``key``; the bool says whether it is new (its productions must be added)."""
        idx = self.nt_index.get(key)
        if idx is not None:
            return idx, False
        idx = len(self.nt_names)
        self.nt_index[key] = idx
        self.nt_names.append(name)
        return idx, True

    def _add(self, lhs: int, rhs: tuple[int, ...] | None) -> None:
        if rhs is None:  # contains a symbol with an empty language
            return
        self.productions.append(Production(lhs, rhs))
        if len(self.productions) > self.limits.max_productions:
            raise LimitExceeded("max_productions", self.limits.max_productions)

    def _terminal_symbols(self, expr: Expr) -> tuple[int, ...] | None:
        """A regular piece as 0 or 1 symbols; None when its language is empty."""
        if expr == EMPTY:
            return ()
        if expr in self.symbol_cache:
            sym = self.symbol_cache[expr]
            return None if sym is None else ((sym,) if sym != _EPSILON else ())
        from grammars.automata.byte_dfa import (
            nonempty,  # local: avoid import cycle at load
        )

        dfa = self.compile_dfa(self._expand(expr))
        if dfa.is_empty_language:
            self.symbol_cache[expr] = None
            return None
        core = nonempty(dfa) if dfa.accepts_empty else dfa
        if core.is_empty_language:  # language is exactly {""}
            self.symbol_cache[expr] = _EPSILON
            return ()
        tid = self.terminal_by_key.get(core.key)
        if tid is None:
            tid = len(self.terminals)
            self.terminals.append(core)
            self.terminal_exprs.append(expr)
            self.terminal_by_key[core.key] = tid
        sym = ~tid
        if dfa.accepts_empty:  # optional terminal: T? as a helper nonterminal
            nt, new = self._nonterminal(("opt", tid), f"<{tid}>?")
            if new:
                self._add(nt, (sym,))
                self._add(nt, ())
            sym = nt
        self.symbol_cache[expr] = sym
        return (sym,)

    def _symbols_now(self, expr: Expr) -> tuple[int, ...] | None | object:
        """``expr``'s symbols when they need no frame of their own, else ``_LATER``: a regular
        leaf, a regular expression lowered before, or a rule already numbered. The states of an
        any-order object are thousands of rules whose items are mostly these; a generator
        frame each cost most of their lowering."""
        if self._is_regular(expr):
            if isinstance(expr, (Seq, Ref, Repeat, Alt)):
                return self._run_symbols_now([expr])
            return self._terminal_symbols(expr)
        if isinstance(expr, Ref):
            nt = self.nt_index.get(("rule", expr.name))
            return (nt,) if nt is not None else _LATER
        if isinstance(expr, Seq):  # as ``_symbols`` lowers a sequence, without frames
            out: list[int] = []
            run: list[Expr] = []
            for item in (*expr.items, None):
                if item is not None and self._is_regular(item):
                    run.append(item)
                    continue
                if run:
                    piece = self._run_symbols_now(run)
                    if piece is None or piece is _LATER:
                        return piece
                    out.extend(piece)  # type: ignore[arg-type]
                    run = []
                if item is not None:
                    piece = self._symbols_now(item)
                    if piece is None or piece is _LATER:
                        return piece
                    out.extend(piece)  # type: ignore[arg-type]
            return tuple(out)
        return _LATER

    def _run_symbols_now(self, run: list[Expr]) -> tuple[int, ...] | None | object:
        """``_run_symbols``' memoised value for ``run``, else ``_LATER``."""
        hit = self._runs_seen.get(tuple(map(id, run)))
        return hit[1] if hit is not None else _LATER

    def _run_symbols(self, run: list[Expr]) -> Frame:  # -> tuple[int, ...] | None
        """``_run_symbols_of``, memoised by the identity of the run's items: the states of an
        any-order object repeat the same runs (a comma and a member) thousands of times, each
        as a new list of the same objects. The value keeps the items alive, so ids stay unique."""
        key = tuple(map(id, run))
        hit = self._runs_seen.get(key)
        if hit is None:
            symbols = yield self._run_symbols_of(run)
            hit = self._runs_seen[key] = (tuple(run), symbols)
        return hit[1]

    def _run_symbols_of(self, run: list[Expr]) -> Frame:  # -> tuple[int, ...] | None
        """A regular run as terminals: merged, except that big pieces stand alone.

        A piece whose DFA has more than ``ALONE_STATES`` states (a long counted string, the
        complement of many keys) would otherwise be copied into the terminal of every context
        it appears in — each copy determinised, minimised and walked over the vocabulary again.
        A repetition or alternative that holds a big piece (an array of long strings, an
        optional long string) is lowered as rules around it instead (``_structural``): one
        terminal of it would copy the big piece once per repetition or alternative.
        A wholly regular grammar is not split.
        """
        pieces = self._pieces(run) if self.split_runs else []
        if not any(self._structural(p) or self._big(p) for p in pieces):
            return self._terminal_symbols(seq(run))
        # a big piece takes the literals right around it (a string body its quotes): a terminal
        # that may end anywhere inside a token would make every such token a boundary walk. With
        # an unbounded repetition between it and a literal (an unanchored pattern: any* P any*),
        # it takes the repetition and the literal beyond: standing alone, P could end after any
        # character of its loop, and the next terminal was walked from ~240,000 trie nodes (one
        # mask of 140 ms on JsonSchemaStore---kode-ci-build)
        groups: list[list[Expr] | Expr] = [[]]  # terminal groups; a structural piece stands between
        follow = None  # after a big piece: "literal" (one may join it) or "loose" (join up to a literal)
        for p in pieces:
            last: list[Expr] = groups[-1]  # type: ignore[assignment]  # a list after every step
            if self._structural(p):
                groups.append(p)
                groups.append([])
                follow = None
            elif self._big(p):
                k = len(last)
                while k and not isinstance(last[k - 1], Literal):
                    k -= 1
                if any(_loose(q) for q in last[k:]):  # back to the nearest literal, which joins too
                    cut = max(k - 1, 0)
                    before = last[cut:]
                    del last[cut:]
                else:
                    before = last[-1:] if last and isinstance(last[-1], Literal) else []
                    if before:
                        last.pop()
                groups.append(before + [p])
                groups.append([])
                follow = "literal"
            elif follow is not None and not last and (isinstance(p, Literal) or _loose(p) or follow == "loose"):
                groups[-2].append(p)  # type: ignore[union-attr]
                follow = None if isinstance(p, Literal) else "loose"
            else:
                last.append(p)
                follow = None
        out: list[int] = []
        for group in groups:
            if isinstance(group, list):
                if not group:
                    continue
                sym = self._terminal_symbols(seq(group))
            else:
                sym = yield self._structural_symbols(group)
            if sym is None:
                return None
            out.extend(sym)
        return tuple(out)

    def _structural(self, piece: Expr) -> bool:
        """A regular repetition or alternative with a big piece inside its item or alternatives,
        or many copies of a sizeable item (memoised): lowered as rules, the big piece or the
        item a terminal of its own."""
        if not self.split_runs or not isinstance(piece, (Repeat, Alt)):
            return False
        hit = self._structural_pieces.get(piece)
        return hit if hit is not None else run_frames(self._structural_frame(piece))

    def _structural_frame(self, piece: Expr) -> Frame:
        if not self.split_runs or not isinstance(piece, (Repeat, Alt)):
            return False
        hit = self._structural_pieces.get(piece)
        if hit is None:
            items = (piece.item,) if isinstance(piece, Repeat) else piece.items
            hit = False
            for item in items:
                if (yield self._holds_big(item)):
                    hit = True
                    break
            if not hit and isinstance(piece, Repeat) and piece.max is not None and piece.max > 1:
                # many copies of a sizeable item (an array of up to 200 fixed-length strings)
                states = getattr(self.compile_dfa(self._expand(piece.item)), "n_states", 0)
                hit = states > REPEATED_ITEM_STATES and states * piece.max > ALONE_STATES
            self._structural_pieces[piece] = hit
        return hit

    def _holds_big(self, expr: Expr) -> Frame:  # -> bool
        for q in self._pieces([expr]):
            if (yield self._structural_frame(q)):
                return True
            if isinstance(q, Alt) or (isinstance(q, Repeat) and q.max is None):
                continue  # many small alternatives, or a loop: big only as a whole, not holding
            if self._big(q):
                return True
        return False

    def _structural_symbols(self, piece: Expr) -> Frame:  # -> tuple[int, ...] | None
        return self._repeat(piece) if isinstance(piece, Repeat) else self._alt(piece)  # type: ignore[arg-type]

    def _alt(self, expr: Alt) -> Frame:  # -> tuple[int, ...]
        """An alternative as a nonterminal with one production per branch."""
        nt, new = self._nonterminal(("alt", expr), "<alt>")
        if new:
            for item in expr.items:
                symbols = self._symbols_now(item)
                self._add(nt, symbols if symbols is not _LATER else (yield self._symbols(item)))
        return (nt,)

    def _pieces(self, run: list[Expr]) -> list[Expr]:
        """The items of a run with inlined references and nested sequences flattened."""
        out: list[Expr] = []
        stack = list(reversed(run))
        while stack:
            e = stack.pop()
            if isinstance(e, (Ref, Repeat, Alt)):
                e = self._expand(e)
            if isinstance(e, Seq):
                stack.extend(reversed(e.items))
            else:
                out.append(e)
        return out

    def _big(self, piece: Expr) -> bool:
        """Memoised per piece: every run containing a piece asks, and sizing an Alt walks it."""
        hit = self._big_pieces.get(piece)
        if hit is None:
            sized = piece
            if isinstance(piece, Repeat) or (isinstance(piece, Alt) and _size(piece, ALONE_MIN_SIZE) > ALONE_MIN_SIZE):
                sized = self.compile_dfa(piece)  # memoised; a terminal containing it reuses it
            hit = self._big_pieces[piece] = getattr(sized, "n_states", 0) > ALONE_STATES
        return hit

    def _symbols(self, expr: Expr) -> Frame:  # -> tuple[int, ...] | None
        """``expr`` as a sequence of symbols; None when its language is empty.

        This and the methods it calls that lead back to it (``_rule``, ``_alt``, ``_repeat``,
        ``_run_symbols``) are frames for ``run_frames``: rules and expressions may nest
        thousands of levels deep, and each level is a generator on the heap, not a Python frame."""
        if self._is_regular(expr):
            if isinstance(expr, (Seq, Ref, Repeat, Alt)):
                return (yield self._run_symbols([expr]))
            return self._terminal_symbols(expr)
        if isinstance(expr, Ref):
            return ((yield self._rule(expr.name)),)
        if isinstance(expr, Seq):
            out: list[int] = []
            run: list[Expr] = []
            for item in expr.items:
                if self._is_regular(item):
                    run.append(item)
                    continue
                if run:
                    piece = self._run_symbols_now(run)
                    if piece is _LATER:
                        piece = yield self._run_symbols(run)
                    if piece is None:
                        return None
                    out.extend(piece)
                    run = []
                piece = self._symbols_now(item)
                if piece is _LATER:
                    piece = yield self._symbols(item)
                if piece is None:
                    return None
                out.extend(piece)
            if run:
                piece = self._run_symbols_now(run)
                if piece is _LATER:
                    piece = yield self._run_symbols(run)
                if piece is None:
                    return None
                out.extend(piece)
            return tuple(out)
        if isinstance(expr, Alt):
            return (yield self._alt(expr))
        if isinstance(expr, Repeat):
            return (yield self._repeat(expr))
        raise GrammarError(f"unexpected IR node {expr!r}")  # pragma: no cover - exhaustive

    def _repeat(self, expr: Repeat) -> Frame:  # -> tuple[int, ...] | None
        body = yield self._symbols(expr.item)
        if body is None:
            return () if expr.min == 0 else None
        if not body:
            return ()
        item_nt, new = self._nonterminal(("item", expr.item), "<item>")
        if new:
            self._add(item_nt, body)
        if expr.max is None:
            star, new = self._nonterminal(("star", expr.item), "<star>")
            if new:  # left recursion keeps LR stacks flat
                self._add(star, ())
                self._add(star, (star, item_nt))
            return (item_nt,) * expr.min + (star,)
        optional_tail: tuple[int, ...] = ()
        prev: int | None = None
        for k in range(1, expr.max - expr.min + 1):
            nt, new = self._nonterminal(("upto", expr.item, k), f"<upto{k}>")
            if new:
                self._add(nt, ())
                self._add(nt, (item_nt,) + ((prev,) if prev is not None else ()))
            prev = nt
        if prev is not None:
            optional_tail = (prev,)
        return (item_nt,) * expr.min + optional_tail

    def _rule(self, name: str) -> Frame:  # -> int
        nt, new = self._nonterminal(("rule", name), name)
        if new:
            expr = self.rules[name]
            alts = expr.items if isinstance(expr, Alt) and not self._is_regular(expr) else (expr,)
            for item in alts:
                symbols = self._symbols_now(item)
                self._add(nt, symbols if symbols is not _LATER else (yield self._symbols(item)))
        return nt

    # --- normalisation -------------------------------------------------------------------

    def run(self) -> TerminalCFG:
        start = run_frames(self._rule(self.start_name))
        prods, nullable = _split_nullable_heavy(self.productions, len(self.nt_names), self.nt_names)
        prods = _eliminate_epsilon(prods, nullable, self.limits)
        productive = _productive(prods)
        start_nullable = start in nullable
        if start not in productive:
            if not start_nullable and not self.allow_empty:
                raise EmptyLanguageError(f"grammar rooted at {self.start_name!r} accepts no string")
            return TerminalCFG(tuple(self.terminals), tuple(self.terminal_exprs), (), tuple(self.nt_names), -1,
                               start_nullable)
        prods = [p for p in prods if all(s < 0 or s in productive for s in p.rhs)]  # s < 0: a terminal
        prods = _reachable(prods, start)
        return TerminalCFG(
            terminals=tuple(self.terminals),
            terminal_exprs=tuple(self.terminal_exprs),
            productions=tuple(prods),
            nonterminal_names=tuple(self.nt_names),
            start=start,
            start_nullable=start_nullable,
        )


_EPSILON = object()
_LATER = object()  # ``_symbols_now``: the symbols need a frame


def _loose(piece: Expr) -> bool:
    """An unbounded repetition: a lexeme may end anywhere along it."""
    return isinstance(piece, Repeat) and piece.max is None


def _size(expr: Expr, cap: int | None = None) -> int:
    """IR nodes of ``expr`` with bounded repetitions unrolled (up to 64 copies); with ``cap``, any
    value above ``cap`` once the count passes it.

    A pre-compiled ``ByteDFA`` is one node but counts ``DFA_STATE_NODES`` per state (one of 32
    states or more is over the inlining budget): a rule inlined with it into an alternative (an
    any-order object's next member) would copy it into one terminal per alternative instead of
    standing alone (``_run_symbols``)."""
    total = 0
    stack: list[tuple[Expr, int]] = [(expr, 1)]
    while stack:
        e, weight = stack.pop()
        total += weight
        if cap is not None and total > cap:
            return total
        if isinstance(e, (Seq, Alt)):
            stack.extend((item, weight) for item in e.items)
        elif isinstance(e, Repeat):
            copies = e.max if e.max is not None else max(e.min, 1)
            stack.append((e.item, weight * max(1, min(copies, 64))))
        elif isinstance(e, Literal):
            total += weight * len(e.text)
        elif hasattr(e, "n_states"):
            total += weight * (e.n_states * DFA_STATE_NODES - 1)
    return total


def _derivable(prods: list[Production], *, through_terminals: bool) -> set[int]:
    """The nonterminals with a production whose every symbol is derivable, terminals counting
    as derivable when ``through_terminals`` (productive) and never otherwise (nullable).

    A worklist with one counter per production, linear in the grammar: a round-robin fixpoint
    makes one pass over every production per level of the longest derivation chain, and the
    states of an any-order object chain through every subset."""
    waiting: dict[int, list[int]] = {}  # nonterminal -> productions, once per occurrence
    missing: list[int] = []
    ready: list[int] = []
    for i, p in enumerate(prods):
        nonterminals = [s for s in p.rhs if s >= 0]  # ``is_terminal`` inline: every symbol of the grammar
        if not through_terminals and len(nonterminals) < len(p.rhs):
            missing.append(-1)  # holds a terminal: never empty
            continue
        missing.append(len(nonterminals))
        for s in nonterminals:
            waiting.setdefault(s, []).append(i)
        if not nonterminals:
            ready.append(p.lhs)
    derived: set[int] = set()
    while ready:
        nt = ready.pop()
        if nt in derived:
            continue
        derived.add(nt)
        for i in waiting.get(nt, ()):
            missing[i] -= 1
            if missing[i] == 0:
                ready.append(prods[i].lhs)
    return derived


def _nullable(prods: list[Production]) -> set[int]:
    return _derivable(prods, through_terminals=False)


def _split_nullable_heavy(prods: list[Production], n_nt: int,
                          names: list[str]) -> tuple[list[Production], set[int]]:
    """Split productions with many possibly-nullable symbols so epsilon elimination stays linear;
    the productions and their nullable nonterminals."""
    nullable = _nullable(prods)

    def heavy(p: Production) -> bool:
        return len(p.rhs) > 2 and sum(1 for s in p.rhs if s >= 0 and s in nullable) > MAX_NULLABLE_PER_PRODUCTION

    if not any(map(heavy, prods)):
        return prods, nullable
    out: list[Production] = []
    next_nt = n_nt
    work = list(prods)
    while work:
        p = work.pop()
        if not heavy(p):  # against the nullable set as it stands after the splits so far
            out.append(p)
            continue
        half = len(p.rhs) // 2
        helper = next_nt
        next_nt += 1
        names.append("<split>")
        work.append(Production(p.lhs, p.rhs[:half] + (helper,)))
        work.append(Production(helper, p.rhs[half:]))
        nullable = _nullable(work + out)
    out.reverse()
    return out, nullable


def _eliminate_epsilon(prods: list[Production], nullable: set[int], limits: Limits) -> list[Production]:
    seen: set[tuple[int, tuple[int, ...]]] = set()  # (lhs, rhs): a tuple hashes in C, a Production in Python
    out: list[Production] = []
    for p in prods:
        positions = [i for i, s in enumerate(p.rhs) if s >= 0 and s in nullable]
        for r in range(len(positions) + 1):
            for drop in combinations(positions, r):
                rhs = tuple(s for i, s in enumerate(p.rhs) if i not in drop) if drop else p.rhs
                if not rhs or rhs == (p.lhs,) or (p.lhs, rhs) in seen:
                    continue
                seen.add((p.lhs, rhs))
                out.append(p if rhs is p.rhs else Production(p.lhs, rhs))
                if len(out) > limits.max_productions:
                    raise LimitExceeded("max_productions", limits.max_productions)
    return out


def _productive(prods: list[Production]) -> set[int]:
    return _derivable(prods, through_terminals=True)


def _reachable(prods: list[Production], start: int) -> list[Production]:
    by_lhs: dict[int, list[Production]] = {}
    for p in prods:
        by_lhs.setdefault(p.lhs, []).append(p)
    seen = {start}
    stack = [start]
    while stack:
        nt = stack.pop()
        for p in by_lhs.get(nt, ()):
            for s in p.rhs:
                if s >= 0 and s not in seen:  # a nonterminal (``is_terminal`` inline)
                    seen.add(s)
                    stack.append(s)
    return [p for p in prods if p.lhs in seen]
