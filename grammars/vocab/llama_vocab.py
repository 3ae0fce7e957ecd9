"""A GGUF vocabulary read as llama.cpp reads it: token attributes, special ids, and exact token bytes.

Everything comes from the file's ``tokenizer.ggml.*`` metadata; ``general.architecture`` plays no
part in the bytes (llama.cpp consults it, and ``general.name``, only for a few tokens' whitespace
stripping when encoding, which ``LlamaVocab.strip_flags`` reproduces). The rules follow llama.cpp's
``src/llama-vocab.cpp`` (``llama_vocab::impl::load`` and ``token_to_piece``):

* token types become attributes, then llama.cpp's text-based corrections apply: end-of-generation
  texts (``<|eot_id|>``, ``<|im_end|>``, ``</s>``, ...) and fill-in-the-middle markers the metadata
  does not name become control tokens; gpt-oss's ``<|channel|>``-style markers become user-defined;
* a token's bytes are ``token_to_piece(special=false)``: control and unknown tokens are empty;
  user-defined tokens are their literal text; normal tokens are decoded by the tokenizer model
  (SentencePiece-style ``▁`` → space, or GPT-2's byte alphabet reversed, or RWKV's escapes); byte
  tokens ``<0xNN>`` are that byte;
* corral's one departure, on the safe side: unused and undefined tokens are always special (empty),
  where llama.cpp would print the text of such RWKV and PLaMo-2 tokens.

Tokenizer models: ``llama`` (SPM), ``gpt2`` and ``gemma4`` (BPE), ``bert`` (WPM), ``t5`` (UGM),
``rwkv`` and ``plamo2``. ``none``/``no_vocab`` (no tokens), ``hybriddna`` and ``whitespace`` and
any other name are refused with a ``VocabularyError`` naming the model.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from grammars.errors import VocabularyError
from grammars.vocab.gguf_reader import GGUFMetadata
from grammars.vocab.llama_pre import PreTokenizer, pre_tokenizer

__all__ = [
    "EOG_TOKEN_TEXTS",
    "FIM_TOKEN_TEXTS",
    "GGUFTokenType",
    "LlamaVocab",
    "SUPPORTED_MODELS",
    "TokenAttr",
    "gpt2_decode_text",
    "rwkv_unescape",
]

_SPACE = "\u2581".encode()  # ▁ as UTF-8
_BYTE_TOKEN = re.compile(rb"<0x([0-9A-Fa-f]{2})>")


class GGUFTokenType:
    """``tokenizer.ggml.token_type`` values (llama.cpp's ``llama_token_type``)."""

    UNDEFINED = 0
    NORMAL = 1
    UNKNOWN = 2
    CONTROL = 3
    USER_DEFINED = 4
    UNUSED = 5
    BYTE = 6


class TokenAttr:
    """llama.cpp's ``llama_token_attr`` bits (the ones corral uses); plain ints, as they are tested per token."""

    UNDEFINED = 0
    UNKNOWN = 1 << 0
    UNUSED = 1 << 1
    NORMAL = 1 << 2
    CONTROL = 1 << 3
    USER_DEFINED = 1 << 4
    BYTE = 1 << 5
    LSTRIP = 1 << 7
    RSTRIP = 1 << 8


_TYPE_TO_ATTR = {
    GGUFTokenType.NORMAL: TokenAttr.NORMAL,
    GGUFTokenType.UNKNOWN: TokenAttr.UNKNOWN,
    GGUFTokenType.CONTROL: TokenAttr.CONTROL,
    GGUFTokenType.USER_DEFINED: TokenAttr.USER_DEFINED,
    GGUFTokenType.UNUSED: TokenAttr.UNUSED,
    GGUFTokenType.BYTE: TokenAttr.BYTE,
}

#: tokenizer.ggml.model -> llama.cpp's vocabulary type
SUPPORTED_MODELS: dict[str, str] = {
    "llama": "spm",
    "gpt2": "bpe",
    "gemma4": "bpe",
    "bert": "wpm",
    "t5": "ugm",
    "rwkv": "rwkv",
    "plamo2": "plamo2",
}
_REFUSED_MODELS = {
    "none": "it has no vocabulary",
    "no_vocab": "it has no vocabulary",
    "hybriddna": "its DNA k-mer tokens are rewritten at load in ways corral does not reproduce",
    "whitespace": "llama.cpp prints its raw UTF-8 tokens through the GPT-2 byte map, garbling non-ASCII text",
}

#: Token texts llama.cpp makes end-of-generation (and control) whatever the metadata says.
EOG_TOKEN_TEXTS = frozenset(
    {
        "<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<|flush|>", "<|calls|>",
        "<end_of_turn>", "<|endoftext|>", "</s>", "<|eom_id|>", "<EOT>", "_<EOT>", "[EOT]", "[EOS]",
        "<|end_of_text|>", "<end_of_utterance>", "<eos>", "<turn|>", "<|tool_response>",
        "<\uff5cend\u2581of\u2581sentence\uff5c>", "[e~[",
    }
)
# Fill-in-the-middle markers llama.cpp recognises by text when the metadata names none of that kind.
_FIM_TEXTS: dict[str, frozenset[str]] = {
    "pre": frozenset({"<|fim_prefix|>", "<fim-prefix>", "<fim_prefix>", "<\uff5cfim\u2581begin\uff5c>", "<PRE>",
                      "\u2581<PRE>", "<|code_prefix|>", "<|prefix|>"}),
    "suf": frozenset({"<|fim_suffix|>", "<fim-suffix>", "<fim_suffix>", "<\uff5cfim\u2581hole\uff5c>", "<SUF>",
                      "\u2581<SUF>", "<|code_suffix|>", "<|suffix|>"}),
    "mid": frozenset({"<|fim_middle|>", "<fim-middle>", "<fim_middle>", "<\uff5cfim\u2581end\uff5c>", "<MID>",
                      "\u2581<MID>", "<|code_middle|>", "<|middle|>"}),
    "pad": frozenset({"<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]"}),
    "rep": frozenset({"<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>"}),
    "sep": frozenset({"<|file_sep|>"}),
}
#: The same, public: the texts by which fill-in-the-middle markers are recognised, per kind.
FIM_TOKEN_TEXTS = _FIM_TEXTS
# EOT/EOM texts: each is also an EOG text, so detecting them adds nothing beyond ``EOG_TOKEN_TEXTS``.
_FIM_KEYS = {
    "pre": ("tokenizer.ggml.fim_pre_token_id", "tokenizer.ggml.prefix_token_id"),
    "suf": ("tokenizer.ggml.fim_suf_token_id", "tokenizer.ggml.suffix_token_id"),
    "mid": ("tokenizer.ggml.fim_mid_token_id", "tokenizer.ggml.middle_token_id"),
    "pad": ("tokenizer.ggml.fim_pad_token_id",),
    "rep": ("tokenizer.ggml.fim_rep_token_id",),
    "sep": ("tokenizer.ggml.fim_sep_token_id",),
}
_GPT_OSS_USER_DEFINED = frozenset({"<|channel|>", "<|message|>", "<|start|>", "<|constrain|>"})


def _gpt2_byte_map() -> dict[str, int]:
    """GPT-2's printable character -> byte map (the inverse of ``bytes_to_unicode``)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars = {b: chr(b) for b in printable}
    extra = 0
    for b in range(256):
        if b not in chars:
            chars[b] = chr(256 + extra)
            extra += 1
    return {ch: b for b, ch in chars.items()}


_GPT2_BYTES = _gpt2_byte_map()
# alphabet character -> its byte as a latin-1 character; other code points below 256 -> U+FFFF, so
# that ``encode("latin-1")`` fails on every character outside the alphabet
_GPT2_TABLE = {cp: "\uffff" for cp in range(256)}
_GPT2_TABLE.update({ord(ch): chr(b) for ch, b in _GPT2_BYTES.items()})


def gpt2_decode_text(text: bytes) -> bytes:
    """llama.cpp's ``llama_decode_text``: each character of GPT-2's alphabet is its byte.

    A character outside the alphabet becomes ``[UNK_BYTE_0x<its UTF-8 in hex><the whole token>]``,
    which is what llama.cpp prints for such a token; text that is not UTF-8 is refused (llama.cpp
    fails to load such a vocabulary).
    """
    try:
        s = text.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise VocabularyError(f"byte-level BPE token {text!r} is not UTF-8 text") from exc
    try:  # the common case: every character is in the alphabet
        return s.translate(_GPT2_TABLE).encode("latin-1")
    except UnicodeEncodeError:
        pass
    out = bytearray()
    for c in s:
        b = _GPT2_BYTES.get(c)
        if b is not None:
            out.append(b)
        else:
            out += b"[UNK_BYTE_0x" + c.encode("utf-8").hex().encode() + text + b"]"
    return bytes(out)


def rwkv_unescape(text: bytes) -> bytes:
    """llama.cpp's ``llama_unescape_rwkv_token``, byte for byte (``\\t``, ``\\n``, ``\\r``, ``\\xNN``, ``\\c`` -> c)."""
    if b"\\" not in text:
        return text
    out = bytearray()
    escaping = False
    hex_remaining = 0
    acc = 0
    for c in text:
        if hex_remaining:
            value = c - 0x61 + 10 if c >= 0x61 else c - 0x30  # llama.cpp reads lower-case hex digits only
            acc = ((acc << 4) + value) & 0xFF
            hex_remaining -= 1
            if not hex_remaining:
                out.append(acc)
                acc = 0
        elif escaping:
            if c == 0x74:
                out.append(0x09)
            elif c == 0x6E:
                out.append(0x0A)
            elif c == 0x72:
                out.append(0x0D)
            elif c == 0x78:
                hex_remaining = 2
            else:
                out.append(c)
            escaping = False
        elif c == 0x5C:
            escaping = True
        else:
            out.append(c)
    return bytes(out)


@dataclass(frozen=True, eq=False)
class LlamaVocab:
    """A GGUF tokenizer as llama.cpp loads it (attributes after its text-based corrections)."""

    source: str
    #: ``tokenizer.ggml.model``
    model: str
    #: llama.cpp's vocabulary type: "spm", "bpe", "wpm", "ugm", "rwkv" or "plamo2"
    kind: str
    #: ``tokenizer.ggml.pre`` (``""`` when absent)
    pre: str
    #: token texts as stored (raw bytes; empty ones replaced by ``[EMPTY_i]`` as llama.cpp does)
    texts: tuple[bytes, ...] = field(repr=False)
    #: ``TokenAttr`` values per id, after llama.cpp's corrections
    attrs: tuple[int, ...] = field(repr=False)
    scores: np.ndarray | None = field(repr=False)
    merges: tuple[bytes, ...] | None = field(repr=False)
    bos_token_id: int | None
    eos_token_id: int | None
    eot_token_id: int | None
    eom_token_id: int | None
    unk_token_id: int | None
    pad_token_id: int | None
    eog_ids: frozenset[int]
    add_bos: bool
    add_eos: bool
    add_space_prefix: bool
    escape_whitespaces: bool
    ignore_merges: bool
    pre_regexes: tuple[str, ...] | None
    chat_template: str | None = field(default=None, repr=False)

    def __len__(self) -> int:
        return len(self.texts)

    # --- loading ---------------------------------------------------------------------------

    @classmethod
    def from_metadata(cls, meta: GGUFMetadata) -> "LlamaVocab":
        """Apply llama.cpp's loader to the metadata (``VocabularyError`` for what it cannot decode)."""
        source = str(meta.path)
        model = meta.text("tokenizer.ggml.model")
        if model is None:
            raise VocabularyError(f"{source} has no tokenizer (no tokenizer.ggml.model)")
        if model in _REFUSED_MODELS:
            raise VocabularyError(f"{source}: tokenizer model {model!r} is not supported: {_REFUSED_MODELS[model]}")
        kind = SUPPORTED_MODELS.get(model)
        if kind is None:
            raise VocabularyError(
                f"{source}: tokenizer model {model!r} is unknown to llama.cpp and corral "
                f"(supported: {', '.join(sorted(SUPPORTED_MODELS))})"
            )
        pre_name = "gemma4" if model == "gemma4" else (meta.text("tokenizer.ggml.pre") or "")
        pre = _resolve_pre(source, kind, pre_name)
        texts = _token_texts(meta, source)
        n = len(texts)
        types = _array(meta, "tokenizer.ggml.token_type", n, source)
        attrs = [TokenAttr.NORMAL] * n if types is None else [_TYPE_TO_ATTR.get(t, TokenAttr.UNDEFINED) for t in types.tolist()]
        scores = _array(meta, "tokenizer.ggml.scores", n, source)
        ids = {key: _token_id(meta, f"tokenizer.ggml.{key}_token_id", n) for key in ("bos", "eos", "eot", "eom")}
        ids["unk"] = _token_id(meta, "tokenizer.ggml.unknown_token_id", n)
        ids["pad"] = _token_id(meta, "tokenizer.ggml.padding_token_id", n)
        eog = _apply_text_rules(meta, texts, attrs, ids)
        _apply_strip_rules(meta, texts, attrs)
        add_bos = _flag(meta, "tokenizer.ggml.add_bos_token", _adds_bos_by_default(kind, pre))
        if pre is not None and pre.name in ("gemma4", "granite-embed-multi-311m"):
            add_bos = True  # llama.cpp overrides the metadata for Gemma 4
        merges = meta.get("tokenizer.ggml.merges")
        if kind == "bpe" and merges is None:
            raise VocabularyError(f"{source}: BPE tokenizer without tokenizer.ggml.merges")
        return cls(
            source=source,
            model=model,
            kind=kind,
            pre=pre_name,
            texts=tuple(texts),
            attrs=tuple(attrs),
            scores=None if scores is None else np.asarray(scores, dtype=np.float32),
            merges=None if merges is None else tuple(merges),
            bos_token_id=ids["bos"],
            eos_token_id=ids["eos"],
            eot_token_id=ids["eot"],
            eom_token_id=ids["eom"],
            unk_token_id=ids["unk"],
            pad_token_id=ids["pad"],
            eog_ids=frozenset(eog),
            add_bos=add_bos,
            add_eos=_flag(meta, "tokenizer.ggml.add_eos_token", kind == "ugm"),
            add_space_prefix=_flag(meta, "tokenizer.ggml.add_space_prefix", kind == "spm"),
            escape_whitespaces=kind != "bpe" or (pre is not None and pre.escape_whitespaces),
            ignore_merges=bool(pre and pre.ignore_merges),
            pre_regexes=None if pre is None else pre.regexes,
            chat_template=_loose_text(meta, "tokenizer.chat_template") or None,
        )

    # --- bytes -----------------------------------------------------------------------------

    def token_pieces(self) -> tuple[list[bytes], set[int]]:
        """Bytes per id (``token_to_piece(special=false)``) and the ids that are special (empty)."""
        pieces: list[bytes] = []
        special: set[int] = set()
        fast_normal = self.kind == "bpe" and not self.escape_whitespaces
        for i, (text, attr) in enumerate(zip(self.texts, self.attrs)):
            if attr == TokenAttr.NORMAL and fast_normal:  # the bulk of a byte-level vocabulary
                piece = gpt2_decode_text(text)
            else:
                piece = self._piece(i, text, attr)
            if not piece:
                special.add(i)
            pieces.append(piece)
        return pieces, special

    def _piece(self, i: int, text: bytes, attr: int) -> bytes:
        if attr & (TokenAttr.CONTROL | TokenAttr.UNKNOWN | TokenAttr.UNUSED) or attr == TokenAttr.UNDEFINED:
            return b""
        kind = self.kind
        if kind == "rwkv":
            return rwkv_unescape(text)
        if kind == "plamo2":
            if attr & TokenAttr.BYTE and _BYTE_TOKEN.fullmatch(text):
                return bytes([int(text[3:5], 16)])
            return text
        if attr & TokenAttr.USER_DEFINED:
            return text
        if attr & TokenAttr.NORMAL:
            if kind == "bpe" and not self.escape_whitespaces:
                return gpt2_decode_text(text)
            return text.replace(_SPACE, b" ")
        if attr & TokenAttr.BYTE:
            m = _BYTE_TOKEN.fullmatch(text)
            if kind == "wpm" or m is None:
                raise VocabularyError(
                    f"{self.source}: byte token {i} is {text!r}, which llama.cpp cannot read as one byte "
                    f"for tokenizer model {self.model!r}"
                )
            return bytes([int(m.group(1), 16)])
        return b""

    def text(self, i: int) -> str:
        """Token ``i``'s text for display and tokenizer files (undecodable bytes escaped)."""
        return self.texts[i].decode("utf-8", errors="backslashreplace")


# --- helpers -------------------------------------------------------------------------------------


def _resolve_pre(source: str, kind: str, name: str) -> PreTokenizer | None:
    """The BPE pre-tokenizer llama.cpp would use; an unknown name fails to load in llama.cpp too."""
    if kind != "bpe":
        return None
    pre = pre_tokenizer(name)
    if pre is None:
        raise VocabularyError(f"{source}: pre-tokenizer {name!r} (tokenizer.ggml.pre) is unknown to llama.cpp")
    return pre


def _token_texts(meta: GGUFMetadata, source: str) -> list[bytes]:
    tokens = meta.get("tokenizer.ggml.tokens")
    if not tokens:
        raise VocabularyError(f"{source} has no tokenizer.ggml.tokens")
    if not isinstance(tokens, list) or not all(isinstance(t, bytes) for t in tokens):
        raise VocabularyError(f"{source}: tokenizer.ggml.tokens is not an array of strings")
    texts = [t if t else f"[EMPTY_{i}]".encode() for i, t in enumerate(tokens)]
    seen: dict[bytes, int] = {}
    for i, t in enumerate(texts):
        first = seen.setdefault(t, i)
        if first != i:
            raise VocabularyError(f"{source}: duplicate token {t!r} at ids {first} and {i} (llama.cpp refuses it too)")
    return texts


def _array(meta: GGUFMetadata, key: str, n: int, source: str) -> Any:
    values = meta.get(key)
    if values is None:
        return None
    if not isinstance(values, np.ndarray):
        raise VocabularyError(f"{source}: {key} is not an array of numbers")
    if len(values) < n:
        raise VocabularyError(f"{source}: {key} has {len(values)} entries for {n} tokens")
    return values[:n]


def _token_id(meta: GGUFMetadata, key: str, n: int) -> int | None:
    """A special-token id from the metadata; llama.cpp ignores one outside the vocabulary, and so does corral."""
    value = meta.get(key)
    if isinstance(value, (int, np.integer)) and not isinstance(value, bool) and 0 <= int(value) < n:
        return int(value)
    return None


def _loose_text(meta: GGUFMetadata, key: str) -> str:
    """A descriptive string (name, architecture, chat template): never a reason to refuse a vocabulary."""
    value = meta.get(key)
    return value.decode("utf-8", errors="replace") if isinstance(value, bytes) else ""


def _flag(meta: GGUFMetadata, key: str, default: bool) -> bool:
    value = meta.get(key)
    return bool(value) if isinstance(value, (bool, int, np.bool_)) else default


def _adds_bos_by_default(kind: str, pre: PreTokenizer | None) -> bool:
    """llama.cpp's ``add_bos`` before ``tokenizer.ggml.add_bos_token`` overrides it."""
    if kind == "bpe":
        return bool(pre and pre.add_bos)
    return kind in ("spm", "wpm")


def _apply_text_rules(meta: GGUFMetadata, texts: list[bytes], attrs: list[int], ids: dict[str, int | None]) -> set[int]:
    """llama.cpp's corrections by token text (mutates ``attrs``); returns the end-of-generation ids."""
    by_text = {t.decode("utf-8", errors="replace"): i for i, t in enumerate(texts)}
    eog: set[int] = set()
    for kind, texts_of_kind in _FIM_TEXTS.items():
        meta_id = next((i for key in _FIM_KEYS[kind] if (i := _token_id(meta, key, len(texts))) is not None), None)
        found = [meta_id] if meta_id is not None else [by_text[t] for t in sorted(texts_of_kind) if t in by_text]
        if meta_id is None:  # llama.cpp takes one match (in hash order) and makes it control; corral takes them all
            for i in found:
                attrs[i] |= TokenAttr.CONTROL
        if kind in ("pad", "rep", "sep"):
            eog.update(found)
    for text in EOG_TOKEN_TEXTS:
        i = by_text.get(text)
        if i is not None:
            eog.add(i)
            attrs[i] |= TokenAttr.CONTROL
    for text in _GPT_OSS_USER_DEFINED:
        if text in by_text:
            attrs[by_text[text]] = TokenAttr.USER_DEFINED
    eog.update(i for i in (ids["eos"], ids["eot"], ids["eom"]) if i is not None)
    eog_texts = {texts[i].decode("utf-8", errors="replace"): i for i in eog}
    has_call = "<|call|>" in eog_texts or "<|calls|>" in eog_texts
    if "<|end|>" in eog_texts and has_call and ("<|return|>" in eog_texts or "<|flush|>" in eog_texts):
        eog.discard(eog_texts["<|end|>"])  # o200k_harmony / solar-open: <|end|> ends a message, not generation
        attrs[eog_texts["<|end|>"]] = TokenAttr.USER_DEFINED
    if "<|tool_response>" in eog_texts and "</s>" in eog_texts:
        eog.discard(eog_texts["</s>"])  # gemma4 / paddleocr: </s> is text there
        attrs[eog_texts["</s>"]] = TokenAttr.NORMAL
    return eog


def _apply_strip_rules(meta: GGUFMetadata, texts: list[bytes], attrs: list[int]) -> None:
    """llama.cpp's per-model lstrip/rstrip of whitespace around special tokens (encoding only)."""
    name = _loose_text(meta, "general.name").lower()
    pre = _loose_text(meta, "tokenizer.ggml.pre")
    arch = _loose_text(meta, "general.architecture")
    by_text = {t: i for i, t in enumerate(texts)}

    def set_attr(text: bytes, attr: int, on: bool) -> None:
        i = by_text.get(text)
        if i is not None:
            attrs[i] = attrs[i] | attr if on else attrs[i] & ~attr

    if any(s in pre for s in ("jina-v2-de", "jina-v2-es", "jina-v2-code")) or any(
        s in arch for s in ("nomic-bert-moe", "jina-bert-v3")
    ):
        set_attr(b"<mask>", TokenAttr.LSTRIP, True)
    elif "phi-3" in name or "phi3" in name:
        for i, attr in enumerate(attrs):
            if attr & (TokenAttr.CONTROL | TokenAttr.USER_DEFINED | TokenAttr.UNKNOWN):
                attrs[i] = attr | TokenAttr.RSTRIP
        set_attr(b"</s>", TokenAttr.RSTRIP, True)
        for text in (b"<unk>", b"<s>", b"<|endoftext|>"):
            set_attr(text, TokenAttr.RSTRIP, False)
    elif "modern-bert" in name:
        set_attr(b"[MASK]", TokenAttr.LSTRIP, True)
