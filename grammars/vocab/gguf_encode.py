"""Tokenize text as llama.cpp does (``llama_tokenize(add_special=false, parse_special=false)``).

Three steps, each a port of llama.cpp's ``src/llama-vocab.cpp``:

1. ``partition``: user-defined tokens are cut out of the text first, longest text first, with the
   whitespace stripping some models ask for; control and unknown tokens' texts stay plain text.
2. each remaining run of text is tokenized by the vocabulary's model:
   * BPE: a ``tokenizers.Tokenizer`` built from the GGUF tokens and merges, with llama.cpp's split
     regexes for the ``tokenizer.ggml.pre`` value, GPT-2 byte-level pieces and ``ignore_merges``
     where llama.cpp sets it (``bpe_tokenizer_json``; cached on disk by ``grammars.vocab.gguf``);
   * SentencePiece (``llama``): llama.cpp's own algorithm in Python (``SpmEncoder``): merge the
     adjacent pair whose joined text is the highest-scoring token, leftmost first, then byte
     fallback; a dummy-prefix space goes in front of the first run and of every run after a
     special token. A ``tokenizers`` BPE with merges ranked by score is *not* the same algorithm
     (ties between equal-scored merges break differently), so it only serves ``hf_tokenizer``;
   * RWKV: greedy longest match over the unescaped token bytes (``RwkvEncoder``).
3. the ids of all runs and cut-out tokens, in order.

WPM (``bert``), UGM (``t5``), PLaMo-2 and the pre-tokenizers ``llama_pre`` has no regexes for are
not ported: ``encode`` raises a ``VocabularyError`` naming them. Their token bytes are exact all
the same, so masks work; only tokenizing prompts needs another tokenizer.
"""

from __future__ import annotations

import heapq
from typing import Any, Callable, Sequence

from grammars.errors import VocabularyError
from grammars.vocab.llama_vocab import LlamaVocab, TokenAttr, rwkv_unescape

__all__ = [
    "BpeEncoder",
    "RwkvEncoder",
    "SpmEncoder",
    "bpe_tokenizer_json",
    "encoder_unavailable_reason",
    "make_encoder",
    "partition",
    "partition_tokens",
    "spm_tokenizer_json",
]

_C_SPACE = " \t\n\v\f\r"  # C's isspace() on ASCII: what llama.cpp strips around special tokens
_SPACE_MARKER = "\u2581"


# --- 1. special tokens -------------------------------------------------------------------------


def partition_tokens(vocab: LlamaVocab) -> list[tuple[str, int, bool, bool]]:
    """The tokens ``partition`` cuts out: (text, id, lstrip, rstrip), longest text first.

    llama.cpp's candidates are tokens with a control, user-defined or unknown attribute; with
    ``parse_special=false`` it skips the control and unknown ones, which leaves the user-defined.
    Equal lengths go by id (llama.cpp's unstable sort leaves their order unspecified).
    """
    out = []
    for i, (text, attr) in enumerate(zip(vocab.texts, vocab.attrs)):
        if attr & TokenAttr.USER_DEFINED and not attr & (TokenAttr.CONTROL | TokenAttr.UNKNOWN):
            try:
                s = text.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise VocabularyError(
                    f"{vocab.source}: user-defined token {i} {text!r} is not UTF-8; llama.cpp would match it "
                    f"inside characters, which corral does not reproduce"
                ) from exc
            out.append((s, i, bool(attr & TokenAttr.LSTRIP), bool(attr & TokenAttr.RSTRIP)))
    out.sort(key=lambda t: (-len(t[0].encode("utf-8")), t[1]))
    return out


def partition(text: str, specials: Sequence[tuple[str, int, bool, bool]]) -> list[str | int]:
    """``tokenizer_st_partition``: runs of text (str) and cut-out token ids (int), in order."""
    fragments: list[str | int] = [text] if text else []
    for special, tid, lstrip, rstrip in specials:
        out: list[str | int] = []
        for frag in fragments:
            if isinstance(frag, int) or special not in frag:
                out.append(frag)
                continue
            start = 0
            while (match := frag.find(special, start)) >= 0:
                left = frag[start:match]
                if lstrip:
                    left = left.rstrip(_C_SPACE)
                if left:
                    out.append(left)
                out.append(tid)
                start = match + len(special)
                if rstrip:
                    while start < len(frag) and frag[start] in _C_SPACE:
                        start += 1
            if start < len(frag):
                out.append(frag[start:])
        fragments = out
    return fragments


# --- 2a. SentencePiece -------------------------------------------------------------------------


class SpmEncoder:
    """llama.cpp's ``llm_tokenizer_spm_session`` with its dummy-prefix rule, on Python strings."""

    def __init__(self, vocab: LlamaVocab):
        if vocab.scores is None:
            raise VocabularyError(f"{vocab.source}: a SentencePiece vocabulary needs tokenizer.ggml.scores")
        self._ids: dict[str, int] = {}
        for i, text in enumerate(vocab.texts):
            try:
                self._ids[text.decode("utf-8")] = i
            except UnicodeDecodeError:
                pass  # text that is not UTF-8 never equals a run of characters
        self._scores = [float(s) for s in vocab.scores]
        self._add_space_prefix = vocab.add_space_prefix
        self._specials = partition_tokens(vocab)
        self._byte_ids = [self._byte_token(vocab, b) for b in range(256)]

    def _byte_token(self, vocab: LlamaVocab, b: int) -> int | None:
        """``byte_to_token``: the ``<0xNN>`` token, else the one-byte token, else none."""
        i = self._ids.get(f"<0x{b:02X}>")
        if i is None and b < 0x80:
            i = self._ids.get(chr(b))
        return i

    def __call__(self, text: str) -> list[int]:
        out: list[int] = []
        prev_special = True
        for frag in partition(text, self._specials):
            if isinstance(frag, int):
                out.append(frag)
                prev_special = True
                continue
            run = (" " if self._add_space_prefix and prev_special else "") + frag
            self._tokenize(run.replace(" ", _SPACE_MARKER), out)
            prev_special = False
        return out

    def _tokenize(self, text: str, out: list[int]) -> None:
        ids, scores = self._ids, self._scores
        n = len(text)
        starts = list(range(n))  # symbol i covers text[starts[i]:starts[i] + lens[i]]
        lens = [1] * n
        prev = [i - 1 for i in range(n)]
        nxt = [i + 1 if i + 1 < n else -1 for i in range(n)]
        queue: list[tuple[float, int, int, int]] = []

        def add(left: int, right: int) -> None:
            if left < 0 or right < 0:
                return
            piece = text[starts[left] : starts[right] + lens[right]]
            tid = ids.get(piece)
            if tid is not None:  # highest score first, then the leftmost pair
                heapq.heappush(queue, (-scores[tid], left, right, len(piece)))

        for i in range(1, n):
            add(i - 1, i)
        while queue:
            _, left, right, size = heapq.heappop(queue)
            if lens[left] == 0 or lens[right] == 0 or lens[left] + lens[right] != size:
                continue  # one side was merged since this pair was queued
            lens[left] += lens[right]
            lens[right] = 0
            nxt[left] = nxt[right]
            if nxt[right] >= 0:
                prev[nxt[right]] = left
            add(prev[left], left)
            add(left, nxt[left])
        i = 0 if n else -1
        while i != -1:
            piece = text[starts[i] : starts[i] + lens[i]]
            tid = ids.get(piece)
            if tid is not None:
                out.append(tid)
            else:  # only single characters can be missing: merges make tokens
                for b in piece.encode("utf-8"):
                    bid = self._byte_ids[b]
                    if bid is None:
                        raise VocabularyError(f"no token for byte 0x{b:02x} (no <0x{b:02X}> byte token)")
                    out.append(bid)
            i = nxt[i]


# --- 2b. RWKV --------------------------------------------------------------------------------


class RwkvEncoder:
    """llama.cpp's ``llm_tokenizer_rwkv_session``: greedy longest match over every token's bytes."""

    def __init__(self, vocab: LlamaVocab):
        self._ids = {rwkv_unescape(text): i for i, text in enumerate(vocab.texts)}  # a later id wins, as in the trie
        self._longest = max(map(len, self._ids))
        self._specials = partition_tokens(vocab)

    def __call__(self, text: str) -> list[int]:
        out: list[int] = []
        for frag in partition(text, self._specials):
            if isinstance(frag, int):
                out.append(frag)
                continue
            data = frag.encode("utf-8")
            pos = 0
            while pos < len(data):
                for size in range(min(self._longest, len(data) - pos), 0, -1):
                    tid = self._ids.get(data[pos : pos + size])
                    if tid is not None:
                        out.append(tid)
                        pos += size
                        break
                else:  # llama.cpp emits its unknown token here, which RWKV vocabularies do not have
                    raise VocabularyError(f"no RWKV token starts with byte 0x{data[pos]:02x}")
        return out


# --- 2c. BPE via tokenizers -----------------------------------------------------------------------


class BpeEncoder:
    """Cut out user-defined tokens, then a ``tokenizers.Tokenizer`` per run of text."""

    def __init__(self, vocab: LlamaVocab, tokenizer: Any):
        self._tokenizer = tokenizer
        self._specials = partition_tokens(vocab)

    def __call__(self, text: str) -> list[int]:
        out: list[int] = []
        for frag in partition(text, self._specials):
            if isinstance(frag, int):
                out.append(frag)
            else:
                out.extend(self._tokenizer.encode(frag, add_special_tokens=False).ids)
        return out


def encoder_unavailable_reason(vocab: LlamaVocab) -> str | None:
    """Why ``encode`` cannot tokenize this vocabulary as llama.cpp does, or None when it can."""
    if vocab.kind in ("spm", "rwkv"):
        return None
    if vocab.kind == "bpe":
        if vocab.pre_regexes is None:
            return f"pre-tokenizer {vocab.pre!r} is split by code corral does not reproduce"
        return None
    return f"tokenizer model {vocab.model!r} ({vocab.kind.upper()}) has no llama.cpp-exact encoder in corral"


def make_encoder(vocab: LlamaVocab, load_tokenizer: Callable[[], Any]) -> Callable[[str], list[int]]:
    """The encoder for a vocabulary (``load_tokenizer`` gives the BPE ``tokenizers.Tokenizer``)."""
    reason = encoder_unavailable_reason(vocab)
    if reason is not None:
        raise VocabularyError(f"{vocab.source}: cannot encode text: {reason}")
    if vocab.kind == "spm":
        return SpmEncoder(vocab)
    if vocab.kind == "rwkv":
        return RwkvEncoder(vocab)
    return BpeEncoder(vocab, load_tokenizer())


# --- tokenizer.json (for encoding BPE, and for transformers) ------------------------------------


def _split(regex: str) -> dict:
    return {"type": "Split", "pattern": {"Regex": regex}, "behavior": "Isolated", "invert": False}


def _added_tokens(vocab: LlamaVocab) -> list[dict]:
    """Every non-normal token as an added token at its id: user-defined ones plain, the rest special."""
    out = []
    for i, attr in enumerate(vocab.attrs):
        if attr & (TokenAttr.CONTROL | TokenAttr.USER_DEFINED | TokenAttr.UNKNOWN | TokenAttr.UNUSED) or not attr:
            special = not (attr & TokenAttr.USER_DEFINED) or bool(attr & (TokenAttr.CONTROL | TokenAttr.UNKNOWN))
            out.append({"id": i, "content": vocab.text(i), "single_word": False, "lstrip": bool(attr & TokenAttr.LSTRIP),
                        "rstrip": bool(attr & TokenAttr.RSTRIP), "normalized": False, "special": special})
    return out


def _post_processor(vocab: LlamaVocab) -> dict:
    """BOS/EOS around a text as llama.cpp's ``add_special`` puts them (transformers' ``add_special_tokens``)."""
    specials: dict[str, dict] = {}

    def token(tid: int | None, on: bool, type_id: int) -> list[dict]:
        if not on or tid is None:
            return []
        text = vocab.text(tid)
        specials[text] = {"id": text, "ids": [tid], "tokens": [text]}
        return [{"SpecialToken": {"id": text, "type_id": type_id}}]

    def seq(name: str, type_id: int) -> list[dict]:
        return [{"Sequence": {"id": name, "type_id": type_id}}]

    bos, eos = vocab.bos_token_id, vocab.eos_token_id
    single = token(bos, vocab.add_bos, 0) + seq("A", 0) + token(eos, vocab.add_eos, 0)
    pair = single + token(bos, vocab.add_bos, 1) + seq("B", 1) + token(eos, vocab.add_eos, 1)
    return {"type": "TemplateProcessing", "single": single, "pair": pair, "special_tokens": specials}


def _model_vocab(vocab: LlamaVocab) -> dict[str, int]:
    out: dict[str, int] = {}
    for i in range(len(vocab)):
        out.setdefault(vocab.text(i), i)
    return out


def bpe_tokenizer_json(vocab: LlamaVocab) -> dict:
    """A ``tokenizers`` JSON that splits and merges as llama.cpp's BPE does (``VocabularyError`` if it cannot)."""
    reason = encoder_unavailable_reason(vocab)
    if reason is not None or vocab.kind != "bpe" or vocab.escape_whitespaces:
        raise VocabularyError(f"{vocab.source}: no tokenizers BPE for it: {reason or 'not byte-level BPE'}")
    model_vocab = _model_vocab(vocab)
    merges = []
    for rank, raw in enumerate(vocab.merges or ()):
        merge = raw.decode("utf-8", errors="backslashreplace")
        cut = merge.find(" ", 1)  # llama.cpp splits at the first space after the first character
        if cut < 0:
            continue  # llama.cpp stores an empty pair that never matches
        left, right = merge[:cut], merge[cut + 1 :]
        if left not in model_vocab or right not in model_vocab or left + right not in model_vocab:
            missing = next(t for t in (left, right, left + right) if t not in model_vocab)
            raise VocabularyError(
                f"{vocab.source}: merge {rank} {merge!r} uses {missing!r}, which is not a token; llama.cpp "
                f"would fall back to bytes there, which corral does not reproduce"
            )
        merges.append([left, right])
    pre_tokenizers = [_split(rx) for rx in vocab.pre_regexes or ()]
    pre_tokenizers.append({"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False})
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": _added_tokens(vocab),
        "normalizer": None,
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": pre_tokenizers},
        "post_processor": _post_processor(vocab),
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
        "model": {
            "type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
            "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False,
            "ignore_merges": vocab.ignore_merges, "vocab": model_vocab, "merges": merges,
        },
    }


def spm_tokenizer_json(vocab: LlamaVocab) -> dict:
    """A ``tokenizers`` JSON close to llama.cpp's SentencePiece, for transformers (``hf_tokenizer``) only.

    Merges are every split of a token into two tokens, ranked by the joined token's score: the
    usual conversion, which can break ties between equal scores differently from llama.cpp, so
    ``TokenVocabulary.encode`` uses ``SpmEncoder`` instead.
    """
    if vocab.kind != "spm" or vocab.scores is None:
        raise VocabularyError(f"{vocab.source}: not a SentencePiece vocabulary with scores")
    model_vocab = _model_vocab(vocab)
    candidates = []
    for piece, tid in model_vocab.items():
        for cut in range(1, len(piece)):
            left, right = piece[:cut], piece[cut:]
            if left in model_vocab and right in model_vocab:
                candidates.append((-float(vocab.scores[tid]), tid, model_vocab[left], left, right))
    candidates.sort()
    steps: list[dict] = []
    if vocab.add_space_prefix:
        steps.append({"type": "Prepend", "prepend": _SPACE_MARKER})
    steps.append({"type": "Replace", "pattern": {"String": " "}, "content": _SPACE_MARKER})
    decoders: list[dict] = [
        {"type": "Replace", "pattern": {"String": _SPACE_MARKER}, "content": " "},
        {"type": "ByteFallback"},
        {"type": "Fuse"},
    ]
    if vocab.add_space_prefix:
        decoders.append({"type": "Strip", "content": " ", "start": 1, "stop": 0})
    unk = None if vocab.unk_token_id is None else vocab.text(vocab.unk_token_id)
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": _added_tokens(vocab),
        "normalizer": {"type": "Sequence", "normalizers": steps},
        "pre_tokenizer": None,
        "post_processor": _post_processor(vocab),
        "decoder": {"type": "Sequence", "decoders": decoders},
        "model": {
            "type": "BPE", "dropout": None, "unk_token": unk, "continuing_subword_prefix": None,
            "end_of_word_suffix": None, "fuse_unk": True, "byte_fallback": True, "ignore_merges": False,
            "vocab": model_vocab, "merges": [[left, right] for *_, left, right in candidates],
        },
    }
