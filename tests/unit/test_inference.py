"""Inference cost and the route-override knob: the export counts the same FLOPs as mohge's model, the KV cache
decodes the tokens the full recomputation does, a smaller K_g (or top-k, or barred widest groups) costs fewer
activated FLOPs, and the override at the trained value is the trained model."""

import json

import pytest
import torch
from conftest import tiny_model_config, tiny_run, train_tiny
from mohge_studies.bench.inference import bench_inference, greedy_cached, greedy_uncached, routed_pass
from mohge_studies.bench.inference import main as inference_main

from mohge.config import ConfigError, RunConfig
from mohge.data.tokenizer import EOT_ID
from mohge.evaluate.hf_export import to_hf_model
from mohge.evaluate.route_override import RouteOverride, apply_route_override
from mohge.evaluate.routed_cost import record_routing, token_cost
from mohge.model import LanguageModel
from mohge.train.checkpoint import load_trained
from mohge.train.heldout import heldout_loss
from mohge.train.trainer import train

MOE = {"ffn": {"kind": "moe", "expert_widths": [32], "placement": "contiguous"}, "router": {"topk": 3}}
HMOE = {"ffn": {"kind": "hmoe"}, "router": {"topk": 3}}
DENSE = {"ffn": {"kind": "dense"}}


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """Tiny MoHGE, MoE and dense models trained on one graded data folder: {family: model dir}, data dir."""
    root = tmp_path_factory.mktemp("infer")
    mohge_dir, data = train_tiny(root, tiny_run())
    n = torch.get_num_threads()
    out = {"mohge": mohge_dir}
    for fam, over in (
        ("moe", {"ffn": {"kind": "moe", "expert_widths": [40], "placement": "contiguous"}}),
        ("dense", {"ffn": {"kind": "dense", "dense_width": 80}}),
    ):
        run = tiny_run(name=f"tiny-{fam}", family=fam, model=over)
        train(RunConfig.from_dict(run), root / fam, data=str(data))
        out[fam] = root / fam
    torch.set_num_threads(n)
    return out, data


def _mean_flops(model, cfg, x_BS):
    with torch.no_grad(), record_routing(model) as calls:
        model(x_BS)
    pos_T = torch.arange(x_BS.shape[1]).repeat(x_BS.shape[0])
    return token_cost(cfg, calls, pos_T)


@pytest.mark.parametrize("family", ["mohge", "moe", "hmoe", "dense"])
def test_export_and_mohge_model_count_equal_flops_per_token(family):
    over = {"mohge": {}, "moe": MOE, "hmoe": HMOE, "dense": DENSE}[family]
    cfg = tiny_model_config(**over)
    model = LanguageModel(cfg).eval()
    hf = to_hf_model(model, 16, eot_id=EOT_ID)
    x_BS = torch.randint(0, 97, (4, 16))
    ours, theirs = _mean_flops(model, cfg, x_BS), _mean_flops(hf, cfg, x_BS)
    assert (ours["flops"] == theirs["flops"]).all() and (ours["params"] == theirs["params"]).all()


def test_cached_decode_gives_the_tokens_of_full_recomputation():
    model = LanguageModel(tiny_model_config()).eval()
    hf = to_hf_model(model, 16, eot_id=EOT_ID)
    prompt_BS = torch.randint(1, 97, (3, 5))
    cached = greedy_cached(hf, prompt_BS, 8)
    assert torch.equal(cached, greedy_uncached(model, prompt_BS, 8))
    assert torch.equal(cached, greedy_uncached(hf, prompt_BS, 8))


def test_override_at_the_trained_group_topk_gives_the_trained_perplexity_exactly(trained):
    models, data = trained
    cfg, model = load_trained(models["mohge"])
    base = heldout_loss(model, data, "val", 8, 16, 2)
    served = apply_route_override(model, cfg.model, RouteOverride(group_topk=cfg.model.router.group_topk))
    assert served["group_topk"] == cfg.model.router.group_topk
    assert heldout_loss(model, data, "val", 8, 16, 2) == base


def test_fewer_groups_at_the_same_experts_per_group_or_barred_widest_lower_the_flops_reported(trained):
    models, data = trained
    out = bench_inference([models["mohge"]], data, group_topk=[1], bar_widest=[1], eval_batches=1, timing=False)
    knob = {k["point"]: k for k in out["models"][0]["knob"]}
    assert set(knob) == {"trained", "group_topk=1", "group_topk=1,topk=1", "bar_widest=1"}
    assert knob["group_topk=1,topk=1"]["flops_mean"] < knob["trained"]["flops_mean"]
    assert knob["bar_widest=1"]["flops_mean"] < knob["trained"]["flops_mean"]
    # K_g alone keeps K experts per token: what it costs is what the served routing picked, token by token
    cfg, model = load_trained(models["mohge"])
    apply_route_override(model, cfg.model, RouteOverride(group_topk=1))
    tokens = routed_pass(model, cfg, data, "val", 16, 1)
    assert knob["group_topk=1"]["flops_mean"] == tokens["flops"].mean()
    assert knob["group_topk=1"]["routing"] == {"group_topk": 1, "topk": 2, "bar_widest": 0}
    assert knob["trained"]["flops_mean"] == out["models"][0]["cost"]["flops"]["mean"]
    assert out["models"][0]["hf_max_abs_diff"] == {"params": 0.0, "flops": 0.0}


def test_lower_topk_of_a_flat_moe_lowers_flops_and_barred_classes_get_no_token():
    cfg = tiny_model_config(**HMOE)
    x_BS = torch.randint(0, 97, (4, 16))
    base = _mean_flops(LanguageModel(cfg).eval(), cfg, x_BS)["flops"].mean()
    model = LanguageModel(cfg).eval()
    apply_route_override(model, cfg, RouteOverride(topk=1, bar_widest=1))
    with torch.no_grad(), record_routing(model) as calls:
        model(x_BS)
    widest = torch.arange(12, 16)  # class 3 (width 40) of 4 experts per class
    assert all(c.shape[1] == 1 and not torch.isin(c, widest).any() for c in calls)
    assert token_cost(cfg, calls, torch.arange(16).repeat(4))["flops"].mean() < base


def test_mohge_never_routes_to_a_barred_group():
    cfg = tiny_model_config()  # 4 groups of 4, widths 16..40, Kg 2
    model = LanguageModel(cfg).eval()
    apply_route_override(model, cfg, RouteOverride(bar_widest=2))
    with torch.no_grad(), record_routing(model) as calls:
        model(torch.randint(0, 97, (4, 16)))
    assert all(int(c.max()) < 8 for c in calls)  # groups 2 and 3 hold experts 8..15


@pytest.mark.parametrize(
    "items, over, message",
    [
        (["group_topk=3"], {}, "above the trained 2"),
        (["group_topk=1"], MOE, "only a MoHGE model"),
        (["bar_widest=3"], {}, "only 1 groups are left"),
        (["topk=3", "group_topk=1"], {"ffn": {"num_experts": 8}}, "more than the 2 experts of 1 groups"),
        (["width=2"], {}, "expected KEY=VALUE"),
        (["topk=0"], {}, "must be >= 1"),
    ],
)
def test_route_override_refuses_what_the_model_cannot_serve(items, over, message):
    with pytest.raises(ConfigError, match=message):
        RouteOverride.parse(items).served(tiny_model_config(**over))


def test_bench_inference_cli_records_timings_memory_cpu_and_ratios(trained, tmp_path):
    models, data = trained
    out = tmp_path / "inference.json"
    argv = ["--models", *(str(models[f]) for f in ("mohge", "moe", "dense")), "--data", str(data)]
    argv += ["--out", str(out), "--topk", "1", "--group-topk", "1", "--prompt-lengths", "8", "16"]
    argv += ["--batch-sizes", "1", "4", "--decode-tokens", "3", "--reps", "1", "--eval-batches", "1"]
    assert inference_main(argv) == 0
    rec = json.loads(out.read_text())
    assert rec["threads"] == 1 and rec["clock"] == "thread_time" and rec["cpu"]
    by_run = {m["family"]: m for m in rec["models"]}
    assert [p["prompt_len"] for p in by_run["mohge"]["prefill"]] == [8, 16]
    assert [(d["batch"], d["cache"]) for d in by_run["moe"]["decode"]] == [(1, True), (4, True), (1, False)]
    assert all(d["tokens_per_s"] > 0 for d in by_run["dense"]["decode"])
    assert set(by_run["mohge"]["memory"]) == {"prefill_16_rss_bytes", "decode_b4_rss_bytes"}
    assert [k["point"] for k in by_run["moe"]["knob"]] == ["trained", "topk=1"]
    assert [k["point"] for k in by_run["mohge"]["knob"]] == ["trained", "group_topk=1", "group_topk=1,topk=1", "topk=1"]
    assert [k["point"] for k in by_run["dense"]["knob"]] == ["trained"]
    assert set(by_run["mohge"]["cost"]["by_level"]) == {"easy", "medium", "hard"}
    ds = by_run["mohge"]["dataset"]
    ratios = rec["ratios"][f"{ds}:mohge_over_moe"]
    assert ratios["flops_per_token"] == pytest.approx(
        by_run["mohge"]["cost"]["flops"]["mean"] / by_run["moe"]["cost"]["flops"]["mean"]
    )
    assert "decode_b4_tokens_per_s" in rec["ratios"][f"{ds}:mohge_over_dense"]


def test_evaluate_records_the_route_override(trained, tmp_path):
    from mohge.evaluate.suite import evaluate

    models, data = trained
    plain = evaluate(models["mohge"], data, tasks=[], device="cpu", max_loss_batches=1)
    cheap = evaluate(
        models["mohge"], data, tasks=[], device="cpu", max_loss_batches=1, route_override=RouteOverride(group_topk=1)
    )
    assert "route_override" not in plain
    served = cheap["route_override"]
    assert {k: served[k] for k in ("point", "routing", "cost_split")} == {
        "point": "group_topk=1",
        "routing": {"group_topk": 1, "topk": 2, "bar_widest": 0},
        "cost_split": "val",
    }
    assert served["tokens"] == cheap["val"]["tokens"] and served["flops_per_token"] > served["params_per_token"] > 0
    assert cheap["val"]["loss"] != plain["val"]["loss"]


def test_export_rereads_group_by_group_as_one_fused_moe_call_per_width(trained, tmp_path):
    from mohge.evaluate.hf_export import export
    from mohge.evaluate.serving import group_weights, grouped_fused_moe

    models, _ = trained
    cfg, model = load_trained(models["mohge"])
    groups = group_weights(export(models["mohge"], tmp_path / "hf"))
    ffn = cfg.model.ffn
    n, D = ffn.experts_per_group, cfg.model.d_model
    assert sorted(groups) == [i for i, b in enumerate(model.blocks) if hasattr(b.ffn, "router")]
    x_TD = torch.randn(37, D)
    for i, per_group in groups.items():
        assert [(w13.shape, w2.shape) for w13, w2 in per_group] == [
            ((n, 2 * h, D), (n, D, h)) for h in ffn.expert_widths
        ]
        layer = model.blocks[i].ffn
        with torch.no_grad():
            r = layer.router(x_TD)
            ref = layer.experts(x_TD, r.idx_TK, r.gates_TK)
            got = grouped_fused_moe(x_TD, r.idx_TK, r.gates_TK, per_group, n)
        assert torch.allclose(got, ref, atol=1e-5)
