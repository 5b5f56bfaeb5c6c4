"""The expert-parallel layer under torchrun (2 gloo ranks): same forward and gradients as one process.

Each test launches ``python -m torch.distributed.run --standalone --nproc-per-node 2`` once (about 4 s).
"""

import csv
import json
import subprocess
import sys

import pytest
import torch
from conftest import tiny_run
from mohge.kernels.reference import swiglu_grouped_torch, swiglu_loop
from mohge_studies.analysis.utilization import main as utilization_main

from mohge.model.allocation import PLACEMENTS, place
from mohge.train.distributed.ep_layer import local_layout

TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2"]


def test_local_layout_class_major_by_width():
    widths_E = [8, 8, 12, 12, 16, 16, 20, 20]
    ranks = place("all_size", widths_E, 2)
    layout = local_layout(widths_E, ranks, 2)
    assert layout == [[[0], [2], [4], [6]], [[1], [3], [5], [7]]]
    layout = local_layout(widths_E, place("modse_pairs", widths_E, 2), 2)
    assert layout == [[[0, 1], [6, 7]], [[2, 3], [4, 5]]]


@pytest.fixture(scope="module")
def ep_check(tmp_path_factory):
    out = tmp_path_factory.mktemp("ep") / "check.pt"
    cmd = [*TORCHRUN, "-m", "mohge.train.distributed.ep_equivalence", "--out", str(out)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=out.parent)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return torch.load(out, weights_only=False)


def reference(p):
    x = p["x"].clone().requires_grad_(True)
    gates = p["gates"].clone().requires_grad_(True)
    w1s = [w.clone().requires_grad_(True) for w in p["w1s"]]
    w2s = [w.clone().requires_grad_(True) for w in p["w2s"]]
    y = swiglu_grouped_torch(x, p["idx"], gates, w1s, w2s)
    (y * p["dy"]).sum().backward()
    return y.detach(), x.grad, gates.grad, [w.grad for w in w1s], [w.grad for w in w2s]


@pytest.mark.multiprocess
def test_ep_forward_and_backward_match_single_process(ep_check):
    p, results = ep_check["problem"], ep_check["results"]
    assert ep_check["world"] == 2 and set(results) == set(PLACEMENTS)
    y, dx, dgates, dw1s, dw2s = reference(p)
    torch.testing.assert_close(y, swiglu_loop(p["x"], p["idx"], p["gates"], p["w1s"], p["w2s"]))
    assert torch.bincount(p["idx"].reshape(-1), minlength=8)[5] == 0  # an expert without tokens
    placements = set()
    for strategy, r in results.items():
        ranks = r["rank_of_expert"]
        assert sorted(ranks) == [0] * 4 + [1] * 4, strategy
        placements.add(tuple(ranks))
        torch.testing.assert_close(r["y"], y, msg=strategy)
        torch.testing.assert_close(r["dx"], dx, msg=strategy)
        torch.testing.assert_close(r["dgates"], dgates, msg=strategy)
        for got, want in zip(r["dw1s"] + r["dw2s"], dw1s + dw2s, strict=True):
            torch.testing.assert_close(got, want, msg=strategy)
    assert len(placements) == len(PLACEMENTS)  # four different layouts, all exercised across ranks


@pytest.mark.multiprocess
def test_ep_second_run_is_bitwise_equal(ep_check):
    for strategy, r in ep_check["results"].items():
        again = ep_check["repeats"][strategy]
        for key in ("y", "dx", "dgates"):
            assert torch.equal(r[key], again[key]), (strategy, key)
        for got, want in zip(r["dw1s"] + r["dw2s"], again["dw1s"] + again["dw2s"], strict=True):
            assert torch.equal(got, want), strategy


@pytest.mark.multiprocess
def test_measure_end_to_end_two_ranks(tmp_path):
    out = tmp_path / "u"
    args = ["--synthetic", "--out", str(out), "--widths", "16", "24", "32", "40", "--experts-per-group", "2"]
    args += ["--tokens", "64", "--topk", "2", "--d-model", "16", "--popularity", "4", "3", "2", "1"]
    args += ["--ep", "2", "--measure", "--nproc", "2", "--repeats", "2"]
    assert utilization_main(args) == 0
    with open(out / "measured.csv", newline="") as fh:
        measured = list(csv.DictReader(fh))
    with open(out / "analytic.csv", newline="") as fh:
        analytic = {(r["strategy"], r["rank"]): r for r in csv.DictReader(fh)}
    with open(out / "comparison.csv", newline="") as fh:
        comparison = list(csv.DictReader(fh))
    assert {(r["strategy"], r["rank"]) for r in measured} == {(s, str(k)) for s in PLACEMENTS for k in (0, 1)}
    for r in measured:
        a = analytic[r["strategy"], r["rank"]]
        assert r["tokens"] == a["tokens"] and float(r["flops"]) == pytest.approx(float(a["flops"]))
        assert float(r["seconds"]) > 0 and r["repeats"] == "2" and r["timing"] == "sequential"
        assert r["routing"] == "replay" and r["device"] == "cpu"
    assert {r["strategy"] for r in comparison} == set(PLACEMENTS)


@pytest.mark.multiprocess
def test_measure_live_routing_with_the_run_configs_router(tmp_path):
    run = tiny_run()  # widths 16, 32, 48, 64 x 2 experts, d_model 32, top-2 in 2 groups
    (tmp_path / "run.json").write_text(json.dumps(run))
    trace = {"model": "tiny", "d_model": 32, "expert_widths": [16, 32, 48, 64], "num_experts": 8}
    trace.update(experts_per_group=2, tokens=64, topk=2, layers=[{"layer": 0, "counts": [16] * 8}])
    (tmp_path / "trace.json").write_text(json.dumps(trace))
    cmd = [*TORCHRUN, "-m", "mohge_studies.analysis.ep_timing", "measure", "--trace", "trace.json", "--out", "m"]
    cmd += ["--routing", "live", "--config", "run.json", "--repeats", "1", "--strategies", "contiguous", "all_size"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    with open(tmp_path / "m" / "measured.csv", newline="") as fh:
        rows = list(csv.DictReader(fh))
    assert {(r["strategy"], r["routing"]) for r in rows} == {("contiguous", "live"), ("all_size", "live")}
    assert sum(int(r["tokens"]) for r in rows if r["strategy"] == "all_size") == 64 * 2  # every routed slot
