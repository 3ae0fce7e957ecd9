"""corral as SGLang's grammar backend, driven through SGLang's own classes and call sequence.

Runs in the SGLang virtual environment only (``scripts/integration.sh sglang``); elsewhere the
module is skipped. No GPU and no model: like SGLang's own backend tests, the backend is built
from a real tokenizer (GPT-2's, from the shared vocabularies) and a model vocabulary size, and
each step does what the scheduler does — ``allocate_vocab_mask`` / ``fill_vocab_mask`` (through
``fill_vocab_mask_batched``) / ``move_vocab_mask`` / ``apply_vocab_mask`` on a logits row, then
``accept_token`` with the token the text spells.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import signal
import subprocess
import sys
import time
from concurrent.futures import Future
from importlib.metadata import entry_points

import pytest

pytestmark = pytest.mark.integration

pytest.importorskip("sglang", reason="SGLang is not installed (run scripts/integration.sh sglang)")
torch = pytest.importorskip("torch")

from sglang.srt.constrained.base_grammar_backend import (
    GRAMMAR_BACKEND_REGISTRY,
    BaseGrammarBackend,
    BaseGrammarObject,
    GrammarMask,
    GrammarRow,
    InvalidGrammarObject,
    create_grammar_backend,
)
from sglang.srt.server_args import GRAMMAR_BACKEND_CHOICES
from shared_data import REPO_ROOT, vocab_file

from grammars import Compiler, ConstraintError, TokenVocabulary
from integrations import sglang_backend
from integrations.sglang_backend import CorralGrammar, CorralGrammarBackend

#: GPT-2 has 50,257 tokens; models pad their logits to a multiple of 64 (50,304): the
#: padding columns must never be allowed.
MODEL_VOCAB_SIZE = 50304
EOS = 50256
NEG_INF = float("-inf")

PERSON = {
    "type": "object",
    "properties": {"name": {"type": "string"}, "age": {"type": "integer", "minimum": 0}},
    "required": ["name", "age"],
    "additionalProperties": False,
}
GREETING_EBNF = 'root ::= ("Hello" | "Hi") " " name "!"\nname ::= [a-z]+\n'


@pytest.fixture(scope="module")
def tokenizer():
    """The transformers tokenizer SGLang would load for a GPT-2 model."""
    tok = TokenVocabulary.from_pretrained(vocab_file("gpt-2")).hf_tokenizer
    assert tok is not None
    return tok


@pytest.fixture(scope="module")
def backend(tokenizer) -> CorralGrammarBackend:
    """Built as SGLang's scheduler builds it: the plugin registers, then ``create_grammar_backend``
    with ``grammar_backend="corral"`` published in SGLang's runtime context."""
    from sglang.test.test_utils import published_topology

    sglang_backend.register()
    with published_topology(grammar_backend="corral") as server_args:
        built = create_grammar_backend(server_args, tokenizer, MODEL_VOCAB_SIZE, {EOS})
    yield built
    built.executor.shutdown(wait=False)


def encode(tokenizer, text: str) -> list[int]:
    return tokenizer.encode(text, add_special_tokens=False)


def compile_via_sglang(backend: BaseGrammarBackend, key: tuple[str, str]) -> BaseGrammarObject:
    """SGLang's path for a new constraint: a future from the backend's executor (which calls
    ``_init_value_dispatch`` and so ``dispatch_*``), then the template cached as a copy."""
    value, cache_hit = backend.get_cached_or_future_value(key, False)
    if cache_hit:
        return value
    assert isinstance(value, Future)
    grammar = value.result(timeout=120)
    backend.set_cache(key, grammar.copy())
    return grammar


def masked_logits(grammar: BaseGrammarObject, rows: int = 1, row: int = 0) -> torch.Tensor:
    """One decoding step's masking as ``SamplingBatchInfo.update_regex_vocab_mask`` and
    ``apply_logits_bias`` do it, for a batch whose row ``row`` holds ``grammar``."""
    vocab_mask = grammar.allocate_vocab_mask(vocab_size=MODEL_VOCAB_SIZE, batch_size=rows, device="cpu")
    grammar.fill_vocab_mask_batched([GrammarRow(row=row, grammar=grammar)], vocab_mask)
    vocab_mask = grammar.move_vocab_mask(vocab_mask, "cpu")
    logits = torch.zeros((rows, MODEL_VOCAB_SIZE), dtype=torch.float32)
    GrammarMask(grammar, vocab_mask).apply(logits)
    return logits


def walk(grammar: BaseGrammarObject, tokens: list[int], forbidden: list[int]) -> None:
    """Decode ``tokens`` then EOS: each is allowed at its step, EOS and padding are ``-inf``
    until the text is complete, and every token in ``forbidden`` is ``-inf`` at the first step."""
    for step, token in enumerate(tokens):
        logits = masked_logits(grammar)[0]
        assert logits[token] == 0, f"token {token} of the valid text is masked at step {step}"
        assert logits[EOS] == NEG_INF, f"EOS allowed at step {step}, before the text is complete"
        assert torch.all(logits[50257:] == NEG_INF), "padding columns of the logits are allowed"
        if step == 0:
            for bad in forbidden:
                assert logits[bad] == NEG_INF, f"token {bad} cannot start the text but is allowed"
        grammar.accept_token(token)
        assert not grammar.is_terminated()
    logits = masked_logits(grammar)[0]
    assert logits[EOS] == 0, "EOS is masked after a complete text"
    grammar.accept_token(EOS)
    assert grammar.is_terminated()


# --- the plugin -------------------------------------------------------------------------------


def test_entry_point_is_declared_and_loads_register():
    found = [ep for ep in entry_points(group="sglang.srt.plugins") if ep.name == "corral"]
    assert len(found) == 1, "corral's sglang.srt.plugins entry point is not installed"
    assert found[0].value == "integrations.sglang_backend:register"
    assert found[0].load() is sglang_backend.register


def test_sglangs_plugin_loader_registers_corral(monkeypatch):
    from sglang.srt.plugins import GENERAL_PLUGINS_GROUP, load_plugins_by_group

    monkeypatch.delitem(GRAMMAR_BACKEND_REGISTRY, "corral", raising=False)
    plugins = load_plugins_by_group(GENERAL_PLUGINS_GROUP)
    assert "corral" in plugins
    func, _dist = plugins["corral"]
    func()
    assert GRAMMAR_BACKEND_REGISTRY["corral"] is sglang_backend.create_backend
    assert GRAMMAR_BACKEND_CHOICES.count("corral") == 1
    func()  # idempotent: SGLang loads plugins in every process it starts
    assert GRAMMAR_BACKEND_CHOICES.count("corral") == 1


def test_command_line_accepts_grammar_backend_corral():
    import argparse

    from sglang.srt.server_args import ServerArgs

    sglang_backend.register()
    parser = argparse.ArgumentParser()
    ServerArgs.add_cli_args(parser)
    args = parser.parse_args(["--model-path", "dummy", "--grammar-backend", "corral"])
    assert args.grammar_backend == "corral"
    with pytest.raises(SystemExit):
        parser.parse_args(["--model-path", "dummy", "--grammar-backend", "no-such-backend"])


def test_create_grammar_backend_builds_corral_for_the_model(backend, tokenizer):
    assert isinstance(backend, CorralGrammarBackend)
    assert isinstance(backend, BaseGrammarBackend)
    assert backend.vocab.logits_width == MODEL_VOCAB_SIZE  # the model's width, not the tokenizer's
    assert len(backend.vocab) == len(tokenizer)
    assert EOS in backend.vocab.eos_token_ids
    assert backend.compiler.vocab is backend.vocab
    assert backend.json_options == {"whitespace": "flexible"}  # SGLang's default: any whitespace


def test_server_args_whitespace_flags_reach_the_json_compiler(tokenizer):
    from sglang.test.test_utils import published_topology

    sglang_backend.register()
    with published_topology(grammar_backend="corral", constrained_json_disable_any_whitespace=True) as args:
        strict = create_grammar_backend(args, tokenizer, MODEL_VOCAB_SIZE, {EOS})
    try:
        assert strict.json_options == {"whitespace": "compact"}
        grammar = strict.dispatch_json(json.dumps(PERSON))
        assert masked_logits(grammar)[0][encode(tokenizer, "{")[0]] == 0
        assert masked_logits(grammar)[0][encode(tokenizer, " {")[0]] == NEG_INF  # no leading space
    finally:
        strict.executor.shutdown(wait=False)


# --- decoding a valid instance ------------------------------------------------------------------


def test_json_schema_instance_walks_to_termination(backend, tokenizer):
    grammar = compile_via_sglang(backend, ("json", json.dumps(PERSON)))
    assert isinstance(grammar, CorralGrammar)
    assert grammar.grammar_stats.dispatch_type == "json"
    assert grammar.grammar_stats.compilation_time is not None  # set by SGLang's dispatcher
    text = '{"name": "Ann", "age": 42}'
    walk(grammar, encode(tokenizer, text), forbidden=encode(tokenizer, "hello") + encode(tokenizer, "[1]"))


def test_any_json_key_accepts_any_value(backend, tokenizer):
    grammar = compile_via_sglang(backend, ("json", "$$ANY$$"))
    walk(grammar, encode(tokenizer, '[1, {"a": null}]'), forbidden=encode(tokenizer, "hello"))


def test_regex_instance_walks_to_termination(backend, tokenizer):
    grammar = compile_via_sglang(backend, ("regex", r"(yes|no), [0-9]{2}"))
    walk(grammar, encode(tokenizer, "yes, 42"), forbidden=encode(tokenizer, "maybe") + encode(tokenizer, " yes"))


def test_ebnf_instance_walks_to_termination(backend, tokenizer):
    grammar = compile_via_sglang(backend, ("ebnf", GREETING_EBNF))
    assert grammar.grammar_stats.dispatch_type == "ebnf"
    walk(grammar, encode(tokenizer, "Hi bob!"), forbidden=encode(tokenizer, "Hey") + encode(tokenizer, "bob"))


def test_a_forbidden_token_is_refused_with_a_value_error(backend, tokenizer):
    """SGLang catches ValueError from accept_token and aborts the request."""
    grammar = compile_via_sglang(backend, ("regex", r"[0-9]+"))
    (token,) = encode(tokenizer, "x")
    with pytest.raises(ValueError):
        grammar.accept_token(token)
    assert masked_logits(grammar)[0][encode(tokenizer, "7")[0]] == 0  # state unchanged


def test_unfilled_rows_of_a_batch_stay_unconstrained(backend, tokenizer):
    grammar = compile_via_sglang(backend, ("regex", r"[0-9]+"))
    logits = masked_logits(grammar, rows=3, row=1)
    assert torch.all(logits[0] == 0) and torch.all(logits[2] == 0)
    assert logits[1][encode(tokenizer, "x")[0]] == NEG_INF
    assert logits[1][encode(tokenizer, "7")[0]] == 0
    vocab_mask = grammar.allocate_vocab_mask(vocab_size=MODEL_VOCAB_SIZE, batch_size=2, device="cpu")
    grammar.fill_vocab_mask(vocab_mask, 0)
    grammar.reset_vocab_mask(vocab_mask)
    assert torch.all(vocab_mask == -1)


# --- rollback, copy, jump forward -------------------------------------------------------------


def test_rollback_restores_masks_and_allows_re_accepting(backend, tokenizer):
    grammar = compile_via_sglang(backend, ("json", json.dumps(PERSON)))
    tokens = encode(tokenizer, '{"name": "Ann", "age": 42}')
    masks = []
    for token in tokens:
        masks.append(masked_logits(grammar))
        grammar.accept_token(token)
    masks.append(masked_logits(grammar))
    grammar.rollback(3)
    assert torch.equal(masked_logits(grammar), masks[-4])
    for token in tokens[-3:]:
        grammar.accept_token(token)
    assert torch.equal(masked_logits(grammar), masks[-1])
    grammar.accept_token(EOS)
    assert grammar.is_terminated()
    grammar.rollback(1)
    assert not grammar.is_terminated()
    assert masked_logits(grammar)[0][EOS] == 0


def test_tokens_after_eos_are_ignored_and_rolled_back_first(backend, tokenizer):
    """Speculative verification feeds draft tokens past EOS, then rolls them back."""
    grammar = compile_via_sglang(backend, ("regex", "ok"))
    grammar.accept_token(encode(tokenizer, "ok")[0])
    grammar.accept_token(EOS)
    grammar.accept_token(encode(tokenizer, "x")[0])  # after EOS: ignored, no error
    assert grammar.is_terminated()
    grammar.rollback(1)
    assert grammar.is_terminated()
    grammar.rollback(1)
    assert not grammar.is_terminated()


def test_copy_is_independent(backend, tokenizer):
    key = ("regex", r"(yes|no), [0-9]{2}")
    template = compile_via_sglang(backend, key)
    cached, hit = backend.get_cached_or_future_value(key, False)  # SGLang's copy of the template
    assert hit and isinstance(cached, CorralGrammar) and cached is not template
    assert cached.grammar_stats.is_cache_hit
    start = masked_logits(cached)
    tokens = encode(tokenizer, "no, 17")
    cached.accept_token(tokens[0])
    assert torch.equal(masked_logits(template), start)  # the template did not move
    second = cached.copy()
    assert torch.equal(masked_logits(second), masked_logits(cached))  # same position
    for token in tokens[1:]:
        second.accept_token(token)
    second.accept_token(EOS)
    assert second.is_terminated() and not cached.is_terminated()
    assert masked_logits(cached)[0][tokens[1]] == 0


def test_jump_forward_offers_forced_tokens_and_retokenizes(backend, tokenizer):
    grammar = compile_via_sglang(backend, ("regex", "ab"))
    assert grammar.try_jump_forward(tokenizer) is None  # "a" or "ab": a choice
    (a,) = encode(tokenizer, "a")
    grammar.accept_token(a)
    helper = grammar.try_jump_forward(tokenizer)
    assert helper == (encode(tokenizer, "b"), "b")
    text, _state = grammar.jump_forward_str_state(helper)
    assert text == "b"
    (ab,) = encode(tokenizer, "ab")  # the output re-tokenized with the jump text appended
    grammar.jump_and_retokenize([a], [ab], _state)
    assert masked_logits(grammar)[0][EOS] == 0
    assert grammar.try_jump_forward(tokenizer) is None  # complete: EOS is a choice, not forced


# --- invalid constraints ----------------------------------------------------------------------


@pytest.mark.parametrize(("kind", "source", "compile_"), [
    ("json", '{"type": "object", "properties": ', lambda c, s: c.compile_json_schema(s)),
    ("json", '{"type": "string", "minLength": 5, "maxLength": 2}', lambda c, s: c.compile_json_schema(s)),
    ("regex", "(unclosed", lambda c, s: c.compile_regex(s)),
    ("ebnf", "root ::= missing_rule", lambda c, s: c.compile_gbnf(s)),
])
def test_an_invalid_constraint_becomes_sglangs_invalid_grammar_with_corrals_message(backend, kind, source, compile_):
    with pytest.raises(ConstraintError) as raised:
        compile_(Compiler(backend.vocab), source)
    grammar = compile_via_sglang(backend, (kind, source))
    assert isinstance(grammar, InvalidGrammarObject)
    assert str(raised.value) in grammar.error_message
    assert type(raised.value).__name__ in grammar.error_message


def test_structural_tags_are_refused_with_a_message(backend):
    tag = json.dumps({"structures": [{"begin": "<f>", "schema": {}, "end": "</f>"}], "triggers": ["<f>"]})
    grammar = compile_via_sglang(backend, ("structural_tag", tag))
    assert isinstance(grammar, InvalidGrammarObject)
    assert "structural_tag" in grammar.error_message and "corral" in grammar.error_message


# --- the vocabulary -------------------------------------------------------------------------------


def test_a_tokenizer_larger_than_the_models_vocab_size_keeps_its_width(tokenizer):
    vocab = sglang_backend.vocabulary_for(tokenizer, 50000, None)
    assert vocab.logits_width == len(tokenizer)
    assert vocab.eos_token_ids == frozenset({tokenizer.eos_token_id})


def test_importing_without_sglang_says_what_is_missing():
    code = "import sys; sys.modules['sglang'] = None; import integrations.sglang_backend"
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, check=False, capture_output=True, text=True, timeout=300)
    assert result.returncode != 0
    assert "ImportError" in result.stderr
    assert "needs SGLang" in result.stderr and "scripts/integration/sglang.txt" in result.stderr


# --- the real server: python -m sglang.launch_server --grammar-backend corral -------------------


def _serve_helpers():
    """The server tests' tiny-model builder (a random 2-layer GPT-2 over the real GPT-2 tokenizer)."""
    if "serve_helpers" in sys.modules:
        return sys.modules["serve_helpers"]
    spec = importlib.util.spec_from_file_location("serve_helpers", REPO_ROOT / "tests" / "server" / "serve_helpers.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["serve_helpers"] = module  # before running it: its dataclasses look themselves up
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def sglang_server(tmp_path_factory):
    """SGLang's HTTP server on the CPU with ``--grammar-backend corral``, found through the entry
    point (a fresh process: nothing registered by hand). A small KV pool keeps it to a few hundred
    MB; startup takes minutes on two cores."""
    import httpx

    helpers = _serve_helpers()
    folder = tmp_path_factory.mktemp("sglang-model")
    helpers.build_tiny_model(folder, vocab_file("gpt-2"))
    port = helpers.free_port()
    log_path = folder / "server.log"
    command = [sys.executable, "-m", "sglang.launch_server", "--model-path", str(folder), "--device", "cpu",
               "--grammar-backend", "corral", "--host", "127.0.0.1", "--port", str(port),
               "--max-total-tokens", "4096", "--max-running-requests", "4", "--skip-server-warmup"]
    with open(log_path, "w", encoding="utf-8") as log:
        process = subprocess.Popen(command, cwd=REPO_ROOT, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    base_url = f"http://127.0.0.1:{port}"

    def tail() -> str:
        return log_path.read_text(encoding="utf-8", errors="replace")[-5000:]

    def stop() -> None:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGTERM)
            try:
                process.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait(10)

    deadline = time.monotonic() + 900
    try:
        while True:
            if process.poll() is not None:
                pytest.fail(f"sglang.launch_server exited with code {process.returncode} during startup:\n{tail()}")
            try:
                if httpx.get(base_url + "/model_info", timeout=5).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"sglang.launch_server did not answer within 900 s:\n{tail()}")
            time.sleep(1)
        yield base_url
    finally:
        stop()


def generate(base_url: str, prompt: str, **sampling) -> dict:
    import httpx

    body = {"text": prompt, "sampling_params": {"max_new_tokens": 200, "temperature": 1.0, **sampling}}
    return httpx.post(base_url + "/generate", json=body, timeout=300).json()


@pytest.mark.slow
def test_server_regex_output_matches(sglang_server):
    for _ in range(3):  # sampled at temperature 1 from a random model: only the mask keeps it in line
        out = generate(sglang_server, "Answer:", regex=r"(yes|no), [0-9]{2}")
        assert re.fullmatch(r"(yes|no), [0-9]{2}", out["text"]), out
        assert out["meta_info"]["finish_reason"]["type"] == "stop", out


@pytest.mark.slow
def test_server_json_schema_output_is_a_valid_instance(sglang_server):
    import jsonschema

    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}, "n": {"type": "integer", "minimum": 0,
              "maximum": 9}}, "required": ["ok", "n"], "additionalProperties": False}
    out = generate(sglang_server, "JSON:", json_schema=json.dumps(schema), max_new_tokens=400)
    assert out["meta_info"]["finish_reason"]["type"] == "stop", out
    jsonschema.validate(json.loads(out["text"]), schema)


@pytest.mark.slow
def test_server_ebnf_output_matches(sglang_server):
    bounded = 'root ::= ("Hello" | "Hi") " " [a-z]{1,5} "!"'  # a random model may not stop on its own
    out = generate(sglang_server, "Greet:", ebnf=bounded)
    assert re.fullmatch(r"(Hello|Hi) [a-z]{1,5}!", out["text"]), out
    assert out["meta_info"]["finish_reason"]["type"] == "stop", out


@pytest.mark.slow
def test_server_reports_corrals_error_for_an_invalid_schema(sglang_server):
    out = generate(sglang_server, "Bad:", json_schema='{"type": "object", "properties": ')
    message = out["error"]["message"]
    assert "Failed to compile json grammar" in message and "GrammarSyntaxError" in message
    assert "schema is not valid JSON" in message
