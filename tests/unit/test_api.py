"""The layer API of docs/api.md: ``from mohge import MoHGELayer``, its checks at construction, its weighted aux loss,
and the page's examples, run as written."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from mohge.config import ConfigError, FFNConfig, LossConfig, RouterConfig
from mohge.model.losses import group_aux_active, weighted_aux
from mohge.model.moe import MoELayer, MoHGELayer

ROOT = Path(__file__).resolve().parents[2]
API_DOC = ROOT / "docs" / "api.md"


def python_blocks(path: Path) -> dict[str, str]:
    """The python block of each section of ``path`` that has one, by the section's heading."""
    sections = re.split(r"^## (.*)$", path.read_text(), flags=re.M)
    out = {}
    for heading, body in zip(sections[1::2], sections[2::2], strict=True):
        blocks = re.findall(r"```python\n(.*?)```", body, flags=re.S)
        assert len(blocks) <= 1, heading
        if blocks:
            out[heading] = blocks[0]
    return out


BLOCK, TRAINING, CONFIG_ROUTE = (
    "In a transformer block",
    "Padding, in a training loop, and what a token costs",
    "The config route: every family and every switch",
)


def test_the_docs_examples_run_as_written():
    """Every python block of docs/api.md runs as it stands: the transformer block with MoHGELayer trains a step
    (the weighted aux loss has a gradient that reaches the routers), and the config route gives its aux loss."""
    blocks = python_blocks(API_DOC)
    assert blocks.keys() == {BLOCK, TRAINING, CONFIG_ROUTE}
    first, second = blocks[BLOCK], blocks[CONFIG_ROUTE]
    ns: dict = {}
    exec(compile(first, str(API_DOC), "exec"), ns)
    assert ns["y"].shape == ns["x"].shape == (2, 16, 128)
    assert ns["aux"].ndim == 0 and ns["aux"].item() > 0
    router = ns["block"].ffn.router
    assert router.group_router.weight.grad is not None and router.expert_router.weight.grad is not None
    ns = {}
    exec(compile(second, str(API_DOC), "exec"), ns)
    assert ns["y"].shape == (2, 16, 128) and ns["aux"].item() > 0


def test_the_docs_training_loop_with_padding_runs_learns_and_prints_the_cost_it_shows(capsys):
    """The training loop of docs/api.md runs as written: its LM loss falls from about ln(VOCAB) to under a tenth of
    it, and it prints the lines its comments show; those are the layer's parameter count, the activated parameters
    of uniform routing and 2x / 6x them (moe_layer_cost against the model's own count, test_the_cost_per_token_...)."""
    code = python_blocks(API_DOC)[TRAINING]
    ns: dict = {}
    exec(compile(code, str(API_DOC), "exec"), ns)
    assert ns["losses"][0] > 3.0 and ns["losses"][-1] < ns["losses"][0] / 10, ns["losses"]
    shown = [line.removeprefix("# ") for line in code.strip().splitlines() if line.startswith("# ")]
    assert capsys.readouterr().out.splitlines() == shown
    layer, cost = ns["model"].ffn, ns["cost"]
    assert cost["params"] == sum(p.numel() for p in layer.parameters())
    D, K, widths = 64, layer.router_cfg.topk, layer.ffn_cfg.expert_widths
    activated = (16 + 4) * D + K * 3 * D * sum(widths) / len(widths) + 3 * D * 256  # routers, K mean slots, shared
    assert (cost["activated_params"], cost["forward_flops"], cost["train_flops"]) == (
        activated, 2 * activated, 6 * activated
    )  # fmt: skip


@pytest.mark.parametrize("kind", ["mohge", "moe", "hmoe", "modse"])
def test_the_cost_per_token_of_a_layer_is_that_of_the_model_it_is_a_layer_of(kind):
    """A layer's parameters are its module's; its parameters, activated parameters (uniform or under measured
    counts) and FLOPs per token are those of the MoE layer of a one-layer model in mohge.config.sizes.count_params and
    mohge.train.distributed.flops.model_flops_per_token (less the attention, embedding and norms there)."""
    from mohge.config import ModelConfig
    from mohge.config.sizes import count_params
    from mohge.train.distributed.flops import model_flops_per_token

    widths = {"moe": (96,), "hmoe": (32, 160), "mohge": (32, 64, 128, 160), "modse": (32, 64, 128, 160)}[kind]
    ffn = FFNConfig(kind=kind, num_experts=8, expert_widths=widths, shared_expert_width=48, dense_layers=0,
                    placement="contiguous")  # fmt: skip
    router = RouterConfig(topk=3, group_topk=2 if kind == "mohge" else 1)
    layer = MoELayer(64, ffn, router, LossConfig(), 0.02, 0.02)
    cfg = ModelConfig(d_model=64, n_layers=1, n_heads=4, vocab_size=50, tie_embeddings=True, ffn=ffn, router=router)
    parts = ("routers", "routed_experts", "shared_experts")
    counts = torch.tensor([5, 0, 1, 9, 2, 2, 7, 4])
    for slots, hist in ((None, None), (counts, [counts.tolist()])):
        cost, model = layer.cost_per_token(slots), count_params(cfg, hist)
        assert cost["params"] == sum(model["total"][c] for c in parts) == sum(p.numel() for p in layer.parameters())
        assert cost["activated_params"] == sum(model["activated"][c] for c in parts)
        assert cost["mean_routed_width"] == pytest.approx(model["mean_activated_width"][0])
    rest = count_params(cfg)["activated_sum"] - layer.cost_per_token()["activated_params"]
    assert model_flops_per_token(cfg, 1) - 6 * rest - 6 * 2 * 4 * 16 == layer.cost_per_token()["train_flops"]
    with pytest.raises(ConfigError, match=r"^slots_E has 2 entries; the model has 8 experts"):
        layer.cost_per_token([1, 2])


def test_import_mohge_imports_no_torch_and_exports_the_layer_api():
    """``import mohge`` (run by every ``python -m mohge.<command>``) stays free of torch; the layer API comes on
    first access and is mohge.model's."""
    code = (
        "import sys, mohge; assert 'torch' not in sys.modules, 'torch imported'; "
        "from mohge import MoHGELayer, MoELayer, weighted_aux; import mohge.model.moe as m; "
        "assert (MoHGELayer, MoELayer) == (m.MoHGELayer, m.MoELayer); print(sorted(mohge.__all__))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["['MoELayer',", "'MoHGELayer',", "'__version__',", "'weighted_aux']"]
    with pytest.raises(ImportError):
        exec("from mohge import NoSuchLayer", {})


def sections(**router):
    ffn = FFNConfig(kind="mohge", num_experts=16, expert_widths=(64, 128, 192, 256), shared_expert_width=256,
                    placement="contiguous")  # fmt: skip
    return ffn, RouterConfig(**{"topk": 4, "group_topk": 2, **router}), LossConfig()


def test_the_layer_is_the_trainers_moe_layer_and_its_aux_is_weighted():
    """MoHGELayer's parameters, their names and its output are MoELayer's from the same sections and seed, and its
    aux is alpha_E * L_E + alpha_G * L_G of that layer's raw losses (L_G on: no schedule given)."""
    torch.manual_seed(3)
    ours = MoHGELayer(128)
    torch.manual_seed(3)
    ref = MoELayer(128, *sections(), std=0.02, out_std=0.02)
    assert ours.state_dict().keys() == ref.state_dict().keys()
    for (name, a), b in zip(ours.state_dict().items(), ref.state_dict().values(), strict=True):
        assert torch.equal(a, b), name
    x = torch.randn(2, 8, 128)
    y, aux = ours(x)
    y_ref, stats = ref(x)
    assert torch.equal(y, y_ref)
    lc = ours.loss_cfg
    expect = lc.expert_aux_coeff * stats.aux["expert_aux"] + lc.group_aux_coeff * stats.aux["group_aux"]
    assert aux.item() == pytest.approx(expect.item(), rel=1e-6)
    assert (lc.expert_aux_coeff, lc.group_aux_coeff) == (5e-3, 1e-5)  # docs/method.md §5.1, §5.2


def test_the_group_loss_follows_the_schedule_when_the_step_is_given():
    """With step and total_steps, L_G counts only once step > total_steps * group_aux_start_frac (docs/method.md
    §6); L_E always."""
    layer = MoHGELayer(64, group_aux_coeff=0.5)
    x = torch.randn(32, 64)
    _, stats = MoELayer.forward(layer, x[None])
    early, late = layer(x, step=50, total_steps=100), layer(x, step=51, total_steps=100)
    assert not group_aux_active(50, 100, 0.5) and group_aux_active(51, 100, 0.5)
    assert early[1].item() == pytest.approx(5e-3 * stats.aux["expert_aux"].item(), rel=1e-6)
    assert late[1].item() == pytest.approx(weighted_aux(stats.aux, layer.loss_cfg, 51, 100).item(), rel=1e-6)
    assert late[1].item() > early[1].item()
    with pytest.raises(ValueError, match="both step and total_steps"):
        layer(x, step=3)


def test_any_leading_shape_and_eval_mode():
    """x may be [T, D] or [B, S, D] (the tokens are routed together); in eval mode the aux loss is 0; a wrong width
    is refused naming d_model."""
    layer = MoHGELayer(64, shared_expert_width=0)
    x = torch.randn(3, 5, 64)
    y3, _ = layer(x)
    y2, _ = layer(x.reshape(15, 64))
    assert torch.equal(y3.reshape(15, 64), y2)
    y, aux = layer.eval()(x)
    assert y.shape == x.shape and aux.item() == 0 and layer.shared is None
    with pytest.raises(ValueError, match="d_model=64"):
        layer(torch.randn(4, 32))


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"topk": 9}, "topk=9: exceeds the experts reachable in the selected groups"),
        ({"topk": 0}, "topk=0: must be > 0"),
        ({"group_topk": 5}, "group_topk=5: exceeds the number of groups G=4"),
        ({"expert_widths": [64, 0]}, "expert_widths[1]=0: must be > 0"),
        ({"expert_widths": []}, "expert_widths=[]: expected a list or tuple of widths, one per group"),
        ({"expert_widths": 64}, "expert_widths=64: expected a list or tuple"),
        ({"expert_widths": [64, "wide"]}, "expert_widths[1]='wide': expected an integer"),
        ({"expert_widths": [16.0, 32.0]}, "expert_widths[0]=16.0: expected an integer"),
        ({"expert_widths": [64, True]}, "expert_widths[1]=True: expected an integer"),
        ({"topk": 2.5}, "topk=2.5: expected an integer"),
        ({"topk": 4.0}, "topk=4.0: expected an integer"),
        ({"topk": True}, "topk=True: expected an integer"),
        ({"group_topk": 2.0}, "group_topk=2.0: expected an integer"),
        ({"group_topk": True}, "group_topk=True: expected an integer"),
        ({"shared_expert_width": 64.0}, "shared_expert_width=64.0: expected an integer"),
        ({"experts_per_group": 2.0}, "experts_per_group=2.0: must be an integer > 0"),
        ({"experts_per_group": True}, "experts_per_group=True: must be an integer > 0"),
        ({"experts_per_group": 0}, "experts_per_group=0: must be an integer > 0"),
        ({"shared_expert_width": -1}, "shared_expert_width=-1: must be >= 0"),
        ({"expert_aux_coeff": -1.0}, "expert_aux_coeff=-1.0: must be >= 0"),
        ({"group_aux_start_frac": 2.0}, "group_aux_start_frac=2.0: must be <= 1"),
        ({"init_std": 0.0}, "init_std=0.0: must be a number > 0"),
        ({"backend": "cuda"}, "backend='cuda': must be one of"),
    ],
)
def test_every_bad_argument_is_refused_at_construction_naming_it(kwargs, message):
    with pytest.raises(ConfigError) as err:
        MoHGELayer(64, **kwargs)
    assert str(err.value).startswith(message), str(err.value)


def test_d_model_is_checked():
    with pytest.raises(ConfigError, match=r"^d_model=0: must be an integer > 0"):
        MoHGELayer(0)


@pytest.mark.parametrize(
    ("section", "kwargs", "message"),
    [
        (RouterConfig, {"topk": 2.0}, "topk=2.0: expected an integer"),
        (FFNConfig, {"num_experts": 8.0}, "num_experts=8.0: expected an integer"),
        (FFNConfig, {"expert_widths": (16, 32.5)}, "expert_widths[1]=32.5: expected an integer"),
        (LossConfig, {"group_cost_min": 64.0}, "group_cost_min=64.0: expected an integer"),
        (LossConfig, {"group_cost_interval": False}, "group_cost_interval=False: expected an integer"),
    ],
)
def test_a_section_built_in_code_takes_no_float_or_bool_where_it_declares_an_integer(section, kwargs, message):
    """An integer field (or a tuple of them) given a float, even an integral one, or a bool is refused when the
    section is built, as from_dict refuses it, naming the key; a float field takes an int."""
    with pytest.raises(ConfigError) as err:
        section(**kwargs)
    assert str(err.value) == message
    assert RouterConfig(init_std=1).init_std == 1 and LossConfig(group_cost_weights=(1, 2)).group_cost_weights == (1, 2)
    assert FFNConfig(num_experts=np.int64(8), expert_widths=(np.int64(16), 32), placement="contiguous").num_experts == 8


def test_widths_as_a_list_or_a_tuple_give_the_same_layer():
    torch.manual_seed(0)
    a = MoHGELayer(32, expert_widths=[16, 32])
    torch.manual_seed(0)
    b = MoHGELayer(32, expert_widths=(16, 32))
    assert a.ffn_cfg == b.ffn_cfg and a.ffn_cfg.expert_widths == (16, 32)
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters(), strict=True))


def test_moe_layer_refuses_sections_that_disagree_at_construction():
    """A router that cannot route over the FFN is refused when the layer is built (not at its first forward with
    'selected index k out of range'), naming the key; so is a dense FFN and a loss section of another G."""
    ffn, _, loss = sections()
    with pytest.raises(ConfigError, match=r"^topk=6: exceeds the experts reachable"):
        MoELayer(64, ffn, RouterConfig(topk=6, group_topk=1), loss, 0.02, 0.02)
    moe = FFNConfig(kind="moe", num_experts=4, expert_widths=[32], placement="contiguous")
    with pytest.raises(ConfigError, match=r"^topk=6: exceeds num_experts=4"):
        MoELayer(64, moe, RouterConfig(topk=6), loss, 0.02, 0.02)
    with pytest.raises(ConfigError, match=r"^kind='dense'"):
        MoELayer(64, FFNConfig(kind="dense"), RouterConfig(), loss, 0.02, 0.02)
    with pytest.raises(ConfigError, match=r"^group_cost_weights=\(1, 2\): needs one weight per group"):
        MoELayer(64, ffn, RouterConfig(topk=4, group_topk=2), LossConfig(group_cost_weights=[1, 2]), 0.02, 0.02)


def test_sections_built_in_code_take_lists_and_refuse_non_numbers():
    """A list where a section declares a tuple is that tuple (the section stays hashable); a non-number where a bound
    is declared is a ConfigError naming the key, not a TypeError from the comparison."""
    ffn = FFNConfig(expert_widths=[64, 128], num_experts=4, placement="contiguous")
    assert ffn == FFNConfig(expert_widths=(64, 128), num_experts=4, placement="contiguous") and hash(ffn)
    assert LossConfig(group_cost_weights=[1, 2.5]).group_cost_weights == (1, 2.5)
    with pytest.raises(ConfigError, match=r"^num_experts='8': expected an integer"):
        FFNConfig(num_experts="8")
    with pytest.raises(ConfigError, match=r"^init_std='0.1': expected a number"):
        RouterConfig(init_std="0.1")
