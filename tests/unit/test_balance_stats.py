"""Balance losses under global-batch statistics do not depend on how a batch is split (docs/method.md §5.5).

One global batch of 8 sequences, one step, four layouts: one process with the whole batch, one process with
``grad_accum`` 4, two FSDP2 data-parallel ranks with ``grad_accum`` 2, expert parallelism 2 x FSDP 2 on four ranks.
Under ``balance_stats: global_batch`` the loss and every gradient equal the whole batch's (to the tolerance of the
other gloo equivalence tests: only the order of sums differs); under ``micro_batch`` (the release) they differ,
which is what the option is for. One 2-process and one 4-process launch (about 30 s on 2 cores).
"""

import json
import random
from pathlib import Path

import numpy as np
import pytest
import torch
from balance_support import balance_step, global_batch
from dist_support import DATA, rel, run_dict, torchrun, write

from mohge.config import ConfigError, RunConfig
from mohge.data import DataConfig, prepare
from mohge.model import LanguageModel
from mohge.model.moe import MoELayer
from mohge.train.runtime import Runtime
from mohge.train.step import set_global_balance

WORKER = Path(__file__).with_name("balance_worker.py")
LOSS_RTOL = 1e-5
GRAD_RTOL, GRAD_ATOL = 1e-4, 1e-7
ONE = Runtime(0, 1, torch.device("cpu"), None)
# (name, processes, sequences per rank, grad_accum, train.parallel)
SPLITS = [("accum4", 1, 8, 4, {}), ("dp2_accum2", 2, 4, 2, {"dp_shard": -1, "ep": 1}),
          ("ep2_dp2", 4, 2, 1, {"dp_shard": -1, "ep": 2})]  # fmt: skip


def balance_run(stats: str, batch_size: int, grad_accum: int, family: str = "mohge", **parallel) -> dict:
    """A tiny run whose balance losses weigh in (coefficients 0.1, L_G on), with ``loss.balance_stats`` ``stats``,
    ``batch_size`` sequences per rank in ``grad_accum`` micro-batches."""
    run = run_dict(2, **parallel)  # 2 steps: warm-up must be shorter than the run
    run["train"].update(batch_size=batch_size, grad_accum=grad_accum)
    run["loss"] = {"balance_stats": stats, "expert_aux_coeff": 0.1, "group_aux_coeff": 0.1,
                   "group_aux_start_frac": 0.0, "hmoe_penalty_coeff": 0.1}  # fmt: skip
    if family != "mohge":
        run["family"] = family
        run["model"]["ffn"].update(kind=family, expert_widths=[32] if family == "moe" else [16, 32, 48, 64])
        if family == "moe":
            run["model"]["ffn"]["placement"] = "contiguous"
    return run


def one_process(run: dict, data_dir) -> dict:
    cfg = RunConfig.from_dict(run)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    random.seed(cfg.train.seed)
    np.random.seed(cfg.train.seed)
    torch.manual_seed(cfg.train.seed)
    model = LanguageModel(cfg.model, cfg.loss)
    loss = balance_step(model, cfg, *global_batch(cfg, data_dir, 1), ONE)
    torch.set_num_threads(threads)
    return {"loss": loss, "grads": {k: p.grad.clone() for k, p in model.named_parameters()}}


@pytest.fixture(scope="module")
def layouts(tmp_path_factory):
    """{stats: {layout: {"loss", "grads"}}} for both statistics and all four layouts."""
    root = tmp_path_factory.mktemp("balance")
    prepare(DataConfig.from_dict(DATA), root / "data")
    out = {
        stats: {"whole": one_process(balance_run(stats, 8, 1), root / "data")}
        for stats in ("global_batch", "micro_batch")
    }
    for name, procs, rows, accum, par in SPLITS:
        runs = [balance_run(stats, rows, accum, **par) for stats in out]
        if procs == 1:
            for stats, run in zip(out, runs, strict=True):
                out[stats][name] = one_process(run, root / "data")
            continue
        configs = [str(write(root / f"{name}-{stats}.json", run)) for stats, run in zip(out, runs, strict=True)]
        result = root / f"{name}.pt"
        torchrun(procs, [str(WORKER), str(root / "data"), str(result), *configs], cwd=root)
        for stats, r in zip(out, torch.load(result, weights_only=True), strict=True):
            out[stats][name] = r
    return out


@pytest.mark.multiprocess
@pytest.mark.parametrize("split", [s[0] for s in SPLITS])
def test_global_batch_loss_and_gradients_do_not_depend_on_the_split(layouts, split):
    want, got = layouts["global_batch"]["whole"], layouts["global_batch"][split]
    assert rel(got["loss"], want["loss"]) < LOSS_RTOL, (got["loss"], want["loss"])
    assert got["grads"].keys() == want["grads"].keys()
    for name, g in want["grads"].items():
        torch.testing.assert_close(got["grads"][name], g, rtol=GRAD_RTOL, atol=GRAD_ATOL, msg=name)


@pytest.mark.multiprocess
@pytest.mark.parametrize("split", [s[0] for s in SPLITS])
def test_per_micro_batch_statistics_depend_on_the_split(layouts, split):
    """The release's statistics: the same batch split differently is a different loss with different router
    gradients (the H0 'the split does not matter' is refuted for every split)."""
    want, got = layouts["micro_batch"]["whole"], layouts["micro_batch"][split]
    assert rel(got["loss"], want["loss"]) > 100 * LOSS_RTOL, (got["loss"], want["loss"])
    assert router_gradients_differ(got, want)


def router_gradients_differ(got: dict, want: dict) -> bool:
    """Some router weight's gradient differs by 100 times the equivalence tolerance."""
    router = [k for k in want["grads"] if "router" in k]
    assert router
    return any(
        not torch.allclose(got["grads"][k], want["grads"][k], rtol=100 * GRAD_RTOL, atol=100 * GRAD_ATOL)
        for k in router
    )


@pytest.mark.multiprocess
def test_one_whole_batch_is_the_same_step_under_either_statistics(layouts):
    a, b = layouts["global_batch"]["whole"], layouts["micro_batch"]["whole"]
    assert a["loss"] == b["loss"]
    assert all(torch.equal(a["grads"][k], b["grads"][k]) for k in a["grads"])


@pytest.mark.parametrize("family", ["moe", "hmoe"])
def test_flat_router_losses_under_global_batch_do_not_depend_on_grad_accum(tmp_path, family):
    prepare(DataConfig.from_dict(DATA), tmp_path / "data")
    whole = one_process(balance_run("global_batch", 8, 1, family), tmp_path / "data")
    accum = one_process(balance_run("global_batch", 8, 4, family), tmp_path / "data")
    micro = one_process(balance_run("micro_batch", 8, 4, family), tmp_path / "data")
    assert rel(accum["loss"], whole["loss"]) < LOSS_RTOL
    for name, g in whole["grads"].items():
        torch.testing.assert_close(accum["grads"][name], g, rtol=GRAD_RTOL, atol=GRAD_ATOL, msg=name)
    assert router_gradients_differ(micro, whole)


def test_global_counts_are_cleared_for_a_single_split():
    cfg = RunConfig.from_dict(balance_run("global_batch", 8, 1))
    model = LanguageModel(cfg.model, cfg.loss)
    for layer in model.modules():
        if isinstance(layer, MoELayer):
            layer.balance_counts = torch.ones(12)
    set_global_balance(model, [torch.zeros(8, 16, dtype=torch.long)], ONE, None)
    assert all(m.balance_counts is None for m in model.modules() if isinstance(m, MoELayer))


def test_global_batch_with_the_per_group_expert_loss_is_refused():
    run = balance_run("global_batch", 8, 1)
    run["loss"]["expert_aux_mode"] = "per_group"
    with pytest.raises(ConfigError, match="loss.balance_stats"):
        RunConfig.from_dict(run)


def test_the_trainer_steps_under_global_batch_statistics_do_not_depend_on_grad_accum(tmp_path):
    """The training loop sets the global counts before its micro-batches: two steps (the second after an AdamW
    update by the first step's gradients) log the same loss with the batch in 1 and in 4 micro-batches."""
    from conftest import train_tiny

    losses = []
    for accum in (1, 4):
        run = balance_run("global_batch", 8, accum)
        run["train"].update(log_every=1, ckpt_every=2)
        model_dir, _ = train_tiny(tmp_path / f"accum{accum}", run)
        rows = [json.loads(line) for line in (model_dir / "train_log.jsonl").read_text().splitlines()]
        losses.append([r["loss"] for r in rows if "loss" in r])
    assert len(losses[0]) == 2
    for a, b in zip(*losses, strict=True):
        assert rel(b, a) < LOSS_RTOL, losses
