"""Code point ranges as UTF-8 byte-range sequences.

``utf8_ranges(lo, hi)`` splits a range of Unicode scalar values into sequences of byte ranges such
that a byte string matches one of the sequences exactly when it is the (shortest-form, valid)
UTF-8 encoding of a code point in ``[lo, hi]``. This is the classic construction used by RE2 and
Rust's ``regex-syntax`` (``Utf8Sequences``): split at the encoding-length boundaries
(U+007F/U+0080, U+07FF/U+0800, U+FFFF/U+10000), cut out the surrogate block, then split until
every continuation byte spans a whole aligned block, so the cross product of the byte ranges is
exactly the encoded set. A complemented class such as "everything except ``"`` and ``\\``" needs
only a handful of sequences.
"""

from __future__ import annotations

__all__ = ["utf8_ranges", "utf8_sequences", "MAX_SCALAR"]

MAX_SCALAR = 0x10FFFF
_SURROGATE_LO = 0xD800
_SURROGATE_HI = 0xDFFF
_LENGTH_LIMITS = (0x7F, 0x7FF, 0xFFFF)


def _encode(cp: int) -> bytes:
    return chr(cp).encode("utf-8")


def utf8_ranges(lo: int, hi: int) -> list[list[tuple[int, int]]]:
    """Byte-range sequences whose union encodes exactly the code points ``lo..hi`` (inclusive).

    Each sequence is a list of 1 to 4 inclusive ``(byte_lo, byte_hi)`` ranges; sequences are
    disjoint and returned in increasing code point order. Surrogates are skipped and the range is
    clipped to ``0..0x10FFFF``; an empty range gives ``[]``.
    """
    lo = max(0, int(lo))
    hi = min(MAX_SCALAR, int(hi))
    out: list[list[tuple[int, int]]] = []
    if lo > hi:
        return out
    stack: list[tuple[int, int]] = [(lo, hi)]
    while stack:
        start, end = stack.pop()
        while True:
            # cut out the surrogate block
            if start <= _SURROGATE_HI and end >= _SURROGATE_LO:
                if end > _SURROGATE_HI:
                    stack.append((_SURROGATE_HI + 1, end))
                if start < _SURROGATE_LO:
                    end = _SURROGATE_LO - 1
                    continue
                break  # nothing left below the surrogates
            if start > end:
                break
            # split at the encoding-length boundaries
            split = False
            for limit in _LENGTH_LIMITS:
                if start <= limit < end:
                    stack.append((limit + 1, end))
                    end = limit
                    split = True
                    break
            if split:
                continue
            if end <= 0x7F:
                out.append([(start, end)])
                break
            # split until each continuation byte position spans a full aligned block
            for i in (1, 2, 3):
                m = (1 << (6 * i)) - 1
                if (start & ~m) != (end & ~m):
                    if start & m:
                        stack.append(((start | m) + 1, end))
                        end = start | m
                        split = True
                        break
                    if (end & m) != m:
                        stack.append((end & ~m, end))
                        end = (end & ~m) - 1
                        split = True
                        break
            if split:
                continue
            a, b = _encode(start), _encode(end)
            out.append(list(zip(a, b)))
            break
    return out


def utf8_sequences(ranges) -> list[list[tuple[int, int]]]:
    """``utf8_ranges`` over several code point ranges (e.g. ``Chars.ranges``), concatenated."""
    out: list[list[tuple[int, int]]] = []
    for lo, hi in ranges:
        out.extend(utf8_ranges(lo, hi))
    return out
