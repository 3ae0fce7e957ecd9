"""corral's vLLM logits-processor plugin, driven the way vLLM's engine drives it.

Run in vLLM's own environment: ``scripts/integration.sh vllm``. The processor is built by vLLM's
loaders from the installed entry point, for a real ``VllmConfig`` whose ``ModelConfig`` points at a
folder holding GPT-2's tokenizer (from ``../shared/vocab``) and a GPT-2 config with a padded
vocabulary (50,304 logits for 50,257 tokens). No weights: the logits are random.

* V1 runner: ``BatchUpdate``s from vLLM's ``BatchUpdateBuilder`` add, remove, move and swap rows as
  the persistent batch does, and each request's output list is appended to in place; every step
  is checked against an independent ``Matcher`` of the same grammar.
* V2 runner (the default on GPUs): vLLM's own loader and ``LogitsContext``; its pinned-memory
  request buffers need a CUDA driver, so this test gives the processor CPU tensors with the same
  ``.np``/``.gpu`` views.
"""

from __future__ import annotations

import json
from importlib.metadata import entry_points
from types import SimpleNamespace

import pytest

pytestmark = pytest.mark.integration

vllm = pytest.importorskip("vllm")
torch = pytest.importorskip("torch")

from shared_data import vocab_file
from vllm import SamplingParams
from vllm.v1.sample.logits_processor import (
    BatchUpdateBuilder,
    MoveDirectionality,
    build_logitsprocs,
    validate_logits_processors_parameters,
)

from grammars import (
    TokenVocabulary,
    allocate_token_bitmask,
    compile_gbnf,
    compile_json_schema,
    compile_regex,
)
from grammars.bitmask import unpack_bits

WIDTH = 50304  # GPT-2's 50,257 tokens padded to a multiple of 64, as many checkpoints do
EOS = 50256

SCHEMA = {
    "type": "object",
    "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
    "required": ["name", "age"],
    "additionalProperties": False,
}
REGEX = r"[0-9]{3}-[a-z]+"


@pytest.fixture(scope="module")
def vllm_config(tmp_path_factory):
    from transformers import GPT2Config
    from vllm.config import DeviceConfig, ModelConfig, VllmConfig

    folder = tmp_path_factory.mktemp("gpt2-tokenizer")
    TokenVocabulary.from_pretrained(vocab_file("gpt-2")).hf_tokenizer.save_pretrained(folder)
    GPT2Config(vocab_size=WIDTH, n_embd=32, n_layer=1, n_head=2, bos_token_id=EOS, eos_token_id=EOS).save_pretrained(
        folder
    )
    # the platform of a machine without an accelerator cannot name a device: say "cpu"
    return VllmConfig(model_config=ModelConfig(model=str(folder)), device_config=DeviceConfig(device="cpu"))


@pytest.fixture(scope="module")
def processor(vllm_config):
    """Built by vLLM's V1 loader from the installed entry point, next to vLLM's built-in ones."""
    import vllm.utils.torch_utils

    from integrations.vllm_logits import CorralLogitsProcessor

    # vLLM's built-in processors stage tensors in pinned memory when the platform says it has it;
    # a CUDA build of vLLM on a machine without a driver says so but cannot pin
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(vllm.utils.torch_utils, "PIN_MEMORY", torch.cuda.is_available())
        procs = build_logitsprocs(vllm_config, torch.device("cpu"), False, False)
    ours = [p for p in procs.all if isinstance(p, CorralLogitsProcessor)]
    assert len(ours) == 1 and ours[0] in procs.non_argmax_invariant
    return ours[0]


@pytest.fixture
def fresh(processor, vllm_config):
    """A processor with no rows (the module's one, reset), built as vLLM's loader built it."""
    return type(processor)(vllm_config, torch.device("cpu"), False)


def params(**extra) -> SamplingParams:
    return SamplingParams(max_tokens=64, extra_args=extra or None)


def continuation(vocab, text: str) -> list[int]:
    return vocab.encode(text) + [EOS]


def expected_allowed(matcher) -> torch.Tensor:
    """The ids ``matcher`` allows next (only EOS once it consumed one), over the padded width."""
    if matcher.is_terminated():
        allowed = torch.zeros(WIDTH, dtype=torch.bool)
        allowed[EOS] = True
        return allowed
    words = allocate_token_bitmask(1, WIDTH)
    matcher.fill_mask(words, 0)
    return torch.from_numpy(unpack_bits(words[0], WIDTH))


def assert_masked(before: torch.Tensor, after: torch.Tensor, allowed: torch.Tensor, next_token: int | None) -> None:
    """Allowed ids keep their logits, every other id (padding included) is -inf."""
    assert allowed.any()
    assert torch.equal(after[allowed], before[allowed])
    assert torch.all(after[~allowed] == float("-inf"))
    assert torch.all(after[50257:] == float("-inf"))  # padding columns are never allowed
    if next_token is not None:
        assert torch.isfinite(after[next_token]), f"the valid continuation's token {next_token} was masked"


class Request:
    """One request of the test's batch: its output list (vLLM's, appended in place), the tokens it
    will produce, and an independent matcher of the same grammar (None: unconstrained)."""

    def __init__(self, name: str, sampling: SamplingParams, tokens: list[int], matcher):
        self.name, self.params, self.tokens, self.matcher = name, sampling, tokens, matcher
        self.output: list[int] = []

    @property
    def next_token(self) -> int | None:
        return self.tokens[len(self.output)] if len(self.output) < len(self.tokens) else None

    def commit(self) -> None:
        token = self.next_token
        self.output.append(token)  # in place: the list the processor was given
        if self.matcher is not None and not self.matcher.is_terminated():
            self.matcher.advance(token)


def step(proc, batch: list[Request], seed: int) -> None:
    """One sampling step: apply, check every row, then commit each request's next token."""
    gen = torch.Generator().manual_seed(seed)
    before = torch.randn(len(batch), WIDTH, generator=gen)
    after = proc.apply(before.clone())
    for row, req in enumerate(batch):
        if req.matcher is None:
            assert torch.equal(after[row], before[row]), f"unconstrained {req.name} was changed"
        else:
            assert_masked(before[row], after[row], expected_allowed(req.matcher), req.next_token)
    for req in batch:
        if req.next_token is not None:
            req.commit()


def test_entry_point_is_installed_and_loads():
    from integrations.vllm_logits import CorralLogitsProcessor

    (ep,) = [e for e in entry_points(group="vllm.logits_processors") if e.name == "corral"]
    assert ep.value == "integrations.vllm_logits:CorralLogitsProcessor"
    assert ep.load() is CorralLogitsProcessor


def test_constrained_rows_follow_their_requests_through_the_batch(processor, vllm_config):
    proc = type(processor)(vllm_config, torch.device("cpu"), False)
    vocab = proc.vocab
    assert (vocab.logits_width, sorted(vocab.eos_token_ids)) == (WIDTH, [EOS])
    schema = Request("schema", params(corral_json_schema=SCHEMA), continuation(vocab, '{"name":"Ann","age":42}'),
                     compile_json_schema(SCHEMA, vocab).matcher())
    regex = Request("regex", params(corral_regex=REGEX), continuation(vocab, "123-abc"),
                    compile_regex(REGEX, vocab).matcher())
    free = Request("free", params(), vocab.encode("anything at all, unmasked"), None)
    schema_text = Request("schema as text", params(corral_json_schema=json.dumps(SCHEMA)),
                          continuation(vocab, '{"name":"Bo","age":7}'), compile_json_schema(SCHEMA, vocab).matcher())

    batch = [schema, regex, free]
    builder = BatchUpdateBuilder()
    for index, req in enumerate(batch):
        builder.added.append((index, req.params, [1, 2, 3], req.output))
    proc.update_state(builder.get_and_reset(len(batch)))
    for s in range(2):
        step(proc, batch, s)
        proc.update_state(None)  # no change to the batch: vLLM passes None

    # swaps (as the batch's reordering does) keep each request's matcher with it
    builder.moved.append((0, 1, MoveDirectionality.SWAP))
    batch = [regex, schema, free]
    proc.update_state(builder.get_and_reset(len(batch)))
    step(proc, batch, 10)
    builder.moved.append((1, 2, MoveDirectionality.SWAP))
    batch = [regex, free, schema]
    proc.update_state(builder.get_and_reset(len(batch)))
    step(proc, batch, 11)

    # the regex request leaves; the last row moves into its hole (condense); a new one joins
    builder.removed_append(0)
    builder.moved.append((2, 0, MoveDirectionality.UNIDIRECTIONAL))
    batch = [schema, free]
    proc.update_state(builder.get_and_reset(len(batch)))
    step(proc, batch, 20)
    builder.added.append((2, schema_text.params, None, schema_text.output))
    batch = [schema, free, schema_text]
    proc.update_state(builder.get_and_reset(len(batch)))
    while schema.next_token is not None or schema_text.next_token is not None:
        step(proc, batch, len(schema.output) + 100)
    assert schema.matcher.is_terminated() and schema_text.matcher.is_terminated()


def test_finished_request_allows_only_eos(fresh):
    """After EOS (a request with ``ignore_eos`` goes on) and once the grammar is complete."""
    vocab = fresh.vocab
    output = vocab.encode("123-ab")
    builder = BatchUpdateBuilder()
    builder.added.append((0, params(corral_regex=REGEX), None, output))
    fresh.update_state(builder.get_and_reset(1))
    logits = fresh.apply(torch.zeros(1, WIDTH))
    assert torch.isfinite(logits[0, EOS]) and torch.isfinite(logits[0, vocab.encode("c")[0]])
    output.append(EOS)
    logits = fresh.apply(torch.zeros(1, WIDTH))
    assert torch.isfinite(logits[0]).nonzero().flatten().tolist() == [EOS]

    choice = []
    builder.added.append((0, params(corral_choice=["yes", "no"]), None, choice))
    fresh.update_state(builder.get_and_reset(1))
    choice.extend(vocab.encode("yes"))
    logits = fresh.apply(torch.zeros(1, WIDTH))
    assert torch.isfinite(logits[0]).nonzero().flatten().tolist() == [EOS]


@pytest.mark.parametrize(
    "extra",
    [{"corral_grammar": 'root ::= "yes" | "no"'}, {"corral_grammar": 'start: "yes" | "no"'},
     {"corral_choice": ["yes", "no"]}],
    ids=["gbnf", "lark", "choice"],
)
def test_grammar_and_choice_constraints(fresh, extra):
    vocab = fresh.vocab
    matcher = compile_gbnf('root ::= "yes" | "no"', vocab).matcher()
    output: list[int] = []
    builder = BatchUpdateBuilder()
    builder.added.append((0, params(**extra), None, output))
    fresh.update_state(builder.get_and_reset(1))
    yes = vocab.encode("yes")
    before = torch.randn(1, WIDTH)
    assert_masked(before[0], fresh.apply(before.clone())[0], expected_allowed(matcher), yes[0])
    output.extend(yes)
    logits = fresh.apply(torch.zeros(1, WIDTH))
    assert torch.isfinite(logits[0]).nonzero().flatten().tolist() == [EOS]


def test_discarded_tokens_roll_back(fresh):
    """A KV-load failure makes vLLM shorten the output list: the matcher follows it back."""
    vocab = fresh.vocab
    matcher = compile_regex(REGEX, vocab).matcher()
    output = vocab.encode("12")
    builder = BatchUpdateBuilder()
    builder.added.append((0, params(corral_regex=REGEX), None, output))
    fresh.update_state(builder.get_and_reset(1))
    output.append(vocab.encode("3")[0])
    matcher.try_advance(output)
    before = torch.randn(1, WIDTH)
    assert_masked(before[0], fresh.apply(before.clone())[0], expected_allowed(matcher), vocab.encode("-")[0])
    matcher.rollback(len(output) - 1)
    del output[1:]
    before = torch.randn(1, WIDTH)
    assert_masked(before[0], fresh.apply(before.clone())[0], expected_allowed(matcher), vocab.encode("3")[0])


def test_unfilled_async_placeholder_ends_the_request(fresh, caplog):
    """V1 + async scheduling + plugin only: vLLM leaves -1 in the list; refuse to guess."""
    output = fresh.vocab.encode("12") + [-1]
    builder = BatchUpdateBuilder()
    builder.added.append((0, params(corral_regex=REGEX), None, output))
    fresh.update_state(builder.get_and_reset(1))
    logits = fresh.apply(torch.zeros(1, WIDTH))
    assert torch.isfinite(logits[0]).nonzero().flatten().tolist() == [EOS]
    assert "--logits-processors" in caplog.text


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({"corral_json_schema": {"$ref": "https://example.com/x.json"}}, "corral_json_schema: unsupported keyword '\\$ref'"),
        ({"corral_json_schema": "{not json"}, "corral_json_schema"),
        ({"corral_regex": "(ab"}, "corral_regex"),
        ({"corral_grammar": "root ::= (\"a\""}, "corral_grammar"),
        ({"corral_choice": []}, "non-empty list"),
        ({"corral_regex": "a", "corral_choice": ["a"]}, "give exactly one"),
        ({"corral_schema": {}}, "unknown corral constraint key"),
    ],
)
def test_invalid_constraints_are_refused_at_admission(extra, message):
    """vLLM's own admission check (V1 and V2 runners) raises with corral's message."""
    from vllm.exceptions import VLLMValidationError
    from vllm.v1.worker.gpu.sample.logits_processor import (
        build_custom_logits_processors_params_validator,
    )

    sampling = params(**extra)
    with pytest.raises(VLLMValidationError, match=message):
        validate_logits_processors_parameters(None, sampling)
    with pytest.raises(VLLMValidationError, match=message):
        build_custom_logits_processors_params_validator(None)(sampling)


def test_valid_constraints_pass_admission():
    for extra in ({"corral_json_schema": SCHEMA}, {"corral_regex": REGEX}, {"corral_choice": ["yes", "no"]},
                  {"corral_grammar": 'root ::= "a" | "b"'}, {"corral_grammar": 'start: "a" | "b"'}, {}):
        validate_logits_processors_parameters(None, params(**extra))


def test_constraint_that_fails_to_compile_ends_the_request(fresh):
    """It parses (admission lets it through) but accepts nothing: only EOS, no crash."""
    schema = {"allOf": [{"type": "string"}, {"type": "integer"}]}
    builder = BatchUpdateBuilder()
    builder.added.append((0, params(corral_json_schema=schema), None, []))
    fresh.update_state(builder.get_and_reset(1))
    logits = fresh.apply(torch.zeros(1, WIDTH))
    assert torch.isfinite(logits[0]).nonzero().flatten().tolist() == [EOS]


# --- Model Runner V2 --------------------------------------------------------------------------


class _Buffer(SimpleNamespace):
    """A request-state buffer's host (``np``) and device (``gpu``) views, both on the CPU here."""


def v2_processor(vllm_config, max_reqs: int = 4, max_len: int = 64):
    from vllm.v1.worker.gpu.sample.logits_processor import (
        build_custom_logits_processors,
    )

    from integrations.vllm_logits import CorralLogitsProcessor

    tokens = torch.zeros(max_reqs, max_len, dtype=torch.int32)
    prompt_len = torch.zeros(max_reqs, dtype=torch.int32)
    prefill_len = torch.zeros(max_reqs, dtype=torch.int32)
    states = SimpleNamespace(
        device=torch.device("cpu"), max_num_reqs=max_reqs, vocab_size=WIDTH,
        all_token_ids=_Buffer(gpu=tokens), prompt_len=_Buffer(np=prompt_len.numpy()),
        prefill_len=_Buffer(np=prefill_len.numpy()), total_len=_Buffer(),
    )
    procs = build_custom_logits_processors(vllm_config, states, False)
    (proc,) = [p for p in procs if isinstance(p, CorralLogitsProcessor)]
    return proc, tokens, prompt_len, prefill_len


def v2_context(rows: list[tuple[int, int, int, int]]):
    """``LogitsContext`` for rows of (slot, local position, position, fed token)."""
    import numpy as np
    from vllm.v1.worker.gpu.sample.logits_processor import LogitsContext

    slots = torch.tensor([r[0] for r in rows])
    order = list(dict.fromkeys(r[0] for r in rows))
    return LogitsContext(
        expanded_idx_mapping=slots, idx_mapping=torch.tensor(order), idx_mapping_np=np.array(order),
        expanded_local_pos=torch.tensor([r[1] for r in rows]), input_ids=torch.tensor([r[3] for r in rows]),
        pos=torch.tensor([r[2] for r in rows]), seq_lens_upper_bound_np=np.array([r[2] + 1 for r in rows]),
    )


def test_v2_runner_decoding_speculation_and_resumption(vllm_config):
    proc, tokens, prompt_len, prefill_len = v2_processor(vllm_config)
    vocab = proc.vocab
    text = continuation(vocab, "123-abcdef")
    assert len(text) >= 5
    prompt = [11, 12, 13]
    # slot 2: constrained, prompt of 3; slot 0: unconstrained
    assert proc.add_request(2, params(corral_regex=REGEX)) is True
    assert proc.add_request(0, params()) is False
    prompt_len[2], prefill_len[2] = 3, 3
    prompt_len[0], prefill_len[0] = 2, 2
    proc.apply_staged_writes()
    matcher = compile_regex(REGEX, vocab).matcher()

    def check(rows, masks):
        before = torch.randn(len(rows), WIDTH)
        after = proc.apply(before.clone(), v2_context(rows))
        for r, (slot, *_rest) in enumerate(rows):
            if masks[r] is None:
                assert torch.equal(after[r], before[r])
            else:
                assert_masked(before[r], after[r], masks[r], None)

    # prefill step: the last prompt token is fed; nothing generated yet
    check([(0, 0, 1, 7), (2, 0, 2, prompt[-1])], [None, expected_allowed(matcher)])
    # decode: the first output token is fed at position 3
    matcher.advance(text[0])
    check([(2, 0, 3, text[0]), (0, 0, 2, 9)], [expected_allowed(matcher), None])
    # speculative step: bonus token text[1] fed with drafts text[2] (valid) and a refused "-"
    matcher.advance(text[1])
    after_draft = matcher.fork()
    after_draft.advance(text[2])
    bad = vocab.encode("-")[0]
    assert after_draft.try_advance([bad]) == 0
    eos_only = torch.zeros(WIDTH, dtype=torch.bool)
    eos_only[EOS] = True
    check([(2, 0, 4, text[1]), (2, 1, 5, text[2]), (2, 2, 6, bad)],
          [expected_allowed(matcher), expected_allowed(after_draft), eos_only])
    # next step: text[2] was accepted, then the bonus text[3] is fed at position 6
    matcher.advance(text[2])
    matcher.advance(text[3])
    check([(2, 0, 6, text[3])], [expected_allowed(matcher)])

    # preempted, resumed in slot 1: its output so far is replayed from the token history
    done = text[:4]
    assert proc.add_request(1, params(corral_regex=REGEX)) is True
    tokens[1, : 3 + len(done)] = torch.tensor(prompt + done)
    prompt_len[1], prefill_len[1] = 3, 3 + len(done)
    proc.apply_staged_writes()
    check([(1, 0, 3 + len(done) - 1, done[-1])], [expected_allowed(matcher)])
