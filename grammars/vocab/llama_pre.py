"""llama.cpp's BPE pre-tokenizers, by ``tokenizer.ggml.pre`` name: split regexes and flags.

Transcribed from llama.cpp's ``src/llama-vocab.cpp`` (``llm_tokenizer_bpe`` and
``llama_vocab::impl::load``). Each regex splits the pieces left by the previous one, keeping
matches and the gaps between them alike; ``tokenizers`` does the same with a sequence of
``Split(..., behavior="Isolated")`` steps.

llama.cpp runs regexes that use ``\\p{..}`` on a "collapsed" text where every non-ASCII code point
stands for its general category (and every ``\\p{Lu}``, ``\\p{Ll}``, ... for any letter), so the
regexes here are the ones whose meaning does not change under that scheme: standard Unicode
classes, and case tests only through ``[a-z]``/``[A-Z]``. Pre-tokenizers that llama.cpp implements
with custom code (``kimi-k2``, ``afmoe``), with ASCII-only ``\\d``/``\\b`` (``tiny_aya``), with
empty-match splits (``superbpe``), on raw UTF-8 instead of GPT-2 bytes (``gemma4``,
``sarvam-moe``, ``whitespace``), or with long literal classes not transcribed here
(``deepseek-llm``, ``youtu``) are known by name but have no regexes: their vocabularies load,
and ``encode`` refuses them with a ``VocabularyError`` naming the pre-tokenizer.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["PreTokenizer", "pre_tokenizer"]

_GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"
_C = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"  # English contractions, either case
_LLAMA3 = _C + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
_QWEN2 = _C + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
_JAIS2 = (
    _C + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s{512}(?!\S)|\s{256}(?!\S)"
    r"|\s{128}(?!\S)|\s{64}(?!\S)|\s{32}(?!\S)|\s{16}(?!\S)|\s{8}(?!\S)|\s{4}(?!\S)|\s{1,2}(?!\S)|\s{1}"
)
_QWEN35 = _C + r"|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
_DEEPSEEK3_WORDS = (
    r"""[!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+"""
)
_CJK_KANA = "[\u4e00-\u9fa5\u3040-\u309f\u30a0-\u30ff]+"
_PORO = " ?[^(\\s|.,!?\u2026\u3002\uff0c\u3001\u0964\u06d4\u060c)]+"
_TEKKEN = (
    r"[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))*((?=[\p{L}])([^A-Z]))+|[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))+"
    r"((?=[\p{L}])([^A-Z]))*|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)


def _gpt4o(letter: str) -> str:
    """GPT-4o's regex with case tests written as look-aheads (``letter`` is the class a letter is in)."""
    upper = f"((?=[{letter}])([^a-z]))"
    lower = f"((?=[{letter}])([^A-Z]))"
    return (
        rf"[^\r\n\p{{L}}\p{{N}}]?{upper}*{lower}+{_C}?|[^\r\n\p{{L}}\p{{N}}]?{upper}+{lower}*{_C}?"
        r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
    )


@dataclass(frozen=True)
class PreTokenizer:
    """One ``tokenizer.ggml.pre`` value as llama.cpp reads it."""

    name: str
    #: split regexes in order; ``None`` when corral cannot split as llama.cpp does (encode refuses)
    regexes: tuple[str, ...] | None
    #: a whole pre-token that is itself a token is emitted without running the merges
    ignore_merges: bool = False
    #: llama.cpp's ``add_bos`` before ``tokenizer.ggml.add_bos_token`` is read
    add_bos: bool = False
    #: tokens spell spaces as ``▁`` and bytes as ``<0xNN>`` (SentencePiece-style BPE, raw UTF-8)
    escape_whitespaces: bool = False


_STARCODER = (r"\p{N}", _GPT2)
_DEEPSEEK3 = (r"\p{N}{1,3}", _CJK_KANA, _DEEPSEEK3_WORDS + r"| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")

# name -> (regexes, ignore_merges, add_bos, escape_whitespaces)
_TABLE: dict[tuple[str, ...], tuple[tuple[str, ...] | None, bool, bool, bool]] = {
    ("", "default"): ((r"[\p{P}\$\+<=>\^~\|]+", _GPT2, r"\p{N}+", "[0-9][0-9][0-9]"), False, False, False),
    ("minicpm5",): (
        (r"\p{N}{1,3}", _C + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}+| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"),
        True, False, False,
    ),
    ("llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral", "midm-2.0", "lfm2", "jina-v5-nano"): (
        (_LLAMA3,), True, True, False,
    ),
    ("dbrx", "smaug-bpe", "glm4", "chatglm-bpe"): ((_LLAMA3,), False, False, False),
    ("jais-2",): ((_JAIS2,), False, False, False),
    ("deepseek-coder",): (("[\r\n]", r"\s?\p{L}+", r"\s?\p{P}+", "[\u4e00-\u9fa5\u0800-\u4e00\uac00-\ud7ff]+", r"\p{N}"),
                          False, False, False),
    ("deepseek-v3", "hunyuan-dense", "hy_v4", "joyai-llm"): (_DEEPSEEK3, False, False, False),
    ("spark2_5",): (
        (r"\p{N}{1,3}", _CJK_KANA, _DEEPSEEK3_WORDS + r"| ?[\p{P}\p{S}]+|[\r\n]|\s+(?!\S)|\s+", r"\p{N}"),
        False, False, False,
    ),
    ("falcon",): ((r"[\p{P}\$\+<=>\^~\|`]+", _GPT2, "[0-9][0-9][0-9]"), False, False, False),
    ("starcoder", "refact", "command-r", "smollm", "codeshell", "exaone", "minerva-7b", "mellum2"): (
        _STARCODER, False, False, False,
    ),
    ("gpt-2", "phi-2", "jina-es", "jina-de", "gigachat", "jina-v2-es", "jina-v2-de", "a.x-4.0", "mellum",
     "modern-bert", "jina-v1-en", "jina-v2-code", "roberta-bpe", "exaone4", "mpt", "olmo", "jais", "trillion",
     "granite-docling"): ((_GPT2,), False, False, False),
    ("qwen2", "deepseek-r1-qwen", "kormo", "f2llmv2", "stablelm2", "megrez", "hunyuan", "solar-open", "grok-2"): (
        (_QWEN2,), False, False, False,
    ),
    ("qwen35",): ((_QWEN35,), False, False, False),
    ("poro-chat", "bloom", "gpt3-finnish"): ((_PORO,), False, False, False),
    ("viking",): ((_PORO, r"\p{N}"), False, False, False),
    ("tekken",): ((_TEKKEN,), True, True, False),
    ("chameleon",): (
        ("<sentinel:[0-9]+>", "(IMGIMG)((A|B|C|D|E|F|G|H|I){1,4})Z", "([\t\n]|    |  )", r"\p{N}",
         r"[\p{P}!-/:-@\[-`{-~]", _GPT2),
        False, True, False,
    ),
    ("gpt-4o", "llama4", "kanana2", "talkie", "minimax-m2"): ((_gpt4o(r"\p{L}"),), False, False, False),
    ("granite-embed-multi-97m",): ((_gpt4o(r"\p{L}\p{M}"),), True, False, False),
    ("bailingmoe", "bailingmoe2", "llada-moe"): (
        (r"'(?:[sSdDmMtT]|[lL][lL]|[vV][eE]|[rR][eE])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
         r"|\s*[\r\n]|\s+(?!\S)|\s+",),
        False, False, False,
    ),
    ("seed-coder",): (
        (_C + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1}| ?[^\s\p{L}\p{N}\r\n]+|\s*[\r\n]+|\s+(?!\S)|\s+",),
        False, False, False,
    ),
    ("ufakzeka",): ((r"[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",),
                    False, False, False),
    ("laguna",): (("[^\n]+|[\n]+", _QWEN2), False, False, False),
    ("exaone-moe",): (
        (_C + r"|[^\r\n\p{L}\p{N}]?(?:\p{L}\p{M}*(?: \p{L}\p{M}*)*)+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]?|\s*[\r\n]"
         r"|\s+(?!\S)|\s+",),
        False, False, False,
    ),
    # known to llama.cpp, but split by code corral does not reproduce: vocabularies load, encode refuses
    ("deepseek-llm", "tiny_aya", "cohere2moe", "kimi-k2", "superbpe", "afmoe", "whitespace"): (None, False, False, False),
    ("youtu",): (None, True, False, False),
    ("gemma4", "granite-embed-multi-311m", "sarvam-moe"): (None, False, False, True),
}

_BY_NAME: dict[str, PreTokenizer] = {
    name: PreTokenizer(name, regexes, ignore_merges, add_bos, escape)
    for names, (regexes, ignore_merges, add_bos, escape) in _TABLE.items()
    for name in names
}


def pre_tokenizer(name: str) -> PreTokenizer | None:
    """llama.cpp's pre-tokenizer of that ``tokenizer.ggml.pre`` value, or None when llama.cpp does not know it."""
    return _BY_NAME.get(name)
