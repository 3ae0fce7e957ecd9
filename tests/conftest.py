"""Shared fixtures: where the shared data lives, and vocabularies built from it.

Tests that need ``../shared`` skip with a message naming the missing path, so a fresh clone
without the data still runs the rest of the suite.
"""

from __future__ import annotations

import pytest

from shared_data import SHARED_DIR, VOCAB_NAMES, shared_path, vocab_file  # noqa: F401 (re-exported)


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
