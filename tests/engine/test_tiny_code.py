"""``engine.tiny_code``: the C++ corpus, fill-in-the-middle examples, and a model that loads back."""

from __future__ import annotations

import random

import pytest

from engine.tiny_code import cpp_chunks, encode_code_examples, main
from jsonschemabench.infill_bench import cut_lines, cut_spans
from shared_data import vocab_file

SOURCE = """// a comment
#include <vector>
/* block
   comment */
int add(int a, int b) {
    return a + b;
}

struct Point {
    int x;
    int y;
};
"""


def test_chunks_are_whole_blocks_without_comments():
    chunks = cpp_chunks(SOURCE, min_chars=10)
    assert chunks
    joined = "".join(chunks)
    assert "comment" not in joined and "return a + b;" in joined
    for chunk in chunks:
        assert chunk.count("{") == chunk.count("}")


def test_fim_examples_supervise_the_middle_only():
    from grammars import TokenVocabulary

    vocab = TokenVocabulary.from_pretrained(vocab_file("starcoder"))
    fim = (1, 3, 2)
    chunk = "int add(int a, int b) {\n    return a + b;\n}\n"
    examples = encode_code_examples([chunk] * 20, vocab, fim=fim, max_len=200, fim_rate=1.0, seed=0)
    for ids, start in examples:
        assert ids[0] == fim[0] and ids[start - 1] == fim[2] and fim[1] in ids[:start]
        prefix = vocab.decode(ids[1:ids.index(fim[1])])
        suffix = vocab.decode(ids[ids.index(fim[1]) + 1:start - 1])
        middle = vocab.decode(ids[start:-1])
        assert prefix + middle + suffix == chunk.encode()
    plain = encode_code_examples([chunk], vocab, fim=None, max_len=200)
    assert plain[0][1] == 1 and vocab.decode(plain[0][0][1:-1]) == chunk.encode()


def test_cuts_keep_the_text_around_the_holes():
    rng = random.Random(0)
    solution = "    int x = 0;\n    x += 1;\n    if (x) x--;\n    return x;\n}\n"
    for regions in (1, 2):
        parts = cut_lines(solution, regions, rng)
        assert parts is not None and len(parts) == regions + 1
        assert all(p.endswith("\n") or p == "" for p in parts[:-1])
        assert sum(len(p) for p in parts) < len(solution)
    spans = cut_spans('{"a": 1, "b": [true, null]}', 2, rng)
    assert len(spans) == 3


@pytest.mark.slow
def test_trains_and_saves_a_model_that_loads(tmp_path):
    source = tmp_path / "src.cpp"
    source.write_text(SOURCE * 5, encoding="utf-8")
    out = tmp_path / "model"
    code = main(["--vocab", str(vocab_file("starcoder")), "--out", str(out), "--source", str(source),
                 "--max-steps", "2", "--layers", "1", "--hidden", "16", "--heads", "2"], log=lambda m: None)
    assert code == 0
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(out)
    tokenizer = AutoTokenizer.from_pretrained(out)
    assert model.config.vocab_size >= len(tokenizer)
    assert "<fim_middle>" in tokenizer.get_vocab()
