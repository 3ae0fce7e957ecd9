"""``python -m jsonschemabench compile-profile``: the phases are the compile's own steps, their sum
is one compile and first mask, and failures are rows naming the phase."""

from __future__ import annotations

import json

import pytest
from shared_data import vocab_file

from grammars import Compiler, TokenVocabulary, allocate_token_bitmask
from jsonschemabench.compile_profile import PHASES, PhaseTimes, markdown, profile_schema, summarize

SCHEMA = {"type": "object", "properties": {"id": {"type": "integer"}, "tags": {"type": "array",
                                                                                "items": {"type": "string"}}},
          "required": ["id"]}


@pytest.fixture(scope="module")
def vocab():
    return TokenVocabulary.from_pretrained(vocab_file("gpt-2"))


def test_phases_run_the_compile_and_give_the_same_grammar(vocab):
    times = profile_schema(vocab, SCHEMA, "s.json")
    assert times.error is None and times.phases_done == list(PHASES)
    assert all(getattr(times, p) > 0 for p in PHASES)
    assert times.total == pytest.approx(sum(getattr(times, p) for p in PHASES))
    # maskbench's options: authors' whitespace, members in any order
    reference = Compiler(vocab, allow_empty_language=True).compile_json_schema(SCHEMA, whitespace="flexible",
                                                                               property_order="any")
    assert (times.n_terminals, times.n_productions) == (reference.n_terminals, reference.n_productions)
    three = {"type": "object", "properties": {k: {"type": "integer"} for k in "abc"}}
    in_order, any_order = (profile_schema(vocab, three, "3.json", property_order=o) for o in ("schema", "any"))
    assert in_order.n_productions < any_order.n_productions  # the option reaches the front end
    mask = allocate_token_bitmask(1, vocab.logits_width)
    reference.matcher().fill_mask(mask, 0)
    assert mask.any()


def test_an_unsupported_schema_is_a_row_naming_its_phase(vocab):
    times = profile_schema(vocab, {"type": "string", "format": "no-such-format-anywhere"}, "bad.json")
    if times.error is None:
        pytest.skip("the front end accepts unknown formats")
    assert "front_end" in times.error and times.phases_done == []


def test_a_timeout_is_a_row_and_the_alarm_is_cleared(vocab):
    import signal

    times = profile_schema(vocab, SCHEMA, "slow.json", timeout_s=1e-6)
    assert times.error is not None and times.error.startswith("timeout")
    assert signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)


def test_summary_orders_files_and_shares_add_up():
    rows = [PhaseTimes(f"f{i}.json", front_end=i * 1e-3, lowering=1e-3, automata=2e-3, assemble=0.0,
                       first_mask=1e-4) for i in range(1, 8)]
    rows.append(PhaseTimes("broken.json", error="UnsupportedSchemaError in front_end: x"))
    summary = summarize(rows, slowest=3)
    assert summary["compiled"] == 7 and summary["errors"] == 1
    assert [r["file"] for r in summary["slowest"]] == ["f7.json", "f6.json", "f5.json"]
    assert summary["median_file"]["file"] == "f4.json"
    assert sum(summary["share"].values()) == pytest.approx(1.0)
    text = markdown(summary)
    assert "f7.json" in text and "broken.json" not in text
    json.dumps(summary)  # what the run writes
