"""Turn a GGUF file's tokenizer into one that tokenizes like llama.cpp, and keep it on disk.

transformers can build a tokenizer from a GGUF file, but slowly (~15 s for Llama 3) and with
differences from llama.cpp, which is the reference for a GGUF vocabulary. Measured on llama.cpp's
own test vectors, this module corrects them after conversion:

* ids at or beyond the GGUF token count (transformers appends ``<|endoftext|>`` to Llama 3 and
  three tokens to DeepSeek-Coder) are dropped: the model has no logits for them;
* ``ignore_merges`` is set for the pre-tokenizers where llama.cpp sets it (Llama 3: ``Cửa Việt``);
* the pre-tokenizer is rebuilt from llama.cpp's regexes where transformers uses the plain GPT-2
  one (StarCoder and DeepSeek-Coder split digits such as ``½`` apart);
* SentencePiece always gets its dummy-prefix space, as llama.cpp adds it (transformers' Metaspace
  skips it when the text already starts with a space);
* every non-normal GGUF token becomes an added token at its GGUF id: user-defined ones match
  literally in text as in llama.cpp, control, unknown and unused ones are special.

The corrected ``tokenizer.json`` (via ``save_pretrained``) and the GGUF metadata the vocabulary
needs are cached under ``<cache root>/tokenizers/<sha256 of the file>/``, written to a temporary
folder and renamed into place so concurrent processes never read a half-written entry.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from grammars.errors import VocabularyError

__all__ = [
    "CACHE_ENV_VAR",
    "EOG_TOKEN_TEXTS",
    "GGUFTokenizer",
    "GGUFTokenType",
    "align_with_llama_cpp",
    "default_cache_root",
    "file_sha256",
    "load_gguf_tokenizer",
    "load_tokenizer_file",
]

#: Environment variable naming corral's cache root (default ``$XDG_CACHE_HOME/corral`` or ``~/.cache/corral``).
CACHE_ENV_VAR = "CORRAL_CACHE_DIR"
#: Bumped whenever the corrections or the cached layout change, so stale entries are rebuilt.
CACHE_FORMAT = 2
_META_FILE = "corral-gguf.json"
_TOKENIZER_FILE = "tokenizer.json"


class GGUFTokenType:
    """``tokenizer.ggml.token_type`` values (llama.cpp's ``llama_token_type``)."""

    NORMAL = 1
    UNKNOWN = 2
    CONTROL = 3
    USER_DEFINED = 4
    UNUSED = 5
    BYTE = 6


# Pre-tokenizer names (``tokenizer.ggml.pre``) for which llama.cpp sets ``ignore_merges``: a whole
# pre-token that is itself in the vocabulary is emitted as is, without running the merges.
_IGNORE_MERGES_PRE = frozenset({"llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral", "tekken"})

# llama.cpp's split regexes (src/llama-vocab.cpp) for pre-tokenizers that transformers converts to
# the plain GPT-2 ByteLevel regex. Each regex splits the pieces left by the previous one, keeping
# matches and gaps alike: a sequence of isolated ``Split``s followed by a regex-free ByteLevel.
_GPT2_REGEX = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"
_STARCODER_REGEXES = (r"\p{N}", _GPT2_REGEX)
_PRE_TOKENIZER_REGEXES: dict[str, tuple[str, ...]] = {
    "deepseek-coder": ("[\r\n]", r"\s?\p{L}+", r"\s?\p{P}+", "[一-龥ࠀ-一가-퟿]+", r"\p{N}"),
    **{
        name: _STARCODER_REGEXES
        for name in ("starcoder", "refact", "command-r", "smollm", "codeshell", "exaone", "minerva-7b")
    },
}

# Token texts llama.cpp treats as end of generation whatever the metadata says (llama-vocab.cpp).
EOG_TOKEN_TEXTS = frozenset(
    {
        "<|eot_id|>",
        "<|im_end|>",
        "<|end|>",
        "<|return|>",
        "<|call|>",
        "<end_of_turn>",
        "<|endoftext|>",
        "<|eom_id|>",
        "<EOT>",
        "_<EOT>",
        "<|end_of_text|>",
        "<end_of_utterance>",
    }
)

_SUPPORTED_MODELS = ("gpt2", "llama")


@dataclass(frozen=True)
class GGUFTokenizer:
    """What a GGUF file says about its tokenizer, plus where its corrected ``tokenizer.json`` is cached."""

    source: Path
    sha256: str
    #: ``tokenizer.ggml.model``: ``"gpt2"`` (byte-level BPE) or ``"llama"`` (SentencePiece)
    model: str
    #: ``tokenizer.ggml.pre``: the pre-tokenizer name, ``""`` when absent
    pre: str
    tokens: tuple[str, ...]
    token_types: tuple[int, ...]
    bos_token_id: int | None
    eos_token_id: int | None
    eot_token_id: int | None
    eom_token_id: int | None
    add_space_prefix: bool
    tokenizer_file: Path

    def end_of_generation_ids(self) -> frozenset[int]:
        """EOS, EOT and EOM from the metadata plus the tokens llama.cpp recognises by their text."""
        ids = {i for i in (self.eos_token_id, self.eot_token_id, self.eom_token_id) if i is not None}
        ids.update(
            i
            for i, (text, kind) in enumerate(zip(self.tokens, self.token_types, strict=True))
            if text in EOG_TOKEN_TEXTS and kind != GGUFTokenType.BYTE
        )
        return frozenset(ids)


def default_cache_root() -> Path:
    """``$CORRAL_CACHE_DIR``, else ``$XDG_CACHE_HOME/corral``, else ``~/.cache/corral``."""
    env = os.environ.get(CACHE_ENV_VAR)
    if env:
        return Path(env).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return base / "corral"


def file_sha256(path: Path, chunk_size: int = 1 << 20) -> str:
    """Hex sha256 of a file's contents, read in chunks (a full model GGUF can be gigabytes)."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(chunk_size):
            digest.update(chunk)
    return digest.hexdigest()


def load_tokenizer_file(path: Path) -> Any:
    """A ``tokenizers.Tokenizer`` that leaves special tokens' text alone, like llama.cpp's ``parse_special=false``."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(path))
    tokenizer.encode_special_tokens = True
    return tokenizer


def load_gguf_tokenizer(
    path: str | os.PathLike[str], *, cache_dir: str | os.PathLike[str] | None = None
) -> GGUFTokenizer:
    """Read (from the cache, or by converting and caching) the tokenizer of a GGUF file.

    ``cache_dir`` is corral's cache root (default: ``default_cache_root()``); entries live in its
    ``tokenizers/`` folder. Raises ``VocabularyError`` naming the file when it is missing, is not
    a GGUF file, or holds a tokenizer model other than byte-level BPE or SentencePiece.
    """
    source = Path(path).expanduser().resolve()
    if not source.is_file():
        raise VocabularyError(f"GGUF file not found: {source}")
    sha = file_sha256(source)
    root = Path(cache_dir).expanduser() if cache_dir is not None else default_cache_root()
    entry = root / "tokenizers" / sha
    cached = _read_entry(entry, source, sha)
    if cached is not None:
        return cached

    entry.parent.mkdir(parents=True, exist_ok=True)
    tmp = entry.parent / f".{sha}.{os.getpid()}.{uuid.uuid4().hex}.tmp"
    try:
        _build_entry(source, sha, tmp)
        _publish(tmp, entry, source, sha)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    cached = _read_entry(entry, source, sha)
    if cached is None:  # pragma: no cover - only if another process keeps writing garbage there
        raise VocabularyError(f"tokenizer cache entry {entry} for {source} is unreadable after writing it")
    return cached


# --- the cache entry -------------------------------------------------------------------------


def _transformers_version() -> str:
    """The converter's version, read without importing transformers (which takes seconds)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("transformers")
    except PackageNotFoundError:
        return "none"


def _read_entry(entry: Path, source: Path, sha: str) -> GGUFTokenizer | None:
    """The cached entry, or None when absent, incomplete, or written by another format/converter."""
    try:
        meta = json.loads((entry / _META_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    tokenizer_file = entry / _TOKENIZER_FILE
    if (
        not isinstance(meta, dict)
        or meta.get("format") != CACHE_FORMAT
        or meta.get("sha256") != sha
        or meta.get("transformers") != _transformers_version()
        or not tokenizer_file.is_file()
    ):
        return None
    try:
        tokens = tuple(meta["tokens"])
        token_types = tuple(meta["token_types"])
        if len(tokens) != len(token_types):
            return None
        return GGUFTokenizer(
            source=source,
            sha256=sha,
            model=meta["model"],
            pre=meta["pre"],
            tokens=tokens,
            token_types=token_types,
            bos_token_id=meta["bos_token_id"],
            eos_token_id=meta["eos_token_id"],
            eot_token_id=meta["eot_token_id"],
            eom_token_id=meta["eom_token_id"],
            add_space_prefix=meta["add_space_prefix"],
            tokenizer_file=tokenizer_file,
        )
    except (KeyError, TypeError):
        return None


def _publish(tmp: Path, entry: Path, source: Path, sha: str) -> None:
    """Rename ``tmp`` to ``entry``; a valid entry another process published first wins."""
    try:
        os.rename(tmp, entry)
        return
    except OSError:
        if not entry.exists():
            raise
    if _read_entry(entry, source, sha) is not None:
        return
    # A stale entry (older format or converter): move it aside, then put ours in its place.
    stale = entry.parent / f".{sha}.{uuid.uuid4().hex}.stale"
    try:
        os.rename(entry, stale)
    except OSError:
        pass  # someone else moved it first
    try:
        os.rename(tmp, entry)
    except OSError:
        if _read_entry(entry, source, sha) is None:
            raise
    finally:
        shutil.rmtree(stale, ignore_errors=True)


def _build_entry(source: Path, sha: str, out: Path) -> None:
    meta = _read_gguf_metadata(source)
    if meta["model"] not in _SUPPORTED_MODELS:
        raise VocabularyError(
            f"{source}: tokenizer model {meta['model']!r} is not supported "
            f"(only byte-level BPE 'gpt2' and SentencePiece 'llama' decode to exact bytes)"
        )
    try:
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(str(source.parent), gguf_file=source.name)
    except Exception as exc:  # transformers raises many types here; all mean "cannot convert"
        raise VocabularyError(f"transformers could not convert the tokenizer of {source}: {exc}") from exc
    if not hasattr(tok, "backend_tokenizer"):
        raise VocabularyError(f"transformers gave no fast tokenizer for {source}")
    tokenizer_json = json.loads(tok.backend_tokenizer.to_str())
    if not meta["token_types"]:
        meta["token_types"] = _types_from_added_tokens(tokenizer_json, len(meta["tokens"]))
    fixed = align_with_llama_cpp(tokenizer_json, meta, source)

    out.mkdir(parents=True)
    tok.save_pretrained(str(out))
    # save_pretrained wrote transformers' conversion; replace it with the corrected one.
    (out / _TOKENIZER_FILE).write_text(json.dumps(fixed, ensure_ascii=False), encoding="utf-8")
    load_tokenizer_file(out / _TOKENIZER_FILE)  # fail now, not at first encode, if it does not load
    record = {"format": CACHE_FORMAT, "sha256": sha, "transformers": _transformers_version(), **meta}
    (out / _META_FILE).write_text(json.dumps(record, ensure_ascii=False), encoding="utf-8")


# --- reading GGUF metadata -------------------------------------------------------------------


def _read_gguf_metadata(source: Path) -> dict[str, Any]:
    """The ``tokenizer.ggml.*`` fields the vocabulary needs (``gguf.GGUFReader``: slow, so cached)."""
    try:
        import gguf

        reader = gguf.GGUFReader(str(source))
    except Exception as exc:
        raise VocabularyError(f"{source} is not a readable GGUF file: {exc}") from exc

    def value(key: str, default: Any = None) -> Any:
        field = reader.fields.get(key)
        if field is None or not field.types:
            return default
        try:
            return _field_value(field, gguf.GGUFValueType)
        except UnicodeDecodeError as exc:
            raise VocabularyError(f"{source}: {key} holds text that is not UTF-8 ({exc})") from exc

    tokens = value("tokenizer.ggml.tokens")
    if not tokens:
        raise VocabularyError(f"{source} has no tokenizer (no tokenizer.ggml.tokens)")
    model = value("tokenizer.ggml.model", "")
    token_types = [int(t) for t in value("tokenizer.ggml.token_type", [])]
    if token_types and len(token_types) != len(tokens):
        raise VocabularyError(f"{source}: {len(tokens)} tokens but {len(token_types)} token types")
    return {
        "model": model,
        "pre": value("tokenizer.ggml.pre", "") or "",
        "tokens": list(tokens),
        "token_types": token_types,
        "bos_token_id": _opt_int(value("tokenizer.ggml.bos_token_id")),
        "eos_token_id": _opt_int(value("tokenizer.ggml.eos_token_id")),
        "eot_token_id": _opt_int(value("tokenizer.ggml.eot_token_id")),
        "eom_token_id": _opt_int(value("tokenizer.ggml.eom_token_id")),
        # llama.cpp's default: SentencePiece vocabularies add the dummy-prefix space unless told not to
        "add_space_prefix": bool(value("tokenizer.ggml.add_space_prefix", model == "llama")),
    }


def _field_value(field: Any, value_type: Any) -> Any:
    """A GGUFReader field as Python values (``ReaderField.contents()`` does this in newer gguf releases)."""
    if field.types[0] == value_type.ARRAY:
        if field.types[-1] == value_type.STRING:
            return [bytes(field.parts[i]).decode("utf-8") for i in field.data]
        return [v for i in field.data for v in field.parts[i].tolist()]
    if field.types[0] == value_type.STRING:
        return bytes(field.parts[-1]).decode("utf-8")
    return field.parts[-1].tolist()[0]


def _opt_int(v: Any) -> int | None:
    return None if v is None else int(v)


def _types_from_added_tokens(tokenizer_json: dict, n: int) -> list[int]:
    """Token types for a GGUF file without ``tokenizer.ggml.token_type``: added tokens are the non-normal ones."""
    types = [GGUFTokenType.NORMAL] * n
    for added in tokenizer_json.get("added_tokens", []):
        if added["id"] < n:
            types[added["id"]] = GGUFTokenType.CONTROL if added.get("special") else GGUFTokenType.USER_DEFINED
    return types


# --- the corrections ------------------------------------------------------------------------


def align_with_llama_cpp(tokenizer_json: dict, meta: dict[str, Any], source: Path) -> dict:
    """Correct transformers' conversion of a GGUF tokenizer to tokenize as llama.cpp does (see module doc)."""
    tokens: list[str] = meta["tokens"]
    types: list[int] = meta["token_types"]
    n = len(tokens)
    tj = json.loads(json.dumps(tokenizer_json))  # deep copy; the caller's dict stays as it was
    model = tj["model"]

    if isinstance(model.get("vocab"), dict):
        model["vocab"] = {piece: i for piece, i in model["vocab"].items() if i < n}
        by_id = {i: piece for piece, i in model["vocab"].items()}
    else:
        by_id = dict(enumerate(piece for piece, _ in model.get("vocab") or []))
    for i, piece in by_id.items():
        if types[i] in (GGUFTokenType.NORMAL, GGUFTokenType.BYTE) and piece != tokens[i]:
            raise VocabularyError(
                f"transformers converted {source} inconsistently: token {i} is {tokens[i]!r} in the "
                f"GGUF file but {piece!r} in the converted tokenizer"
            )

    # Every non-normal GGUF token becomes an added token: user-defined ones match their literal
    # text (llama.cpp matches them before pre-tokenizing), the others are special. ``tokenizers``
    # ignores an added token's "id" and looks its content up in the model vocabulary (appending
    # a new id when absent), so the model vocabulary must hold the GGUF text at that id: DeepSeek-
    # Coder's conversion stores '<｜fim▁hole｜>' there in byte-level form instead.
    vocab = model.get("vocab") if isinstance(model.get("vocab"), dict) else None
    added = {a["id"]: a for a in tj.get("added_tokens", []) if a["id"] < n}
    for i, kind in enumerate(types):
        if kind in (GGUFTokenType.NORMAL, GGUFTokenType.BYTE):
            continue
        entry = added.get(i) or {"id": i, "single_word": False, "lstrip": False, "rstrip": False}
        entry.update(content=tokens[i], normalized=False, special=kind != GGUFTokenType.USER_DEFINED)
        added[i] = entry
        if vocab is not None and by_id.get(i) != tokens[i]:
            if vocab.get(tokens[i], i) != i:
                raise VocabularyError(
                    f"{source}: token {i} {tokens[i]!r} is also token {vocab[tokens[i]]} in the converted vocabulary"
                )
            vocab.pop(by_id.get(i), None)
            vocab[tokens[i]] = i
    tj["added_tokens"] = [added[i] for i in sorted(added)]

    post = tj.get("post_processor")
    if isinstance(post, dict) and post.get("type") == "TemplateProcessing":
        text_to_id = {t: i for i, t in enumerate(tokens)}
        for special in (post.get("special_tokens") or {}).values():
            if any(i >= n for i in special.get("ids", [])):
                ids = [text_to_id.get(t) for t in special.get("tokens", [])]
                if None in ids:
                    tj["post_processor"] = None
                    break
                special["ids"] = ids

    pre = meta["pre"]
    if meta["model"] == "gpt2":
        if pre in _IGNORE_MERGES_PRE and model.get("type") == "BPE":
            model["ignore_merges"] = True
        if pre in _PRE_TOKENIZER_REGEXES:
            tj["pre_tokenizer"] = {
                "type": "Sequence",
                "pretokenizers": [
                    {"type": "Split", "pattern": {"Regex": rx}, "behavior": "Isolated", "invert": False}
                    for rx in _PRE_TOKENIZER_REGEXES[pre]
                ]
                + [{"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False}],
            }
    elif meta["model"] == "llama":
        pre_tok = tj.get("pre_tokenizer") or {}
        if pre_tok.get("type") == "Metaspace":
            # llama.cpp escapes every space to ▁ and prepends one to each run of text, even text
            # that already starts with a space; Metaspace(prepend_scheme="first") skips that case.
            replacement = pre_tok.get("replacement", "\u2581")
            steps: list[dict] = [{"type": "Replace", "pattern": {"String": " "}, "content": replacement}]
            if meta["add_space_prefix"]:
                steps.insert(0, {"type": "Prepend", "prepend": replacement})
            if tj.get("normalizer") is not None:
                steps.insert(0, tj["normalizer"])
            tj["normalizer"] = {"type": "Sequence", "normalizers": steps}
            tj["pre_tokenizer"] = None
    return tj
