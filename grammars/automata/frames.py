"""Recursion without the Python stack, for walks whose depth the input controls.

A recursive function is written as a generator: where it would call itself (or a partner), it
``yield``s the generator of that call and is sent the call's return value; ``run_frames`` keeps
the pending generators in a list. The order of evaluation is exactly the recursive one, so
memo tables, first-seen numbering and error precedence do not change, but a grammar nested
thousands of levels deep costs heap, not frames. An exception raised in a call is thrown into its
caller at the ``yield``, as if the call had raised there.

Only the hop that closes a cycle of calls needs to be a yielded frame; helpers that do not lead
back may be called, or delegated to with ``yield from``, as usual (a ``yield from`` chain nests
C calls on every resume, so it must stay bounded).
"""

from __future__ import annotations

from typing import Any, Generator

__all__ = ["Frame", "run_frames"]

#: a generator-coded call: yields the calls it makes, receives their results, returns its own
Frame = Generator["Frame", Any, Any]


def run_frames(frame: Frame) -> Any:
    """Run ``frame`` and every call it yields to completion; its return value."""
    stack: list[Frame] = [frame]
    value: Any = None
    error: BaseException | None = None
    while True:
        top = stack[-1]
        try:
            if error is None:
                call = top.send(value)
            else:
                thrown, error = error, None
                call = top.throw(thrown)
        except StopIteration as stop:
            stack.pop()
            if not stack:
                return stop.value
            value = stop.value
            continue
        except BaseException as exc:  # handed to the caller's frame
            stack.pop()
            if not stack:
                raise
            error = exc
            continue
        stack.append(call)
        value = None
