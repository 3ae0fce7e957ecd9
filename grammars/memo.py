"""Bounded, thread-safe memo tables, and the process-wide one for automata.

Why a process-wide table: the automata a grammar's terminals compile to are pure functions of
their expression (and the ``Limits`` they were built under), and schemas share most of them —
string bodies with the same bounds, numbers, whitespace, common keys. A server or a benchmark
that compiles many schemas with many ``Compiler`` objects builds each such automaton once.
Values kept here are immutable (``ByteDFA`` arrays are read-only), so sharing them across
compilers and threads is safe; every value is recomputable, so eviction only costs time.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Hashable
from threading import Lock
from typing import Any

__all__ = ["SHARED_AUTOMATA_BYTES", "SHARED_AUTOMATA_ENTRIES", "BoundedCache", "shared_automata"]


class BoundedCache:
    """A thread-safe LRU map bounded in entries and, with ``size_of``, in estimated bytes.

    Only for recomputable values: ``None`` is never stored (``get`` returns it for a miss).
    A value larger than ``max_bytes`` on its own is not kept.
    """

    def __init__(self, capacity: int, *, max_bytes: int | None = None,
                 size_of: Callable[[Any], int] | None = None):
        self.capacity = max(1, int(capacity))
        self.max_bytes = max_bytes
        self._size_of = size_of
        self._data: OrderedDict = OrderedDict()
        self._sizes: dict = {}
        self._bytes = 0
        self._lock = Lock()
        self.hits = 0
        self.misses = 0

    def get(self, key: Hashable):
        with self._lock:
            value = self._data.get(key)
            if value is not None:
                self._data.move_to_end(key)
                self.hits += 1
            else:
                self.misses += 1
            return value

    def put(self, key: Hashable, value) -> None:
        if value is None:
            return
        size = self._size_of(value) if self._size_of is not None and self.max_bytes is not None else 0
        if self.max_bytes is not None and size > self.max_bytes:
            return
        with self._lock:
            if key in self._data:
                self._bytes -= self._sizes.pop(key, 0)
            self._data[key] = value
            self._data.move_to_end(key)
            if size:
                self._sizes[key] = size
                self._bytes += size
            while len(self._data) > self.capacity or (self.max_bytes is not None and self._bytes > self.max_bytes):
                old, _ = self._data.popitem(last=False)
                self._bytes -= self._sizes.pop(old, 0)

    def clear(self) -> None:
        with self._lock:
            self._data.clear()
            self._sizes.clear()
            self._bytes = 0

    @property
    def nbytes(self) -> int:
        """Estimated bytes held (0 without ``size_of``)."""
        return self._bytes

    def __len__(self) -> int:
        return len(self._data)


#: Bounds of the process-wide automata table: entries and estimated bytes of their arrays.
SHARED_AUTOMATA_ENTRIES = 16384
SHARED_AUTOMATA_BYTES = 256 << 20


def _automaton_bytes(value: Any) -> int:
    """Estimated bytes of a memoised automaton: its arrays (a ``ByteDFA``'s table and accepting
    flags), plus a fixed overhead for the key and the object."""
    size = 512
    for name in ("table", "accepting"):
        array = getattr(value, name, None)
        size += int(getattr(array, "nbytes", 0))
    return size


_SHARED = BoundedCache(SHARED_AUTOMATA_ENTRIES, max_bytes=SHARED_AUTOMATA_BYTES, size_of=_automaton_bytes)


def shared_automata() -> BoundedCache:
    """The process-wide table of compiled automata (keys name what built them: the builder, its
    inputs and the ``Limits``)."""
    return _SHARED
