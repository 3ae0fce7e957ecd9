"""A GGUF file's tokenizer, read from its own metadata, with the derived ``tokenizer.json`` cached on disk.

Nothing here asks transformers to understand the file: ``gguf_reader`` parses the key-value
section, ``llama_vocab`` applies llama.cpp's loader rules (token attributes, special ids, exact
token bytes) whatever ``general.architecture`` says, and ``gguf_encode`` tokenizes as llama.cpp.

What is cached, under ``<cache root>/tokenizers/<digest>/`` (the digest is the sha256 of the
file's header and metadata, so a multi-gigabyte model file is never hashed whole):

* ``tokenizer.json``: a ``tokenizers`` tokenizer built from the GGUF tokens and merges. For
  byte-level BPE it is what ``encode`` runs (llama.cpp's split regexes, ``ignore_merges``); for
  SentencePiece it serves only ``hf_tokenizer`` (``encode`` runs llama.cpp's own algorithm);
* ``tokenizer_config.json``: so transformers' ``AutoTokenizer`` loads the folder (``hf_tokenizer``),
  with BOS/EOS as llama.cpp adds them and the file's chat template;
* ``corral-gguf.json``: the format version and why ``encode`` is unavailable, if it is.

Entries are written to a temporary folder and renamed into place, so concurrent processes never
read a half-written entry; an entry of another format is rebuilt.
"""

from __future__ import annotations

import json
import os
import shutil
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from grammars.errors import VocabularyError
from grammars.vocab.gguf_encode import bpe_tokenizer_json, encoder_unavailable_reason, spm_tokenizer_json
from grammars.vocab.gguf_reader import read_gguf_metadata
from grammars.vocab.llama_vocab import EOG_TOKEN_TEXTS, GGUFTokenType, LlamaVocab

__all__ = [
    "CACHE_ENV_VAR",
    "EOG_TOKEN_TEXTS",
    "GGUFTokenizer",
    "GGUFTokenType",
    "default_cache_root",
    "load_gguf_tokenizer",
    "load_tokenizer_file",
]

#: Environment variable naming corral's cache root (default ``$XDG_CACHE_HOME/corral`` or ``~/.cache/corral``).
CACHE_ENV_VAR = "CORRAL_CACHE_DIR"
#: Bumped whenever the cached files or their meaning change, so stale entries are rebuilt.
CACHE_FORMAT = 3
_META_FILE = "corral-gguf.json"
_TOKENIZER_FILE = "tokenizer.json"
_CONFIG_FILE = "tokenizer_config.json"


@dataclass(frozen=True, eq=False)
class GGUFTokenizer:
    """A GGUF file's vocabulary as llama.cpp reads it, plus where its cached tokenizer files are."""

    source: Path
    #: sha256 of the file's header and metadata: the cache key
    digest: str
    vocab: LlamaVocab
    #: the cached ``tokenizer.json``, or None for tokenizer models ``tokenizers`` cannot express
    tokenizer_file: Path | None
    #: why ``encode`` cannot tokenize as llama.cpp does, or None when it can
    encoder_error: str | None

    @property
    def model(self) -> str:
        return self.vocab.model

    @property
    def pre(self) -> str:
        return self.vocab.pre

    def end_of_generation_ids(self) -> frozenset[int]:
        """llama.cpp's end-of-generation ids: EOS/EOT/EOM, FIM pad/repo/separator, and tokens known by text."""
        return self.vocab.eog_ids


def default_cache_root() -> Path:
    """``$CORRAL_CACHE_DIR``, else ``$XDG_CACHE_HOME/corral``, else ``~/.cache/corral``."""
    env = os.environ.get(CACHE_ENV_VAR)
    if env:
        return Path(env).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return base / "corral"


def load_tokenizer_file(path: Path) -> Any:
    """A ``tokenizers.Tokenizer`` that leaves special tokens' text alone, like llama.cpp's ``parse_special=false``."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(path))
    tokenizer.encode_special_tokens = True
    return tokenizer


def load_gguf_tokenizer(
    path: str | os.PathLike[str], *, cache_dir: str | os.PathLike[str] | None = None
) -> GGUFTokenizer:
    """Read a GGUF file's tokenizer, building its cache entry when absent.

    ``cache_dir`` is corral's cache root (default: ``default_cache_root()``); entries live in its
    ``tokenizers/`` folder. Raises ``VocabularyError`` naming the file when it is missing, is not a
    GGUF file, or holds a tokenizer whose tokens cannot be decoded exactly (see ``llama_vocab``).
    """
    source = Path(path).expanduser().resolve()
    if not source.is_file():
        raise VocabularyError(f"GGUF file not found: {source}")
    meta = read_gguf_metadata(source)
    vocab = LlamaVocab.from_metadata(meta)
    root = Path(cache_dir).expanduser() if cache_dir is not None else default_cache_root()
    entry = root / "tokenizers" / meta.digest
    record = _read_entry(entry, meta.digest)
    if record is None:
        entry.parent.mkdir(parents=True, exist_ok=True)
        tmp = entry.parent / f".{meta.digest}.{os.getpid()}.{uuid.uuid4().hex}.tmp"
        try:
            _build_entry(vocab, meta.digest, tmp)
            _publish(tmp, entry, meta.digest)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        record = _read_entry(entry, meta.digest)
        if record is None:  # pragma: no cover - only if another process keeps writing garbage there
            raise VocabularyError(f"tokenizer cache entry {entry} for {source} is unreadable after writing it")
    return GGUFTokenizer(
        source=source,
        digest=meta.digest,
        vocab=vocab,
        tokenizer_file=entry / _TOKENIZER_FILE if record["tokenizer"] else None,
        encoder_error=record["encoder_error"],
    )


# --- the cache entry -------------------------------------------------------------------------


def _read_entry(entry: Path, digest: str) -> dict | None:
    """The entry's record, or None when absent, incomplete, or of another format."""
    try:
        record = json.loads((entry / _META_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(record, dict) or record.get("format") != CACHE_FORMAT or record.get("digest") != digest:
        return None
    if not isinstance(record.get("tokenizer"), bool) or not isinstance(record.get("encoder_error"), (str, type(None))):
        return None
    if record["tokenizer"] and not (entry / _TOKENIZER_FILE).is_file():
        return None
    return record


def _publish(tmp: Path, entry: Path, digest: str) -> None:
    """Rename ``tmp`` to ``entry``; a valid entry another process published first wins."""
    try:
        os.rename(tmp, entry)
        return
    except OSError:
        if not entry.exists():
            raise
    if _read_entry(entry, digest) is not None:
        return
    # A stale entry (older format, or damaged): move it aside, then put ours in its place.
    stale = entry.parent / f".{digest}.{uuid.uuid4().hex}.stale"
    try:
        os.rename(entry, stale)
    except OSError:
        pass  # someone else moved it first
    try:
        os.rename(tmp, entry)
    except OSError:
        if _read_entry(entry, digest) is None:
            raise
    finally:
        shutil.rmtree(stale, ignore_errors=True)


def _build_entry(vocab: LlamaVocab, digest: str, out: Path) -> None:
    """Write the tokenizer files (when ``tokenizers`` can express the model) and the record."""
    out.mkdir(parents=True)
    error = encoder_unavailable_reason(vocab)
    tokenizer_json: dict | None = None
    try:
        if vocab.kind == "bpe" and error is None:
            tokenizer_json = bpe_tokenizer_json(vocab)
        elif vocab.kind == "spm":
            tokenizer_json = spm_tokenizer_json(vocab)
    except VocabularyError as exc:
        error = str(exc)
    if tokenizer_json is not None:
        path = out / _TOKENIZER_FILE
        path.write_text(json.dumps(tokenizer_json, ensure_ascii=False), encoding="utf-8")
        try:
            load_tokenizer_file(path)  # fail now, not at first encode, if it does not load
        except Exception as exc:  # tokenizers raises plain Exceptions for invalid files
            path.unlink()
            tokenizer_json = None
            if vocab.kind == "bpe":
                error = f"tokenizers cannot load the BPE built from {vocab.source}: {exc}"
    if tokenizer_json is not None:
        config = _tokenizer_config(vocab)
        (out / _CONFIG_FILE).write_text(json.dumps(config, ensure_ascii=False, indent=1), encoding="utf-8")
    record = {
        "format": CACHE_FORMAT,
        "digest": digest,
        "model": vocab.model,
        "pre": vocab.pre,
        "tokenizer": tokenizer_json is not None,
        "encoder_error": error,
    }
    (out / _META_FILE).write_text(json.dumps(record, ensure_ascii=False), encoding="utf-8")


def _tokenizer_config(vocab: LlamaVocab) -> dict:
    """What transformers needs to load the folder as a fast tokenizer with the GGUF's special tokens."""

    def text(tid: int | None) -> str | None:
        return None if tid is None else vocab.text(tid)

    config: dict[str, Any] = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": text(vocab.bos_token_id),
        "eos_token": text(vocab.eos_token_id),
        "unk_token": text(vocab.unk_token_id),
        "pad_token": text(vocab.pad_token_id),
        "clean_up_tokenization_spaces": False,
        "model_max_length": 1 << 60,
    }
    if vocab.chat_template:
        config["chat_template"] = vocab.chat_template
    return config
