"""The speculative benchmark: its summary arithmetic, the mask-wait replay, and (``-m bench``) a
whole run on three schemas with random GPT-2 target and draft models over the real GPT-2
vocabulary, whose rows must be consistent: greedy outputs equal constrained autoregressive
decoding token for token, accepted ≤ drafted, finished outputs validate against their schema.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from shared_data import vocab_file

from jsonschemabench import speculative_bench as bench
from jsonschemabench.__main__ import build_parser


def _row(config: str, file: str, seconds: float, **fields) -> dict:
    base = {"file": file, "config": config, "tokens": 10, "target_calls": 10, "seconds": seconds,
            "validity": "valid", "finish_reason": "stop"}
    if config != bench.BASELINE:
        base |= {"committed": 11, "drafted": 8, "accepted": 6, "forced": 2, "invalid_tokens": 0, "k_mean": 4.0,
                 "same_as_baseline": True, "draft_s": 0.1, "verify_s": 0.2}
    return base | fields


def test_summary_pools_seconds_and_counts_source_drafts_only():
    rows = [
        _row(bench.BASELINE, "a", 2.0), _row(bench.BASELINE, "b", 4.0),
        _row("prompt_lookup k=4", "a", 1.0, target_calls=5),
        _row("prompt_lookup k=4", "b", 2.0, target_calls=6, validity="invalid", same_as_baseline=False),
        _row("prompt_lookup k=4 no-filter", "a", 1.5, drafted=10, invalid_tokens=2),
        _row("prompt_lookup k=4 no-filter", "b", 2.5, drafted=10, invalid_tokens=2),
    ]
    summary = bench.summarize(rows)
    by = {c["config"]: c for c in summary["configs"]}
    assert summary["schemas"] == 2
    assert by[bench.BASELINE]["speedup"] == 1.0 and by[bench.BASELINE]["tokens_per_call"] == pytest.approx(22 / 20)
    lookup = by["prompt_lookup k=4"]
    assert lookup["speedup"] == pytest.approx(6.0 / 3.0)  # Σ baseline seconds / Σ seconds (same tokens)
    assert lookup["tokens_per_call"] == pytest.approx(22 / 11)
    assert lookup["acceptance"] == pytest.approx((6 - 2) * 2 / ((8 - 2) * 2))  # forced tokens aside
    assert (lookup["valid"], lookup["same_as_baseline"]) == (1, 1)
    sampled = bench.summarize(rows[:2] + [_row("jacobi k=4", "a", 1.0, tokens=5), _row("jacobi k=4", "b", 1.0, tokens=5)])
    assert sampled["configs"][1]["speedup"] == pytest.approx((6.0 / 20) / (2.0 / 10))  # seconds per token: half the tokens
    unfiltered = by["prompt_lookup k=4 no-filter"]
    assert unfiltered["acceptance"] == pytest.approx(8 / 16) and unfiltered["invalid_tokens"] == 4
    text = bench.render_markdown(summary)
    assert "| prompt_lookup k=4 | 2.00 | 66.7% |" in text
    assert ("prompt_lookup k=4: 66.7% vs 50.0% acceptance, 11 vs 20 target calls scoring 16 vs 20 draft positions, "
            "3.00 s vs 4.00 s") in text


def test_configs_and_labels():
    labels = [c.label for c in bench.configs(3, with_draft=True)]
    assert "draft-model k=auto" in labels and "draft-unmasked k=3 no-filter" in labels
    assert all(not c.source.startswith("draft") for c in bench.configs(3, with_draft=False))
    assert not any(c.source == "diffusion" for c in bench.configs(3, with_draft=True))
    diffusion = [c.label for c in bench.configs(3, with_draft=False, with_diffusion=True) if c.source == "diffusion"]
    assert diffusion == ["diffusion k=3", "diffusion k=auto"]


def test_mask_wait_fills_positions_masks_per_row_and_step():
    from grammars import Compiler, TokenVocabulary

    vocab = TokenVocabulary.from_bytes([b"a", b"b", b"ab", b""], eos_token_ids=[3], special_token_ids=[3])
    grammar = Compiler(vocab).compile_regex("(ab)+")
    ticks = iter(range(10_000))
    # a fake clock: one tick per reading, so a step's time is 1 whatever the work
    assert bench.mask_wait([(grammar, [2, 2, 2])], 4, 3, clock=lambda: next(ticks)) == 1.0
    assert bench.mask_wait([(grammar, [])], 4, 3) is None
    real = bench.mask_wait([(grammar, [0, 1, 0, 1]), (grammar, [2])], 8, 2)
    assert real is not None and real > 0


# --- a whole run (-m bench) -----------------------------------------------------------------------

SCHEMAS = {
    "Synthetic---flags.json": {"type": "object", "properties": {"ok": {"type": "boolean"},
                                                                "mode": {"enum": ["fast", "slow", "off"]}},
                               "required": ["ok", "mode"], "additionalProperties": False},
    "Synthetic---tags.json": {"type": "array", "items": {"enum": ["red", "green", "blue"]}, "minItems": 1,
                              "maxItems": 3},
    "Synthetic---note.json": {"type": "object", "properties": {"title": {"enum": ["a", "bb"]},
                                                               "done": {"type": "boolean"}},
                              "required": ["title", "done"], "additionalProperties": False},
}


def _save_random_gpt2(folder: Path, vocab, *, hidden: int, layers: int, seed: int) -> Path:
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(seed)
    config = GPT2Config(vocab_size=vocab.logits_width, n_embd=hidden, n_layer=layers, n_head=2, n_positions=512,
                        bos_token_id=50256, eos_token_id=50256)
    model = GPT2LMHeadModel(config).eval()
    model.generation_config.eos_token_id = 50256
    model.save_pretrained(folder)
    vocab.hf_tokenizer.save_pretrained(folder)
    return folder


@pytest.mark.bench
def test_a_run_on_three_schemas_is_consistent(tmp_path):
    from grammars import TokenVocabulary

    vocab = TokenVocabulary.from_pretrained(vocab_file("gpt-2"))
    target = _save_random_gpt2(tmp_path / "target", vocab, hidden=32, layers=2, seed=0)
    draft = _save_random_gpt2(tmp_path / "draft", vocab, hidden=16, layers=1, seed=1)
    data = tmp_path / "maskbench"
    data.mkdir()
    for name, schema in SCHEMAS.items():
        (data / name).write_text(json.dumps({"schema": schema, "tests": [{"valid": True, "data": None}]}),
                                 encoding="utf-8")
    out = tmp_path / "run"
    args = build_parser().parse_args(["speculative", "--target", str(target), "--draft", str(draft),
                                      "--data", str(data), "--files", "all", "--schemas", "3", "--max-tokens", "48",
                                      "--batches", "1,8", "--out", str(out)])
    assert args.run(args) == 0
    rows = [json.loads(line) for line in (out / "rows.jsonl").read_text(encoding="utf-8").splitlines()]
    labels = {c.label for c in bench.configs(4, with_draft=True)} | {bench.BASELINE}
    assert {r["config"] for r in rows} == labels and len(rows) == 3 * len(labels)
    for row in rows:
        if row["finish_reason"] == "stop":
            assert row["validity"] == "valid", row
        if row["config"] == bench.BASELINE:
            continue
        assert row["same_as_baseline"] is True, row  # greedy: lossless means the same tokens
        assert 0 <= row["forced"] <= row["accepted"] <= row["drafted"], row
        assert row["tokens"] <= row["committed"] <= row["tokens"] + 1, row
        assert row["target_calls"] >= 1 and row["seconds"] > 0
        if row["filter"] and row["source"] in ("draft-model", "forced"):
            assert row["invalid_tokens"] == 0  # drafted under the mask, or forced
    summary = json.loads((out / "summary.json").read_text(encoding="utf-8"))
    assert [m["batch"] for m in summary["mask_wait"]] == [1, 8]
    assert all(m["ar_ms"] > 0 and m["spec_ms"] > 0 for m in summary["mask_wait"])
    assert "| constrained AR |" in (out / "summary.md").read_text(encoding="utf-8")
