"""TokenVocabulary: exact token bytes, checked against llama.cpp's tokenizer test vectors.

The seven GGUF vocabularies are read from their own metadata; the derived ``tokenizer.json`` is
cached under ``~/.cache/corral`` or ``$CORRAL_CACHE_DIR`` (a few seconds each to build, about a
second to load). llama.cpp's test vectors are run in ``test_vocab_real_files.py``, small GGUF
files of every tokenizer model in ``test_vocab_gguf.py``. Tests that need ``../shared`` skip
without it.

The round-trip rule, as documented on ``TokenVocabulary``: for byte-level vocabularies
``decode(encode(text)) == text.encode()``; for SentencePiece vocabularies (llama-spm, phi-3)
llama.cpp adds one dummy-prefix space in front of every non-empty text, so
``decode(encode(text)) == b" " + text.encode()``, and ``""`` encodes to no tokens.
"""

from __future__ import annotations

import dataclasses
import json
import os
import pickle
import threading
import time

import pytest
from shared_data import VOCAB_NAMES, shared_path, vocab_file
from hypothesis import given, settings
from hypothesis import strategies as st

from grammars.errors import VocabularyError
from grammars.vocab.gguf import CACHE_ENV_VAR, load_gguf_tokenizer
from grammars.vocab.gguf_reader import read_gguf_metadata
from grammars.vocab.vocabulary import TokenVocabulary, decode_tokenizer_json

# Token counts, EOS ids (llama.cpp's end-of-generation set) and BOS ids of the GGUF files. llama.cpp
# ends generation on every "</s>" (Qwen2's ordinary token 128247, Phi-3's user-defined 2) and on
# FIM padding (StarCoder's <fim_pad>, 4), whatever the token types say.
EXPECTED = {
    "llama-bpe": (128_256, {128001, 128009}, 128000, "byte-level"),
    "qwen2": (151_936, {128247, 151643, 151645}, 151643, "byte-level"),
    "gpt-2": (50_257, {50256}, 50256, "byte-level"),
    "llama-spm": (32_000, {2}, 1, "sentencepiece"),
    "phi-3": (32_064, {2, 32000, 32007}, 1, "sentencepiece"),
    "deepseek-coder": (32_256, {32014}, 32013, "byte-level"),
    "starcoder": (49_152, {0, 4}, 0, "byte-level"),
}
SEPARATOR = "\n__ggml_vocab_test__\n"


@pytest.fixture(scope="module")
def gguf_vocabs():
    """Vocabularies loaded once per module, by name, from the default user cache."""
    loaded: dict[str, TokenVocabulary] = {}

    def get(name: str) -> TokenVocabulary:
        if name not in loaded:
            loaded[name] = TokenVocabulary.from_pretrained(vocab_file(name))
        return loaded[name]

    return get


def llama_cpp_vectors(name: str) -> list[tuple[str, list[int]]]:
    """llama.cpp's test-tokenizer-0 vectors: texts end with ``SEPARATOR``; the .out has one id line per text."""
    # bytes, not read_text: universal newlines would turn a text's "\r" into "\n"
    raw = shared_path("vocab", f"ggml-vocab-{name}.gguf.inp").read_bytes().decode("utf-8")
    out = shared_path("vocab", f"ggml-vocab-{name}.gguf.out").read_bytes().decode("utf-8")
    texts = raw.split(SEPARATOR)
    assert texts[-1] == "", "every text, the last included, is followed by the separator"
    lines = out.split("\n")
    assert lines[-1] == ""
    texts, lines = texts[:-1], lines[:-1]
    assert len(texts) == len(lines) > 40
    return [(text, [int(x) for x in line.split()]) for text, line in zip(texts, lines, strict=True)]


def expected_bytes(vocab: TokenVocabulary, text: str) -> bytes:
    if vocab.scheme == "sentencepiece" and text:
        return b" " + text.encode("utf-8")
    return text.encode("utf-8")


# --- real vocabularies -----------------------------------------------------------------------


@pytest.mark.parametrize("name", VOCAB_NAMES)
def test_gguf_vocabulary_loads(gguf_vocabs, name):
    vocab = gguf_vocabs(name)
    size, eos, bos, scheme = EXPECTED[name]
    assert len(vocab) == vocab.size == size == vocab.logits_width
    assert vocab.eos_token_ids == eos
    assert vocab.bos_token_id == bos
    assert vocab.scheme == scheme
    assert vocab.eos_token_ids <= vocab.special_token_ids
    assert vocab.bos_token_id in vocab.special_token_ids
    assert all(vocab.token_bytes[i] == b"" for i in vocab.special_token_ids)
    assert all(b for i, b in enumerate(vocab.token_bytes) if i not in vocab.special_token_ids)
    # every ASCII byte is a token of its own (byte-level alphabet or SentencePiece <0xNN> pieces)
    assert {b for b in vocab.token_bytes if len(b) == 1} >= {bytes([c]) for c in range(128)}


@pytest.mark.parametrize("name", VOCAB_NAMES)
def test_token_bytes_spell_llama_cpp_tokenizations(gguf_vocabs, name):
    """The bytes of llama.cpp's expected ids are the text: checks token bytes without our encoder."""
    vocab = gguf_vocabs(name)
    wrong = [
        (text, ids)
        for text, ids in llama_cpp_vectors(name)
        if b"".join(vocab.token_bytes[i] for i in ids) != expected_bytes(vocab, text)
    ]
    assert not wrong, f"{len(wrong)} texts spelled wrongly, first: {wrong[:3]}"


@pytest.mark.parametrize("name", ["gpt-2", "llama-spm", "deepseek-coder"])
def test_saved_gguf_tokenizer_loads_through_from_pretrained(gguf_vocabs, tmp_path, name):
    """The main route: a transformers tokenizer (here the one built from a GGUF file), saved and loaded back."""
    vocab = gguf_vocabs(name)
    vocab.hf_tokenizer.save_pretrained(str(tmp_path))
    again = TokenVocabulary.from_pretrained(tmp_path)
    assert again.token_bytes == vocab.token_bytes
    assert (again.scheme, again.bos_token_id) == (vocab.scheme, vocab.bos_token_id)
    assert again.eos_token_ids <= vocab.eos_token_ids
    mismatches = [text for text, ids in llama_cpp_vectors(name) if again.encode(text) != ids]
    assert not mismatches, mismatches
    # BOS as llama.cpp adds it: SentencePiece and DeepSeek-Coder yes, GPT-2 no
    assert (again.hf_tokenizer.encode("a")[0] == vocab.bos_token_id) == (name != "gpt-2")


def test_hf_tokenizer_is_the_corrected_conversion(gguf_vocabs):
    vocab = gguf_vocabs("deepseek-coder")
    hf = vocab.hf_tokenizer
    assert hf is vocab.hf_tokenizer  # loaded once
    assert len(hf) == len(vocab)  # transformers' three extra ids are gone
    assert hf.eos_token_id in vocab.eos_token_ids and hf.bos_token_id == vocab.bos_token_id
    text = "def f(x):\n    return ½ * x"
    assert hf.encode(text, add_special_tokens=False) == vocab.encode(text)
    assert TokenVocabulary.from_bytes([b"a", b""], eos_token_ids=[1]).hf_tokenizer is None


def test_encode_leaves_special_token_text_alone(gguf_vocabs):
    vocab = gguf_vocabs("llama-bpe")
    ids = vocab.encode("a<|eot_id|>b")
    assert not set(ids) & vocab.special_token_ids
    assert vocab.decode(ids) == b"a<|eot_id|>b"


def test_user_defined_tokens_match_literally(gguf_vocabs):
    """User-defined tokens are their text, and llama.cpp cuts them out of the text before BPE."""
    vocab = gguf_vocabs("deepseek-coder")
    assert vocab.token_bytes[32000] == "õ".encode()
    assert vocab.encode("xõy")[1] == 32000
    qwen = gguf_vocabs("qwen2")
    assert qwen.token_bytes[151646] == b"[PAD151646]"
    assert qwen.encode("a[PAD151646]b") == qwen.encode("a") + [151646] + qwen.encode("b")


def test_fim_markers_are_control_tokens(gguf_vocabs):
    """DeepSeek-Coder's FIM markers are typed user-defined, but llama.cpp makes FIM markers control tokens."""
    vocab = gguf_vocabs("deepseek-coder")
    assert {32015, 32016, 32017} <= vocab.special_token_ids
    ids = vocab.encode("<｜fim▁hole｜>x")
    assert 32015 not in ids and vocab.decode(ids) == "<｜fim▁hole｜>x".encode()


def test_fingerprint_stable_and_distinct(gguf_vocabs):
    fingerprints = {name: gguf_vocabs(name).fingerprint for name in VOCAB_NAMES}
    assert len(set(fingerprints.values())) == len(VOCAB_NAMES)
    again = TokenVocabulary.from_pretrained(vocab_file("llama-bpe"))
    assert again.fingerprint == fingerprints["llama-bpe"]
    assert again == gguf_vocabs("llama-bpe") and hash(again) == hash(gguf_vocabs("llama-bpe"))
    assert again != gguf_vocabs("qwen2")


def test_fingerprint_is_fast(gguf_vocabs):
    vocab = gguf_vocabs("llama-bpe")
    start = time.perf_counter()
    widened = dataclasses.replace(vocab, logits_width=vocab.size + 256)
    assert time.perf_counter() - start < 0.5
    assert widened.fingerprint != vocab.fingerprint  # the width is part of the identity
    assert widened.encode("hi") == vocab.encode("hi")


def test_eos_override(gguf_vocabs):
    vocab = TokenVocabulary.from_pretrained(vocab_file("llama-bpe"), eos_token_ids=[128009], logits_width=128_320)
    assert vocab.eos_token_ids == {128009}
    assert 128001 in vocab.special_token_ids  # still a control token, just not an end
    assert vocab.logits_width == 128_320 and len(vocab) == 128_256
    assert vocab.fingerprint != gguf_vocabs("llama-bpe").fingerprint


def test_pickle_round_trip(gguf_vocabs):
    vocab = gguf_vocabs("gpt-2")
    vocab.encode("warm up the lazy tokenizer")
    clone = pickle.loads(pickle.dumps(vocab))
    assert clone == vocab
    assert clone.encode("Hello world") == vocab.encode("Hello world")


@pytest.mark.parametrize("name", ["gpt-2", "llama-spm", "phi-3", "deepseek-coder"])
def test_from_tokenizer_agrees_with_gguf(gguf_vocabs, name):
    """The generic path (scheme read from tokenizer JSON) on the cached, corrected tokenizer folder."""
    vocab = gguf_vocabs(name)
    folder = load_gguf_tokenizer(vocab_file(name)).tokenizer_file.parent
    from_folder = TokenVocabulary.from_pretrained(folder)
    assert from_folder.scheme == vocab.scheme
    assert from_folder.token_bytes == vocab.token_bytes
    assert from_folder.encode("Hello, world! 123") == vocab.encode("Hello, world! 123")
    assert from_folder.bos_token_id == vocab.bos_token_id
    from_file = TokenVocabulary.from_pretrained(folder / "tokenizer.json")
    assert from_file.token_bytes == vocab.token_bytes


def test_gguf_cache_is_written_atomically_and_reused(gguf_vocabs, tmp_path, monkeypatch):
    """Cold loads into an empty cache root (named by the env var) leave one complete entry and no temp folders."""
    monkeypatch.setenv(CACHE_ENV_VAR, str(tmp_path))
    path = vocab_file("llama-spm")
    first = TokenVocabulary.from_pretrained(path)
    assert first == gguf_vocabs("llama-spm")
    entries = os.listdir(tmp_path / "tokenizers")
    assert entries == [read_gguf_metadata(path).digest], entries
    entry = tmp_path / "tokenizers" / entries[0]
    assert {"tokenizer.json", "tokenizer_config.json", "corral-gguf.json"} <= set(os.listdir(entry))

    start = time.perf_counter()
    assert TokenVocabulary.from_pretrained(path) == first
    assert time.perf_counter() - start < 2.0, "a cached load must not convert again"

    # A damaged entry is rebuilt, not trusted, even by two loaders racing to replace it.
    (entry / "corral-gguf.json").write_text("{not json", encoding="utf-8")
    results: list[TokenVocabulary] = []
    threads = [
        threading.Thread(target=lambda: results.append(TokenVocabulary.from_pretrained(path, cache_dir=tmp_path)))
        for _ in range(2)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == [first, first]
    assert os.listdir(tmp_path / "tokenizers") == entries
    assert json.loads((entry / "corral-gguf.json").read_text(encoding="utf-8"))["model"] == "llama"
    assert results[0].encode("Hello") == first.encode("Hello")


# --- errors -----------------------------------------------------------------------------------


def test_missing_paths_name_the_path(tmp_path):
    missing = tmp_path / "nope.gguf"
    with pytest.raises(VocabularyError, match="nope.gguf"):
        TokenVocabulary.from_pretrained(missing)
    with pytest.raises(VocabularyError, match="nope.gguf"):
        TokenVocabulary.from_gguf(missing)
    with pytest.raises(VocabularyError, match="no-such-dir"):
        TokenVocabulary.from_pretrained(tmp_path / "no-such-dir")


def test_garbage_gguf_raises(tmp_path):
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"not a gguf file at all" * 10)
    with pytest.raises(VocabularyError, match="bad.gguf"):
        TokenVocabulary.from_gguf(bad, cache_dir=tmp_path / "cache")


def test_logits_width_smaller_than_vocab_raises(gguf_vocabs):
    with pytest.raises(VocabularyError, match="logits_width"):
        TokenVocabulary.from_bytes([b"a", b"b", b""], eos_token_ids=[2], logits_width=2)
    with pytest.raises(VocabularyError, match="logits_width"):
        TokenVocabulary.from_pretrained(vocab_file("gpt-2"), logits_width=50_000)


def test_inconsistent_vocabularies_raise():
    with pytest.raises(VocabularyError, match="empty bytes"):
        TokenVocabulary(token_bytes=(b"a", b"</s>"), eos_token_ids=frozenset({1}))
    with pytest.raises(VocabularyError, match="no bytes"):
        TokenVocabulary(token_bytes=(b"a", b"", b""), eos_token_ids=frozenset({2}))
    with pytest.raises(VocabularyError, match="outside"):
        TokenVocabulary.from_bytes([b"a", b""], eos_token_ids=[5])
    with pytest.raises(VocabularyError, match="BOS"):
        TokenVocabulary.from_bytes([b"a", b""], eos_token_ids=[1], bos_token_id=-1)
    with pytest.raises(VocabularyError, match="at least one"):
        TokenVocabulary.from_bytes([], eos_token_ids=[])


def test_unknown_tokenizer_schemes_raise():
    wordpiece = {"model": {"type": "WordPiece", "vocab": {"a": 0}}, "decoder": {"type": "WordPiece"}}
    with pytest.raises(VocabularyError, match="WordPiece"):
        decode_tokenizer_json(wordpiece)
    unknown_decoder = {"model": {"type": "BPE", "vocab": {"a": 0}, "merges": []}, "decoder": {"type": "CTC"}}
    with pytest.raises(VocabularyError, match="cannot tell"):
        decode_tokenizer_json(unknown_decoder)
    clip_like = {
        "model": {"type": "BPE", "vocab": {"a</w>": 0}, "merges": [], "end_of_word_suffix": "</w>"},
        "decoder": {"type": "ByteLevel"},
    }
    with pytest.raises(VocabularyError, match="suffix"):
        decode_tokenizer_json(clip_like)


def test_from_tokenizer_without_eos_or_backend_raises():
    class NoBackend:
        name_or_path = "fake"

    with pytest.raises(VocabularyError, match="fake"):
        TokenVocabulary.from_tokenizer(NoBackend())

    tokenizers = pytest.importorskip("tokenizers")
    backend = tokenizers.Tokenizer(tokenizers.models.BPE(vocab={"a": 0, "b": 1}, merges=[]))
    backend.decoder = tokenizers.decoders.ByteLevel()

    class NoEos:
        name_or_path = "no-eos"
        backend_tokenizer = backend
        eos_token_id = None

    with pytest.raises(VocabularyError, match="eos_token_ids"):
        TokenVocabulary.from_tokenizer(NoEos())
    vocab = TokenVocabulary.from_tokenizer(NoEos(), eos_token_ids=[1])
    assert vocab.token_bytes == (b"a", b"") and vocab.scheme == "byte-level"


# --- decoding rules and from_bytes --------------------------------------------------------------


def test_decoding_rules():
    sp = {
        "model": {
            "type": "BPE",
            "vocab": {"<unk>": 0, "▁a": 1, "<0x0A>": 2, "▁▁": 3, "<|user|>": 4, "x": 5},
            "merges": [],
            "byte_fallback": True,
            "unk_token": "<unk>",
        },
        "decoder": {
            "type": "Sequence",
            "decoders": [
                {"type": "Replace", "pattern": {"String": "▁"}, "content": " "},
                {"type": "ByteFallback"},
                {"type": "Fuse"},
                {"type": "Strip", "content": " ", "start": 1, "stop": 0},
            ],
        },
        "added_tokens": [
            {"id": 4, "content": "<|user|>", "special": True},
            {"id": 6, "content": "<tool>", "special": False},
        ],
    }
    scheme, pieces, special = decode_tokenizer_json(sp)
    assert scheme == "sentencepiece"
    assert pieces == [b"", b" a", b"\n", b"  ", b"", b"x", b"<tool>"]
    assert special == {0, 4}
    bl = {
        "model": {"type": "BPE", "vocab": {"Ġa": 0, "Ċ": 1, "Ã©": 2, "Ā": 3}, "merges": []},
        "decoder": {"type": "ByteLevel"},
    }
    scheme, pieces, special = decode_tokenizer_json(bl)
    assert scheme == "byte-level"
    assert pieces == [b" a", b"\n", "é".encode(), b"\x00"] and not special


def test_from_bytes_round_trip(byte_vocab_local):
    vocab = byte_vocab_local
    assert len(vocab) == vocab.logits_width == 268
    assert vocab.scheme == "bytes"
    text = '{"a": true, "b": null, "c": "é"}'
    ids = vocab.encode(text)
    assert vocab.decode(ids) == text.encode()
    assert ids[0] == 256  # greedy longest match takes '{"' over '{'
    assert vocab.encode("") == []


def test_from_bytes_blanks_special_pieces_and_pads():
    vocab = TokenVocabulary.from_bytes([b"a", b"b", b"</s>"], eos_token_ids=[2], logits_width=64, name="tiny")
    assert vocab.token_bytes == (b"a", b"b", b"")
    assert vocab.special_token_ids == {2} and vocab.logits_width == 64 and len(vocab) == 3
    assert vocab.encode("ab") == [0, 1]
    with pytest.raises(VocabularyError, match="no token matches"):
        vocab.encode("c")
    with pytest.raises(VocabularyError, match="outside"):
        vocab.decode([0, 3])  # a padding column of the logits, not a token
    with pytest.raises(VocabularyError, match="outside"):
        vocab.decode([-1])
    same = TokenVocabulary.from_bytes([b"a", b"b", b""], eos_token_ids=[2], logits_width=64, name="other")
    assert same == vocab and hash(same) == hash(vocab)  # the name is not part of the identity
    assert TokenVocabulary.from_bytes([b"a", b"b", b""], eos_token_ids=[2]) != vocab
    assert "tiny" in repr(vocab) and "b'a'" not in repr(vocab)


@pytest.fixture
def byte_vocab_local():
    """conftest's ``byte_vocab``, built here because ``grammars`` may not export the class yet."""
    pieces = [bytes([b]) for b in range(256)]
    pieces += [b'{"', b'":', b'",', b'"}', b"true", b"null", b"  ", b"12", b"ab", b"\xc3\xa9", b"\xe3\x81"]
    return TokenVocabulary.from_bytes(pieces + [b""], eos_token_ids=[len(pieces)], special_token_ids=[len(pieces)])


@settings(max_examples=60, deadline=None)
@given(
    extra=st.lists(st.binary(min_size=2, max_size=6), max_size=30),
    text=st.text(max_size=40),
)
def test_from_bytes_greedy_round_trip(extra, text):
    pieces = [bytes([b]) for b in range(256)] + extra + [b""]
    vocab = TokenVocabulary.from_bytes(pieces, eos_token_ids=[len(pieces) - 1])
    ids = vocab.encode(text)
    assert vocab.decode(ids) == text.encode("utf-8")
    assert vocab.eos_token_ids.isdisjoint(ids)
    assert vocab.fingerprint == TokenVocabulary.from_bytes(pieces, eos_token_ids=[len(pieces) - 1]).fingerprint
