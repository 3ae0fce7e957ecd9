"""Objects: ``properties``, ``required``, ``additionalProperties``, ``patternProperties``,
``propertyNames``, ``minProperties``/``maxProperties`` — merged across a conjunction, then laid out.

Merging. Each schema that has ``properties``/``patternProperties``/``additionalProperties``
contributes one ``KeyRule``: its own names, patterns and fallback, because
``additionalProperties`` only speaks about names *that schema* does not list. The value allowed
under a name is the conjunction, over rules, of what each rule says about that name.

Keys. Declared names (and required ones) are *known*: each gets its own member with every JSON
spelling of the name as key. Every other key is *extra*: its value is what the rules say about
unlisted names, and its key language excludes all known names (``string_not_in``), so a known
name can never sneak in as an extra key with the wrong value. Patterns split extra keys into
regions (which patterns match); regions whose keys need a regular-language complement or
intersection are built by ``combinators.key_language``.

Layout. Members are accepted in one order per ``property_order`` (see ``JsonSchemaOptions``),
optional ones may be absent, required ones must appear, extra members may sit between declared
ones, and ``minProperties``/``maxProperties`` count all of them. The language is built as a
small automaton over (position, count, started) states, each state an IR rule, so the size is
linear in the number of properties (times the count bound) and the grammar is unambiguous:
extra members attach to the earliest slot, a skipped optional property is never revisited.
``property_order="any"`` uses subsets of emitted properties as states instead (exact, exponential,
hence ``any_order_limit``); beyond it, subsets of the *required* properties seen, with declared
members free to repeat (``any_order_repeating``: exact for validity, since every occurrence is
checked and a parser keeps one); with more than ``MAX_REPEATING_REQUIRED`` required
properties, positions in one of two orders of the required ones (``required_in_order_repeating``,
a narrowing). Each member and the extra member are rules of their own. Unbounded lists of members
are left-recursive rules where that pays: ``any_order_repeating`` (``member_lists``) and the runs
of extra members before a declared member or the end (``extra_run``), so the parser stack is the
same after each member and masks cached at one member boundary serve the next. (Written so,
``required_in_order_repeating`` kept more parses alive inside members of a ``oneOf`` of such
objects, and any-order states with their own extra members grew a rule each; both stay
right-recursive.) A run of extra members is a rule rather than a ``Repeat``: that
keeps the (large) key automaton of extra keys one parser terminal shared by every state,
instead of a copy inlined into each state's DFA. Duplicate keys are never accepted for known names (except in those
repeating layouts); extra keys cannot be checked for duplicates by a context-free grammar and are not.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from grammars.errors import GrammarError
from grammars.frontends.json_schema import combinators
from grammars.frontends.json_schema.conjunction import (
    OBJECT_KEYWORDS,
    Conjunction,
    KeyRule,
    ObjectRules,
    SchemaContext,
)
from grammars.frontends.json_schema.document import Located, count_keyword
from grammars.ir import NOTHING, Expr, alt, optional, seq

__all__ = ["OBJECT_KEYWORDS", "KeyRule", "ObjectRules", "apply_object_keywords", "object_expr", "object_body"]

#: more states than this in an any-order object falls back to schema order
MAX_ANY_ORDER_STATES = 1 << 12
#: a large any-order object repeats members (``_Automaton.any_order_repeating``) when it has at
#: most this many required properties (2**n states) and no property count bounds
MAX_REPEATING_REQUIRED = 6
#: an any-order object of at most this many subset states (4 properties) is always exact; larger
#: ones draw their states from the schema's ``JsonSchemaOptions.any_order_budget``
FREE_ANY_ORDER_STATES = 16


def apply_object_keywords(c: SchemaContext, conj: Conjunction, part: Located, node: dict) -> None:
    """Merge ``node``'s object keywords into ``conj``."""
    if not OBJECT_KEYWORDS.intersection(node):
        return
    rules = conj.objects
    where = part.where
    if rules.where == "#" and not rules.key_rules and not rules.required:
        rules.where = where
    doc = c.document
    props = node.get("properties", {})
    patterns = node.get("patternProperties", {})
    additional = node.get("additionalProperties")
    for keyword, value in (("properties", props), ("patternProperties", patterns)):
        if not isinstance(value, dict):
            raise GrammarError(f"malformed schema at {where}: {keyword!r} must be an object, got {value!r}")
    if additional is not None and not isinstance(additional, (dict, bool)):
        raise GrammarError(f"malformed schema at {where}: 'additionalProperties' must be a schema, got {additional!r}")
    if props or patterns or (additional is not None and additional is not True and additional != {}):
        rules.key_rules.append(
            KeyRule(
                where,
                {name: doc.child(part, sub, "properties", name) for name, sub in props.items()},
                tuple((p, doc.child(part, sub, "patternProperties", p)) for p, sub in patterns.items()),
                None if additional is None else doc.child(part, additional, "additionalProperties"),
            )
        )
    if "required" in node:
        required = node["required"]
        if not isinstance(required, list) or not all(isinstance(n, str) for n in required):
            raise GrammarError(f"malformed schema at {where}: 'required' must be an array of strings, got {required!r}")
        for name in required:
            rules.required[name] = None
    if "minProperties" in node:
        rules.min_properties = max(rules.min_properties, count_keyword(node["minProperties"], "minProperties", where))
    if "maxProperties" in node:
        high = count_keyword(node["maxProperties"], "maxProperties", where)
        rules.max_properties = high if rules.max_properties is None else min(rules.max_properties, high)
    names = node.get("propertyNames")
    if names is not None and names is not True and names != {}:
        if not isinstance(names, (dict, bool)):
            raise GrammarError(f"malformed schema at {where}: 'propertyNames' must be a schema, got {names!r}")
        rules.property_names.append(doc.child(part, names, "propertyNames"))


# --- the object expression --------------------------------------------------------------------


@dataclass(frozen=True)
class Member:
    name: str
    expr: Expr  # key, colon, value
    required: bool


def object_expr(c: SchemaContext, conj: Conjunction, *, sole: bool = True) -> Expr:
    """The object branch of a leaf conjunction (``sole``: the value's only leaf)."""
    back_references = c.back_references
    rules: ObjectRules = conj.objects
    lay = c.layout
    names: dict[str, None] = {}
    for rule in rules.key_rules:
        names.update(dict.fromkeys(rule.properties))
    names.update(rules.required)
    extra_names, open_extra = _finite_property_names(c, rules, names)
    members: list[Member] = []
    for name in list(names) + extra_names:
        parts = combinators.member_parts(c, rules, name)
        if not parts and name in extra_names and _closed_by_default(c, rules):
            continue
        value = c.value(parts)
        if value != NOTHING and not all(c.satisfies(name, pn) for pn in rules.property_names):
            value = NOTHING
        required = name in rules.required
        if value == NOTHING:
            if required:
                return NOTHING
            continue
        member = c.add_rule(f"{rules.where}@{name}", lay.member(lay.strings((name,)), value))
        members.append(Member(name, member, required))
    known = set(names) | set(extra_names)
    extra = _extra_member(c, rules, known) if open_extra else None
    if extra is not None:  # referenced from every state of the automaton: share it
        extra = c.add_rule(f"{rules.where}@*", extra)
    low, high = rules.min_properties, rules.max_properties
    if high is not None and (low > high or sum(m.required for m in members) > high):
        return NOTHING
    if extra is None and len(members) < low:
        return NOTHING
    low, high = _counted_properties(c, members, extra, low, high, rules.where)
    if extra is not None and low >= 2 and len(members) + 1 < low:
        # meeting the bound needs two or more distinct undeclared keys (see _Automaton)
        c.unsupported("minProperties", rules.where,
                      f"minProperties {low} needs {low - len(members)} distinct undeclared keys; a grammar "
                      "cannot exclude duplicate keys")
        low = 0
    recursive = c.back_references > back_references  # a member's value leads back to an enclosing rule
    body = object_body(c, members, extra, low, high, hint=rules.where, repeat=sole or not recursive,
                       required_order=tuple(rules.required))
    return lay.object(body)


#: largest ``minProperties``/``maxProperties`` that is counted (each count is a state of the
#: member automaton, an IR rule per declared position): a bound every object meets (or none can
#: exceed) is dropped, exactly; beyond it a larger ``maxProperties`` is narrowed to it
#: (reported) and a larger ``minProperties`` raises
MAX_COUNTED_PROPERTIES = 128


def _counted_properties(c: SchemaContext, members: list, extra: Expr | None, low: int, high: int | None,
                        where: str) -> tuple[int, int | None]:
    """``(low, high)`` as the member automaton counts them: a ``minProperties`` the required
    members already meet, or a ``maxProperties`` no object without undeclared members can exceed,
    constrains nothing and is dropped; past ``MAX_COUNTED_PROPERTIES`` the bound is refused
    (``minProperties``) or narrowed (``maxProperties``)."""
    if low <= sum(m.required for m in members):
        low = 0
    if high is not None and extra is None and high >= len(members):
        high = None
    if low > MAX_COUNTED_PROPERTIES:
        c.unsupported("minProperties", where, f"minProperties {_shown(low)} needs more than {MAX_COUNTED_PROPERTIES} "
                      "counted members")
        low = 0  # lenient: dropped, and reported
    if high is not None and high > MAX_COUNTED_PROPERTIES:
        c.narrowed(f"{where}: maxProperties {_shown(high)} accepted only up to {MAX_COUNTED_PROPERTIES} members")
        high = MAX_COUNTED_PROPERTIES
    return low, high


def _shown(value: int) -> str:
    text = str(value)
    return text if len(text) <= 24 else f"{text[:12]}...({len(text)} digits)"


def _closed_by_default(c: SchemaContext, rules: ObjectRules) -> bool:
    return not c.options.additional_properties_default and all(r.additional is None for r in rules.key_rules)


#: a closed object whose patterns match at most this many names gets one declared member per name
MAX_PATTERN_NAMES = 64


def _finite_property_names(c: SchemaContext, rules: ObjectRules, known: dict) -> tuple[list[str], bool]:
    """Undeclared names that can be listed — from a finite ``propertyNames`` enum, or from the
    patterns of a closed object (``additionalProperties: false`` with finite patterns such as
    ``^[a-d]$``) — which then become declared members.

    Pattern names are listed only for ``minProperties`` of 2 or more: declared members appear at
    most once each, so counting them counts distinct keys, which extra members cannot guarantee
    (see ``_Automaton``); otherwise they stay extra members, free to sit anywhere.
    Returns (extra declared names, whether other undeclared keys remain possible)."""
    finite: set | None = None
    for pn in rules.property_names:
        conj = c.conjunction([pn])
        if conj.enum is not None:
            names = {v for v in conj.enum if isinstance(v, str)}
            finite = names if finite is None else finite & names
    by_default = _closed_by_default(c, rules)
    for rule in rules.key_rules if rules.min_properties >= 2 else ():  # only counting needs distinct keys
        if not (by_default or (rule.additional is not None and _forbids_all(rule.additional.node))):
            continue
        names = set(rule.properties)
        for pattern, loc in rule.patterns:
            listed = combinators.pattern_strings(c, pattern, loc.where, MAX_PATTERN_NAMES)
            if listed is None:
                break
            names.update(listed)
        else:
            finite = names if finite is None else finite & names
    if finite is None:
        return [], True
    extra = sorted(n for n in finite if n not in known and all(c.satisfies(n, pn) for pn in rules.property_names))
    return extra, False


def _forbids_all(node: Any) -> bool:
    return node is False or node == combinators.FORBIDDEN


def _extra_member(c: SchemaContext, rules: ObjectRules, known: set[str]) -> Expr | None:
    """One member with an undeclared key (all regions), or None when no such key is allowed."""
    if _closed_by_default(c, rules) and not any(r.patterns for r in rules.key_rules):
        return None
    regions = combinators.key_regions(c, rules, known)
    lay = c.layout
    out = [lay.member(key, value) for key, value in regions if key != NOTHING and value != NOTHING]
    return alt(out) if out else None


# --- layout: the member automaton -------------------------------------------------------------


def object_body(
    c: SchemaContext, members: list[Member], extra: Expr | None, low: int, high: int | None, *, hint: str,
    repeat: bool = True, required_order: tuple[str, ...] = (),
) -> Expr:
    """Members in the configured order, ``low..high`` of them in all, then ``ws`` (or nothing).

    ``repeat``: a large any-order object may use the repeating layouts. Not for one of several
    leaves of a value (``dependencies``, ``anyOf`` expanded) whose members lead back to an
    enclosing rule: the leaves' layouts all stay alive to the object's end, key order no longer
    telling them apart, and through the recursion the live parses multiply with the depth.
    ``required_order``: the names of the ``required`` keyword, in its order (the second order
    ``required_in_order_repeating`` accepts)."""
    order = c.options.property_order
    if order == "any" and len(members) > 1:
        automaton = _Automaton(c, members, extra, low, high, hint)
        states = (1 << len(members)) * len(automaton.counts())
        required = sum(m.required for m in members)
        can_repeat = repeat and low == 0 and high is None and required <= MAX_REPEATING_REQUIRED
        within_limits = len(members) <= c.options.any_order_limit and states <= MAX_ANY_ORDER_STATES
        affordable = states <= FREE_ANY_ORDER_STATES or states <= c.any_order_states_left or not can_repeat
        if within_limits and affordable:
            if states > FREE_ANY_ORDER_STATES:
                c.any_order_states_left = max(0, c.any_order_states_left - states)
            return automaton.any_order()
        if repeat and low == 0 and high is None:
            if can_repeat:
                return automaton.any_order_repeating()
            c.narrowed(f"{hint}: {required} required properties accepted in the order of 'properties' or of "
                       "'required' only (any_order_limit)")
            return automaton.required_in_order_repeating(required_order)
        c.narrowed(f"{hint}: {len(members)} properties accepted in schema order only (any_order_limit)")
    if order == "required_first":
        members = [m for m in members if m.required] + [m for m in members if not m.required]
    return _Automaton(c, members, extra, low, high, hint).in_order()


class _Automaton:
    """States (position or subset, count, started) as IR rules, built from the end backwards.

    ``G`` states choose the next declared member (or the end); ``F`` states may first take extra
    members. Any-order ``S`` states take their own extra members once the count no longer moves
    (their ``F`` states are then the ``S`` states themselves). ``count`` is capped at ``low`` when
    there is no ``high`` (only "enough yet?" matters).
    """

    def __init__(self, c: SchemaContext, members: list[Member], extra: Expr | None, low: int, high: int | None, hint: str):
        self.c = c
        self.lay = c.layout
        self.members = members
        self.extra = extra
        self.low = low
        self.high = high
        self.counted = low > 0 or high is not None
        self.cap = high if high is not None else low
        self.hint = hint
        self.memo: dict = {}
        self._extra_run: Expr | None = None
        #: set by ``any_order``: its states take extra members themselves, ``F`` only counts up to them
        self.states_take_extras = False
        # Extra keys may repeat ({"x":1,"x":2} parses to one property), which no context-free
        # grammar can exclude. Counting them toward maxProperties over-counts (safe); toward
        # minProperties it would accept too few distinct keys. So from a lower bound of 2 on,
        # a count is (all members, declared members + [any extra member]) and only the second
        # meets the lower bound: exact for declared keys, narrowed to one for extra ones.
        self.distinct = extra is not None and low >= 2
        if self.distinct:
            c.narrowed(f"{hint}: minProperties counts at most one undeclared member (duplicate keys cannot be excluded)")

    @property
    def zero(self):
        return (0, 0, 0) if self.distinct else 0

    def counts(self) -> list:
        """Every count state, highest first (the bottom-up construction order)."""
        if not self.counted:
            return [0]
        if not self.distinct:
            return list(range(self.cap, -1, -1))
        totals = range(self.high, -1, -1) if self.high is not None else (0,)
        return [(t, d, x) for t in totals for d in range(self.low, -1, -1) for x in (1, 0)]

    def inc(self, count, extra: bool = False):
        if not self.counted:
            return 0
        if not self.distinct:
            if self.high is not None:
                return count + 1 if count < self.high else None
            return min(count + 1, self.cap)
        total, seen, has_extra = count
        if self.high is not None:
            if total >= self.high:
                return None
            total += 1
        if extra and has_extra:
            return (total, seen, 1)
        seen = min(seen + 1, self.low)
        return (total, seen, 1 if extra or has_extra or seen == self.low else 0)

    def enough(self, count) -> bool:
        return (count[1] if self.distinct else count) >= self.low

    def saturated(self, count) -> bool:
        """Further extra members change nothing: no upper bound, and the lower bound is met (or,
        counting distinct keys, an extra member has already been counted)."""
        if not self.counted:
            return True
        if self.high is not None:
            return False
        return count[2] == 1 if self.distinct else count == self.cap

    @staticmethod
    def label(count) -> str:
        return ".".join(map(str, count)) if isinstance(count, tuple) else str(count)

    def rule(self, key: tuple, expr: Expr) -> Expr:
        out = self.c.add_rule(f"{self.hint}@{'.'.join(map(self.label, key))}", expr)
        self.memo[key] = out
        return out

    def free(self, key: tuple, count: int, started: bool, choose) -> Expr:
        """F: extra members, then the choice ``choose(count, started)``."""
        if self.extra is None:
            return choose(count, started)
        lay = self.lay
        if self.saturated(count) and self.states_take_extras:
            # the state takes its extra members itself (``g_any``)
            return choose(count, True) if started else alt([seq([self.extra, choose(count, True)]), choose(count, False)])
        if self.saturated(count):
            # F = (", X")* G, the run being the object's ``extra_run`` rule
            loop_state = seq([optional(self.extra_run()), choose(count, True)])
            if started:
                return loop_state
            return alt([seq([self.extra, loop_state]), choose(count, False)])
        nxt = self.inc(count, extra=True)
        options = [choose(count, started)]
        if nxt is not None:
            options.append(seq([lay.sep(started), self.extra, self.state_f(key, nxt, True, choose)]))
        return alt(options)

    def extra_run(self) -> Expr:
        """``, X`` once or more: one left-recursive rule shared by every state of the object. A
        rule rather than a ``Repeat`` keeps the extra member (a big key automaton) one parser
        terminal instead of a copy inlined into one DFA per state; left recursion keeps the
        parser stack flat over the run (see ``member_lists``)."""
        if self._extra_run is None:
            lay = self.lay
            self._extra_run = self.c.add_recursive_rule(
                f"{self.hint}@X", lambda me: alt([seq([me, lay.comma, self.extra]), seq([lay.comma, self.extra])]))
        return self._extra_run

    def state_f(self, key: tuple, count: int, started: bool, choose) -> Expr:
        k = ("F", *key, count, int(started))
        if k not in self.memo:
            self.rule(k, self.free(key, count, started, choose))
        return self.memo[k]

    def end(self, count: int, started: bool) -> Expr:
        return self.lay.end(started) if self.enough(count) else NOTHING

    # --- declared members in a fixed order ---

    def in_order(self) -> Expr:
        n = len(self.members)
        counts = self.counts()
        for i in range(n, -1, -1):  # bottom-up keeps the Python stack flat
            for count in counts:
                for started in (True, False):
                    self.g(i, count, started)
                    self.state_f((i,), count, started, lambda cnt, st, i=i: self.g(i, cnt, st))
        return self.state_f((0,), self.zero, False, lambda cnt, st: self.g(0, cnt, st))

    def g(self, i: int, count: int, started: bool) -> Expr:
        k = ("G", i, count, int(started))
        if k in self.memo:
            return self.memo[k]
        if i == len(self.members):
            return self.rule(k, self.end(count, started))
        m = self.members[i]
        options = []
        nxt = self.inc(count)
        if nxt is not None:
            options.append(seq([self.lay.sep(started), m.expr, self.state_f((i + 1,), nxt, True, lambda cnt, st: self.g(i + 1, cnt, st))]))
        if not m.required:
            options.append(self.g(i + 1, count, started))
        return self.rule(k, alt(options))

    # --- declared members in any order ---

    def any_order(self) -> Expr:
        required = sum(1 << i for i, m in enumerate(self.members) if m.required)
        self.required_mask = required
        self.states_take_extras = True
        return self.state_f((0,), self.zero, False, lambda cnt, st: self.g_any(0, cnt, st))

    # --- declared members in any order, repeats allowed ---

    def anything_optional(self) -> Expr | None:
        """One optional declared member or extra member (a shared rule), for the repeating layouts."""
        optional = [m.expr for m in self.members if not m.required] + ([self.extra] if self.extra is not None else [])
        if len(optional) > 1:
            return self.c.add_rule(f"{self.hint}@optional", alt(optional))
        return optional[0] if optional else None

    def any_order_repeating(self) -> Expr:
        """Any order for objects too large for subsets of all members: states are the subsets of
        *required* members seen, so a declared member may appear again. Exact for validity:
        every occurrence's value is checked against its member's schema, a JSON parser keeps
        one of them (the last), and every required member appears. Only without property
        count bounds (duplicates would miscount) — the caller checks."""
        required = [m for m in self.members if m.required]
        anything_optional = self.anything_optional()
        full = (1 << len(required)) - 1

        def moves(seen: int) -> list[tuple[Expr, int]]:
            out = [(anything_optional, seen)] if anything_optional is not None else []
            return out + [(m.expr, seen | (1 << j)) for j, m in enumerate(required)]

        return self.member_lists(range(full + 1), 0, moves, lambda seen: seen == full, "R")

    def required_in_order_repeating(self, required_order: tuple[str, ...]) -> Expr:
        """The repeating layout for too many required members to track as a subset: optional
        members anywhere, any number of times, the required ones once each, in one of two
        orders, that of ``properties`` (the members' order) or that of ``required``. States are
        positions in one order, so the size is linear. A narrowing (other orders, and a required
        member met again, are rejected), exact for validity like ``any_order_repeating``: each
        occurrence is checked, a parser keeps one, every required member appears. No property
        count bounds (the caller checks).

        Only the next required member may follow a position: letting every member met before
        it repeat there made each mask inside such an object consider every earlier key (587
        members: 1.3 ms a mask at the median, against 30 µs for schema order elsewhere)."""
        required = [m for m in self.members if m.required]
        rank = {name: i for i, name in enumerate(required_order)}
        by_keyword = sorted(required, key=lambda m: rank.get(m.name, len(rank)))
        orders = [required] if by_keyword == required else [required, by_keyword]
        anything_optional = self.anything_optional()
        lay = self.lay
        starts = []
        for which, sequence in enumerate(orders):
            state: dict[int, Expr] = {}

            def choices(i: int, started: bool, me: Expr | None, sequence=sequence, state=state) -> list[Expr]:
                out = []
                if anything_optional is not None:
                    out.append(seq([lay.sep(started), anything_optional, me if me is not None else state[i]]))
                if i < len(sequence):
                    out.append(seq([lay.sep(started), sequence[i].expr, state[i + 1]]))
                else:
                    out.append(lay.end(started))
                return out

            for i in range(len(sequence), -1, -1):  # the later positions first: each state names the next
                state[i] = self.c.add_recursive_rule(
                    f"{self.hint}@Q{which}.{i}", lambda me, i=i, choices=choices: alt(choices(i, True, me)))
            starts.append(alt(choices(0, False, None)))
        return alt(starts)

    def member_lists(self, states, initial, moves, accepting, tag: str) -> Expr:
        """The bodies of an automaton over member lists, written left-recursively.

        ``moves(q)`` lists (member, next state) pairs; the body is a list of members leading from
        ``initial`` to an ``accepting`` state. Rule ``P[q]`` derives the nonempty lists that end
        in ``q``: ``P[q] = first member | P[p] , member``. Left recursion keeps the parser stack
        flat: after each member it is the same stack again, whatever came before, so every mask
        cached at one member boundary serves the next. A right-recursive state rule
        (``q = , member q'``) would push a level per member and make each boundary new.
        """
        states = list(states)
        index = {q: i for i, q in enumerate(states)}
        lay = self.lay

        def build(refs: list[Expr]) -> list[Expr]:
            options: list[list[Expr]] = [[] for _ in states]
            for member, q in moves(initial):
                options[index[q]].append(seq([lay.sep(False), member]))
            for p in states:
                for member, q in moves(p):
                    options[index[q]].append(seq([refs[index[p]], lay.sep(True), member]))
            return [alt(o) for o in options]

        lists = self.c.add_rules([f"{self.hint}@{tag}.{q}" for q in states], build)
        ends = [seq([lists[index[q]], lay.end(True)]) for q in states if accepting(q)]
        if accepting(initial):
            ends.append(lay.end(False))
        return alt(ends)

    def g_any(self, emitted: int, count: int, started: bool) -> Expr:
        """The state after the members in ``emitted``: the next declared member, the end, or
        (once extra members no longer change the count) an extra member and this state again.

        Taking extra members here rather than in an ``F`` state before it halves the rules of
        an open object (``additionalProperties`` defaults to true), and stays unambiguous: every
        alternative starts with a different key (extra keys exclude the declared names)."""
        k = ("S", emitted, count, int(started))
        if k in self.memo:
            return self.memo[k]

        def body(me: Expr | None) -> Expr:
            options = [seq([self.lay.comma, self.extra, me])] if me is not None else []
            nxt = self.inc(count)
            if nxt is not None:
                for i, m in enumerate(self.members):
                    if emitted & (1 << i):
                        continue
                    after = emitted | (1 << i)
                    rest = self.state_f((after,), nxt, True, lambda cnt, st, after=after: self.g_any(after, cnt, st))
                    options.append(seq([self.lay.sep(started), m.expr, rest]))
            if emitted & self.required_mask == self.required_mask:
                options.append(self.end(count, started))
            return alt(options)

        if self.extra is not None and started and self.saturated(count):  # as ``free`` expects
            out = self.c.add_recursive_rule(f"{self.hint}@{'.'.join(map(self.label, k))}", body)
            self.memo[k] = out
            return out
        return self.rule(k, body(None))
