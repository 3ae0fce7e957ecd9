"""GGUF vocabularies read from their own metadata: small files written here, one per tokenizer model.

Every file names an architecture no library knows ("myarch"): the tokenizer metadata alone must
decide the token bytes, which are checked byte for byte against llama.cpp's ``token_to_piece``.
"""

from __future__ import annotations

import pickle

import numpy as np
import pytest

gguf = pytest.importorskip("gguf")

from grammars.errors import VocabularyError  # noqa: E402
from grammars.vocab.gguf import load_gguf_tokenizer  # noqa: E402
from grammars.vocab.gguf_encode import partition  # noqa: E402
from grammars.vocab.gguf_reader import read_gguf_metadata  # noqa: E402
from grammars.vocab.llama_vocab import GGUFTokenType as T  # noqa: E402
from grammars.vocab.llama_vocab import gpt2_decode_text, rwkv_unescape  # noqa: E402
from grammars.vocab.vocabulary import TokenVocabulary  # noqa: E402


def gpt2_chars() -> list[str]:
    """GPT-2's byte alphabet: the character standing for each byte 0..255."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars, extra = {}, 0
    for b in range(256):
        if b in printable:
            chars[b] = chr(b)
        else:
            chars[b] = chr(256 + extra)
            extra += 1
    return [chars[b] for b in range(256)]


def write_gguf(path, *, model, tokens, types=None, pre=None, merges=None, scores=None, ids=None, flags=None,
               name=None, endian=None, extra=None):
    """A vocab-only GGUF file with architecture "myarch" (``ids``: {"bos": 1, ...}; ``flags``: add_* booleans)."""
    kwargs = {} if endian is None else {"endianess": endian}
    w = gguf.GGUFWriter(str(path), "myarch", **kwargs)
    if name is not None:
        w.add_name(name)
    w.add_tokenizer_model(model)
    if pre is not None:
        w.add_tokenizer_pre(pre)
    w.add_token_list(tokens)
    if types is not None:
        w.add_token_types(types)
    if scores is not None:
        w.add_token_scores([float(s) for s in scores])
    if merges is not None:
        w.add_token_merges(merges)
    for key, value in (ids or {}).items():
        w.add_uint32(f"tokenizer.ggml.{key}_token_id", value)
    for key, value in (flags or {}).items():
        w.add_bool(f"tokenizer.ggml.{key}", value)
    for key, value in (extra or {}).items():
        w.add_string(key, value)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.close()
    return path


def load(path, tmp_path, **kwargs) -> TokenVocabulary:
    return TokenVocabulary.from_gguf(path, cache_dir=tmp_path / "cache", **kwargs)


# --- byte-level BPE under an unknown architecture ---------------------------------------------------

BPE_EXTRA = ["Ġt", "he", "Ġthe", "<|endoftext|>", "<tool>", "ĠâĢĶ", "ab中", "<|eot_id|>", "<|fim_pad|>",
             "<|channel|>"]


@pytest.fixture
def bpe_file(tmp_path):
    tokens = gpt2_chars() + BPE_EXTRA
    types = [T.NORMAL] * 256 + [T.NORMAL, T.NORMAL, T.NORMAL, T.CONTROL, T.USER_DEFINED, T.NORMAL, T.NORMAL,
                                T.NORMAL, T.CONTROL, T.CONTROL]
    return write_gguf(tmp_path / "bpe.gguf", model="gpt2", pre="gpt-2", tokens=tokens, types=types,
                      merges=["Ġ t", "h e", "Ġt he"], ids={"bos": 259, "eos": 259})


def test_bpe_token_bytes_follow_token_to_piece(bpe_file, tmp_path):
    vocab = load(bpe_file, tmp_path)
    assert vocab.scheme == "byte-level" and len(vocab) == 266
    assert vocab.token_bytes[:256] == tuple(bytes([b]) for b in range(256))
    assert vocab.token_bytes[256:259] == (b" t", b"he", b" the")
    assert vocab.token_bytes[259] == b""  # control: <|endoftext|>
    assert vocab.token_bytes[260] == b"<tool>"  # user-defined: literal text
    assert vocab.token_bytes[261] == " —".encode()
    # a character outside GPT-2's alphabet: llama.cpp prints this marker (and so does the token)
    assert vocab.token_bytes[262] == b"ab[UNK_BYTE_0xe4b8adab\xe4\xb8\xad]"
    # "<|eot_id|>" is typed normal, but llama.cpp makes it control and end-of-generation
    assert vocab.token_bytes[263] == b"" and 263 in vocab.eos_token_ids
    assert 264 in vocab.eos_token_ids  # FIM padding ends generation in llama.cpp
    assert vocab.token_bytes[265] == b"<|channel|>"  # gpt-oss's markers are printed as text
    assert vocab.eos_token_ids == {259, 263, 264} and vocab.bos_token_id == 259


def test_bpe_encode_cuts_user_defined_tokens_then_merges(bpe_file, tmp_path):
    vocab = load(bpe_file, tmp_path)
    t, x = ord("t"), ord("x")  # byte tokens: id = byte
    assert vocab.encode("the the<tool>x") == [t, 257, 258, 260, x]
    ids = vocab.encode("a<|endoftext|>b")  # control text stays text (parse_special=false)
    assert 259 not in ids and vocab.decode(ids) == b"a<|endoftext|>b"
    assert vocab.encode("<|channel|>") == [265]  # user-defined now, so cut out of the text
    text = "Hello — wörld\n\t \x00"
    assert vocab.decode(vocab.encode(text)) == text.encode()


def test_bpe_vocabulary_pickles_and_reencodes(bpe_file, tmp_path):
    vocab = load(bpe_file, tmp_path)
    clone = pickle.loads(pickle.dumps(vocab))
    assert clone == vocab
    assert clone.encode("the the") == vocab.encode("the the")


def test_hf_tokenizer_of_an_unknown_architecture(bpe_file, tmp_path):
    """The cached tokenizer folder loads in transformers, which cannot read this GGUF file itself."""
    transformers = pytest.importorskip("transformers")
    with pytest.raises(Exception, match="myarch"):
        transformers.AutoTokenizer.from_pretrained(str(bpe_file.parent), gguf_file=bpe_file.name)
    vocab = load(bpe_file, tmp_path)
    hf = vocab.hf_tokenizer
    assert hf is not None and len(hf) == len(vocab)
    assert hf.encode("the the", add_special_tokens=False) == vocab.encode("the the")
    assert hf.encode("the", add_special_tokens=True) == vocab.encode("the")  # gpt-2 adds no BOS
    assert hf.eos_token_id == 259


# --- SentencePiece -----------------------------------------------------------------------------------


def spm_tokens():
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
    types = [T.UNKNOWN, T.CONTROL, T.CONTROL] + [T.BYTE] * 256
    scores = [0.0, 0.0, 0.0] + [0.0] * 256
    for text, kind, score in [("▁", T.NORMAL, -1.0), ("a", T.NORMAL, -2.0), ("b", T.NORMAL, -2.0),
                              ("x", T.NORMAL, -2.0), ("y", T.NORMAL, -2.0), ("z", T.NORMAL, -2.0),
                              ("▁a", T.NORMAL, -3.0), ("yz", T.NORMAL, -5.0), ("xy", T.NORMAL, -5.0),
                              ("▁ab", T.NORMAL, -4.0), ("<tool>", T.USER_DEFINED, 0.0), ("zz", T.UNUSED, -9.0)]:
        tokens.append(text)
        types.append(kind)
        scores.append(score)
    return tokens, types, scores


def spm_file(path, **kwargs):
    tokens, types, scores = spm_tokens()
    return write_gguf(path, model="llama", pre="default", tokens=tokens, types=types,
                      scores=np.array(scores, dtype=np.float32), ids={"bos": 1, "eos": 2, "unknown": 0}, **kwargs)


def test_spm_token_bytes(tmp_path):
    vocab = load(spm_file(tmp_path / "spm.gguf"), tmp_path)
    ids = {t: i for i, t in enumerate(spm_tokens()[0])}
    assert vocab.scheme == "sentencepiece"
    assert [vocab.token_bytes[i] for i in (0, 1, 2)] == [b"", b"", b""]
    assert vocab.token_bytes[3 + 0x0A] == b"\n" and vocab.token_bytes[3 + 0xFF] == b"\xff"
    assert vocab.token_bytes[ids["▁ab"]] == b" ab" and vocab.token_bytes[ids["▁"]] == b" "
    assert vocab.token_bytes[ids["<tool>"]] == b"<tool>"
    assert vocab.token_bytes[ids["zz"]] == b"" and ids["zz"] in vocab.special_token_ids  # unused
    assert vocab.eos_token_ids == {2} and vocab.bos_token_id == 1


def test_spm_encode_is_llama_cpps_algorithm(tmp_path):
    vocab = load(spm_file(tmp_path / "spm.gguf"), tmp_path)
    ids = {t: i for i, t in enumerate(spm_tokens()[0])}
    assert vocab.encode("ab") == [ids["▁ab"]]  # dummy prefix, then ▁a, then ▁ab
    # "xy" and "yz" score the same: llama.cpp merges the leftmost pair ("yz" has the lower id,
    # which is what a score-ranked BPE conversion would have picked)
    assert vocab.encode("xyz")[1:] == [ids["xy"], ids["z"]]
    # no token for "é": its UTF-8 bytes as <0xNN> tokens; a dummy prefix after a cut-out token
    assert vocab.encode("é<tool>a") == [ids["▁"], 3 + 0xC3, 3 + 0xA9, ids["<tool>"], ids["▁a"]]
    assert vocab.encode("") == []


def test_spm_without_space_prefix_and_phi3_rstrip(tmp_path):
    plain = load(spm_file(tmp_path / "a.gguf", flags={"add_space_prefix": False}), tmp_path)
    ids = {t: i for i, t in enumerate(spm_tokens()[0])}
    assert plain.encode("ab") == [ids["a"], ids["b"]]
    # llama.cpp strips whitespace after special tokens of models named Phi-3
    phi = load(spm_file(tmp_path / "b.gguf", name="Phi3"), tmp_path)
    assert phi.encode("<tool>  a") == [ids["<tool>"], ids["▁a"]]
    other = load(spm_file(tmp_path / "c.gguf", name="other"), tmp_path)
    assert other.encode("<tool>  a") == [ids["<tool>"], ids["▁"], ids["▁"], ids["▁a"]]


# --- the other tokenizer models: exact bytes, encode refused -----------------------------------------


def test_wordpiece_bytes(tmp_path):
    path = write_gguf(tmp_path / "bert.gguf", model="bert", tokens=["[PAD]", "[UNK]", "[CLS]", "[SEP]", "▁hello", "ing"],
                      types=[T.CONTROL, T.UNKNOWN, T.CONTROL, T.CONTROL, T.NORMAL, T.NORMAL], ids={"seperator": 3})
    vocab = load(path, tmp_path, eos_token_ids=[3])
    assert vocab.scheme == "wordpiece"
    assert vocab.token_bytes == (b"", b"", b"", b"", b" hello", b"ing")
    with pytest.raises(VocabularyError, match="'bert'"):
        vocab.encode("hello")
    assert vocab.hf_tokenizer is None


def test_unigram_bytes(tmp_path):
    path = write_gguf(tmp_path / "t5.gguf", model="t5", tokens=["<pad>", "</s>", "<unk>", "▁", "▁hello", "<0x41>", "x"],
                      types=[T.CONTROL, T.CONTROL, T.UNKNOWN, T.NORMAL, T.NORMAL, T.BYTE, T.USER_DEFINED],
                      scores=np.array([0, 0, 0, -1, -2, 0, 0], dtype=np.float32), ids={"eos": 1})
    vocab = load(path, tmp_path)
    assert vocab.token_bytes == (b"", b"", b"", b" ", b" hello", b"A", b"x")
    assert vocab.eos_token_ids == {1}
    with pytest.raises(VocabularyError, match="'t5'"):
        vocab.encode("hello")


def test_rwkv_bytes_and_encode(tmp_path):
    tokens = [b"<s>", b"a", b"b", b"ab", b"\\n", b"\\x00", b"\\xe4\\xb8", b"\\\\", b"\\t", b"\\'"]
    path = write_gguf(tmp_path / "rwkv.gguf", model="rwkv", tokens=tokens, types=[T.CONTROL] + [T.NORMAL] * 9)
    with pytest.raises(VocabularyError, match="EOS"):
        load(path, tmp_path)  # RWKV files name no EOS
    vocab = load(path, tmp_path, eos_token_ids=[0])
    assert vocab.scheme == "rwkv"
    assert vocab.token_bytes == (b"", b"a", b"b", b"ab", b"\n", b"\x00", b"\xe4\xb8", b"\\", b"\t", b"'")
    assert vocab.encode("abab\n\t") == [3, 3, 4, 8]


def test_plamo2_bytes(tmp_path):
    tokens = ["<|plamo:unk|>", "<|plamo:bos|>", "<|plamo:eos|>", "<|plamo:pad|>"] + [f"<0x{b:02X}>" for b in range(256)]
    tokens += ["hello", " world", "▁x"]
    types = [T.UNKNOWN, T.CONTROL, T.CONTROL, T.CONTROL] + [T.BYTE] * 256 + [T.NORMAL] * 3
    path = write_gguf(tmp_path / "plamo.gguf", model="plamo2", tokens=tokens, types=types, ids={"bos": 1, "eos": 2})
    vocab = load(path, tmp_path)
    assert vocab.token_bytes[4 + 0x41] == b"A"
    assert vocab.token_bytes[-3:] == (b"hello", b" world", "▁x".encode())  # PLaMo-2 prints its text as is
    with pytest.raises(VocabularyError, match="'plamo2'"):
        vocab.encode("hello")


def test_gemma4_bpe_spells_spaces_with_the_marker(tmp_path):
    tokens = ["<pad>", "<eos>", "<bos>", "<0x0A>", "▁hi", "h", "i", "▁"]
    path = write_gguf(tmp_path / "g4.gguf", model="gemma4", tokens=tokens, merges=["h i", "▁ hi"],
                      types=[T.CONTROL, T.CONTROL, T.CONTROL, T.BYTE, T.NORMAL, T.NORMAL, T.NORMAL, T.NORMAL],
                      ids={"bos": 2, "eos": 1})
    vocab = load(path, tmp_path)
    assert vocab.token_bytes == (b"", b"", b"", b"\n", b" hi", b"h", b"i", b" ")
    with pytest.raises(VocabularyError, match="gemma4"):
        vocab.encode("hi")


@pytest.mark.parametrize(
    ("model", "pre", "message"),
    [("none", None, "'none'.*no vocabulary"), ("no_vocab", None, "no vocabulary"), ("hybriddna", "default", "hybriddna"),
     ("mystery", None, "'mystery' is unknown"), ("gpt2", "weird-pre", "'weird-pre'")],
)
def test_unsupported_tokenizers_are_refused_by_name(tmp_path, model, pre, message):
    path = write_gguf(tmp_path / "x.gguf", model=model, pre=pre, tokens=["a", "b"], merges=["a b"])
    with pytest.raises(VocabularyError, match=message):
        load(path, tmp_path)


def test_malformed_vocabularies_are_refused(tmp_path):
    dup = write_gguf(tmp_path / "dup.gguf", model="llama", tokens=["a", "a"], scores=np.zeros(2, np.float32))
    with pytest.raises(VocabularyError, match="duplicate"):
        load(dup, tmp_path)
    bad_byte = write_gguf(tmp_path / "byte.gguf", model="llama", tokens=["<0xZZ>", "</s>"], types=[T.BYTE, T.CONTROL],
                          scores=np.zeros(2, np.float32), ids={"eos": 1})
    with pytest.raises(VocabularyError, match="byte token 0"):
        load(bad_byte, tmp_path)
    short = tmp_path / "short.gguf"
    short.write_bytes((tmp_path / "byte.gguf").read_bytes()[:60])
    with pytest.raises(VocabularyError, match="short.gguf"):
        load(short, tmp_path)


def test_o200k_end_is_text_when_return_and_call_exist(tmp_path):
    tokens = gpt2_chars() + ["<|return|>", "<|call|>", "<|end|>"]
    path = write_gguf(tmp_path / "o200k.gguf", model="gpt2", pre="gpt-4o", tokens=tokens,
                      types=[T.NORMAL] * 256 + [T.CONTROL] * 3, merges=["a b"])
    vocab = load(path, tmp_path)
    assert vocab.eos_token_ids == {256, 257}
    assert vocab.token_bytes[258] == b"<|end|>"


# --- the reader and the cache ------------------------------------------------------------------------


@pytest.mark.parametrize("endian", ["LITTLE", "BIG"])
def test_reader_agrees_with_gguf_reader(tmp_path, endian):
    path = spm_file(tmp_path / f"{endian}.gguf", endian=gguf.GGUFEndian[endian], name="n",
                    extra={"tokenizer.chat_template": "{{ x }}"})
    ours = read_gguf_metadata(path)
    theirs = gguf.GGUFReader(str(path))
    theirs_fields = {k: f for k, f in theirs.fields.items() if not k.startswith("GGUF.")}  # the header
    assert set(ours.fields) == set(theirs_fields) and ours.version == 3
    for key, field in theirs_fields.items():
        value = ours.fields[key]
        if field.types[0] == gguf.GGUFValueType.ARRAY and field.types[-1] == gguf.GGUFValueType.STRING:
            assert value == [bytes(field.parts[i]) for i in field.data], key
        elif field.types[0] == gguf.GGUFValueType.ARRAY:
            assert np.array_equal(value, np.concatenate([field.parts[i] for i in field.data])), key
        elif field.types[0] == gguf.GGUFValueType.STRING:
            assert value == bytes(field.parts[-1]), key
        else:
            assert value == field.parts[-1].tolist()[0], key


def test_cache_entry_is_keyed_by_metadata(tmp_path):
    path = spm_file(tmp_path / "spm.gguf")
    first = load_gguf_tokenizer(path, cache_dir=tmp_path / "cache")
    assert first.tokenizer_file is not None and first.tokenizer_file.parent.name == first.digest
    assert first.encoder_error is None
    with open(path, "ab") as f:  # bytes after the metadata (tensor data) do not change the key
        f.write(b"\0" * 64)
    assert load_gguf_tokenizer(path, cache_dir=tmp_path / "cache").digest == first.digest
    other = load_gguf_tokenizer(spm_file(tmp_path / "b.gguf", name="other"), cache_dir=tmp_path / "cache")
    assert other.digest != first.digest


def test_gpt2_decode_and_rwkv_unescape_edge_cases():
    assert gpt2_decode_text("ĠĊ".encode()) == b" \n"
    with pytest.raises(VocabularyError):
        gpt2_decode_text(b"\xff")
    assert rwkv_unescape(b"a\\") == b"a"  # a trailing backslash is dropped, as in llama.cpp
    assert rwkv_unescape(b"\\x4") == b""  # an unfinished escape too
    assert rwkv_unescape(b"\\xA0") == bytes([(17 << 4) & 0xFF])  # llama.cpp reads only lower-case hex


def test_partition_matches_llama_cpp_order():
    specials = [("<ab>", 7, False, False), ("<a>", 5, False, True), ("b", 9, True, False)]
    assert partition("x<ab>y<a>  z b", specials) == ["x", 7, "y", 5, "z", 9]
    assert partition("", specials) == []


def test_every_pre_tokenizer_regex_compiles_and_splits():
    """llama.cpp's regexes as transcribed: each compiles in ``tokenizers`` and keeps every character."""
    tokenizers = pytest.importorskip("tokenizers")
    from grammars.vocab.llama_pre import _BY_NAME

    text = "Hello World's 12345 ½ — Cửa Việt\n\n\t  中文字 <sentinel:1> IMGIMGABZ!?"
    for name, pre in _BY_NAME.items():
        if pre.regexes is None:
            continue
        steps = [tokenizers.pre_tokenizers.Split(tokenizers.Regex(rx), "isolated") for rx in pre.regexes]
        pieces = tokenizers.pre_tokenizers.Sequence(steps).pre_tokenize_str(text)
        assert "".join(piece for piece, _ in pieces) == text, name
