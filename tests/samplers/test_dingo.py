"""DINGO over token DFAs (``samplers.dingo``) against brute-force enumeration on tiny vocabularies.

The reference is independent of ``TokenDFA`` and of the lattice: a block is valid when some fill
of its masked positions and some ``remaining`` more tokens make a valid canvas, checked token by
token with the grammar's own ``Matcher`` (text in the language, then only EOS).
"""

from __future__ import annotations

import itertools
import math
from collections import Counter

import numpy as np
import pytest
import torch

from grammars import (
    LimitExceeded,
    MatchError,
    NoAllowedToken,
    TokenVocabulary,
    compile_regex,
)
from samplers import NoValidBlock, dingo_map, dingo_sample
from samplers.dingo import ENDED, prepare
from samplers.enumerate import chisquare_pvalue

PIECES = [b"a", b"b", b"c", b"ab", b""]
EOS = 4
WIDTH = 6  # one padding id past the vocabulary: never allowed
REGEXES = ["(a|b)*c", "a{1,3}b?", "ab|ba|c", "(ab|c)+", "a[bc]{2}", "c(a|b)*"]


@pytest.fixture(scope="module")
def vocab() -> TokenVocabulary:
    return TokenVocabulary.from_bytes(PIECES, eos_token_ids=[EOS], logits_width=WIDTH)


def _grammar(pattern: str, vocab: TokenVocabulary):
    g = compile_regex(pattern, vocab)
    assert g.is_regular
    return g


def canvas_valid(grammar, tokens, eos=frozenset({EOS})) -> bool:
    """The text before the first EOS is in the language and only EOS follows it."""
    m = grammar.matcher()
    ended = False
    for t in tokens:
        if ended:
            if t not in eos:
                return False
        elif t in eos:
            if not m.is_accepting():
                return False
            ended = True
        else:
            if not m.allows(t):
                return False
            m.advance(t)
    return ended or m.is_accepting()


def valid_blocks(grammar, d, *, prefix=(), masked=None, remaining=0, eos=frozenset({EOS})):
    """Every valid block (masked positions as -1) by brute force over the real token ids."""
    ids = list(range(len(PIECES)))
    masked = masked if masked is not None else [False] * d
    free = [ids if not mk else [-1] for mk in masked]
    out = []
    for block in itertools.product(*free):
        holes = [i for i, t in enumerate(block) if t == -1]
        ok = False
        for fill in itertools.product(ids, repeat=len(holes)):
            filled = list(block)
            for i, t in zip(holes, fill):
                filled[i] = t
            for tail in itertools.product(ids, repeat=remaining):
                if canvas_valid(grammar, list(prefix) + filled + list(tail), eos):
                    ok = True
                    break
            if ok:
                break
        if ok:
            out.append(block)
    return out


def block_logp(lp: np.ndarray, block) -> float:
    return math.fsum(float(lp[i, t]) for i, t in enumerate(block) if t >= 0)


def random_lp(d: int, seed: int, width: int = WIDTH) -> np.ndarray:
    rng = np.random.default_rng(seed)
    lp = np.log(rng.dirichlet(np.ones(width) * 0.7, size=d))
    lp[:, WIDTH - 1:] = 5.0  # padding columns look attractive and must never be chosen
    return lp


def state_after(grammar, tokens) -> int:
    """The DFA state after ``tokens`` (``ENDED`` from the first EOS on)."""
    m = grammar.as_dfa().matcher()
    for t in tokens:
        if m.is_terminated():
            assert t == EOS
            continue
        m.advance(t)
    return m.state


# --- dingo_map -----------------------------------------------------------------------------------


@pytest.mark.parametrize("pattern", REGEXES)
@pytest.mark.parametrize("remaining", [0, 1, 2])
def test_map_matches_brute_force(vocab, pattern, remaining):
    g = _grammar(pattern, vocab)
    dfa = g.as_dfa()
    for d, seed in [(1, 0), (3, 1), (4, 2)]:
        lp = random_lp(d, seed + 10 * remaining)
        blocks = valid_blocks(g, d, remaining=remaining)
        if not blocks:
            with pytest.raises(NoValidBlock):
                dingo_map(dfa, lp, remaining=remaining)
            continue
        best = max(blocks, key=lambda b: block_logp(lp, b))
        tokens, logp, end = dingo_map(dfa, lp, remaining=remaining)
        assert tuple(tokens) == best
        assert logp == pytest.approx(block_logp(lp, best), abs=1e-9)
        assert end == state_after(g, tokens)


@pytest.mark.parametrize("pattern", ["(a|b)*c", "a{1,3}b?", "(ab|c)+"])
def test_map_with_masked_positions(vocab, pattern):
    g = _grammar(pattern, vocab)
    dfa = g.as_dfa()
    d = 4
    for seed, mask in enumerate([[True, False, False, False], [False, True, False, True],
                                 [True, True, False, False], [False, False, True, True]]):
        for remaining in (0, 1):
            lp = random_lp(d, 100 + seed)
            blocks = valid_blocks(g, d, masked=mask, remaining=remaining)
            if not blocks:
                with pytest.raises(NoValidBlock):
                    dingo_map(dfa, lp, keep_masked=np.array(mask), remaining=remaining)
                continue
            best = max(blocks, key=lambda b: block_logp(lp, b))
            tokens, logp, end = dingo_map(dfa, lp, keep_masked=np.array(mask), remaining=remaining)
            assert tuple(tokens) == best
            assert logp == pytest.approx(block_logp(lp, best), abs=1e-9)
            tables = prepare(dfa)
            assert end == ENDED or tables.dist[tables.internal(end)] <= remaining


def test_masked_positions_score_zero_and_are_minus_one(vocab):
    dfa = _grammar("a[bc]{2}", vocab).as_dfa()
    lp = np.full((3, WIDTH), -50.0)
    tokens, logp, end = dingo_map(dfa, lp, keep_masked=np.array([True, True, True]))
    assert tokens == [-1, -1, -1] and logp == 0.0 and dfa.is_accepting(end)


def test_end_state_budget(vocab):
    """``a{3}``: 2 tokens leave 1 to go — valid only with remaining >= 1."""
    g = _grammar("a{3}", vocab)
    dfa = g.as_dfa()
    lp = random_lp(2, 7)
    with pytest.raises(NoValidBlock, match="no block"):
        dingo_map(dfa, lp, remaining=0)
    tokens, _, end = dingo_map(dfa, lp, remaining=1)
    assert tokens == [0, 0] and prepare(dfa).dist[prepare(dfa).internal(end)] == 1
    tokens, _, _ = dingo_map(dfa, lp, remaining=2)
    assert tokens == [0, 0]
    assert dingo_map(dfa, lp, remaining=1 << 80)[0] == [0, 0]  # huge budgets are fine
    lp[1, 0] = -np.inf
    with pytest.raises(NoValidBlock):  # only "a" may follow "a", and it has probability 0 here
        dingo_map(dfa, lp, remaining=1 << 80)


def test_eos_fills_the_tail_and_ended_is_absorbing(vocab):
    g = _grammar("(a|b)*c", vocab)
    dfa = g.as_dfa()
    lp = np.full((4, WIDTH), -10.0)
    lp[:, EOS] = -0.1  # EOS everywhere is the most likely, but EOS needs an accepting state first
    lp[0, 2] = -1.0
    tokens, logp, end = dingo_map(dfa, lp)
    assert tokens == [2, EOS, EOS, EOS] and end == ENDED
    assert logp == pytest.approx(-1.0 - 0.3)
    # after EOS only EOS: a likely text token later cannot follow
    lp[2, 0] = 0.0
    tokens, _, end = dingo_map(dfa, lp)
    assert tokens[1:] == [EOS, EOS, EOS] or EOS not in tokens
    assert all(t == EOS for t in tokens[tokens.index(EOS):]) if EOS in tokens else True
    # a block starting after EOS is all EOS
    tokens, _, end = dingo_map(dfa, lp, start_state=ENDED)
    assert tokens == [EOS] * 4 and end == ENDED


def test_several_eos_ids():
    vocab = TokenVocabulary.from_bytes([b"a", b"b", b"", b""], eos_token_ids=[2, 3])
    g = _grammar("ab", vocab)
    dfa = g.as_dfa()
    lp = np.log(np.array([[0.5, 0.1, 0.2, 0.2], [0.1, 0.3, 0.3, 0.3], [0.1, 0.1, 0.3, 0.5]]))
    tokens, logp, end = dingo_map(dfa, lp)
    assert tokens == [0, 1, 3] and end == ENDED
    assert logp == pytest.approx(math.log(0.5 * 0.3 * 0.5))


def test_start_state(vocab):
    g = _grammar("a{1,3}b?", vocab)
    dfa = g.as_dfa()
    start = state_after(g, [0, 0])
    for seed in range(3):
        lp = random_lp(2, 40 + seed)
        blocks = valid_blocks(g, 2, prefix=(0, 0))
        best = max(blocks, key=lambda b: block_logp(lp, b))
        tokens, _, end = dingo_map(dfa, lp, start_state=start)
        assert tuple(tokens) == best
        assert end == state_after(g, [0, 0, *tokens])


def test_zero_probability_is_no_valid_block(vocab):
    dfa = _grammar("ab|ba|c", vocab).as_dfa()
    lp = np.zeros((1, WIDTH))
    lp[0, [2, 3]] = -np.inf  # "c" and "ab", the one-token words
    with pytest.raises(NoValidBlock, match="probability zero") as info:
        dingo_map(dfa, lp)
    assert isinstance(info.value, NoAllowedToken) and isinstance(info.value, MatchError)
    with pytest.raises(NoValidBlock, match="probability zero"):
        dingo_sample(dfa, lp, generator=torch.Generator().manual_seed(0))
    with pytest.raises(NoValidBlock, match="no block"):
        dingo_map(_grammar("a{3}", vocab).as_dfa(), np.zeros((2, WIDTH)))  # three "a" tokens needed


def test_empty_block(vocab):
    dfa = _grammar("ab|ba|c", vocab).as_dfa()
    assert dingo_map(dfa, np.zeros((0, WIDTH)), remaining=1) == ([], 0.0, dfa.start)
    with pytest.raises(NoValidBlock):
        dingo_map(dfa, np.zeros((0, WIDTH)))


def test_tensor_inputs_agree(vocab):
    dfa = _grammar("(a|b)*c", vocab).as_dfa()
    lp = random_lp(5, 3)
    want = dingo_map(dfa, lp, keep_masked=[False, True, False, False, False])
    got = dingo_map(dfa, torch.from_numpy(lp), keep_masked=torch.tensor([False, True, False, False, False]))
    assert got[0] == want[0] and got[2] == want[2] and got[1] == pytest.approx(want[1])
    got32 = dingo_map(dfa, torch.from_numpy(lp).float())
    assert got32[0] == dingo_map(dfa, lp)[0]


def test_bad_arguments(vocab):
    dfa = _grammar("(a|b)*c", vocab).as_dfa()
    lp = random_lp(2, 0)
    with pytest.raises(TypeError):
        dingo_map(dfa, lp.tolist())
    with pytest.raises(ValueError):
        dingo_map(dfa, lp[:, :3])
    with pytest.raises(ValueError):
        dingo_map(dfa, lp[0])
    with pytest.raises(ValueError):
        dingo_map(dfa, lp, keep_masked=[True])
    with pytest.raises(TypeError):
        dingo_map(dfa, lp, keep_masked=[1, 0])
    with pytest.raises(ValueError):
        dingo_map(dfa, lp, remaining=-1)
    with pytest.raises(TypeError):
        dingo_map(dfa, lp, remaining=True)
    with pytest.raises(ValueError):
        dingo_map(dfa, lp, start_state=99)
    with pytest.raises(TypeError):
        dingo_map("not a dfa", lp)
    bad = lp.copy()
    bad[0, 0] = np.nan
    with pytest.raises(ValueError):
        dingo_map(dfa, bad)
    with pytest.raises(ValueError):
        dingo_sample(dfa, lp, temperature=-1.0)


def test_tables_distance_matches_shortest_completion(vocab):
    for pattern in REGEXES:
        dfa = _grammar(pattern, vocab).as_dfa()
        tables = prepare(dfa)
        for i, q in enumerate(tables.states.tolist()):
            done = dfa.shortest_completion(q)
            assert tables.dist[i] == (len(done) if done is not None else tables.dist.max())
        # every token of a class moves every state alike
        for k in range(tables.n_classes):
            toks = tables.perm[tables.class_starts[k]:tables.class_ends[k]].tolist()
            for i, q in enumerate(tables.states.tolist()):
                nexts = {dfa.next_state(q, t) if t != EOS else -3 for t in toks}
                assert len(nexts) == 1


def test_hash_collisions_are_refined(vocab, monkeypatch):
    """With every multiplier 0 all live tokens hash alike; the exact check must split them into
    the same classes as the real hash, with the same answers."""
    from samplers import dingo

    pattern = "a{1,3}b?"
    lp = random_lp(4, 21)
    dfa = _grammar(pattern, vocab).as_dfa()
    want, classes = dingo_map(dfa, lp, remaining=1), prepare(dfa).n_classes
    assert classes > 1
    monkeypatch.setattr(dingo, "_multipliers", lambda count: np.zeros(count, dtype=np.uint64))
    dfa = _grammar(pattern, TokenVocabulary.from_bytes(PIECES, eos_token_ids=[EOS], logits_width=WIDTH)).as_dfa()
    tables = prepare(dfa)
    assert tables.n_classes == classes
    for k in range(tables.n_classes):
        toks = tables.perm[tables.class_starts[k]:tables.class_ends[k]].tolist()
        for q in tables.states.tolist():
            assert len({dfa.next_state(q, t) if t != EOS else -3 for t in toks}) == 1
    assert dingo_map(dfa, lp, remaining=1) == want


def test_temperature_zero_is_map(vocab):
    dfa = _grammar("(ab|c)+", vocab).as_dfa()
    lp = random_lp(4, 9)
    assert dingo_sample(dfa, lp, temperature=0) == dingo_map(dfa, lp)


def test_live_subset_limit(vocab, monkeypatch):
    from samplers import dingo

    dfa = _grammar("(a|b)*c", vocab).as_dfa()
    monkeypatch.setattr(dingo, "MAX_LIVE_SUBSETS", 1)
    with pytest.raises(LimitExceeded):  # after "a", then masked: {0, 1}; "c" from {0,1} and "a" differ
        dingo_sample(dfa, random_lp(4, 0), keep_masked=[True, False, False, False], remaining=2,
                     generator=torch.Generator().manual_seed(0))


# --- dingo_sample --------------------------------------------------------------------------------


def _exact(lp, blocks, temperature=1.0):
    logw = np.array([block_logp(lp, b) / temperature for b in blocks])
    w = np.exp(logw - logw.max())
    return {b: float(x) for b, x in zip(blocks, w / w.sum())}


def _check_sampler(g, lp, *, masked=None, remaining=0, temperature=1.0, n=3000, seed=0):
    d = lp.shape[0]
    blocks = valid_blocks(g, d, masked=masked, remaining=remaining)
    probs = _exact(lp, blocks, temperature)
    gen = torch.Generator().manual_seed(seed)
    counts: Counter = Counter()
    dfa = g.as_dfa()
    for _ in range(n):
        tokens, logp, _ = dingo_sample(dfa, lp, keep_masked=masked, remaining=remaining,
                                       temperature=temperature, generator=gen)
        counts[tuple(tokens)] += 1
        assert logp == pytest.approx(block_logp(lp, tokens), abs=1e-9)
    assert set(counts) <= set(probs)
    p = chisquare_pvalue(counts, probs)
    assert p > 1e-3, (p, counts.most_common(5), sorted(probs.items(), key=lambda kv: -kv[1])[:5])


@pytest.mark.statistical
@pytest.mark.parametrize("pattern,remaining", [("(a|b)*c", 0), ("a{1,3}b?", 1), ("(ab|c)+", 0)])
def test_sample_matches_exact_distribution(vocab, pattern, remaining):
    g = _grammar(pattern, vocab)
    lp = random_lp(3, 5)
    lp[:, :WIDTH - 1] *= 0.3  # flatter, so many blocks carry mass
    _check_sampler(g, lp, remaining=remaining, seed=1)


@pytest.mark.statistical
def test_sample_with_temperature(vocab):
    g = _grammar("(a|b)*c", vocab)
    lp = random_lp(3, 8)
    lp[:, :WIDTH - 1] *= 0.3
    _check_sampler(g, lp, temperature=2.0, remaining=1, seed=2)


@pytest.mark.statistical
def test_sample_with_masked_positions_counts_each_block_once(vocab):
    """A masked position can lead to several states, so one block can have several lattice paths
    (in ``a{1,3}b?``, ``(⊥, a, ⊥)`` = ``a a ⊥`` ends after ``a``, after ``b`` or ended: three
    paths); a block must not be weighted by its paths. Summing over paths would be 0.19 and 0.24 away in total
    variation here, which these tests detect (expected χ² excess ~570 and ~910)."""
    g = _grammar("a{1,3}b?", vocab)
    _check_sampler(g, random_lp(3, 13) * 0.3, masked=[True, False, True], seed=3)
    _check_sampler(g, random_lp(4, 12) * 0.3, masked=[False, True, False, True], remaining=1, seed=4)
    _check_sampler(_grammar("(a|b)*c", vocab), random_lp(3, 11) * 0.2, masked=[True, False, False], seed=5)


def _letters():
    letters = [bytes([c]) for c in b"abcdefghijkl"]
    return TokenVocabulary.from_bytes([*letters, b""], eos_token_ids=[len(letters)]), len(letters)


def test_map_ties_take_the_lowest_token():
    vocab, eos = _letters()
    dfa = _grammar("[c-h]", vocab).as_dfa()
    lp = np.full((2, eos + 1), -1.0, dtype=np.float32)
    assert dingo_map(dfa, lp)[0] == [2, eos]


@pytest.mark.statistical
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_sample_within_one_big_class(dtype):
    """``[a-j]`` then EOS: the ten letters are one class; the letter is drawn within it."""
    vocab, eos = _letters()
    g = _grammar("[a-j]", vocab)
    dfa = g.as_dfa()
    rng = np.random.default_rng(31)
    lp = np.log(rng.dirichlet(np.ones(eos + 1), size=2)).astype(dtype)
    letters = list(range(10))
    w = np.exp(lp[0, letters].astype(np.float64) / 0.7)
    probs = {(t, eos): float(x) for t, x in zip(letters, w / w.sum())}
    gen = torch.Generator().manual_seed(6)
    counts = Counter(tuple(dingo_sample(dfa, lp, temperature=0.7, generator=gen)[0]) for _ in range(3000))
    assert chisquare_pvalue(counts, probs) > 1e-3


def test_states_the_vocabulary_cannot_complete_are_never_ends():
    """``a(b|cd)`` without a ``d`` token: after ``a c`` nothing can close, whatever the budget."""
    vocab = TokenVocabulary.from_bytes([b"a", b"b", b"c", b""], eos_token_ids=[3])
    dfa = _grammar("a(b|cd)", vocab).as_dfa()
    tables = prepare(dfa)
    assert (tables.dist > tables.n_states).sum() == 1  # unreachable acceptance: the state after "a c"
    lp = np.log(np.array([[0.9, 0.05, 0.04, 0.01], [0.01, 0.01, 0.97, 0.01]]))
    for remaining in (0, 3, 1 << 80):
        assert dingo_map(dfa, lp, remaining=remaining)[0] == [0, 1]
        assert dingo_sample(dfa, lp, remaining=remaining, generator=torch.Generator().manual_seed(0))[0] == [0, 1]
