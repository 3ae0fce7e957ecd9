"""Every error corral raises on purpose.

Callers catch the narrowest class that fits; a server catches ``ConstraintError``::

    ConstraintError
    ├── GrammarError                 the grammar, regex or schema cannot be compiled
    │   ├── GrammarSyntaxError       text that does not parse (line, column, caret context)
    │   ├── UnsupportedGrammarError  valid input using a construct corral cannot enforce exactly
    │   │   └── UnsupportedSchemaError   a JSON Schema keyword, with its JSON pointer
    │   └── EmptyLanguageError       the grammar accepts no string at all
    ├── VocabularyError              a tokenizer that cannot be decoded to exact bytes
    ├── LimitExceeded                a ``Limits`` bound (states, stacks, configurations) was hit
    └── MatchError                   misuse of a Matcher at run time
        ├── TokenRejected            ``advance`` with a token outside the mask
        ├── RollbackError            rolling back more tokens than were consumed
        └── NoAllowedToken           a sampler asked to draw where the grammar allows no token

Errors also subclass ``ValueError`` where the cause is bad input, so code written against the
standard library keeps working; corral never flattens them into plain ``ValueError`` itself.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = [
    "ConstraintError",
    "GrammarError",
    "GrammarSyntaxError",
    "UnsupportedGrammarError",
    "UnsupportedSchemaError",
    "EmptyLanguageError",
    "VocabularyError",
    "LimitExceeded",
    "MatchError",
    "TokenRejected",
    "RollbackError",
    "NoAllowedToken",
    "SourcePosition",
]


class ConstraintError(Exception):
    """Root of corral's error tree."""


class GrammarError(ConstraintError, ValueError):
    """The grammar, regular expression or schema cannot be compiled."""


@dataclass(frozen=True)
class SourcePosition:
    """A 1-based line and column in a source text, plus the 0-based character offset."""

    line: int
    column: int
    offset: int

    @classmethod
    def at(cls, text: str, offset: int) -> "SourcePosition":
        offset = max(0, min(offset, len(text)))
        line = text.count("\n", 0, offset) + 1
        line_start = text.rfind("\n", 0, offset) + 1
        return cls(line=line, column=offset - line_start + 1, offset=offset)


class GrammarSyntaxError(GrammarError):
    """Text that does not parse, with the position and a caret line pointing at it."""

    def __init__(self, message: str, text: str = "", offset: int = 0, *, source: str = "<grammar>"):
        self.message = message
        self.text = text
        self.source = source
        self.position = SourcePosition.at(text, offset)
        super().__init__(self._render())

    @property
    def line(self) -> int:
        return self.position.line

    @property
    def column(self) -> int:
        return self.position.column

    def context(self, span: int = 40) -> str:
        """The offending line (trimmed to ``span`` characters either side) and a caret under the column."""
        lines = self.text.split("\n")
        if not lines or self.position.line > len(lines):
            return ""
        line = lines[self.position.line - 1]
        col = self.position.column - 1
        start = max(0, col - span)
        end = min(len(line), col + span)
        prefix = "..." if start > 0 else ""
        suffix = "..." if end < len(line) else ""
        shown = prefix + line[start:end] + suffix
        caret = " " * (len(prefix) + col - start) + "^"
        return f"{shown}\n{caret}"

    def _render(self) -> str:
        where = f"{self.source}:{self.position.line}:{self.position.column}"
        ctx = self.context()
        return f"{where}: {self.message}" + (f"\n{ctx}" if ctx else "")


class UnsupportedGrammarError(GrammarError):
    """Valid input that uses a construct corral cannot enforce exactly (fail closed)."""


class UnsupportedSchemaError(UnsupportedGrammarError):
    """A JSON Schema keyword corral cannot enforce exactly, named with its JSON pointer."""

    def __init__(self, keyword: str, pointer: str, reason: str = ""):
        self.keyword = keyword
        self.pointer = pointer or "#"
        self.reason = reason
        detail = f": {reason}" if reason else ""
        super().__init__(f"unsupported keyword {keyword!r} at {self.pointer}{detail}")


class EmptyLanguageError(GrammarError):
    """The grammar accepts no string, so no output could ever satisfy it."""


class VocabularyError(ConstraintError, ValueError):
    """A tokenizer whose tokens cannot be decoded to exact bytes, or inconsistent vocabulary data."""


class LimitExceeded(ConstraintError):
    """A bound from ``Limits`` was hit; the object that raised stays usable for other inputs."""

    def __init__(self, limit: str, value: int | float, message: str = ""):
        self.limit = limit
        self.value = value
        super().__init__(message or f"limit {limit}={value} exceeded")


class MatchError(ConstraintError):
    """Misuse of a Matcher at run time (not a property of the grammar)."""


class TokenRejected(MatchError, ValueError):
    """``Matcher.advance`` was given a token the mask does not allow; the matcher is unchanged."""

    def __init__(self, token: int, reason: str = ""):
        self.token = token
        super().__init__(f"token {token} is not allowed here" + (f": {reason}" if reason else ""))


class RollbackError(MatchError, ValueError):
    """``Matcher.rollback(n)`` with ``n`` larger than the number of tokens consumed."""


class NoAllowedToken(MatchError, RuntimeError):
    """A draw was asked for where the grammar allows no token (the matcher is terminated, or every
    allowed token had zero probability); the decoding loop should have stopped before it.

    Also a ``RuntimeError``, as it was before it joined the tree, so existing handlers still catch it."""
