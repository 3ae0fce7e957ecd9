"""Timed regions without the garbage collector's pauses, as ``timeit`` times them.

A benchmark's process holds a large heap (every run's compiled grammars and matcher caches), so
a cyclic collection can fire inside a timed loop and charge its pause to whatever was running.
That pause is the benchmark's, not the code's: the runners collect first, then time with the
collector paused.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["gc_paused"]


@contextmanager
def gc_paused() -> Iterator[None]:
    """Collect, then pause the cyclic garbage collector until the block ends (its state restored)."""
    gc.collect()
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()
