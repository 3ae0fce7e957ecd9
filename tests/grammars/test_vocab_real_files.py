"""The real GGUF vocabularies in ``../shared/vocab``: llama.cpp's tokenizer test vectors, and token bytes.

* every ``*.gguf.inp``/``*.gguf.out`` pair found there is run, vector by vector, and the failure
  message lists each file's mismatches (text, llama.cpp's ids, ours);
* the bytes of every id are compared with the rule corral used before it read GGUF metadata
  itself (GGUF types, GPT-2/SentencePiece decoding, a shorter end-of-generation list); the only
  differences allowed are the ones listed in ``CHANGED``, each with llama.cpp's reason.

Skips without the shared data.
"""

from __future__ import annotations

import re

import pytest
from shared_data import SHARED_DIR, shared_path

from grammars.vocab.gguf_reader import read_gguf_metadata
from grammars.vocab.vocabulary import TokenVocabulary, byte_level_piece_bytes, sentencepiece_piece_bytes

SEPARATOR = "\n__ggml_vocab_test__\n"
VOCAB_DIR = SHARED_DIR / "vocab"
PAIRS = sorted(p.name[: -len(".inp")] for p in VOCAB_DIR.glob("*.gguf.inp")) if VOCAB_DIR.is_dir() else []
FILES = sorted(p.name for p in VOCAB_DIR.glob("*.gguf")) if VOCAB_DIR.is_dir() else []


@pytest.fixture(scope="module")
def vocabs():
    loaded: dict[str, TokenVocabulary] = {}

    def get(file_name: str) -> TokenVocabulary:
        if file_name not in loaded:
            loaded[file_name] = TokenVocabulary.from_gguf(shared_path("vocab", file_name))
        return loaded[file_name]

    return get


def vectors(file_name: str) -> list[tuple[str, list[int]]]:
    """llama.cpp's test-tokenizer-0 vectors: texts end with ``SEPARATOR``; the .out has one id line per text."""
    # bytes, not read_text: universal newlines would turn a text's "\r" into "\n"
    texts = shared_path("vocab", file_name + ".inp").read_bytes().decode("utf-8").split(SEPARATOR)
    lines = shared_path("vocab", file_name + ".out").read_bytes().decode("utf-8").split("\n")
    assert texts[-1] == "" and lines[-1] == "", "every text and id line is terminated"
    assert len(texts) == len(lines)
    return [(text, [int(x) for x in line.split()]) for text, line in zip(texts[:-1], lines[:-1], strict=True)]


@pytest.mark.skipif(not PAIRS, reason=f"no llama.cpp test vectors under {VOCAB_DIR}")
@pytest.mark.parametrize("file_name", PAIRS)
def test_encode_matches_every_llama_cpp_vector(vocabs, file_name):
    vocab = vocabs(file_name)
    cases = vectors(file_name)
    mismatches = [(text, ids, got) for text, ids in cases if (got := vocab.encode(text)) != ids]
    report = "\n".join(f"  {text!r}: llama.cpp {ids}, corral {got}" for text, ids, got in mismatches)
    assert not mismatches, f"{file_name}: {len(mismatches)} of {len(cases)} vectors differ\n{report}"


# --- token bytes against the earlier rule ------------------------------------------------------------

# The end-of-generation texts of the earlier rule (llama.cpp's list has grown since).
_OLD_EOG = {"<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<end_of_turn>", "<|endoftext|>",
            "<|eom_id|>", "<EOT>", "_<EOT>", "<|end_of_text|>", "<end_of_utterance>"}
_BYTE = re.compile(r"<0x([0-9A-Fa-f]{2})>")

# file -> {id: why llama.cpp's rules now give b""}
CHANGED = {
    # "</s>" is on llama.cpp's end-of-generation list (for PaddleOCR), which makes it a control token
    "ggml-vocab-qwen2.gguf": {128247: "an ordinary BPE token '</s>', made control and end-of-generation"},
    "ggml-vocab-phi-3.gguf": {2: "user-defined '</s>', made control and end-of-generation"},
    # llama.cpp makes fill-in-the-middle markers control tokens when the metadata does not name them
    "ggml-vocab-deepseek-coder.gguf": {
        32015: "user-defined FIM suffix marker, made control",
        32016: "user-defined FIM prefix marker, made control",
        32017: "user-defined FIM middle marker, made control",
    },
}


def old_token_bytes(file_name: str) -> list[bytes]:
    """Bytes per id by the rule before this reader: GGUF types, and decoding by tokenizer model."""
    meta = read_gguf_metadata(shared_path("vocab", file_name))
    texts = [t.decode("utf-8") for t in meta.get("tokenizer.ggml.tokens")]
    types = meta.get("tokenizer.ggml.token_type").tolist()
    byte_level = meta.text("tokenizer.ggml.model") == "gpt2"
    ends = {meta.get(f"tokenizer.ggml.{k}_token_id") for k in ("eos", "eot", "eom")}
    out = []
    for i, (text, kind) in enumerate(zip(texts, types, strict=True)):
        if i in ends or (text in _OLD_EOG and kind != 6):
            piece = b""
        elif kind == 1:
            piece = byte_level_piece_bytes(text) if byte_level else sentencepiece_piece_bytes(text, byte_fallback=False)
        elif kind == 4:
            piece = text.encode("utf-8")
        elif kind == 6:
            piece = bytes([int(_BYTE.fullmatch(text).group(1), 16)])
        else:
            piece = b""
        out.append(piece)
    return out


@pytest.mark.skipif(not FILES, reason=f"no GGUF vocabularies under {VOCAB_DIR}")
@pytest.mark.parametrize("file_name", FILES)
def test_token_bytes_differ_from_the_earlier_rule_only_where_llama_cpp_says(vocabs, file_name):
    new = vocabs(file_name).token_bytes
    old = old_token_bytes(file_name)
    assert len(new) == len(old)
    changed = {i: (old[i], new[i]) for i in range(len(new)) if old[i] != new[i]}
    expected = CHANGED.get(file_name, {})
    assert set(changed) == set(expected), {i: changed.get(i) for i in set(changed) ^ set(expected)}
    assert all(after == b"" for _, after in changed.values())  # each change makes a token special

