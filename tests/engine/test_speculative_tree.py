"""Token-tree speculative decoding (``engine.spec_tree``) is lossless, and trees are verified in one pass.

The toy grammar, vocabulary and hashed scripted models of ``test_speculative``: greedy tree
decoding equals greedy token-by-token decoding; sampled outputs follow the exact masked
distribution of the target (χ² over 10,000 draws) with a sampled tree (children drawn without
replacement), with an unconstrained sampled tree whose invalid draws stay as ghosts, and with
a deterministic tree. The checks on the tree (pruning, ghosts, depth) and ``tree_logits`` (the
KV-cached single pass of ``HFCausalLM`` against recomputing every path) are tested directly.
"""

from __future__ import annotations

from collections import Counter

import pytest
import torch
from test_speculative import EOS, PROMPT, REGEX, A, B, C, X, scripted, toy_vocabulary

from engine import ScriptedLM, generate, speculative_decode
from engine.lm import HFCausalLM, check_tree, tree_logits, tree_paths
from engine.spec_tree import DraftTree, TokenTree, draft_tree
from grammars import Compiler
from samplers import SamplingParams
from samplers.enumerate import chisquare_pvalue, exact_masked

GREEDY = SamplingParams(temperature=0)


@pytest.fixture(scope="module")
def vocab():
    return toy_vocabulary()


@pytest.fixture(scope="module")
def compiled(vocab):
    return Compiler(vocab).compile_regex(REGEX)


@pytest.mark.parametrize("seed", [1, 4, 5])
@pytest.mark.parametrize("k,width,branch_below", [(1, 2, 1.0), (3, 3, 0.9), (4, 2, 0.5)])
def test_greedy_tree_equals_token_by_token(vocab, compiled, seed, k, width, branch_below):
    target, _ = scripted(vocab, seed=seed)
    expected = generate(PROMPT, model=target, tokenizer=vocab, regex=REGEX, temperature=0, max_tokens=16)
    source = DraftTree(scripted(vocab, seed=2)[0], width=width, branch_below=branch_below, max_nodes=8)
    out = speculative_decode(target, source, vocab, PROMPT, compiled.matcher(), k=k, max_tokens=16, params=GREEDY)
    assert out.token_ids == expected.token_ids and out.finish_reason == expected.finish_reason == "stop"
    assert sum(out.accepted_per_call) - len(out.token_ids) in (0, 1)
    assert out.tree_nodes > 0 and out.invalid_tokens == 0  # drafted under the mask: nothing to prune


def test_greedy_tree_through_generate_and_the_budget(vocab):
    target, _ = scripted(vocab, seed=4)
    for max_tokens in (2, 16):
        plain = generate(PROMPT, model=target, tokenizer=vocab, regex=REGEX, temperature=0, max_tokens=max_tokens,
                         budget_closing=False)
        fast = generate(PROMPT, model=target, tokenizer=vocab, regex=REGEX, temperature=0, max_tokens=max_tokens,
                        draft_model=DraftTree(scripted(vocab, seed=2)[0], width=3), num_speculative_tokens=3)
        assert fast.token_ids == plain.token_ids and fast.finish_reason == plain.finish_reason


def test_draft_tree_branches_where_unsure_and_respects_its_bounds(vocab, compiled):
    draft, _ = scripted(vocab, seed=2)
    matcher = compiled.matcher()
    chain = DraftTree(draft, width=3, branch_below=0.0).propose_tree(PROMPT, matcher.fork(), 4, GREEDY, None, vocab)
    children = chain.children()
    assert all(len(kids) <= 1 for kids in children.values())  # never unsure enough to branch
    bushy = DraftTree(draft, width=3, branch_below=1.0, max_nodes=7)
    tree = bushy.propose_tree(PROMPT, matcher.fork(), 4, GREEDY, None, vocab)
    assert len(tree) <= 7 and len(tree.children()[-1]) == 3  # the root branches fully
    assert max(tree.depth(j) for j in range(len(tree))) <= 4
    assert bushy.calls <= 4  # one draft call per level
    for kids in tree.children().values():  # siblings are distinct tokens the grammar allows
        assert len({tree.nodes[c].token for c in kids}) == len(kids)
    sampled = bushy.propose_tree(PROMPT, matcher.fork(), 2, SamplingParams(), torch.Generator().manual_seed(0),
                                 vocab)
    first, second = sampled.children()[-1][:2]
    q1, q2 = sampled.nodes[first].q, sampled.nodes[second].q
    assert float(q2[sampled.nodes[first].token]) == 0.0  # without replacement
    assert torch.allclose(q2, torch.where(torch.arange(len(q1)) == sampled.nodes[first].token, 0.0, q1)
                          .double() / (1 - float(q1[sampled.nodes[first].token])))


class FixedTree:
    """A source proposing one fixed tree (token, parent, q) below the context."""

    def __init__(self, nodes):
        self.nodes = nodes

    def propose_tree(self, context, matcher, k, params, generator, vocab):
        tree = TokenTree()
        for token, parent, q in self.nodes:
            tree.add(token, parent, q)
        return tree


def test_invalid_nodes_are_pruned_before_verification(vocab, compiled):
    width = vocab.logits_width
    q = torch.full((width,), 1.0 / width, dtype=torch.float64)
    # root: "a" (valid) with child "x" (invalid, deterministic) and its child; "x" sampled (a ghost); "b"
    source = FixedTree([(A, -1, None), (X, 0, None), (A, 1, None), (X, -1, q), (B, -1, None), (B, 4, None)])
    drafted = draft_tree(source, PROMPT, compiled.matcher(), 3, 10, GREEDY, None, vocab)
    tree = drafted.tree
    assert [(n.token, n.parent, n.pruned) for n in tree.nodes] == [(A, -1, False), (X, -1, True), (B, -1, False),
                                                                 (B, 2, False)]
    assert drafted.invalid == 2 and drafted.proposed == 6 and drafted.source_nodes == 3
    target = ScriptedLM(width, [{}])
    out = speculative_decode(target, source, vocab, PROMPT, compiled.matcher(), k=3, max_tokens=1, params=GREEDY)
    assert out.trimmed == 0 and out.token_ids in ([A], [B])  # one token budget: nothing drafted
    target = ScriptedLM(width, [{}])
    out = speculative_decode(target, source, vocab, PROMPT, compiled.matcher(), k=3, max_tokens=16, params=GREEDY)
    first_call = target.prefixes[: 1 + 3]  # the context, then the three live nodes (the ghost takes no row)
    assert [p[len(PROMPT):] for p in first_call] == [(), (A,), (B,), (B, B)]
    assert out.invalid_tokens >= 2 and out.trimmed >= 1


def test_forced_run_and_depth_limit(vocab, compiled):
    matcher = compiled.matcher()
    matcher.try_advance([A, C])  # "ac" -> the second "c" is forced
    source = FixedTree([(A, -1, None), (B, 0, None), (A, 1, None)])
    drafted = draft_tree(source, PROMPT, matcher, 1, 10, GREEDY, None, vocab)
    assert [(n.token, n.forced) for n in drafted.tree.nodes] == [(C, True), (A, False)]  # k = 1 level below it


def test_tree_logits_generic_and_checks():
    width = 11
    lm = ScriptedLM(width, lambda prefix: {prefix[-1]: float(len(prefix))})
    rows = tree_logits(lm, [1, 2], [-1, 0, -1], [3, 4, 5])
    assert rows.shape == (4, width)
    assert lm.prefixes == [(1, 2), (1, 2, 3), (1, 2, 3, 4), (1, 2, 5)]
    assert tree_paths([-1, 0, 1, 0], [7, 8, 9, 6]) == [[7], [7, 8], [7, 8, 9], [7, 6]]
    with pytest.raises(ValueError, match="parent"):
        check_tree([0], [1], width)
    with pytest.raises(ValueError, match="one parent per token"):
        check_tree([-1], [1, 2], width)
    with pytest.raises(ValueError, match="outside"):
        check_tree([-1], [width], width)


def _tiny_gpt2(width: int):
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(3)
    return GPT2LMHeadModel(GPT2Config(vocab_size=width, n_embd=32, n_layer=2, n_head=2, n_positions=512,
                                      bos_token_id=0, eos_token_id=0)).eval()


def test_hf_tree_logits_one_pass_equals_every_path_recomputed():
    model = _tiny_gpt2(97)
    cached, plain = HFCausalLM(model), HFCausalLM(model, use_cache=False)
    context = [5, 6, 7, 8]
    parents, tokens = [-1, 0, 0, -1, 3, 1], [10, 11, 12, 13, 14, 15]
    assert torch.allclose(cached.tree_logits(context, parents, tokens), plain.tree_logits(context, parents, tokens),
                          atol=1e-4)
    assert cached.forward_calls == 1 and cached.tokens_fed == 10
    # the next round extends the context along 10 -> 11 plus a bonus token: only the bonus is fed again
    context2 = context + [10, 11, 90]
    got = cached.tree_logits(context2, [-1, 0, -1], [1, 2, 3])
    assert torch.allclose(got, plain.tree_logits(context2, [-1, 0, -1], [1, 2, 3]), atol=1e-4)
    assert cached.forward_calls == 2 and cached.tokens_fed == 10 + 1 + 3
    # next_logits after a tree, rollbacks, several rows
    for rows in ([context2 + [1]], [context2 + [3, 4], context + [10]], [context[:2]]):
        assert torch.allclose(cached.next_logits(rows), plain.next_logits(rows), atol=1e-4)
    # many rounds: unused tree columns are compacted away and the logits stay exact
    context3 = list(context)
    for i in range(30):
        tokens = [(i * 7 + j) % 97 for j in range(8)]
        tree = [-1, 0, 1, 2, -1, 4, 0, 6]
        assert torch.allclose(cached.tree_logits(context3, tree, tokens), plain.tree_logits(context3, tree, tokens),
                              atol=1e-4)
        context3 += [tokens[0], tokens[1], 42]
    assert cached.cached_tokens < len(context3) + 8 * 30 // 2
    # a tree grown level by level (a draft model's): each call feeds only the new level
    parents, tokens = [], []
    for level in range(4):
        fed = cached.tokens_fed
        above = [-1, -1] if level == 0 else [len(parents) - 2, len(parents) - 1]
        parents, tokens = parents + above, tokens + [20 + level, 40 + level]
        assert torch.allclose(cached.tree_logits(context3, parents, tokens),
                              plain.tree_logits(context3, parents, tokens), atol=1e-4)
        assert level == 0 or cached.tokens_fed - fed == 2


@pytest.mark.parametrize("attention", ["sdpa", "eager"])
def test_hf_tree_logits_llama(attention):
    """Rotary positions and both attention paths take the 4D tree mask and the tree's positions."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(4)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=97, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                         num_attention_heads=2, num_key_value_heads=1,
                                         max_position_embeddings=256)).eval()
    model.config._attn_implementation = attention
    cached, plain = HFCausalLM(model), HFCausalLM(model, use_cache=False)
    for context, parents, tokens in (([5, 6, 7, 8], [-1, 0, 0, -1, 3, 1], [10, 11, 12, 13, 14, 15]),
                                     ([5, 6, 7, 8, 10, 11, 90], [-1, 0], [1, 2]),
                                     ([5, 6, 7, 8, 10, 11, 90], [-1, 0, 1], [1, 2, 3])):
        assert torch.allclose(cached.tree_logits(context, parents, tokens),
                              plain.tree_logits(context, parents, tokens), atol=1e-4)


def test_hf_target_greedy_tree_identical(tiny_gpt2, gpt2_vocab):
    """A real KV-cached target verifying trees in one pass, a tiny GPT-2 drafting them."""
    target = HFCausalLM(tiny_gpt2)
    draft = HFCausalLM(_tiny_gpt2(gpt2_vocab.logits_width))
    options = {"model": target, "tokenizer": gpt2_vocab, "temperature": 0, "max_tokens": 40,
               "regex": r"\[(true|false|null|[0-9]{1,3})(, [a-z]{1,5}){2,4}\]"}
    plain = generate("A list: [true, null, 7, abc]. Another: ", **options)
    for source in (DraftTree(draft, width=3, branch_below=0.9), DraftTree(HFCausalLM(tiny_gpt2), width=2), "jacobi"):
        fast = generate("A list: [true, null, 7, abc]. Another: ", draft_model=source, num_speculative_tokens=3,
                        **options)
        assert fast.token_ids == plain.token_ids and fast.finish_reason == plain.finish_reason


# --- sampled outputs: the exact masked distribution of the target ----------------------------------

N = 10_000


def _pvalue(vocab, compiled, source, params, seed, k=2):
    target, target_fn = scripted(vocab, seed=1)
    exact = exact_masked(target_fn, compiled.matcher(), vocab.logits_width, params=params)
    generator = torch.Generator().manual_seed(seed)
    counts: Counter = Counter()
    totals = Counter()
    for _ in range(N):
        out = speculative_decode(target, source, vocab, PROMPT, compiled.matcher(), k=k, max_tokens=16,
                                 params=params, generator=generator)
        assert out.finish_reason == "stop"
        counts[tuple(out.token_ids) + (EOS,)] += 1
        totals.update(drafted=out.drafted - out.forced_tokens, accepted=out.accepted - out.forced_tokens,
                      invalid=out.invalid_tokens, calls=out.target_calls, committed=sum(out.accepted_per_call))
    return chisquare_pvalue(counts, exact), totals


@pytest.mark.statistical
@pytest.mark.slow
@pytest.mark.bench  # 10,000 sequences: minutes on a CPU (run with -m statistical)
def test_sampled_tree_without_replacement(vocab, compiled):
    source = DraftTree(scripted(vocab, seed=2)[0], width=3, branch_below=1.0, max_nodes=6)
    p, t = _pvalue(vocab, compiled, source, SamplingParams(), seed=0)
    assert 0 < t["accepted"] < t["drafted"]
    assert p > 0.01


def _levels(k: int, children) -> TokenTree:
    """A tree grown ``k`` levels deep, each node's children given by ``children(tree, node)`` as
    ``(token, law)`` pairs (``law`` None: a point mass)."""
    tree = TokenTree()
    frontier = [-1]
    for _ in range(k):
        frontier = [tree.add(t, node, law) for node in frontier for t, law in children(tree, node)]
    return tree


class UnmaskedTree:
    """Samples two children per node from the unmasked draft distribution, without replacement:
    invalid draws are pruned by the check and must stay as ghost draws for the rule to be exact."""

    def __init__(self, lm):
        self.lm = lm

    def propose_tree(self, context, matcher, k, params, generator, vocab):
        from samplers import sample_categorical
        from samplers.base import process_logits

        def children(tree, node):
            q = torch.softmax(process_logits(self.lm.next_logits([context + tree.path(node)])[0], params)
                              .double(), -1)
            drawn = []
            for _ in range(2):
                law = q / q.sum()
                t = sample_categorical(law, generator)
                drawn.append((t, law))
                q = q.clone()
                q[t] = 0.0
            return drawn

        return _levels(k, children)


@pytest.mark.statistical
@pytest.mark.slow
@pytest.mark.bench  # 10,000 sequences: minutes on a CPU (run with -m statistical)
def test_sampled_unmasked_tree_with_ghosts(vocab, compiled):
    draft, _ = scripted(vocab, seed=3, bias={X: 1.5})  # often draws "x": a ghost
    p, t = _pvalue(vocab, compiled, UnmaskedTree(draft), SamplingParams(temperature=0.8, top_k=5), seed=1)
    assert t["invalid"] > 0 and 0 < t["accepted"] < t["drafted"]
    assert p > 0.01


class TopTree:
    """A deterministic tree: the draft model's two most likely tokens per node (point masses)."""

    def __init__(self, lm):
        self.lm = lm

    def propose_tree(self, context, matcher, k, params, generator, vocab):
        def children(tree, node):
            logits = self.lm.next_logits([context + tree.path(node)])[0]
            return [(t, None) for t in torch.topk(logits, 2).indices.tolist()]

        return _levels(k, children)


@pytest.mark.statistical
@pytest.mark.slow
@pytest.mark.bench  # 10,000 sequences: minutes on a CPU (run with -m statistical)
def test_sampled_deterministic_tree(vocab, compiled):
    p, t = _pvalue(vocab, compiled, TopTree(scripted(vocab, seed=2)[0]), SamplingParams(top_p=0.9), seed=2)
    assert 0 < t["accepted"] < t["drafted"]
    assert p > 0.01


def test_replayed_tree_node_cost(compiled):
    """The benchmark's per-node figure: trees along an output, siblings often invalid, timed."""
    from jsonschemabench.speculative_bench import _ReplayTree, tree_node_cost

    tokens = [A, B, C, C, A, EOS]
    tree = _ReplayTree(tokens, 0, width=2).propose_tree([0], compiled.matcher(), 3, GREEDY, None, None)
    assert [tree.nodes[j].token for j in tree.main_path()] == [A, B, C]
    assert len(tree) == 6  # one sibling per level
    cost, nodes = tree_node_cost([(compiled, tokens)], depth=3, width=2, repeats=2)
    assert 0 < cost < 0.01 and nodes > 0
    assert tree_node_cost([(compiled, [])]) is None
