"""Every GBNF grammar of the shared data against an independent character-level Earley oracle.

GBNF is a character-level CFG, so membership is decided by lark's Earley parser with
``lexer="dynamic_complete"`` on a character-level translation of the IR (no maximal munch).
For each grammar:
- known strings of the language are accepted along their canonical tokenization and along
  random tokenizations (every tokenization of a string in the language must be accepted);
- mutated strings are accepted by the matcher exactly when the oracle accepts them;
- random walks through the mask never hit a dead end, and every accepted walk is in the language.
"""

from __future__ import annotations

import random
import numpy as np
import pytest

from shared_data import SHARED_DIR, shared_path
from grammars import parse_gbnf
from grammars.testing.laws import allowed_tokens
from grammars.testing.oracles import char_level_accepts

POSITIVES = {
    "arithmetic": ["1+2*(3-4)/5=x\n", "a=b\n", "x1 = (y +2)\n", "1=2\n3=4\n"],
    "c": ["int main(){int x = 1;return x;}", "float f(int a){while(a<1){a = a+1;}}"],
    "chess": ["1. e4 e5\n2. Nf3 Nc6\n", "1. d4 d5\n2. c4 dxc4\n3. O-O-O Qxd8+\n"],
    "english": ["Hello world, this is fine!", "a\tb\nc"],
    "japanese": ["こんにちは 世界", "カタカナ、漢字"],
    "json": ['{"a": [1, 2.5, "x\\n"], "b": {"c": null}}', '{}', '{"k":true,"é":-0.5e3}'],
    "json_arr": ['[\n{"a": 1},\n2\n]', "[\n]"],
    "list": ["- hello\n- world\n", "- é\n"],
}


def _grammar_files():
    root = SHARED_DIR / "gbnf"
    return sorted(p.stem for p in root.glob("*.gbnf")) if root.exists() else sorted(POSITIVES)


@pytest.fixture(scope="module")
def grammars_by_name():
    folder = shared_path("gbnf")
    return {p.stem: p.read_text() for p in sorted(folder.glob("*.gbnf"))}


def _canonical(vocab, text: str) -> list[int]:
    """The tokenizer's own tokenization of ``text`` as a continuation (no SentencePiece prefix space)."""
    ids = vocab.encode(text)
    if vocab.decode(ids) == text.encode():
        return ids
    # SentencePiece adds a leading space to a fresh text; tokenize after a newline and drop it.
    ids = vocab.encode("\n" + text)
    for k in range(1, 4):
        if vocab.decode(ids[:k]).strip(b" ") == b"\n" and vocab.decode(ids[k:]) == text.encode():
            return ids[k:]
    pytest.skip(f"cannot isolate a canonical tokenization of {text!r} for {vocab.name}")


def _random_tokenization(vocab, data: bytes, rng: random.Random, index: dict[bytes, int]) -> list[int]:
    out = []
    i = 0
    while i < len(data):
        choices = [index[data[i:j]] for j in range(i + 1, min(len(data), i + 12) + 1) if data[i:j] in index]
        tok = rng.choice(choices)
        out.append(tok)
        i += len(vocab.token_bytes[tok])
    return out


def _token_index(vocab) -> dict[bytes, int]:
    index: dict[bytes, int] = {}
    for tok, data in enumerate(vocab.token_bytes):
        if data and tok not in vocab.special_token_ids:
            index.setdefault(data, tok)
    return index


def _accepts_tokens(compiled, tokens) -> tuple[bool, int]:
    """(fully consumed and accepting, number of tokens consumed)."""
    matcher = compiled.matcher()
    n = matcher.try_advance(tokens)
    return n == len(tokens) and matcher.is_accepting(), n


@pytest.mark.parametrize("name", _grammar_files())
def test_positives_in_oracle(grammars_by_name, name):
    grammar = parse_gbnf(grammars_by_name[name])
    for text in POSITIVES[name]:
        assert char_level_accepts(grammar, text), f"test data error: {text!r} not in {name}.gbnf"


@pytest.mark.parametrize("vocab_fixture", ["llama3_vocab", "llama2_vocab"])
@pytest.mark.parametrize("name", _grammar_files())
def test_positives_accepted_along_every_tokenization(request, grammars_by_name, name, vocab_fixture):
    from grammars import Compiler

    vocab = request.getfixturevalue(vocab_fixture)
    compiled = Compiler(vocab).compile_gbnf(grammars_by_name[name])
    index = _token_index(vocab)
    rng = random.Random(0)
    for text in POSITIVES[name]:
        tokens = _canonical(vocab, text)
        matcher = compiled.matcher()
        for k, tok in enumerate(tokens):
            assert allowed_tokens(matcher, vocab.logits_width)[tok], f"{name}: token {k} of {text!r} not in the mask"
            matcher.advance(tok)
        assert matcher.is_accepting(), f"{name}: {text!r} not accepting at the end"
        for _ in range(5):
            tokens = _random_tokenization(vocab, text.encode(), rng, index)
            ok, n = _accepts_tokens(compiled, tokens)
            assert ok, f"{name}: random tokenization of {text!r} rejected at token {n}: {tokens}"


def _mutants(text: str, alphabet: str, rng: random.Random, n: int) -> list[str]:
    out = []
    for _ in range(n):
        chars = list(text)
        op = rng.randrange(3)
        pos = rng.randrange(len(chars) + (1 if op == 1 else 0))
        if op == 0 and chars:
            del chars[pos]
        elif op == 1:
            chars.insert(pos, rng.choice(alphabet))
        elif chars:
            chars[pos] = rng.choice(alphabet)
        out.append("".join(chars))
    return out


@pytest.mark.parametrize("name", _grammar_files())
def test_mutants_agree_with_oracle(llama3_compiler, grammars_by_name, name):
    grammar = parse_gbnf(grammars_by_name[name])
    compiled = llama3_compiler.compile_gbnf(grammars_by_name[name])
    vocab = llama3_compiler.vocab
    rng = random.Random(1)
    alphabet = "".join(sorted(set("".join(POSITIVES[name])))) + ' \n"{}[]()=,;:-+*/0a'
    checked = {True: 0, False: 0}
    for text in POSITIVES[name]:
        for mutant in _mutants(text, alphabet, rng, 25):
            expected = char_level_accepts(grammar, mutant)
            ok, n = _accepts_tokens(compiled, vocab.encode(mutant))
            assert ok == expected, f"{name}: {mutant!r}: matcher {ok} (stopped at token {n}), oracle {expected}"
            checked[expected] += 1
    assert checked[False] > 0, "mutations produced no negative example"


def _shortest_completion(matcher, vocab, byte_tokens: dict[int, int], max_states: int = 5000) -> list[int] | None:
    """Single-byte tokens that bring ``matcher`` to an accepting state (breadth-first), or None."""
    from collections import deque

    start = matcher.fork()
    queue = deque([(start, [])])
    seen = {start.freeze()}
    while queue and len(seen) < max_states:
        current, path = queue.popleft()
        if current.is_accepting():
            return path
        allowed = allowed_tokens(current, vocab.logits_width)
        for byte, tok in byte_tokens.items():
            if allowed[tok]:
                nxt = current.fork()
                nxt.advance(tok)
                key = nxt.freeze()
                if key not in seen:
                    seen.add(key)
                    queue.append((nxt, path + [tok]))
    return None


@pytest.mark.parametrize("name", _grammar_files())
def test_random_walks_are_sound(llama3_compiler, grammars_by_name, name):
    """Random prefixes drawn from the mask can always be completed, and completed walks are in the language.

    A dead end (a state from which no completion exists) fails the completion search.
    """
    grammar = parse_gbnf(grammars_by_name[name])
    compiled = llama3_compiler.compile_gbnf(grammars_by_name[name])
    vocab = llama3_compiler.vocab
    index = _token_index(vocab)
    byte_tokens = {b: index[bytes([b])] for b in range(256) if bytes([b]) in index}
    eos = set(vocab.eos_token_ids)
    rng = np.random.default_rng(2)
    for walk in range(5):
        matcher = compiled.matcher()
        tokens: list[int] = []
        for _ in range(int(rng.integers(1, 12))):
            allowed = [t for t in np.flatnonzero(allowed_tokens(matcher, vocab.logits_width)).tolist() if t not in eos]
            if not allowed:
                break
            tok = int(rng.choice(allowed))
            matcher.advance(tok)
            tokens.append(tok)
        completion = _shortest_completion(matcher, vocab, byte_tokens)
        assert completion is not None, f"{name}: no completion after {vocab.decode(tokens)!r} (dead end)"
        matcher.try_advance(completion)
        assert matcher.is_accepting()
        text = vocab.decode(tokens + completion).decode("utf-8")  # an accepted walk is whole UTF-8
        assert char_level_accepts(grammar, text), f"{name}: accepted walk {text!r} is not in the language"
