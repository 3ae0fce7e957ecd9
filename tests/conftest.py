"""Shared fixtures: where the shared data lives, and vocabularies built from it.

Tests that need ``../shared`` skip with a message naming the missing path, so a fresh clone
without the data still runs the rest of the suite.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent
SHARED_DIR = Path(os.environ.get("CORRAL_SHARED_DIR", REPO_ROOT.parent / "shared"))


def shared_path(*parts: str) -> Path:
    """Path under the shared data folder; skips the calling test when it is absent."""
    path = SHARED_DIR.joinpath(*parts)
    if not path.exists():
        pytest.skip(f"shared data not found: {path} (set CORRAL_SHARED_DIR to its location)")
    return path


VOCAB_NAMES = ("llama-bpe", "qwen2", "gpt-2", "llama-spm", "phi-3", "deepseek-coder", "starcoder")


def vocab_file(name: str) -> Path:
    return shared_path("vocab", f"ggml-vocab-{name}.gguf")


@pytest.fixture(scope="session")
def llama3_vocab():
    from grammars import TokenVocabulary

    return TokenVocabulary.from_pretrained(vocab_file("llama-bpe"))


@pytest.fixture(scope="session")
def llama2_vocab():
    from grammars import TokenVocabulary

    return TokenVocabulary.from_pretrained(vocab_file("llama-spm"))


@pytest.fixture(scope="session")
def byte_vocab():
    """A vocabulary of the 256 single bytes, a few multi-byte tokens and an EOS: no data needed."""
    from grammars import TokenVocabulary

    pieces = [bytes([b]) for b in range(256)]
    pieces += [b'{"', b'":', b'",', b'"}', b"true", b"null", b"  ", b"12", b"ab", b"\xc3\xa9", b"\xe3\x81"]
    return TokenVocabulary.from_bytes(pieces + [b""], eos_token_ids=[len(pieces)], special_token_ids=[len(pieces)])


@pytest.fixture(scope="session")
def llama3_compiler(llama3_vocab):
    """One Compiler for the whole session, so trie walks are shared across tests (as in a server)."""
    from grammars import Compiler

    return Compiler(llama3_vocab)
