"""``Compiler`` (owns caches) and its product ``CompiledGrammar`` (immutable, shareable).

The split follows XGrammar: compiling is expensive and cacheable, matching is per sequence.
A Compiler is bound to one vocabulary; it caches compiled grammars by (kind, source, options,
limits) and shares the per-terminal trie walks across every grammar it compiles, so the JSON
string and number terminals of many schemas are walked once.

The compile cache (``Compiler(cache_size=, cache_bytes=, cache_dir=)``):

- **memory**: an LRU bounded in entries and, optionally, in the estimated bytes of the compiled
  tables (the runtime memos of a grammar grow with use and are bounded by ``Limits`` instead).
  Single-flight: threads asking for the same constraint at once wait for one build and all get
  the same ``CompiledGrammar``; a failed build is not shared (each waiter then tries itself).
- **disk** (``cache_dir``, off by default): what is expensive and vocabulary-independent, the
  grammar IR and the lowered ``TerminalCFG`` with its byte DFAs (stored in byte-class form,
  zlib-compressed), one file per constraint. Per-process state (the ``GrammarRuntime``, its
  lazily built LR(0) automaton, the trie walks) is rebuilt on load: it is cheap or vocabulary
  level. The key is the constraint's text (kind, source, front-end options), the ``Limits``,
  ``allow_empty_language``, a format version and a digest of the ``grammars`` sources (an
  upgrade never reads a stale entry); the vocabulary is not part of it, since nothing stored
  depends on it, so compilers of several vocabularies share one directory. Files are written
  to a temporary name and ``os.replace``d, so readers in other processes see a whole file or
  none; a file is used only when its magic, version, lengths, full key text and SHA-256 match
  and its payload unpickles with an allow-list of the IR and CFG classes (no other global can
  be loaded) into structurally valid data; anything else is ignored, recompiled and
  overwritten. The directory is pruned to ``cache_dir_bytes`` (least recently used first).

``shared_compiler(vocab)`` hands out one Compiler per vocabulary (fingerprint, which includes
the logits width), so one-call APIs that are given no compiler reuse the vocabulary-level
state (trie, text-token flags, walks) and the compiled grammars of earlier calls.
"""

from __future__ import annotations

import hashlib
import io
import logging
import os
import pickle
import struct
import sys
import tempfile
import time
import weakref
import zlib
from collections import OrderedDict
from contextlib import contextmanager
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from threading import Event, Lock
from typing import Callable, Hashable, Sequence

import numpy as np

from grammars.automata.byte_dfa import (
    ByteDFA,
    _language_key,
    byte_classes,
    shared_regular,
)
from grammars.automata.cfg import Production, TerminalCFG, lower_grammar
from grammars.automata.holes import HoleGrammar, solve
from grammars.errors import LimitExceeded, UnsupportedGrammarError
from grammars.frontends import parse_gbnf, parse_lark, parse_regex
from grammars.ir import Alt, Chars, Grammar, Literal, Ref, Repeat, Seq, _children, _Node
from grammars.limits import Limits
from grammars.masks.runtime import GrammarRuntime
from grammars.masks.token_dfa import TokenDFA
from grammars.masks.token_walk import WalkCache
from grammars.matcher import Matcher
from grammars.vocab.gguf import default_cache_root
from grammars.vocab.trie import TokenTrie
from grammars.vocab.vocabulary import TokenVocabulary

__all__ = [
    "Compiler",
    "CompiledGrammar",
    "compile_regex",
    "compile_gbnf",
    "compile_lark",
    "compile_grammar",
    "compile_json_schema",
    "shared_compiler",
]

_log = logging.getLogger(__name__)


class CompiledGrammar:
    """A grammar compiled for one vocabulary. Immutable and thread-safe; create matchers from it.

    Do not construct directly: use ``Compiler`` or the ``compile_*`` functions.
    """

    def __init__(self, grammar: Grammar, cfg: TerminalCFG, runtime: GrammarRuntime, vocab, text_token: np.ndarray,
                 walks: WalkCache, trie: TokenTrie):
        self.grammar = grammar
        self.vocab = vocab
        self._cfg = cfg
        self._runtime = runtime
        self._text_token = text_token
        self._walks = walks
        self._trie = trie
        self._dfa: TokenDFA | None = None
        self._dfa_lock = Lock()

    def matcher(self) -> Matcher:
        """A new Matcher at the start of the grammar."""
        return Matcher(self._runtime, self._text_token)

    @property
    def key(self) -> tuple:
        """Content identity: the grammar IR (equal IR, equal language) and the vocabulary's
        fingerprint. Two compilations of the same constraint for the same vocabulary have equal
        keys, whatever object they are; state learnt about a constraint (ASAp's trie, a compile
        cache) is keyed by this, never by ``id()``, which a collected grammar hands on."""
        return (self.grammar, self.vocab.fingerprint)

    @property
    def accepts_nothing(self) -> bool:
        """The grammar accepts no string (compiled with ``allow_empty_language=True``): its
        matchers start terminated, allow no token and never accept."""
        return self._cfg.accepts_nothing

    @property
    def is_regular(self) -> bool:
        """True when the constraint is one regular language (``as_dfa`` is available)."""
        return self._cfg.is_single_terminal

    def as_dfa(self) -> TokenDFA:
        """The explicit token-level DFA of a regular constraint; raises for context-free ones."""
        if not self.is_regular:
            raise UnsupportedGrammarError("as_dfa() needs a regular constraint; this grammar is context-free")
        with self._dfa_lock:
            if self._dfa is None:
                self._dfa = TokenDFA(
                    self._cfg.terminals[0],
                    self._cfg.start_nullable,
                    self._walks,
                    frozenset(self.vocab.eos_token_ids),
                    self.vocab.logits_width,
                )
            return self._dfa

    def completable(self, parts: Sequence[str | bytes], *, hole_bytes: Sequence[tuple[int, int | None]] | None = None) -> bool:
        """Whether the fixed texts ``parts`` (x1 … xn, a hole between each pair) can be completed:
        is there a fill y1 … y(n-1) with x1 y1 x2 … xn in the language? ``hole_bytes`` bounds
        each hole's fill, ``(min, max)`` bytes (``max`` None: unbounded). ``[prefix, ""]`` asks
        whether ``prefix`` is a prefix of the language. Exact; ``LimitExceeded`` past the
        grammar's ``Limits`` (``grammars.automata.holes`` has the method and its cost)."""
        return solve(self.hole_grammar, parts, hole_bytes, self._runtime.limits, witness=False)[0]

    def complete(self, parts: Sequence[str | bytes], *,
                 hole_bytes: Sequence[tuple[int, int | None]] | None = None) -> list[str] | list[bytes] | None:
        """One fill per hole such that the joined text is in the language, with the fewest fill
        bytes in all; None when ``parts`` cannot be completed. Fills are ``str`` when every part
        is ``str``, else ``bytes``."""
        ok, fills, text = solve(self.hole_grammar, parts, hole_bytes, self._runtime.limits, witness=True)
        if not ok:
            return None
        return [f.decode("utf-8", "surrogatepass") for f in fills] if text else fills

    @cached_property
    def hole_grammar(self) -> HoleGrammar:
        """The grammar as the text-with-holes algorithm reads it (built on first use)."""
        return HoleGrammar(self._cfg)

    @property
    def n_terminals(self) -> int:
        return len(self._cfg.terminals)

    @property
    def n_productions(self) -> int:
        return len(self._cfg.productions)

    def __repr__(self) -> str:
        return f"CompiledGrammar(start={self.grammar.start!r}, terminals={self.n_terminals}, productions={self.n_productions})"


# --- argument checks: every entry point names the parameter it refuses --------------------------


def _require(value: object, kinds: type | tuple[type, ...], what: str, where: str) -> None:
    """``TypeError`` naming ``where`` and the parameter unless ``value`` is one of ``kinds``
    (``bool`` only where asked for by name: ``True`` is an ``int`` but never a size)."""
    kinds = kinds if isinstance(kinds, tuple) else (kinds,)
    if not isinstance(value, kinds) or (isinstance(value, bool) and bool not in kinds):
        raise TypeError(f"{where}: {what}, got {type(value).__name__}")


def _is_pydantic_model(schema: object) -> bool:
    return isinstance(schema, type) and callable(getattr(schema, "model_json_schema", None))


#: set once the JSON Schema front end's compiled kernels are loaded (``strings.load_kernels``)
_JSON_SCHEMA_KERNELS = Event()


def _check_schema(schema: object, where: str) -> None:
    """A schema is a dict, a bool, JSON text (str or UTF-8 bytes) or a Pydantic model class."""
    if not (isinstance(schema, (dict, bool, str, bytes, bytearray)) or _is_pydantic_model(schema)):
        raise TypeError(f"{where}: schema must be a dict, a bool, JSON text or a Pydantic model class, "
                        f"got {type(schema).__name__}")


def _check_vocab(vocab: object, where: str) -> None:
    _require(vocab, TokenVocabulary, "vocab must be a TokenVocabulary (TokenVocabulary.from_pretrained(...))", where)


def _compiler_for(vocab: object, compiler: object, where: str) -> "Compiler":
    """``compiler`` when given (for the same vocabulary), else a throwaway ``Compiler(vocab)``."""
    _check_vocab(vocab, where)
    if compiler is None:
        return Compiler(vocab)
    _require(compiler, Compiler, "compiler must be a grammars.Compiler or None", where)
    if compiler.vocab != vocab:
        raise ValueError(f"{where}: compiler was built for a different vocabulary than vocab "
                         f"({compiler.vocab!r} vs {vocab!r})")
    return compiler


@dataclass(frozen=True)
class _VocabIndex:
    trie: TokenTrie
    text_token: np.ndarray


class Compiler:
    """Compiles grammars for one vocabulary and caches the results.

    Thread-safe. Hold one per vocabulary in a server (or use ``shared_compiler(vocab)``); the
    ``compile_*`` functions make a throwaway one when none is given.

    ``cache_size`` bounds the number of compiled grammars kept in memory and ``cache_bytes``,
    when given, their estimated compiled size; ``cache_dir`` (a directory, created on demand)
    persists them across processes, pruned to ``cache_dir_bytes``. The module docstring has the
    cache's rules; ``cache_info()`` its counters.
    """

    def __init__(self, vocab: TokenVocabulary, *, limits: Limits | None = None, cache_size: int = 64,
                 cache_bytes: int | None = None, cache_dir: str | os.PathLike | None = None,
                 cache_dir_bytes: int = 1 << 30, walk_cache_bytes: int = 256 << 20,
                 allow_empty_language: bool = False):
        _check_vocab(vocab, "Compiler")
        _require(limits, (Limits, type(None)), "limits must be a grammars.Limits or None", "Compiler")
        for name, value, least in (("cache_size", cache_size, 1), ("walk_cache_bytes", walk_cache_bytes, 0),
                                   ("cache_dir_bytes", cache_dir_bytes, 0)):
            _require(value, int, f"{name} must be an int", "Compiler")
            if value < least:
                raise ValueError(f"Compiler: {name} must be >= {least}, got {value}")
        if cache_bytes is not None:
            _require(cache_bytes, int, "cache_bytes must be an int or None", "Compiler")
            if cache_bytes < 1:
                raise ValueError(f"Compiler: cache_bytes must be >= 1, got {cache_bytes}")
        _require(cache_dir, (str, os.PathLike, type(None)), "cache_dir must be a path or None", "Compiler")
        _require(allow_empty_language, bool, "allow_empty_language must be a bool", "Compiler")
        self.vocab = vocab
        self.limits = limits or Limits()
        #: compile grammars that accept nothing (e.g. the schema ``false``) to matchers that
        #: reject everything, instead of raising ``EmptyLanguageError``: what validators want
        self.allow_empty_language = allow_empty_language
        index = _vocab_index(vocab)
        self._trie = index.trie
        self._text_token = index.text_token
        self._walks = WalkCache(self._trie, vocab.logits_width, walk_cache_bytes)
        self._cache = _CompileCache(cache_size, cache_bytes)
        self._disk = None if cache_dir is None else _DiskCache(Path(cache_dir), cache_dir_bytes)

    def cache_info(self) -> dict:
        """Counters of the compile cache: ``entries`` (grammars), ``keys`` (a grammar is found
        under its source and its IR) and their estimated ``bytes`` in memory,
        ``hits`` (memory), ``misses`` (not in memory), ``disk_hits``, ``builds`` (compiled from
        source), ``disk_writes``, ``disk_rejected`` (files present but not used: damaged,
        foreign or stale), ``disk_errors`` (reads or writes that failed) and ``evictions``."""
        info = self._cache.info()
        disk = self._disk.info() if self._disk is not None else {
            "disk_hits": 0, "disk_writes": 0, "disk_rejected": 0, "disk_errors": 0}
        return {**info, **disk}

    def compile_grammar(self, grammar: Grammar) -> CompiledGrammar:
        """Compile a grammar IR (what every front end produces)."""
        _require(grammar, Grammar, "grammar must be a grammars.Grammar (parse text with parse_gbnf/parse_lark, "
                 "or call compile_gbnf/compile_lark/compile_regex)", "Compiler.compile_grammar")

        def build() -> CompiledGrammar:
            disk_key = self._disk_key(("ir", _ir_digest(grammar))) if self._disk is not None else None
            return self._from_disk_or_build(disk_key, lambda: grammar, given=grammar)

        return self._cache.get_or_build(("ir", grammar, self.limits), build)

    def compile_regex(self, pattern: str) -> CompiledGrammar:
        """Full-match semantics: the whole output must match ``pattern``."""
        _require(pattern, str, "pattern must be a str (a regular expression)", "Compiler.compile_regex")
        return self._cached(("regex", pattern), lambda: Grammar.of({"root": parse_regex(pattern)}, "root", "<regex>"))

    def compile_gbnf(self, text: str) -> CompiledGrammar:
        """A llama.cpp GBNF grammar (start rule ``root``)."""
        _require(text, str, "text must be a str (GBNF grammar text)", "Compiler.compile_gbnf")
        return self._cached(("gbnf", text), lambda: parse_gbnf(text))

    def compile_lark(self, text: str, *, start: str = "start") -> CompiledGrammar:
        """A Lark EBNF grammar (character-level semantics, see ``parse_lark``) from rule ``start``."""
        _require(text, str, "text must be a str (Lark grammar text)", "Compiler.compile_lark")
        _require(start, str, "start must be a str (a rule name)", "Compiler.compile_lark")
        return self._cached(("lark", text, start), lambda: parse_lark(text, start=start))

    def compile_json_schema(self, schema, **options) -> CompiledGrammar:
        """A JSON Schema (dict, JSON text or Pydantic model class); options as ``JsonSchemaOptions``.

        Raises ``UnsupportedSchemaError`` (keyword and JSON pointer) for anything it cannot
        enforce exactly, unless ``lenient=True``. ``TypeError`` for a schema of another type or an
        unknown option.
        """
        _check_schema(schema, "Compiler.compile_json_schema")
        from grammars.frontends.json_schema import (
            JsonSchemaOptions,
            load_schema,
            parse_json_schema,
        )
        from grammars.frontends.json_schema.document import canonical_json
        from grammars.frontends.json_schema.strings import load_kernels

        if not _JSON_SCHEMA_KERNELS.is_set():  # once per process, before the first schema's own work
            load_kernels()
            _JSON_SCHEMA_KERNELS.set()

        opts = JsonSchemaOptions(**options)
        with _nesting_guard():
            document = load_schema(schema)
            canonical = canonical_json(document)  # any depth: json.dumps stops near 1,000 levels
        return self._cached(("json_schema", canonical, opts),
                            lambda: parse_json_schema(document, opts, limits=self.limits))

    def _cached(self, source_key: tuple, parse: Callable[[], Grammar]) -> CompiledGrammar:
        """The compiled grammar of a source (memory, else disk, else parsed and compiled; an
        equal IR from another source is shared through ``compile_grammar``'s entry)."""

        def build() -> CompiledGrammar:
            disk_key = self._disk_key(source_key) if self._disk is not None else None
            return self._from_disk_or_build(disk_key, parse, share_ir=True)

        return self._cache.get_or_build(source_key + (self.limits,), build)

    def _from_disk_or_build(self, disk_key: bytes | None, parse: Callable[[], Grammar], *,
                            share_ir: bool = False, given: Grammar | None = None) -> CompiledGrammar:
        """Read ``disk_key``'s entry, else parse and compile (and store). ``given``: the IR the
        caller holds, kept as the result's ``grammar`` (equal to the stored one) so its ``key``
        is the caller's."""
        if disk_key is not None:
            loaded = self._disk.load(disk_key)
            if loaded is not None:
                grammar, cfg = loaded
                return self._assemble(given if given is not None else grammar, cfg)
        with _nesting_guard():
            grammar = parse()
        self._cache.note_build()
        if share_ir:
            _require(grammar, Grammar, "a front end must produce a grammars.Grammar", "Compiler")
            compiled = self._cache.get_or_build(("ir", grammar, self.limits), lambda: self._build(grammar))
        else:
            compiled = self._build(grammar)
        if disk_key is not None:
            self._disk.store(disk_key, compiled.grammar, compiled._cfg)
        return compiled

    def _disk_key(self, source_key: tuple) -> bytes:
        """The text a disk entry is filed under and must repeat: everything the stored IR and
        CFG depend on (reprs of strings, ints, tuples and frozen option dataclasses are
        deterministic across processes)."""
        return "\n".join((
            f"corral compiled grammar, format {_DISK_FORMAT}",
            f"code {_code_digest()}",
            f"allow_empty_language {self.allow_empty_language!r}",
            f"limits {self.limits!r}",
            f"source {source_key!r}",
        )).encode("utf-8", "surrogatepass")

    def _compile_dfa(self, expr):
        """The byte DFA of a regular expression, from the process-wide automata table when any
        compiler built it under the same ``Limits`` (``grammars.memo``)."""
        return shared_regular(expr, self.limits)

    def _build(self, grammar: Grammar) -> CompiledGrammar:
        with _nesting_guard():
            cfg = lower_grammar(grammar, self.limits, self._compile_dfa, allow_empty=self.allow_empty_language)
            return self._assemble(grammar, cfg)

    def _assemble(self, grammar: Grammar, cfg: TerminalCFG) -> CompiledGrammar:
        """The per-process part of a compiled grammar: cheap, and bound to this vocabulary."""
        runtime = GrammarRuntime(
            cfg,
            self._trie,
            self.vocab.token_bytes,
            frozenset(self.vocab.eos_token_ids),
            self.vocab.logits_width,
            self._walks,
            self.limits,
        )
        return CompiledGrammar(grammar, cfg, runtime, self.vocab, self._text_token, self._walks, self._trie)


# --- the memory cache: LRU over entries and estimated bytes, single-flight ----------------------


class _Flight:
    """One build in progress: waiters block on ``done`` and read ``value`` (None: it failed)."""

    __slots__ = ("done", "value")

    def __init__(self) -> None:
        self.done = Event()
        self.value: CompiledGrammar | None = None


def _footprint(compiled: CompiledGrammar) -> int:
    """Estimated bytes of a compiled grammar's tables (its DFAs, productions and IR); the memos
    its matchers fill are bounded by ``Limits`` and not counted."""
    cfg = compiled._cfg
    size = 4096 + sum(d.table.nbytes + d.accepting.nbytes for d in cfg.terminals)
    size += sum(64 + 8 * len(p.rhs) for p in cfg.productions)
    return size + 200 * len(compiled.grammar.rules)


class _CompileCache:
    """Compiled grammars by key: an LRU over keys, bounded in grammars and (optionally) their
    bytes, where a grammar held under several keys (its source and its IR) counts once.
    ``get_or_build`` runs one build per key at a time (single-flight)."""

    def __init__(self, max_entries: int, max_bytes: int | None):
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self._data: OrderedDict[Hashable, CompiledGrammar] = OrderedDict()
        self._held: dict[int, list] = {}  # id(grammar) -> [keys holding it, its bytes]
        self._bytes = 0
        self._flights: dict[Hashable, _Flight] = {}
        self._lock = Lock()
        self.hits = self.misses = self.builds = self.evictions = 0

    def info(self) -> dict:
        with self._lock:
            return {"entries": len(self._held), "keys": len(self._data), "bytes": self._bytes, "hits": self.hits,
                    "misses": self.misses, "builds": self.builds, "evictions": self.evictions}

    def __len__(self) -> int:
        return len(self._data)

    def note_build(self) -> None:
        with self._lock:
            self.builds += 1

    def get_or_build(self, key: Hashable, build: Callable[[], CompiledGrammar]) -> CompiledGrammar:
        while True:
            with self._lock:
                hit = self._data.get(key)
                if hit is not None:
                    self._data.move_to_end(key)
                    self.hits += 1
                    return hit
                flight = self._flights.get(key)
                owner = flight is None
                if owner:
                    flight = self._flights[key] = _Flight()
                    self.misses += 1
            if not owner:
                flight.done.wait()
                if flight.value is not None:
                    with self._lock:
                        self.hits += 1
                    return flight.value
                continue  # the build failed there: try here (its error is this thread's to raise)
            try:
                value = build()
                self._put(key, value)
                flight.value = value
                return value
            finally:
                with self._lock:
                    del self._flights[key]
                flight.done.set()

    def _put(self, key: Hashable, value: CompiledGrammar) -> None:
        size = _footprint(value)
        with self._lock:
            if self.max_bytes is not None and size > self.max_bytes:
                return  # never kept: it alone would break the bound
            old = self._data.pop(key, None)
            if old is not None:
                self._release(old)
            self._data[key] = value
            held = self._held.get(id(value))
            if held is None:
                self._held[id(value)] = [1, size]
                self._bytes += size
            else:
                held[0] += 1
            while len(self._held) > self.max_entries or (self.max_bytes is not None and self._bytes > self.max_bytes):
                _, evicted = self._data.popitem(last=False)
                if self._release(evicted):
                    self.evictions += 1

    def _release(self, value: CompiledGrammar) -> bool:
        """Drop one key's hold on ``value``; True when that was the last (the grammar is gone)."""
        held = self._held[id(value)]
        held[0] -= 1
        if held[0]:
            return False
        del self._held[id(value)]
        self._bytes -= held[1]
        return True


# --- the disk cache --------------------------------------------------------------------------

#: Bumped whenever the file layout or the meaning of what is pickled changes.
_DISK_FORMAT = 1
_MAGIC = b"corral-cg\x00"
_HEADER = struct.Struct("<10sIIQ32s")  # magic, format, key length, payload length, sha256(key + payload)
_SUFFIX = ".cg"
_code_digest_value: str | None = None


def _code_digest() -> str:
    """A digest of the ``grammars`` package's sources: stored entries are keyed by it, so code
    that lowers grammars differently never reads what older code wrote."""
    global _code_digest_value
    if _code_digest_value is None:
        root = Path(__file__).resolve().parent
        h = hashlib.sha256()
        for path in sorted(root.rglob("*.py")):
            h.update(path.relative_to(root).as_posix().encode() + b"\0")
            h.update(path.read_bytes() + b"\0")
        _code_digest_value = h.hexdigest()[:32]
    return _code_digest_value


def _ir_digest(grammar: Grammar) -> str:
    """A content digest of a grammar IR, equal for equal grammars in any process (the IR's own
    hash is salted per process). Bottom-up with an explicit stack and one digest per shared node."""
    memo: dict[int, bytes] = {}

    def part(value) -> bytes:
        if isinstance(value, _Node):
            return b"N" + memo[id(value)]
        if isinstance(value, ByteDFA):
            return b"D" + value.key  # equal keys: identical canonical tables
        return b"V" + repr(value).encode("utf-8", "surrogatepass") + b"\0"

    stack = [e for _, e in grammar.rules if isinstance(e, _Node)]
    while stack:
        node = stack[-1]
        if id(node) in memo:
            stack.pop()
            continue
        pending = [k for k in _children(node) if isinstance(k, _Node) and id(k) not in memo]
        if pending:
            stack.extend(pending)
            continue
        stack.pop()
        h = hashlib.sha256(type(node).__name__.encode() + b"\0")
        for name in node._names:
            value = node.__dict__[name]
            items = value if name == "items" else (value,)
            h.update(f"{name}:{len(items)}\0".encode())
            for item in items:
                h.update(part(item))
        memo[id(node)] = h.digest()
    h = hashlib.sha256(repr(grammar.start).encode() + b"\0")
    for name, expr in grammar.rules:
        h.update(repr(name).encode() + b"\0" + part(expr))
    return h.hexdigest()


def _dfa_from_classes(n_states: int, n_classes: int, wide: bool, classes: bytes, byte_to_class: bytes,
                      accepting: bytes, start: int) -> ByteDFA:
    """A ``ByteDFA`` from the byte-class form ``_DFAPickler`` stores, checked before use."""
    dtype = np.int32 if wide else np.int16
    if not (isinstance(n_states, int) and isinstance(n_classes, int) and 0 <= n_states and 1 <= n_classes <= 256):
        raise ValueError("bad DFA shape")
    cls = np.frombuffer(classes, dtype=dtype)
    b2c = np.frombuffer(byte_to_class, dtype=np.uint8)
    if cls.size != n_states * n_classes or b2c.size != 256 or int(b2c.max()) >= n_classes:
        raise ValueError("bad DFA tables")
    cls = cls.reshape(n_states, n_classes)
    if cls.size and (int(cls.min()) < -1 or int(cls.max()) >= n_states):
        raise ValueError("DFA transition out of range")
    table = cls[:, b2c].astype(np.int32)
    acc = np.unpackbits(np.frombuffer(accepting, dtype=np.uint8), count=n_states).astype(bool)
    dfa = ByteDFA(table, acc, start)  # checks shapes and the start state
    if dfa.is_empty_language:
        return dfa
    # ``key`` from the stored class form: it hashes the whole table (a form byte_classes would
    # not give only loses sharing, never tells two languages apart); saves recomputing classes
    dfa.__dict__["key"] = _language_key(start, cls, b2c.astype(np.intp), acc)
    with _loaded_dfas_lock:  # equal keys, identical tables: loads of one entry share them
        return _loaded_dfas.setdefault(dfa.key, dfa)


#: DFAs read from disk by language key, so that every load of an entry (after an eviction, in
#: another Compiler) embeds the same objects in its IR: one copy of each table in memory (equal
#: IRs need no interning, since ``ByteDFA`` compares by language)
_loaded_dfas: weakref.WeakValueDictionary[bytes, ByteDFA] = weakref.WeakValueDictionary()
_loaded_dfas_lock = Lock()


class _DFAPickler(pickle.Pickler):
    """Pickles byte DFAs in byte-class form (a few distinct columns instead of 256): tables
    shrink about tenfold and load faster."""

    def reducer_override(self, obj):
        if type(obj) is ByteDFA:
            cls, b2c = byte_classes(obj.table)
            wide = obj.n_states >= 1 << 15
            cls = np.ascontiguousarray(cls, dtype=np.int32 if wide else np.int16)
            return _dfa_from_classes, (obj.n_states, int(cls.shape[1]), wide, cls.tobytes(),
                                       b2c.astype(np.uint8).tobytes(), np.packbits(obj.accepting).tobytes(), obj.start)
        return NotImplemented


#: every global a stored payload may name; anything else fails the load
_ALLOWED_GLOBALS = {
    ("grammars.compile", "_dfa_from_classes"): _dfa_from_classes,
    ("grammars.ir", "Grammar"): Grammar,
    ("grammars.ir", "Chars"): Chars,
    ("grammars.ir", "Literal"): Literal,
    ("grammars.ir", "Seq"): Seq,
    ("grammars.ir", "Alt"): Alt,
    ("grammars.ir", "Repeat"): Repeat,
    ("grammars.ir", "Ref"): Ref,
    ("grammars.automata.cfg", "TerminalCFG"): TerminalCFG,
    ("grammars.automata.cfg", "Production"): Production,
}


class _AllowListUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str):
        found = _ALLOWED_GLOBALS.get((module, name))
        if found is None:
            raise pickle.UnpicklingError(f"{module}.{name} is not allowed in a compile cache file")
        return found


def _check_payload(payload: object) -> tuple[Grammar, TerminalCFG]:
    """Raise unless ``payload`` is a (Grammar, TerminalCFG) pair the runtime can run on."""
    if not (isinstance(payload, tuple) and len(payload) == 2):
        raise ValueError("not a (grammar, cfg) pair")
    grammar, cfg = payload
    if type(grammar) is not Grammar or type(cfg) is not TerminalCFG:
        raise ValueError("not a (grammar, cfg) pair")
    if not (isinstance(grammar.rules, tuple) and isinstance(grammar.start, str)
            and all(isinstance(r, tuple) and len(r) == 2 and isinstance(r[0], str) for r in grammar.rules)):
        raise ValueError("malformed grammar")
    terminals, names = cfg.terminals, cfg.nonterminal_names
    if not (isinstance(terminals, tuple) and all(type(t) is ByteDFA for t in terminals)
            and isinstance(cfg.terminal_exprs, tuple) and len(cfg.terminal_exprs) == len(terminals)
            and isinstance(names, tuple) and isinstance(cfg.productions, tuple)
            and type(cfg.start) is int and -1 <= cfg.start < len(names) and type(cfg.start_nullable) is bool):
        raise ValueError("malformed cfg")
    n_t, n_nt = len(terminals), len(names)
    for p in cfg.productions:
        if type(p) is not Production or type(p.lhs) is not int or not 0 <= p.lhs < n_nt \
                or not isinstance(p.rhs, tuple) or not p.rhs:
            raise ValueError("malformed production")
        for sym in p.rhs:
            if type(sym) is not int or not -n_t <= sym < n_nt:
                raise ValueError("production symbol out of range")
    return grammar, cfg


class _DiskCache:
    """Compiled grammars (IR + lowered CFG) in a directory, one file per key, shared by
    processes: atomic writes, verified reads, pruned to ``max_bytes`` by last use."""

    def __init__(self, directory: Path, max_bytes: int):
        self.directory = directory
        self.max_bytes = max_bytes
        self._lock = Lock()
        self._since_prune = None  # bytes written since the last prune; None: none yet
        self.hits = self.writes = self.rejected = self.errors = 0

    def info(self) -> dict:
        with self._lock:
            return {"disk_hits": self.hits, "disk_writes": self.writes, "disk_rejected": self.rejected,
                    "disk_errors": self.errors}

    def _count(self, name: str) -> None:
        with self._lock:
            setattr(self, name, getattr(self, name) + 1)

    def path_of(self, key: bytes) -> Path:
        return self.directory / (hashlib.sha256(key).hexdigest() + _SUFFIX)

    def load(self, key: bytes) -> tuple[Grammar, TerminalCFG] | None:
        path = self.path_of(key)
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            return None
        except OSError as exc:
            _log.debug("compile cache: cannot read %s: %s", path, exc)
            self._count("errors")
            return None
        try:
            magic, fmt, key_len, payload_len, digest = _HEADER.unpack_from(data)
            body = memoryview(data)[_HEADER.size:]
            if magic != _MAGIC or fmt != _DISK_FORMAT or len(body) != key_len + payload_len:
                raise ValueError("not a compile cache file of this format")
            if body[:key_len] != key:
                raise ValueError("the file is another constraint's")
            if hashlib.sha256(body).digest() != digest:
                raise ValueError("checksum mismatch")
            with _nesting_guard():
                payload = _AllowListUnpickler(io.BytesIO(zlib.decompress(body[key_len:]))).load()
            loaded = _check_payload(payload)
        except Exception as exc:  # noqa: BLE001 - damaged, partial, foreign or stale: recompile (and overwrite)
            _log.debug("compile cache: ignoring %s: %s", path, exc)
            self._count("rejected")
            return None
        try:
            os.utime(path)  # last use, for pruning
        except OSError:
            pass
        self._count("hits")
        return loaded

    def store(self, key: bytes, grammar: Grammar, cfg: TerminalCFG) -> None:
        """Best effort: a grammar that cannot be written (too deep to pickle, disk full) stays
        in memory only."""
        tmp = None
        try:
            buf = io.BytesIO()
            with _nesting_guard():
                _DFAPickler(buf, protocol=pickle.HIGHEST_PROTOCOL).dump((grammar, cfg))
            payload = zlib.compress(buf.getbuffer(), 1)
            body = key + payload
            data = _HEADER.pack(_MAGIC, _DISK_FORMAT, len(key), len(payload), hashlib.sha256(body).digest()) + body
            self.directory.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=self.directory, prefix=".", suffix=".tmp")
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            os.replace(tmp, self.path_of(key))
            tmp = None
        except Exception as exc:  # noqa: BLE001 - best effort: the grammar is compiled either way
            _log.debug("compile cache: cannot write an entry to %s: %s", self.directory, exc)
            self._count("errors")
            return
        finally:
            if tmp is not None:
                try:
                    os.unlink(tmp)
                except OSError:
                    pass
        with self._lock:
            self.writes += 1
            due = self._since_prune is None or self._since_prune + len(data) > self.max_bytes // 16
            self._since_prune = 0 if due else self._since_prune + len(data)
        if due:
            self._prune()

    def _prune(self) -> None:
        """Delete the least recently used entries past ``max_bytes``, and temporary files that
        a killed writer left (older than an hour)."""
        entries, total, now = [], 0, time.time()
        try:
            with os.scandir(self.directory) as it:
                for e in it:
                    try:
                        st = e.stat()
                        if e.name.endswith(_SUFFIX):
                            entries.append((st.st_mtime, st.st_size, e.path))
                            total += st.st_size
                        elif e.name.endswith(".tmp") and now - st.st_mtime > 3600:
                            os.unlink(e.path)
                    except OSError:
                        continue
        except OSError:
            return
        entries.sort()
        for _, size, path in entries:
            if total <= self.max_bytes:
                break
            try:
                os.unlink(path)
            except OSError:
                pass
            total -= size


# --- one Compiler per vocabulary --------------------------------------------------------------

#: vocabularies whose shared Compiler is kept (least recently used dropped first)
SHARED_COMPILERS = 4
#: the estimated bytes of compiled grammars each shared Compiler keeps (``cache_bytes``)
SHARED_CACHE_BYTES = 1 << 30
_shared: OrderedDict[str, Compiler] = OrderedDict()
_shared_lock = Lock()


def shared_compiler(vocab: TokenVocabulary) -> Compiler:
    """The process's ``Compiler`` for ``vocab`` (default settings, ``cache_bytes`` of
    ``SHARED_CACHE_BYTES``, no disk cache), made on first use.

    One per vocabulary fingerprint (token bytes, special and EOS ids, logits width), for the
    last ``SHARED_COMPILERS`` vocabularies used: calls that are given no compiler
    (``engine.generate``, ``engine.infill``) reuse the trie, the walks and every grammar
    compiled before for the same vocabulary. Thread-safe.
    """
    _check_vocab(vocab, "shared_compiler")
    key = vocab.fingerprint
    with _shared_lock:
        compiler = _shared.get(key)
        if compiler is not None:
            _shared.move_to_end(key)
            return compiler
        # under the lock: built once per vocabulary; held for the process, so bounded in bytes too
        compiler = _shared[key] = Compiler(vocab, cache_bytes=SHARED_CACHE_BYTES)
        while len(_shared) > SHARED_COMPILERS:
            _shared.popitem(last=False)
        return compiler


@contextmanager
def _nesting_guard():
    """The safety net for what still recurses per level of nesting (Lark's own grammar loader,
    C ``json.loads`` of schema text, very deep ``const``/``enum`` values; front ends and lowering
    walk with explicit stacks): past Python's stack, a typed error, not a ``RecursionError``."""
    try:
        yield
    except RecursionError:
        raise LimitExceeded(
            "recursion", sys.getrecursionlimit(),
            "the grammar is nested too deeply to compile (Python's recursion limit "
            f"{sys.getrecursionlimit()} was reached while building it)",
        ) from None


def _vocab_index(vocab) -> _VocabIndex:
    """Trie and text-token flags, built once per vocabulary object and kept on it."""
    cached = vocab.__dict__.get("_corral_index")
    if cached is not None:
        return cached
    special = set(vocab.special_token_ids) | set(vocab.eos_token_ids)
    text_token = np.array([bool(b) and i not in special for i, b in enumerate(vocab.token_bytes)], dtype=bool)
    text_token.setflags(write=False)
    # small vocabularies (tests) build in milliseconds; big ones are worth a cache file
    path = default_cache_root() / "tries" / f"{vocab.fingerprint}.npz" if len(vocab) > 4096 else None
    index = _VocabIndex(TokenTrie.cached(vocab.token_bytes, text_token, path), text_token)
    vocab.__dict__["_corral_index"] = index  # derived data of an immutable object
    return index


def compile_grammar(grammar: Grammar, vocab: TokenVocabulary, *, compiler: Compiler | None = None) -> CompiledGrammar:
    """Compile a grammar IR (from any front end, or built by hand) for ``vocab``."""
    _require(grammar, Grammar, "grammar must be a grammars.Grammar", "compile_grammar")
    return _compiler_for(vocab, compiler, "compile_grammar").compile_grammar(grammar)


def compile_regex(pattern: str, vocab: TokenVocabulary, *, compiler: Compiler | None = None) -> CompiledGrammar:
    """Compile a regular expression (full match) for ``vocab``."""
    _require(pattern, str, "pattern must be a str (a regular expression)", "compile_regex")
    return _compiler_for(vocab, compiler, "compile_regex").compile_regex(pattern)


def compile_gbnf(text: str, vocab: TokenVocabulary, *, compiler: Compiler | None = None) -> CompiledGrammar:
    """Compile a llama.cpp GBNF grammar (start rule ``root``) for ``vocab``."""
    _require(text, str, "text must be a str (GBNF grammar text)", "compile_gbnf")
    return _compiler_for(vocab, compiler, "compile_gbnf").compile_gbnf(text)


def compile_lark(text: str, vocab: TokenVocabulary, *, start: str = "start",
                 compiler: Compiler | None = None) -> CompiledGrammar:
    """Compile a Lark EBNF grammar (character-level semantics, see ``parse_lark``) for ``vocab``."""
    _require(text, str, "text must be a str (Lark grammar text)", "compile_lark")
    _require(start, str, "start must be a str (a rule name)", "compile_lark")
    return _compiler_for(vocab, compiler, "compile_lark").compile_lark(text, start=start)


def compile_json_schema(schema, vocab: TokenVocabulary, *, compiler: Compiler | None = None,
                        **options) -> CompiledGrammar:
    """Compile a JSON Schema for ``vocab``; see ``Compiler.compile_json_schema``."""
    _check_schema(schema, "compile_json_schema")
    return _compiler_for(vocab, compiler, "compile_json_schema").compile_json_schema(schema, **options)
