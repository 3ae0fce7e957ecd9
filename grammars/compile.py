"""``Compiler`` (owns caches) and its product ``CompiledGrammar`` (immutable, shareable).

The split follows XGrammar: compiling is expensive and cacheable, matching is per sequence.
A Compiler is bound to one vocabulary; it caches compiled grammars by (kind, source, limits)
and shares the per-terminal trie walks across every grammar it compiles, so the JSON string and
number terminals of many schemas are walked once.
"""

from __future__ import annotations

import sys
from contextlib import contextmanager
from dataclasses import dataclass
from functools import cached_property
from threading import Lock
from typing import Sequence

import numpy as np

from grammars.automata.byte_dfa import compile_regular
from grammars.automata.cfg import TerminalCFG, lower_grammar
from grammars.automata.holes import HoleGrammar, solve
from grammars.errors import LimitExceeded, UnsupportedGrammarError
from grammars.frontends import parse_gbnf, parse_lark, parse_regex
from grammars.ir import Grammar
from grammars.limits import Limits
from grammars.masks.runtime import BoundedCache, GrammarRuntime
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
]


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
    """Compiles grammars for one vocabulary and caches the results (bounded LRU).

    Thread-safe. Hold one per vocabulary in a server; the ``compile_*`` functions make a
    throwaway one when none is given.
    """

    def __init__(self, vocab: TokenVocabulary, *, limits: Limits | None = None, cache_size: int = 64,
                 walk_cache_bytes: int = 256 << 20, allow_empty_language: bool = False):
        _check_vocab(vocab, "Compiler")
        _require(limits, (Limits, type(None)), "limits must be a grammars.Limits or None", "Compiler")
        for name, value, least in (("cache_size", cache_size, 1), ("walk_cache_bytes", walk_cache_bytes, 0)):
            _require(value, int, f"{name} must be an int", "Compiler")
            if value < least:
                raise ValueError(f"Compiler: {name} must be >= {least}, got {value}")
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
        self._cache = BoundedCache(cache_size)
        self._dfa_cache = BoundedCache(4096)

    def compile_grammar(self, grammar: Grammar) -> CompiledGrammar:
        """Compile a grammar IR (what every front end produces)."""
        _require(grammar, Grammar, "grammar must be a grammars.Grammar (parse text with parse_gbnf/parse_lark, "
                 "or call compile_gbnf/compile_lark/compile_regex)", "Compiler.compile_grammar")
        key = ("ir", grammar, self.limits)
        hit = self._cache.get(key)
        if hit is None:
            with _nesting_guard():
                hit = self._build(grammar)
            self._cache.put(key, hit)
        return hit

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

        opts = JsonSchemaOptions(**options)
        with _nesting_guard():
            document = load_schema(schema)
            canonical = canonical_json(document)  # any depth: json.dumps stops near 1,000 levels
        return self._cached(("json_schema", canonical, opts),
                            lambda: parse_json_schema(document, opts, limits=self.limits))

    def _cached(self, source_key: tuple, parse) -> CompiledGrammar:
        key = source_key + (self.limits,)
        hit = self._cache.get(key)
        if hit is None:
            with _nesting_guard():
                parsed = parse()
            hit = self.compile_grammar(parsed)
            self._cache.put(key, hit)
        return hit

    def _compile_dfa(self, expr):
        dfa = self._dfa_cache.get(expr)
        if dfa is None:
            dfa = compile_regular(expr, self.limits, self._compile_dfa, self._dfa_cache.get)
            self._dfa_cache.put(expr, dfa)
        return dfa

    def _build(self, grammar: Grammar) -> CompiledGrammar:
        cfg = lower_grammar(grammar, self.limits, self._compile_dfa, allow_empty=self.allow_empty_language)
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
