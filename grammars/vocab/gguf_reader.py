"""Read the key-value metadata of a GGUF file: the tokenizer lives there, whatever the architecture.

Why not ``gguf.GGUFReader``: it builds numpy views for every element of every array, which takes
about 30 s for Llama 3's 128k tokens and 280k merges (and it maps the tensor section too). The
tokenizer needs only the header and the key-value section, which this module parses directly in
well under a second, reading nothing past it (a full model file can be many gigabytes). The
format is GGUF v2/v3 (ggml's ``docs/gguf.md``), little- or big-endian; ``tests`` check this
reader against ``gguf.GGUFReader`` on files written with ``gguf.GGUFWriter``.

Values come back as Python values: integers, floats and bools as such, strings as raw ``bytes``
(a token's text is bytes to llama.cpp; decoding is the caller's decision), arrays of numbers as
numpy arrays and other arrays as lists.
"""

from __future__ import annotations

import hashlib
import mmap
import os
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from grammars.errors import VocabularyError

__all__ = ["GGUFMetadata", "read_gguf_metadata"]

_MAGIC = b"GGUF"
_STRING = 8
_ARRAY = 9
# GGUF value type -> struct format letter (without the byte-order prefix)
_SCALARS: dict[int, str] = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}


@dataclass(frozen=True)
class GGUFMetadata:
    """A GGUF file's key-value pairs, and a digest of the bytes they were read from."""

    path: Path
    version: int
    fields: dict[str, Any]
    #: sha256 of the header and key-value section: identifies the tokenizer without hashing tensors
    digest: str

    def get(self, key: str, default: Any = None) -> Any:
        return self.fields.get(key, default)

    def text(self, key: str, default: str | None = None) -> str | None:
        """A string value decoded as UTF-8 (``VocabularyError`` naming the key when it is not UTF-8 or not a string)."""
        value = self.fields.get(key)
        if value is None:
            return default
        if not isinstance(value, bytes):
            raise VocabularyError(f"{self.path}: {key} should be a string, not {type(value).__name__}")
        try:
            return value.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise VocabularyError(f"{self.path}: {key} is not UTF-8 text ({exc})") from exc


class _Cursor:
    """Sequential reads from a buffer in one byte order; a read past the end is a truncated file."""

    def __init__(self, buf: Any, order: str, path: Path):
        self.buf = buf
        self.pos = 0
        self.order = order
        self.path = path
        self._u64 = struct.Struct(order + "Q")

    def scalar(self, fmt: str) -> Any:
        try:
            (value,) = struct.unpack_from(self.order + fmt, self.buf, self.pos)
        except struct.error as exc:
            raise VocabularyError(f"{self.path}: truncated GGUF metadata at byte {self.pos}") from exc
        self.pos += struct.calcsize(fmt)
        return value

    def string(self) -> bytes:
        n = self.scalar("Q")
        end = self.pos + n
        if end > len(self.buf):
            raise VocabularyError(f"{self.path}: a string of {n} bytes at byte {self.pos} runs past the end of the file")
        value = bytes(self.buf[self.pos : end])
        self.pos = end
        return value

    def strings(self, count: int) -> list[bytes]:
        """``count`` strings in a row: the hot loop for token and merge lists."""
        buf, pos, size, u64 = self.buf, self.pos, len(self.buf), self._u64.unpack_from
        out: list[bytes] = []
        append = out.append
        try:
            for _ in range(count):
                (n,) = u64(buf, pos)
                pos += 8
                if pos + n > size:
                    raise VocabularyError(f"{self.path}: a string at byte {pos} runs past the end of the file")
                append(bytes(buf[pos : pos + n]))
                pos += n
        except struct.error as exc:
            raise VocabularyError(f"{self.path}: truncated GGUF metadata at byte {pos}") from exc
        self.pos = pos
        return out

    def value(self, vtype: int) -> Any:
        if vtype == _STRING:
            return self.string()
        if vtype == _ARRAY:
            return self.array()
        fmt = _SCALARS.get(vtype)
        if fmt is None:
            raise VocabularyError(f"{self.path}: unknown GGUF value type {vtype} at byte {self.pos}")
        return self.scalar(fmt)

    def array(self) -> Any:
        etype = self.scalar("I")
        count = self.scalar("Q")
        if etype == _STRING:
            return self.strings(count)
        fmt = _SCALARS.get(etype)
        if fmt is None:  # arrays of arrays
            return [self.value(etype) for _ in range(count)]
        dtype = np.dtype(self.order + fmt if fmt != "?" else "?")
        nbytes = dtype.itemsize * count
        if self.pos + nbytes > len(self.buf):
            raise VocabularyError(f"{self.path}: an array of {count} values at byte {self.pos} runs past the end")
        values = np.frombuffer(self.buf, dtype=dtype, count=count, offset=self.pos).astype(dtype.newbyteorder("="))
        self.pos += nbytes
        return values


def read_gguf_metadata(path: str | os.PathLike[str]) -> GGUFMetadata:
    """The key-value metadata of a GGUF file (``VocabularyError`` naming the file when it is not one)."""
    source = Path(path)
    try:
        with open(source, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if size < 24:
                raise VocabularyError(f"{source} is not a GGUF file (only {size} bytes)")
            with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
                return _parse(mm, source)
    except OSError as exc:
        raise VocabularyError(f"cannot read {source}: {exc}") from exc


def _parse(buf: mmap.mmap, source: Path) -> GGUFMetadata:
    if buf[:4] != _MAGIC:
        raise VocabularyError(f"{source} is not a GGUF file (magic {bytes(buf[:4])!r})")
    (version,) = struct.unpack_from("<I", buf, 4)
    order = "<"
    if version & 0xFFFF == 0:  # written on a big-endian machine
        order = ">"
        (version,) = struct.unpack_from(">I", buf, 4)
    if version not in (2, 3):
        raise VocabularyError(f"{source}: GGUF version {version} is not supported (only 2 and 3)")
    cursor = _Cursor(buf, order, source)
    cursor.pos = 8
    cursor.scalar("Q")  # tensor count: the tensors are not read
    n_kv = cursor.scalar("Q")
    fields: dict[str, Any] = {}
    for _ in range(n_kv):
        raw_key = cursor.string()
        try:
            key = raw_key.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise VocabularyError(f"{source}: a metadata key is not UTF-8 ({raw_key!r})") from exc
        fields[key] = cursor.value(cursor.scalar("I"))
    digest = hashlib.sha256(buf[: cursor.pos]).hexdigest()
    return GGUFMetadata(path=source, version=version, fields=fields, digest=digest)
