"""The grammar IR every front end produces: character-level expressions over Unicode code points.

A ``Grammar`` maps rule names to ``Expr`` trees. Its meaning is a set of byte strings: characters
are encoded as UTF-8, and the language is exactly what a character-level CFG (no lexer, no maximal
munch) derives. Front ends (regex, GBNF, Lark, JSON Schema) are pure functions to this IR; the
compiler decides what becomes a lexer terminal and what a parser rule.

All nodes are frozen and hashable, so a grammar can key caches by value.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from itertools import chain
from typing import Callable, ClassVar, Iterable, Union

__all__ = [
    "MAX_CODE_POINT",
    "Expr",
    "Chars",
    "Literal",
    "Seq",
    "Alt",
    "Repeat",
    "Ref",
    "EMPTY",
    "NOTHING",
    "Grammar",
    "chars",
    "literal",
    "seq",
    "alt",
    "repeat",
    "optional",
    "references",
]

MAX_CODE_POINT = 0x10FFFF


def _normalize(ranges: Iterable[tuple[int, int]]) -> tuple[tuple[int, int], ...]:
    """Sort, merge, clip to valid scalar values and cut out the surrogate block."""
    pieces: list[tuple[int, int]] = []
    for lo, hi in ranges:
        lo, hi = max(0, int(lo)), min(MAX_CODE_POINT, int(hi))
        if lo > hi:
            continue
        # remove surrogates D800-DFFF
        if hi < 0xD800 or lo > 0xDFFF:
            pieces.append((lo, hi))
        else:
            if lo < 0xD800:
                pieces.append((lo, 0xD7FF))
            if hi > 0xDFFF:
                pieces.append((0xE000, hi))
    pieces.sort()
    merged: list[tuple[int, int]] = []
    for lo, hi in pieces:
        if merged and lo <= merged[-1][1] + 1:
            if hi > merged[-1][1]:
                merged[-1] = (merged[-1][0], hi)
        else:
            merged.append((lo, hi))
    return tuple(merged)


class _Node:
    """Structural equality and hashing with the hash cached on the node.

    Expression trees are deep and shared (a JSON string token is hundreds of nodes) and serve
    as cache keys everywhere; a recomputed dataclass hash cost ~0.1 ms per lookup. The cached
    hash is left out of pickles: string hashes differ between processes. Hashing and comparing
    walk the tree with explicit stacks, so an expression may nest deeper than Python's recursion
    limit.
    """

    _names: ClassVar[tuple[str, ...]] = ()

    def __hash__(self) -> int:
        h = self.__dict__.get("_hash")
        if h is None:
            h = _hash_tree(self)
        return h

    def __eq__(self, other: object) -> bool:
        if self is other:
            return True
        if type(other) is not type(self):
            return NotImplemented
        return _equal_trees(self, other)  # type: ignore[arg-type]

    def __getstate__(self) -> dict:
        return {n: self.__dict__[n] for n in self._names}


def _children(node: _Node) -> tuple:
    """The values below ``node`` that may be nodes: a sequence's or alternative's items, a
    repetition's item (other fields hold text, code-point ranges and counts)."""
    d = node.__dict__
    if "items" in d:
        return d["items"]
    if "item" in d:
        return (d["item"],)
    return ()


def _hash_tree(root: _Node) -> int:
    """The hash of ``root``: a hash of its fields, its children by their cached hashes, so an
    expression nested deeper than Python's recursion limit hashes too (a plain ``hash`` of nested
    tuples recurses once per level)."""
    return _cached_bottom_up(root, "_hash", _own_hash)


def _own_hash(node: _Node) -> int:
    return hash((type(node), *[node.__dict__[n] for n in node._names]))


_NO_REFERENCES: tuple[str, ...] = ()


def references(expr: object) -> tuple[str, ...]:
    """The names of the rules ``expr`` refers to (``Ref`` nodes below it, rules not followed), in
    order of first occurrence.

    Cached on each node like its hash: the front end orders rules by them and the lowering asks
    them of every rule and item, and the big subtrees that expressions share (a string's
    encodings, built once per process) hold none."""
    if not isinstance(expr, _Node):
        return _NO_REFERENCES
    cached = expr.__dict__.get("_refs")
    return cached if cached is not None else _cached_bottom_up(expr, "_refs", _own_references)  # type: ignore[return-value]


def _own_references(node: _Node) -> tuple[str, ...]:
    if isinstance(node, Ref):
        return (node.name,)
    found = [k.__dict__["_refs"] for k in _children(node) if isinstance(k, _Node) and k.__dict__["_refs"]]
    if not found:
        return _NO_REFERENCES
    if len(found) == 1:
        return found[0]
    return tuple(dict.fromkeys(chain.from_iterable(found)))


def _derived(node: Seq | Alt) -> Seq | Alt:
    """``node`` with its hash and references cached now, from its items'.

    The constructors build bottom-up, so the items have theirs (or compute them with their own
    walk): one step here replaces a ``_cached_bottom_up`` walk later, which re-checks every item
    for each of the thousands of states of an object's member automaton."""
    d = node.__dict__
    for item in d["items"]:
        references(item)  # cached on the item (a walk only for an item built without the constructors)
    d["_hash"] = _own_hash(node)
    d["_refs"] = _own_references(node)
    return node


def _cached_bottom_up(root: _Node, key: str, compute: Callable[[_Node], object]) -> object:
    """``compute(node)`` for ``root`` and every node below it that lacks ``key``, children first,
    each kept in the node's dictionary under ``key`` (a derived value: past the frozen
    ``__setattr__``; ``__getstate__`` leaves it out of pickles). An explicit stack: expressions
    nest deeper than Python's recursion limit."""
    stack = [root]
    while stack:
        node = stack[-1]
        d = node.__dict__
        if key in d:
            stack.pop()
            continue
        pending = [k for k in _children(node) if isinstance(k, _Node) and key not in k.__dict__]
        if pending:
            stack.extend(pending)
            continue
        stack.pop()
        d[key] = compute(node)
    return root.__dict__[key]


def _equal_trees(x: _Node, y: _Node) -> bool:
    """Structural equality of two nodes of one type, with an explicit stack (trees may nest
    deeper than Python's recursion limit).

    Equal trees built separately are compared again and again as cache keys: once found equal,
    each pair is linked (``_same_as``), so the next comparison of either (or of a parent holding
    them) stops at once."""
    found: list[tuple[_Node, _Node]] = []
    stack = [(x, y)]
    while stack:
        a, b = stack.pop()
        a, b = _representative(a), _representative(b)
        if a is b:
            continue
        if hash(a) != hash(b):
            return False
        d, e = a.__dict__, b.__dict__
        for n in a._names:
            u, v = d[n], e[n]
            if n == "items":
                if len(u) != len(v):
                    return False
                for p, q in zip(u, v):
                    if p is q:
                        continue
                    if isinstance(p, _Node) and type(p) is type(q):
                        stack.append((p, q))
                    elif not p == q:
                        return False
            elif n == "item" and isinstance(u, _Node) and type(u) is type(v):
                stack.append((u, v))
            elif not u == v:
                return False
        found.append((a, b))
    for a, b in found:  # every pair is equal: link each to one representative (never in a cycle)
        a, b = _representative(a), _representative(b)
        if a is not b:
            b.__dict__["_same_as"] = a
    return True


def _representative(node: _Node) -> _Node:
    """The node at the end of ``_same_as`` links: one per set of nodes found equal."""
    nxt = node.__dict__.get("_same_as")
    while nxt is not None:
        node = nxt
        nxt = node.__dict__.get("_same_as")
    return node


@dataclass(frozen=True, eq=False)
class Chars(_Node):
    """One character from a set of code points, stored as sorted, disjoint, non-adjacent ranges.

    Surrogates (U+D800–U+DFFF) are never produced: they have no UTF-8 encoding.
    An empty set matches nothing.
    """

    ranges: tuple[tuple[int, int], ...]
    _names = ("ranges",)

    def __post_init__(self) -> None:
        object.__setattr__(self, "ranges", _normalize(self.ranges))

    def complement(self) -> "Chars":
        out: list[tuple[int, int]] = []
        nxt = 0
        for lo, hi in self.ranges:
            if lo > nxt:
                out.append((nxt, lo - 1))
            nxt = hi + 1
        if nxt <= MAX_CODE_POINT:
            out.append((nxt, MAX_CODE_POINT))
        return Chars(tuple(out))

    def union(self, other: "Chars") -> "Chars":
        return Chars(self.ranges + other.ranges)

    def intersection(self, other: "Chars") -> "Chars":
        """One merge of the two sorted range lists (a class meets Python's Unicode ``\\w``,
        hundreds of ranges, in pattern after pattern)."""
        out: list[tuple[int, int]] = []
        x, y = self.ranges, other.ranges
        i = j = 0
        while i < len(x) and j < len(y):
            lo, hi = max(x[i][0], y[j][0]), min(x[i][1], y[j][1])
            if lo <= hi:
                out.append((lo, hi))
            if x[i][1] < y[j][1]:
                i += 1
            else:
                j += 1
        return Chars(tuple(out))

    def contains(self, code_point: int) -> bool:
        return any(lo <= code_point <= hi for lo, hi in self.ranges)

    @property
    def is_empty(self) -> bool:
        return not self.ranges


@dataclass(frozen=True, eq=False)
class Literal(_Node):
    """An exact text (may be empty: the empty string)."""

    text: str
    _names = ("text",)


@dataclass(frozen=True, eq=False)
class Seq(_Node):
    items: tuple["Expr", ...]
    _names = ("items",)


@dataclass(frozen=True, eq=False)
class Alt(_Node):
    items: tuple["Expr", ...]
    _names = ("items",)


@dataclass(frozen=True, eq=False)
class Repeat(_Node):
    """``item`` repeated between ``min`` and ``max`` times (``max=None``: unbounded)."""

    item: "Expr"
    min: int = 0
    max: int | None = None
    _names = ("item", "min", "max")

    def __post_init__(self) -> None:
        if self.min < 0 or (self.max is not None and self.max < self.min):
            raise ValueError(f"bad repetition bounds {{{self.min},{self.max}}}")


@dataclass(frozen=True, eq=False)
class Ref(_Node):
    """A reference to another rule of the same grammar."""

    name: str
    _names = ("name",)


Expr = Union[Chars, Literal, Seq, Alt, Repeat, Ref]

EMPTY: Expr = Literal("")
NOTHING: Expr = Chars(())


@dataclass(frozen=True)
class Grammar:
    """Named rules and a start rule. ``rules`` is a tuple of (name, expr) so the grammar hashes."""

    rules: tuple[tuple[str, Expr], ...]
    start: str
    source: str = field(default="<grammar>", compare=False)

    @classmethod
    def of(cls, rules: dict[str, Expr], start: str, source: str = "<grammar>") -> "Grammar":
        return cls(tuple(rules.items()), start, source)

    def rule_map(self) -> dict[str, Expr]:
        return dict(self.rules)


# --- constructors that simplify as they build --------------------------------------------


def chars(*ranges: tuple[int, int] | str) -> Chars:
    """``chars("a", ("0", "9"))``-style helper: single characters or (lo, hi) pairs."""
    out: list[tuple[int, int]] = []
    for r in ranges:
        if isinstance(r, str):
            out.extend((ord(c), ord(c)) for c in r)
        else:
            lo, hi = r
            out.append((ord(lo) if isinstance(lo, str) else lo, ord(hi) if isinstance(hi, str) else hi))
    return Chars(tuple(out))


def literal(text: str) -> Expr:
    return Literal(text)


def seq(items: Iterable[Expr]) -> Expr:
    flat: list[Expr] = []
    for item in items:
        if isinstance(item, Seq):
            flat.extend(item.items)
        elif type(item) is Literal and not item.text:  # EMPTY, without ``__eq__``'s Python calls
            continue
        elif isinstance(item, Chars) and item.is_empty:
            return NOTHING
        else:
            flat.append(item)
    if not flat:
        return EMPTY
    if len(flat) == 1:
        return flat[0]
    return _derived(Seq(tuple(flat)))


def alt(items: Iterable[Expr]) -> Expr:
    flat: list[Expr] = []
    seen: set[Expr] = set()
    for item in items:
        parts = item.items if isinstance(item, Alt) else (item,)
        for part in parts:
            if isinstance(part, Chars) and part.is_empty:
                continue
            if part not in seen:
                seen.add(part)
                flat.append(part)
    if not flat:
        return NOTHING
    if len(flat) == 1:
        return flat[0]
    return _derived(Alt(tuple(flat)))


def repeat(item: Expr, min: int = 0, max: int | None = None) -> Expr:
    if max == 0:
        return EMPTY
    if min == 1 and max == 1:
        return item
    return Repeat(item, min, max)


def optional(item: Expr) -> Expr:
    return repeat(item, 0, 1)
