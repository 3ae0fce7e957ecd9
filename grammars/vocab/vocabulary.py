"""A tokenizer's vocabulary as exact bytes: the only view of a tokenizer that grammar matching needs.

A grammar constrains *bytes*; a model emits *token ids*. ``TokenVocabulary`` is the bridge: the
bytes each id stands for, which ids are special (never match text), which end generation, and how
wide the model's logits are. It is immutable and identified by a content fingerprint, so compiled
grammars and on-disk caches can be keyed by it.

Decoding rules (checked against llama.cpp's tokenizer test vectors for seven real vocabularies):

* byte-level BPE (GPT-2, Llama 3, Qwen2, StarCoder, DeepSeek-Coder): a vocabulary string is a
  sequence of characters of GPT-2's byte-to-unicode alphabet, one character per byte;
* SentencePiece (Llama 2, Phi-3): ``▁`` stands for a space and ``<0xNN>`` byte-fallback pieces
  for the single byte ``0xNN``. The decoder's "strip the first space" step is *not* applied: a
  token's bytes are what it adds to the text, wherever it stands;
* added tokens: special ones (BOS, EOS, ``<|...|>`` control tokens, SentencePiece control,
  unknown and unused pieces) get ``b""`` and are listed in ``special_token_ids``; the others
  (user-defined) stand for their literal UTF-8 text.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import sys
import threading
from array import array
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Literal, Sequence

from grammars.errors import VocabularyError

__all__ = ["TokenVocabulary", "byte_level_piece_bytes", "decode_tokenizer_json", "sentencepiece_piece_bytes"]

_FINGERPRINT_DOMAIN = b"corral.TokenVocabulary.v1\0"
_SPACE_MARKER = "\u2581"  # ▁, SentencePiece's stand-in for a space
_BYTE_PIECE = re.compile(r"<0x([0-9A-Fa-f]{2})>")

#: How token bytes were derived: given explicitly, byte-level BPE, SentencePiece-style ``▁`` pieces
#: (SentencePiece, Unigram, Gemma 4's BPE), WordPiece, or RWKV's escaped byte strings.
Scheme = Literal["bytes", "byte-level", "sentencepiece", "wordpiece", "rwkv"]

# (llama.cpp vocabulary type, spaces spelled as ▁) -> Scheme; PLaMo-2's tokens are their own bytes
_GGUF_SCHEMES: dict[tuple[str, bool], Scheme] = {
    ("bpe", False): "byte-level",
    ("bpe", True): "sentencepiece",
    ("spm", True): "sentencepiece",
    ("ugm", True): "sentencepiece",
    ("wpm", True): "wordpiece",
    ("rwkv", True): "rwkv",
}


def _gpt2_byte_alphabet() -> dict[int, str]:
    """GPT-2's reversible byte -> printable unicode character map (``bytes_to_unicode``)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    mapping = {b: chr(b) for b in printable}
    extra = 0
    for b in range(256):
        if b not in mapping:
            mapping[b] = chr(256 + extra)
            extra += 1
    return mapping


# Translation table from the GPT-2 alphabet back to latin-1 characters (= the bytes). Code points
# below 256 outside the alphabet map to U+FFFF so that ``encode("latin-1")`` fails on them.
_BYTE_LEVEL_TABLE: dict[int, str] = {cp: "\uffff" for cp in range(256)}
_BYTE_LEVEL_TABLE.update({ord(ch): chr(b) for b, ch in _gpt2_byte_alphabet().items()})


def byte_level_piece_bytes(piece: str) -> bytes:
    """Bytes of a byte-level BPE vocabulary string.

    A string with a character outside GPT-2's alphabet stands for its own UTF-8 bytes, which is
    what the ``tokenizers`` ByteLevel decoder does with it.
    """
    try:
        return piece.translate(_BYTE_LEVEL_TABLE).encode("latin-1")
    except UnicodeEncodeError:
        return piece.encode("utf-8")


def sentencepiece_piece_bytes(piece: str, *, replacement: str = _SPACE_MARKER, byte_fallback: bool = True) -> bytes:
    """Bytes of a SentencePiece piece: ``▁`` is a space; ``<0xNN>`` is byte ``0xNN`` under byte fallback."""
    if byte_fallback:
        m = _BYTE_PIECE.fullmatch(piece)
        if m:
            return bytes([int(m.group(1), 16)])
    return piece.replace(replacement, " ").encode("utf-8")


@dataclass(frozen=True, eq=False)
class TokenVocabulary:
    """The exact bytes of every token id of a tokenizer, plus its special, EOS and BOS ids.

    Equality and hashing go by ``fingerprint``, a sha256 over the token bytes, the special and EOS
    ids and ``logits_width`` (everything a token mask depends on; not ``name`` nor the tokenizer).

    Invariants, checked on construction (``VocabularyError`` otherwise): special tokens, EOS ones
    included, have ``b""``; every other token has at least one byte; ids are in range; and
    ``logits_width >= len(self)``. Ids from ``len(self)`` up to ``logits_width`` are padding
    columns of the model's logits that no token stands for: never allowed.

    ``encode(text)`` tokenizes without adding BOS/EOS or turning special-token text into special
    tokens, so ``decode(encode(text))`` gives back the text's UTF-8 bytes, with one exception:
    SentencePiece vocabularies loaded from GGUF files add the dummy-prefix space as llama.cpp
    does, so for them ``decode(encode(text)) == b" " + text.encode()`` for every non-empty
    ``text`` (and ``b""`` for ``""``). Vocabularies from ``from_bytes`` encode greedily, longest
    token first: a test aid, not any real tokenizer's segmentation.

    Build one with ``from_pretrained`` (tokenizer folder, ``tokenizer.json`` or ``.gguf``),
    ``from_tokenizer`` (a loaded transformers tokenizer), ``from_gguf`` or ``from_bytes``.
    """

    token_bytes: tuple[bytes, ...] = field(repr=False)
    eos_token_ids: frozenset[int]
    special_token_ids: frozenset[int] = frozenset()
    bos_token_id: int | None = None
    #: width of the model's logits; ``None`` means ``len(token_bytes)``. Always an int once built.
    logits_width: int | None = None
    name: str = "custom"
    #: how the bytes were derived: "bytes", "byte-level" or "sentencepiece" (informational)
    scheme: Scheme = "bytes"
    fingerprint: str = field(init=False)
    _encoder: Callable[[str], list[int]] | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        tokens = self.token_bytes if type(self.token_bytes) is tuple else tuple(self.token_bytes)
        if not all(type(b) is bytes for b in tokens):
            tokens = tuple(bytes(b) for b in tokens)
        n = len(tokens)
        if n == 0:
            raise VocabularyError("a vocabulary needs at least one token")
        eos = frozenset(_check_ids(self.eos_token_ids, n, "EOS"))
        special = frozenset(_check_ids(self.special_token_ids, n, "special")) | eos
        not_empty = sorted(i for i in special if tokens[i])
        if not_empty:
            raise VocabularyError(
                f"special tokens must have empty bytes (they never match text); ids {not_empty[:5]} do not"
            )
        empty = [i for i, b in enumerate(tokens) if not b and i not in special]
        if empty:
            raise VocabularyError(
                f"tokens {empty[:5]} have no bytes but are not special: an empty token would match "
                f"everywhere; list them in special_token_ids"
            )
        if self.bos_token_id is not None:
            _check_ids([self.bos_token_id], n, "BOS")
        width = n if self.logits_width is None else self.logits_width
        if not isinstance(width, int) or width < n:
            raise VocabularyError(f"logits_width {width} is smaller than the vocabulary ({n} tokens)")
        object.__setattr__(self, "token_bytes", tokens)
        object.__setattr__(self, "eos_token_ids", eos)
        object.__setattr__(self, "special_token_ids", special)
        object.__setattr__(self, "logits_width", width)
        object.__setattr__(self, "fingerprint", _fingerprint(tokens, special, eos, width))

    # --- identity ---------------------------------------------------------------------------

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, TokenVocabulary):
            return NotImplemented
        return self.fingerprint == other.fingerprint

    def __hash__(self) -> int:
        return hash(self.fingerprint)

    def __len__(self) -> int:
        return len(self.token_bytes)

    def __repr__(self) -> str:
        return (
            f"TokenVocabulary(name={self.name!r}, size={len(self)}, logits_width={self.logits_width}, "
            f"scheme={self.scheme!r}, eos={sorted(self.eos_token_ids)}, fingerprint={self.fingerprint[:12]}…)"
        )

    @property
    def size(self) -> int:
        """Number of token ids (the tokenizer's vocabulary size, not the logits width)."""
        return len(self.token_bytes)

    @property
    def hf_tokenizer(self) -> Any:
        """The transformers tokenizer behind this vocabulary, or None for ``from_bytes`` ones.

        For GGUF vocabularies it is loaded on first use from the ``tokenizer.json`` cached by
        ``grammars.vocab.gguf`` (transformers never reads the GGUF file itself), so peers that
        need a transformers tokenizer see the same vocabulary; None for tokenizer models that
        ``tokenizers`` cannot express (WordPiece, Unigram, RWKV, PLaMo-2). Note that it adds
        BOS/EOS as llama.cpp's ``add_special`` would, unlike ``encode``.
        """
        getter = getattr(self._encoder, "hf_tokenizer", None)
        return getter() if callable(getter) else None

    # --- text <-> ids -----------------------------------------------------------------------

    def encode(self, text: str) -> list[int]:
        """Token ids for ``text``, without BOS/EOS and without parsing special-token text (see class doc)."""
        if self._encoder is None:  # pragma: no cover - every constructor sets one
            raise VocabularyError(f"vocabulary {self.name!r} has no tokenizer to encode with")
        return list(self._encoder(text))

    def decode(self, ids: Iterable[int]) -> bytes:
        """The concatenated bytes of ``ids`` (special tokens contribute nothing)."""
        tokens = self.token_bytes
        n = len(tokens)
        out = []
        for i in ids:
            if not 0 <= i < n:
                raise VocabularyError(f"token id {i} is outside the vocabulary (0..{n - 1})")
            out.append(tokens[i])
        return b"".join(out)

    # --- constructors -----------------------------------------------------------------------

    @classmethod
    def from_bytes(
        cls,
        pieces: Sequence[bytes],
        *,
        eos_token_ids: Iterable[int],
        special_token_ids: Iterable[int] = (),
        bos_token_id: int | None = None,
        logits_width: int | None = None,
        name: str = "custom",
    ) -> "TokenVocabulary":
        """A vocabulary from explicit token bytes (id = index), for tests and custom tokenizers.

        Pieces of special and EOS ids are replaced by ``b""`` whatever they were, since special
        tokens never match text. ``encode`` is greedy longest-match over the non-special pieces.
        """
        eos = frozenset(eos_token_ids)
        special = frozenset(special_token_ids) | eos
        tokens = tuple(b"" if i in special else bytes(p) for i, p in enumerate(pieces))
        return cls(
            token_bytes=tokens,
            eos_token_ids=eos,
            special_token_ids=special,
            bos_token_id=bos_token_id,
            logits_width=logits_width,
            name=name,
            scheme="bytes",
            _encoder=_GreedyEncoder(tokens, special),
        )

    @classmethod
    def from_tokenizer(
        cls,
        tokenizer: Any,
        *,
        eos_token_ids: Iterable[int] | None = None,
        logits_width: int | None = None,
    ) -> "TokenVocabulary":
        """A vocabulary from a loaded transformers tokenizer (fast, or slow via transformers' converter).

        The decoding scheme is read from the backend tokenizer's JSON (its decoder and
        pre-tokenizer), never guessed from the model name: ByteLevel means byte-level BPE;
        Metaspace or ``Replace("▁", " ")`` means SentencePiece. Anything else (WordPiece, CLIP's
        ``</w>`` suffixes, ...) raises ``VocabularyError``: its tokens have no exact bytes.

        ``eos_token_ids``, when given, replaces the tokenizer's ``eos_token_id`` (pass every id
        that may end generation, e.g. Llama 3 Instruct's ``<|eot_id|>``).
        """
        tokenizer_json = _tokenizer_json(tokenizer)
        scheme, pieces, special = decode_tokenizer_json(tokenizer_json)
        n = len(pieces)
        special.update(i for i in getattr(tokenizer, "all_special_ids", ()) or () if isinstance(i, int) and 0 <= i < n)
        if eos_token_ids is None:
            eos_id = getattr(tokenizer, "eos_token_id", None)
            eos = frozenset() if eos_id is None else frozenset([eos_id])
        else:
            eos = frozenset(eos_token_ids)
        if not eos:
            raise VocabularyError(f"tokenizer {_tokenizer_name(tokenizer)!r} has no eos_token_id; pass eos_token_ids=")
        special |= eos
        tokens = tuple(b"" if i in special else p for i, p in enumerate(pieces))
        bos = getattr(tokenizer, "bos_token_id", None)
        return cls(
            token_bytes=tokens,
            eos_token_ids=eos,
            special_token_ids=frozenset(special),
            bos_token_id=bos if isinstance(bos, int) and 0 <= bos < n else None,
            logits_width=logits_width,
            name=_tokenizer_name(tokenizer),
            scheme=scheme,
            _encoder=_HFEncoder(tokenizer),
        )

    @classmethod
    def from_gguf(
        cls,
        path: str | os.PathLike[str],
        *,
        eos_token_ids: Iterable[int] | None = None,
        logits_width: int | None = None,
        cache_dir: str | os.PathLike[str] | None = None,
    ) -> "TokenVocabulary":
        """A vocabulary from a GGUF file (a vocab-only one or a full model), tokenizing as llama.cpp.

        Read from the file's own ``tokenizer.ggml.*`` metadata, whatever its architecture, with
        llama.cpp's rules (``grammars.vocab.llama_vocab``): token bytes are llama.cpp's
        ``token_to_piece`` for every tokenizer model it decodes (SentencePiece, byte-level BPE,
        WordPiece, Unigram, RWKV, PLaMo-2); control, unknown and unused tokens are special; user-
        defined tokens are their literal text. EOS ids default to llama.cpp's end-of-generation
        set (EOS/EOT/EOM metadata, FIM pad/repo/separator tokens, and texts such as
        ``<|eot_id|>``). A model corral cannot decode exactly is refused with ``VocabularyError``.

        ``encode`` tokenizes as llama.cpp for BPE, SentencePiece and RWKV vocabularies and raises
        ``VocabularyError`` for the others. The first load builds a ``tokenizer.json`` and caches
        it under ``cache_dir`` (default ``$CORRAL_CACHE_DIR`` or ``~/.cache/corral``); see
        ``grammars.vocab.gguf``.
        """
        from grammars.vocab.gguf import load_gguf_tokenizer

        info = load_gguf_tokenizer(path, cache_dir=cache_dir)
        pieces, special = info.vocab.token_pieces()
        eos = frozenset(eos_token_ids) if eos_token_ids is not None else info.end_of_generation_ids()
        if not eos:
            raise VocabularyError(f"{info.source} names no EOS token; pass eos_token_ids=")
        special |= eos
        n = len(pieces)
        bos = info.vocab.bos_token_id
        return cls(
            token_bytes=tuple(b"" if i in special else b for i, b in enumerate(pieces)),
            eos_token_ids=eos,
            special_token_ids=frozenset(special),
            bos_token_id=bos if bos is not None and 0 <= bos < n else None,
            logits_width=logits_width,
            name=info.source.name,
            scheme=_GGUF_SCHEMES.get((info.vocab.kind, info.vocab.escape_whitespaces), "bytes"),
            _encoder=_GGUFEncoder(info),
        )

    @classmethod
    def from_pretrained(
        cls,
        path: str | os.PathLike[str],
        *,
        eos_token_ids: Iterable[int] | None = None,
        logits_width: int | None = None,
        cache_dir: str | os.PathLike[str] | None = None,
    ) -> "TokenVocabulary":
        """A vocabulary from a local tokenizer folder, a ``tokenizer.json`` file or a ``.gguf`` file.

        Folders load with ``AutoTokenizer`` (local files only); their EOS ids are the tokenizer's
        ``eos_token_id`` plus ``generation_config.json``'s ``eos_token_id`` (one id or a list), as
        transformers' ``generate`` stops on both. ``cache_dir`` only matters for GGUF files.
        Hub model ids are not fetched: load the tokenizer yourself and use ``from_tokenizer``.
        """
        p = Path(path).expanduser()
        if not p.exists():
            raise VocabularyError(f"tokenizer not found: {p}")
        if p.is_file() and p.suffix.lower() == ".gguf":
            return cls.from_gguf(p, eos_token_ids=eos_token_ids, logits_width=logits_width, cache_dir=cache_dir)
        folder = p if p.is_dir() else p.parent
        try:
            import transformers

            if p.is_dir() or (p.name == "tokenizer.json" and (folder / "tokenizer_config.json").is_file()):
                tok = transformers.AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
            elif p.suffix.lower() == ".json":
                tok = transformers.PreTrainedTokenizerFast(tokenizer_file=str(p))
            else:
                raise VocabularyError(f"{p}: expected a tokenizer folder, a tokenizer.json or a .gguf file")
        except VocabularyError:
            raise
        except Exception as exc:  # transformers raises OSError, ValueError, KeyError, ... here
            raise VocabularyError(f"cannot load a tokenizer from {p}: {exc}") from exc
        if eos_token_ids is None:
            eos = {tok.eos_token_id} if tok.eos_token_id is not None else set()
            eos.update(_generation_config_eos(folder))
            eos_token_ids = eos or None
        return cls.from_tokenizer(tok, eos_token_ids=eos_token_ids, logits_width=logits_width)


# --- helpers --------------------------------------------------------------------------------


def _check_ids(ids: Iterable[int], n: int, what: str) -> list[int]:
    out = []
    for i in ids:
        if isinstance(i, bool) or not isinstance(i, int):
            raise VocabularyError(f"{what} token id {i!r} is not an int")
        if not 0 <= i < n:
            raise VocabularyError(f"{what} token id {i} is outside the vocabulary (0..{n - 1})")
        out.append(i)
    return out


def _u32(values: Iterable[int]) -> bytes:
    arr = array("I", values)
    if sys.byteorder != "little":
        arr.byteswap()
    return arr.tobytes()


def _fingerprint(tokens: tuple[bytes, ...], special: frozenset[int], eos: frozenset[int], width: int) -> str:
    """sha256 over counts, token lengths then bytes (an unambiguous encoding), special and EOS ids, width."""
    h = hashlib.sha256(_FINGERPRINT_DOMAIN)
    h.update(_u32([len(tokens), len(special), len(eos), width]))
    h.update(_u32(map(len, tokens)))
    h.update(b"".join(tokens))
    h.update(_u32(sorted(special)))
    h.update(_u32(sorted(eos)))
    return h.hexdigest()


def _tokenizer_name(tokenizer: Any) -> str:
    return str(getattr(tokenizer, "name_or_path", "") or type(tokenizer).__name__)


def _tokenizer_json(tokenizer: Any) -> dict:
    """The ``tokenizers`` JSON of a fast tokenizer, or of transformers' conversion of a slow one."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        try:
            from transformers.convert_slow_tokenizer import convert_slow_tokenizer

            backend = convert_slow_tokenizer(tokenizer)
        except Exception as exc:
            raise VocabularyError(
                f"tokenizer {_tokenizer_name(tokenizer)!r} has no fast backend and transformers cannot "
                f"convert it ({exc}); its tokens' bytes cannot be determined"
            ) from exc
    return json.loads(backend.to_str())


def _flatten(component: dict | None, key: str) -> list[dict]:
    """The steps of a (possibly nested) ``Sequence`` decoder/pre-tokenizer/normalizer."""
    if not component:
        return []
    if component.get("type") == "Sequence":
        return [step for sub in component.get(key, []) for step in _flatten(sub, key)]
    return [component]


def _detect_scheme(tj: dict) -> tuple[Scheme, str]:
    """("byte-level", "") or ("sentencepiece", space marker) from the decoder/pre-tokenizer types."""
    decoders = _flatten(tj.get("decoder"), "decoders")
    types = [d.get("type") for d in decoders]
    if "ByteLevel" in types:
        return "byte-level", ""
    for d in decoders:
        if d.get("type") == "Metaspace":
            return "sentencepiece", d.get("replacement", _SPACE_MARKER)
        pattern = d.get("pattern") or {}
        if d.get("type") == "Replace" and d.get("content") == " " and "String" in pattern:
            return "sentencepiece", pattern["String"]
    pre_types = [p.get("type") for p in _flatten(tj.get("pre_tokenizer"), "pretokenizers")]
    if not decoders and "ByteLevel" in pre_types:
        return "byte-level", ""
    raise VocabularyError(
        "cannot tell how this tokenizer's tokens map to bytes: decoder steps "
        f"{types or None}, pre-tokenizer steps {pre_types or None}; supported are byte-level BPE "
        "(a ByteLevel decoder) and SentencePiece (a Metaspace or Replace('▁', ' ') decoder)"
    )


def decode_tokenizer_json(tj: dict) -> tuple[Scheme, list[bytes], set[int]]:
    """Exact bytes per id of a ``tokenizers`` JSON, and the ids that must be special.

    Ids that no vocabulary entry names, that decode to nothing, the model's unknown token and
    special added tokens are returned special (with ``b""``).
    """
    model = tj.get("model") or {}
    mtype = model.get("type")
    if mtype in ("BPE", "WordLevel"):
        entries = list((model.get("vocab") or {}).items())
    elif mtype == "Unigram":
        entries = [(piece, i) for i, (piece, _score) in enumerate(model.get("vocab") or [])]
    else:
        raise VocabularyError(f"{mtype} tokenizer models cannot be decoded to exact bytes")
    if mtype == "BPE" and (model.get("continuing_subword_prefix") or model.get("end_of_word_suffix")):
        raise VocabularyError("BPE with subword prefixes or end-of-word suffixes has no exact token bytes")
    scheme, marker = _detect_scheme(tj)
    byte_fallback = bool(model.get("byte_fallback")) or any(
        d.get("type") == "ByteFallback" for d in _flatten(tj.get("decoder"), "decoders")
    )
    added = tj.get("added_tokens") or []
    n = 1 + max([i for _, i in entries] + [a["id"] for a in added], default=-1)
    if n == 0:
        raise VocabularyError("the tokenizer has an empty vocabulary")
    pieces: list[bytes] = [b""] * n
    for piece, i in entries:
        if scheme == "byte-level":
            pieces[i] = byte_level_piece_bytes(piece)
        else:
            pieces[i] = sentencepiece_piece_bytes(piece, replacement=marker, byte_fallback=byte_fallback)
    special: set[int] = set()
    if mtype == "Unigram" and model.get("unk_id") is not None:
        special.add(model["unk_id"])
    elif model.get("unk_token") is not None and model["unk_token"] in (model.get("vocab") or {}):
        special.add(model["vocab"][model["unk_token"]])
    for a in added:
        if a.get("special"):
            special.add(a["id"])
        else:
            pieces[a["id"]] = a["content"].encode("utf-8")
    special.update(i for i, p in enumerate(pieces) if not p)
    for i in special:
        pieces[i] = b""
    return scheme, pieces, special


def _generation_config_eos(folder: Path) -> set[int]:
    try:
        value = json.loads((folder / "generation_config.json").read_text(encoding="utf-8")).get("eos_token_id")
    except (OSError, ValueError, AttributeError):
        return set()
    if isinstance(value, int):
        return {value}
    if isinstance(value, list):
        return {v for v in value if isinstance(v, int)}
    return set()


# --- encoders (private: excluded from equality and the fingerprint) --------------------------


class _GreedyEncoder:
    """Longest-match tokenization over explicit token bytes (ties: the lowest id)."""

    def __init__(self, tokens: tuple[bytes, ...], special: frozenset[int]):
        self._tokens = tokens
        self._special = special
        self._table: tuple[dict[bytes, int], int] | None = None

    def _lookup(self) -> tuple[dict[bytes, int], int]:
        if self._table is None:  # a race builds the same table twice, harmlessly
            table: dict[bytes, int] = {}
            for i, b in enumerate(self._tokens):
                if b and i not in self._special:
                    table.setdefault(b, i)
            self._table = (table, max(map(len, table), default=0))
        return self._table

    def __call__(self, text: str) -> list[int]:
        table, longest = self._lookup()
        data = text.encode("utf-8")
        ids, pos = [], 0
        while pos < len(data):
            for length in range(min(longest, len(data) - pos), 0, -1):
                tid = table.get(data[pos : pos + length])
                if tid is not None:
                    ids.append(tid)
                    pos += length
                    break
            else:
                raise VocabularyError(f"no token matches byte 0x{data[pos]:02x} at offset {pos} of {text!r}")
        return ids

    def hf_tokenizer(self) -> None:
        return None


class _HFEncoder:
    """A transformers tokenizer, asked not to add BOS/EOS nor to parse special-token text."""

    def __init__(self, tokenizer: Any):
        self._tokenizer = tokenizer

    def __call__(self, text: str) -> list[int]:
        return list(self._tokenizer.encode(text, add_special_tokens=False, split_special_tokens=True))

    def hf_tokenizer(self) -> Any:
        return self._tokenizer


class _GGUFEncoder:
    """llama.cpp's tokenization of a GGUF vocabulary, built on first use so loading stays fast.

    Pickles as the file's path and metadata digest; the copy rebuilds its encoder from the file
    (and refuses if the file's metadata changed since).
    """

    def __init__(self, info: Any):
        self._info = info
        self._state = {
            "source": str(info.source),
            "digest": info.digest,
            "tokenizer_file": None if info.tokenizer_file is None else str(info.tokenizer_file),
            "encoder_error": info.encoder_error,
        }
        self._lock = threading.Lock()
        self._encode: Callable[[str], list[int]] | None = None
        self._hf: Any = None

    def __getstate__(self) -> dict:
        return dict(self._state)

    def __setstate__(self, state: dict) -> None:
        self._info = None
        self._state = dict(state)
        self._lock = threading.Lock()
        self._encode = None
        self._hf = None

    def _vocab(self) -> Any:
        """The ``LlamaVocab``: kept from loading, or read again after unpickling."""
        if self._info is not None:
            return self._info.vocab
        from grammars.vocab.gguf_reader import read_gguf_metadata
        from grammars.vocab.llama_vocab import LlamaVocab

        meta = read_gguf_metadata(self._state["source"])
        if meta.digest != self._state["digest"]:
            raise VocabularyError(f"{self._state['source']} changed since this vocabulary was loaded; load it again")
        return LlamaVocab.from_metadata(meta)

    def _build(self) -> Callable[[str], list[int]]:
        from grammars.vocab.gguf import load_tokenizer_file
        from grammars.vocab.gguf_encode import make_encoder

        if self._state["encoder_error"]:
            raise VocabularyError(f"{self._state['source']}: cannot encode text: {self._state['encoder_error']}")
        path = self._state["tokenizer_file"]

        def load_tokenizer() -> Any:
            try:
                return load_tokenizer_file(Path(path))
            except Exception as exc:  # the cache was removed or damaged since the vocabulary loaded
                raise VocabularyError(f"cached tokenizer {path} is unreadable ({exc}); load the vocabulary again") from exc

        return make_encoder(self._vocab(), load_tokenizer)

    def __call__(self, text: str) -> list[int]:
        if self._encode is None:
            with self._lock:
                if self._encode is None:
                    self._encode = self._build()
        return self._encode(text)

    def hf_tokenizer(self) -> Any:
        """transformers' view of the cached ``tokenizer.json`` (None where no such file could be built)."""
        path = self._state["tokenizer_file"]
        if path is None:
            return None
        with self._lock:
            if self._hf is None:
                from transformers import AutoTokenizer

                self._hf = AutoTokenizer.from_pretrained(str(Path(path).parent), local_files_only=True)
            return self._hf
