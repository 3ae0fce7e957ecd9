"""Fake engines over a byte tokenizer (token id = byte value, EOS = 256) for the runner tests.

A plain module, not the conftest, because the runners' spawned workers import the fakes by name
(``spec(AcceptAll)`` is ``"fake_engines:AcceptAll"``); this folder is put on ``sys.path`` by the
conftest, and the workers inherit it.

- ``AcceptAll`` allows every token and accepts anywhere (it accepts every invalid instance);
- ``RejectAll`` allows nothing (it rejects every valid instance);
- ``RefuseAll`` refuses every schema at compile time, naming the keyword ``enum``;
- ``ExactEnum`` is exact for ``{"enum": [...]}`` under MaskBench's serialization and refuses any
  other schema; a schema's ``"x-trap"`` makes it sleep 60 s, exit, segfault or raise mid-walk.
"""

from __future__ import annotations

import os
import signal
import time
from typing import Any

import numpy as np

from jsonschemabench.maskbench import serialize_instance
from jsonschemabench.peers import EngineRefused

EOS = 256
WIDTH = 257


def spec(obj: Any) -> str:
    """The ``module:name`` a worker imports ``obj`` by."""
    return f"{obj.__module__}:{obj.__qualname__}"


class ByteTokenizer:
    """Token id = UTF-8 byte; no ``vocab`` (failure notes print ids)."""

    vocab = None

    @staticmethod
    def encode(text: str) -> list[int]:
        return list(text.encode("utf-8"))


def byte_tokenizer(_arg: Any = None) -> ByteTokenizer:
    return ByteTokenizer()


def mask_of(bits) -> np.ndarray:
    """A packed int32 mask row with exactly ``bits`` set."""
    mask = np.zeros((1, (WIDTH + 31) // 32), dtype=np.int32)
    flat = mask.view(np.uint32).reshape(-1)
    for bit in bits:
        flat[bit >> 5] |= np.uint32(1 << (bit & 31))
    return mask


class FakeEngine:
    name = "fake"
    version = "0"
    eos_token_ids = (EOS,)

    def __init__(self, tokenizer: Any):
        self.options = {"call": f"{type(self).__name__}()"}

    def reset_caches(self) -> None:
        pass

    def compile(self, kind: str, schema: Any) -> Any:
        assert kind == "json_schema", kind
        return schema

    def matcher(self, handle: Any) -> list:
        return [handle, b""]

    def allowed(self, mask: np.ndarray, token: int) -> bool:
        return bool((int(mask.reshape(-1)[token >> 5]) >> (token & 31)) & 1)

    def advance(self, m: list, token: int) -> bool:
        m[1] += bytes([token])
        return True

    def is_accepting(self, m: list) -> bool:
        return True


class AcceptAll(FakeEngine):
    name = "accept_all"
    _all = mask_of(range(WIDTH))

    def fill_mask(self, m: list) -> np.ndarray:
        return self._all


class RejectAll(FakeEngine):
    name = "reject_all"
    _none = mask_of(())

    def fill_mask(self, m: list) -> np.ndarray:
        return self._none

    def is_accepting(self, m: list) -> bool:
        return False


class RefuseAll(AcceptAll):
    name = "refuse_all"

    def compile(self, kind: str, schema: Any) -> Any:
        raise EngineRefused("refused on purpose", kind="FakeError", keyword="enum", pointer="#/enum")


class ExactEnum(FakeEngine):
    """Exact for ``{"enum": [...]}`` (refuses anything else); traps on ``"x-trap"``."""

    name = "exact"

    def compile(self, kind: str, schema: Any) -> dict:
        trap = schema.get("x-trap") if isinstance(schema, dict) else None
        if trap == "sleep":
            time.sleep(60)
        elif trap == "exit":
            os._exit(3)
        elif trap == "segv":
            os.kill(os.getpid(), signal.SIGSEGV)
        if not isinstance(schema, dict) or "enum" not in schema:
            raise EngineRefused("only enum schemas", kind="FakeError")
        values = [serialize_instance(v).encode() for v in schema["enum"]]
        return {"values": values, "raise": trap == "raise"}

    def fill_mask(self, m: list) -> np.ndarray:
        handle, prefix = m
        bits = {v[len(prefix)] for v in handle["values"] if v.startswith(prefix) and len(v) > len(prefix)}
        if prefix in handle["values"]:
            bits.add(EOS)
        return mask_of(bits)

    def advance(self, m: list, token: int) -> bool:
        if m[0]["raise"]:
            raise RuntimeError("engine bug in advance")
        return super().advance(m, token)

    def is_accepting(self, m: list) -> bool:
        return m[1] in m[0]["values"]
