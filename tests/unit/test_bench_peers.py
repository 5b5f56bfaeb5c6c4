"""``mohge bench peers``: the record's schema, the refusal without a peer, the committed table, and (with
torchtitan installed) a tiny run where every peer computes our homogeneous layer's function."""

import importlib.util
import json
import logging

import jsonschema
import pytest
from conftest import ROOT
from mohge_studies.bench import main as bench_main
from mohge_studies.bench import peers

TINY = peers.Shape("tiny", d_model=32, tokens=64, experts=8, width=16, topk=2, widths=(8, 16, 16, 24), group_topk=2)
HAVE_PEERS = all(importlib.util.find_spec(name) for name in peers.PEER_PACKAGES)

_SECONDS = {"type": "object", "additionalProperties": {"type": "number", "exclusiveMinimum": 0}}
_STRINGS = {"type": "object", "additionalProperties": {"type": "string"}}
SCHEMA = {
    "type": "object",
    "additionalProperties": False,
    "required": "bench date versions cpu arch cores threads clock reps loadavg bf16_gemm shapes results".split(),
    "properties": {
        "bench": {"const": "peers"},
        "date": {"type": "string", "pattern": r"^\d{4}-\d{2}-\d{2}$"},
        "versions": {**_STRINGS, "required": ["torch"]},
        "cpu": {"type": "string"},
        "arch": {"type": "string"},
        "cores": {"type": ["integer", "null"]},
        "cpu_capability": {"type": "string"},  # ATen's vector unit; records before it was kept lack it
        "threads": {"const": 1},
        "clock": {"const": "thread_time"},
        "reps": {"type": "integer", "minimum": 1},
        "loadavg": {"type": "array", "items": {"type": "number"}, "minItems": 3, "maxItems": 3},
        "bf16_gemm": {"type": "object", "required": ["gemm_fp32_over_bf16_time"]},
        "shapes": {
            "type": "object",
            "additionalProperties": {
                "type": "object",
                "additionalProperties": False,
                "required": ["name", "d_model", "tokens", "experts", "width", "topk", "widths", "group_topk"],
                "properties": {
                    "name": {"type": "string"},
                    "widths": {"type": "array", "items": {"type": "integer"}},
                    **{
                        k: {"type": "integer", "minimum": 1}
                        for k in "d_model tokens experts width topk group_topk".split()
                    },
                },
            },
        },
        "results": {
            "type": "array",
            "minItems": 1,
            "items": {
                "type": "object",
                "additionalProperties": False,
                "required": "shape precision seconds skipped ratios max_rel_diff_vs_moe expert_dtype".split(),
                "properties": {
                    "shape": {"type": "string"},
                    "precision": {"enum": list(peers.DTYPES)},
                    "seconds": {**_SECONDS, "required": ["moe", "moe_grouped_mm", "mohge", "mohge_grouped_mm"]},
                    "skipped": _STRINGS,
                    "ratios": {**_SECONDS, "required": ["mohge_over_moe", "mohge_grouped_mm_over_moe_grouped_mm"]},
                    "max_rel_diff_vs_moe": {"type": "object", "additionalProperties": {"type": "number"}},
                    "expert_dtype": {"type": "object", "additionalProperties": {"enum": list(peers.DTYPES)}},
                },
            },
        },
    },
}


def test_record_of_our_layers_fits_the_schema_and_formats():
    record = peers.run([TINY], ["fp32", "bf16"], reps=1, peers=False)
    jsonschema.validate(record, SCHEMA)
    assert [(r["shape"], r["precision"]) for r in record["results"]] == [("tiny", "fp32"), ("tiny", "bf16")]
    for r in record["results"]:
        assert r["max_rel_diff_vs_moe"]["moe_grouped_mm"] < (1e-5 if r["precision"] == "fp32" else 1e-2)
    table = peers.markdown_table(record)
    assert table.count("\n| tiny |") == 2 and "fastest peer" in table


def test_refuses_in_one_line_naming_the_missing_peer(monkeypatch, caplog):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "torchtitan" else real(name, *a))
    with caplog.at_level(logging.ERROR, logger="mohge"):
        assert bench_main(["peers", "--shapes", "d128", "--reps", "1"]) == 2
    (line,) = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert "'torchtitan' is not installed" in line and "\n" not in line


def test_refuses_an_unknown_shape(caplog):
    with caplog.at_level(logging.ERROR, logger="mohge"):
        assert peers.main(["--shapes", "d999"]) == 2
    assert "--shapes='d999'" in caplog.text


def test_committed_table_is_the_committed_record():
    record = json.loads((ROOT / "results/bench/peers_cpu.json").read_text())
    jsonschema.validate(record, SCHEMA)
    assert peers.markdown_table(record) in (ROOT / "docs/benchmarks.md").read_text()


@pytest.mark.skipif(not HAVE_PEERS, reason="peer packages not installed (docs/benchmarks.md: torchtitan, '.[peers]')")
def test_peers_compute_our_function_on_a_tiny_shape():
    record = peers.run([TINY], ["fp32"], reps=1)
    jsonschema.validate(record, SCHEMA)
    (r,) = record["results"]
    assert set(r["seconds"]) >= {"torchtitan", "hf_eager", "hf_grouped_mm"}
    assert record["versions"]["torchtitan"] == peers.PEER_PACKAGES["torchtitan"]
    # torchtitan's experts compute in bf16 whatever the parameters' dtype; the others in fp32
    assert r["expert_dtype"]["torchtitan"] == "bf16" and r["max_rel_diff_vs_moe"]["torchtitan"] < 2e-2
    assert max(v for k, v in r["max_rel_diff_vs_moe"].items() if k != "torchtitan") < 1e-5
    assert {"moe_over_fastest_peer", "moe_grouped_mm_over_torchtitan"} <= set(r["ratios"])
