"""``python -m jsonschemabench wide-objects``: the instances are valid for the schema, corral walks
both member orders to acceptance with one mask per token and one at the end, and the table and
command line say what was measured."""

from __future__ import annotations

import argparse
import json

import jsonschema
import pytest
from shared_data import vocab_file

from jsonschemabench.peers import load_bench_tokenizer, load_engine, warm_up
from jsonschemabench.wide_objects import (
    ORDERS,
    format_table,
    main,
    measure,
    wide_instance,
    wide_object,
)


@pytest.mark.parametrize("members", [1, 5, 12])
def test_both_instances_are_valid_and_differ_in_order_only(members):
    schema = wide_object(members)
    by_properties, by_required = (wide_instance(members, order) for order in ORDERS)
    for instance in (by_properties, by_required):
        jsonschema.validate(instance, schema)
    assert by_properties == by_required
    assert list(by_properties) == list(schema["properties"]) and list(by_required) == schema["required"]
    with pytest.raises(ValueError):
        wide_instance(members, "alphabetical")


@pytest.fixture(scope="module")
def corral_engine():
    tokenizer = load_bench_tokenizer(str(vocab_file("gpt-2")))
    engine = load_engine("corral", tokenizer)
    warm_up(engine, "json_schema", {"type": "integer"})
    return engine, tokenizer


def test_corral_accepts_both_orders_of_a_wide_object(corral_engine):
    engine, tokenizer = corral_engine
    members = 12  # past any_order_limit and the 6 required members tracked as subsets: the order layout
    rows = measure(engine, tokenizer, members)
    assert [r["order"] for r in rows] == list(ORDERS)
    for row in rows:
        assert row["error"] is None and row["verdict"] == "accepted"
        assert row["masks"] == row["tokens"] + 1  # one mask per token, one for the end
        assert 0 < row["tbm_p50_us"] <= row["tbm_p99_us"] <= row["tbm_max_us"]
        assert row["ttfm_ms"] > 0
    table = format_table(rows)
    assert table.count("| 12 | corral |") == 2 and "accepted" in table


def test_a_refused_schema_is_a_row_per_order():
    class Refusing:
        name = "refusing"

        def reset_caches(self):
            pass

        def compile(self, kind, source):
            from jsonschemabench.peers import EngineRefused
            raise EngineRefused("too wide")

    rows = measure(Refusing(), tokenizer=None, members=3)
    assert [(r["order"], r["error"]) for r in rows] == [(o, "too wide") for o in ORDERS]
    assert "refused: too wide" in format_table(rows)


def test_the_command_line_checks_its_counts_and_writes_json(tmp_path, capsys):
    bad = argparse.Namespace(members="8,x", engines="corral", tokenizer=str(vocab_file("gpt-2")), json=None)
    with pytest.raises(SystemExit):
        main(bad)
    out = tmp_path / "rows.json"
    args = argparse.Namespace(members="3", engines="corral", tokenizer=str(vocab_file("gpt-2")), json=out)
    assert main(args) == 0
    rows = json.loads(out.read_text())
    assert {r["order"] for r in rows} == set(ORDERS) and all(r["verdict"] == "accepted" for r in rows)
    assert "| 3 | corral | properties |" in capsys.readouterr().out
