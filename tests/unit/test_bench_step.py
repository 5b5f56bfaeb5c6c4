"""The CPU training step's speed-ups train the numbers of the step before them bit for bit, and ``mohge bench step``
(this checkout against a baseline commit, each in its own process) writes the record docs/speed.md quotes.

The step before them, where it differs, is rebuilt here from what it ran: RoPE through ``apply_rope`` on q and k, and
AdamW's single-tensor loop (torch's default on a CPU). The row gathers of the expert path (``index_select`` for
indexing) and the allocator setting are copies and memory, no arithmetic. The whole step of the baseline commit
against this checkout is the committed record's ``identical`` (losses of every step, and the weights and optimizer
state after the last, equal bit for bit).
"""

import dataclasses
import json
from pathlib import Path

import pytest
import torch
from mohge_studies.bench import main
from mohge_studies.bench import step as bench_step
from mohge_studies.bench.step_worker import PARTS

from mohge.config import load_run_config, preflight
from mohge.model import transformer
from mohge.model.transformer import apply_rope, rope_qkv, rope_tables
from mohge.train import trainer
from mohge.train.parallelism import Replicated
from mohge.train.runtime import Runtime, keep_freed_memory, set_deterministic
from mohge.train.step import WindowMeter, bias_balanced, build_optimizer, lr_at

ROOT = Path(__file__).resolve().parents[2]
RUNS = ROOT / "results" / "capacity" / "runs"
RECORD = ROOT / "results" / "bench" / "train_small_cpu.json"


def todays_rope(x_BS3HD, cos_SF, sin_SF):
    q, k, v = x_BS3HD.permute(2, 0, 3, 1, 4)
    return apply_rope(q, cos_SF, sin_SF), apply_rope(k, cos_SF, sin_SF), v


def todays_optimizer(model, tc, fused=False):
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        (no_decay if p.ndim < 2 or name.startswith("embed.") else decay).append(p)
    groups = [{"params": decay, "weight_decay": tc.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=lr_at(0, tc), betas=(tc.beta1, tc.beta2), eps=1e-8, foreach=False)


def train_steps(cfg, steps: int, make_optimizer) -> tuple[list[float], dict[str, torch.Tensor]]:
    """The trainer's own step (``mohge.train.trainer._step``, with the log window and a log row every
    ``train.log_every`` steps) on seeded random batches: every step's loss, and the final weights."""
    tc = cfg.train
    rt = Runtime(0, 1, torch.device("cpu"), None)
    threads, deterministic = torch.get_num_threads(), torch.are_deterministic_algorithms_enabled()
    torch.set_num_threads(1)
    set_deterministic(True)
    try:
        torch.manual_seed(tc.seed)
        par = Replicated(cfg, rt, Path("/nonexistent"))
        model = par.build().train()
        opt = make_optimizer(model, tc)
        gen = torch.Generator().manual_seed(tc.seed)
        S = cfg.data_config.seq_len
        meter, losses = WindowMeter(), []
        for s in range(steps):
            b = torch.randint(0, cfg.model.vocab_size, (tc.batch_size, S + 1), generator=gen)
            vals = trainer._step(s, par, opt, (b[:, :-1], b[:, 1:]), meter, bias_balanced(model), None)
            meter.add_step(vals, tc.batch_size * S, 1.0)
            if (s + 1) % tc.log_every == 0:
                meter.row(s, lr_at(s, tc), cfg, rt, 0)
                meter = WindowMeter()
            losses.append(vals["loss"])
        return losses, {k: v.clone() for k, v in model.state_dict().items()}
    finally:
        torch.set_num_threads(threads)
        set_deterministic(deterministic)


@pytest.mark.parametrize("run", ["facts-mohge-best_renorm_lr5e3-s10", "facts-moe-best_lr5e3-s10"])
def test_the_fast_step_trains_the_numbers_of_todays_step_bit_for_bit(run, monkeypatch):
    cfg = load_run_config(RUNS / run / "config.json")  # d_model 32, the capacity study's MoHGE and MoE-15
    cfg = dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, batch_size=256, log_every=3))
    fast_losses, fast_weights = train_steps(cfg, 6, build_optimizer)
    monkeypatch.setattr(transformer, "rope_qkv", todays_rope)
    today_losses, today_weights = train_steps(cfg, 6, todays_optimizer)
    assert fast_losses == today_losses
    assert fast_weights.keys() == today_weights.keys()
    assert all(torch.equal(fast_weights[k], today_weights[k]) for k in fast_weights)
    assert len(set(fast_losses)) == 6  # it trained


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape", [(3, 7, 2, 4), (2, 5, 4, 8), (2, 5, 4, 16), (1, 1, 1, 6)])
def test_rope_of_q_and_k_together_is_apply_ropes_arithmetic_forward_and_backward(shape, dtype):
    B, S, H, Dh = shape
    cos, sin = rope_tables(S + 3, Dh, 10000.0)
    y = torch.randn(B, S, 3 * H * Dh, dtype=dtype, requires_grad=True)
    grads = [torch.randn(B, H, S, Dh, dtype=dtype) for _ in range(3)]
    want = todays_rope(y.view(B, S, 3, H, Dh), cos, sin)
    got = rope_qkv(y.view(B, S, 3, H, Dh), cos, sin)
    for w, g in zip(want, got, strict=True):
        assert torch.equal(w, g) and w.stride() == g.stride() and w.storage_offset() == g.storage_offset()
    (dwant,) = torch.autograd.grad(want, y, grads)
    (dgot,) = torch.autograd.grad(got, y, grads)
    assert torch.equal(dwant, dgot)
    (dwant,) = torch.autograd.grad(todays_rope(y.view(B, S, 3, H, Dh), cos, sin)[1].sum(), y)  # k alone: zeros else
    (dgot,) = torch.autograd.grad(rope_qkv(y.view(B, S, 3, H, Dh), cos, sin)[1].sum(), y)
    assert torch.equal(dwant, dgot) and torch.equal(dgot.signbit(), dwant.signbit())


def test_the_allocator_setting_is_taken_where_glibc_runs():
    import platform

    assert keep_freed_memory() == (platform.libc_ver()[0] == "glibc")


def test_the_command_times_two_checkouts_and_writes_its_record(tmp_path):
    raw = json.loads((RUNS / "facts-mohge-best_renorm_lr5e3-s10" / "config.json").read_text())
    raw["train"]["batch_size"] = 64
    config = tmp_path / "small.json"
    config.write_text(json.dumps(raw))
    out = tmp_path / "rec.json"
    argv = ["step", "--baseline-tree", str(ROOT), "--config", str(config), "--steps", "2", "--warmup", "1"]
    argv += ["--repeats", "1"]
    assert main([*argv, "--parts", "1", "--kernels", "1", "--json", str(out)]) == 0
    rec = json.loads(out.read_text())
    assert rec["bench"] == "step" and rec["clock"] == "thread_time" and rec["threads"] == 1
    assert set(rec["host"]) >= {"cpu", "cpu_capability", "matrix_units", "torch", "python"}
    assert rec["host"]["cpu_capability"] == torch.backends.cpu.get_cpu_capability()
    assert set(rec["loadavg"]) == {"start", "end"} and rec["baseline"]["commit"] == rec["new"]["commit"]
    (run,) = rec["runs"]
    assert run["tokens_per_step"] == 64 * 5 and all(len(run["times"][r]) == 2 for r in ("baseline", "control", "new"))
    assert len(run["losses"]["new"]) == 3 and run["identical"] and rec["identical"]  # the same tree three times
    assert run["ratio"] == pytest.approx(run["step_seconds"]["baseline"] / run["step_seconds"]["new"])
    assert run["control_ratio"] == pytest.approx(run["step_seconds"]["baseline"] / run["step_seconds"]["control"])
    assert len(run["ratio_per_repeat"]) == rec["repeats"] == 1
    parts = run["parts_ms"]["new"]
    assert set(parts) == {*PARTS, "aten", "step"} and parts["attention kernel"] < parts["attention"]
    assert sum(parts[p] for p in PARTS if p != "attention kernel") == pytest.approx(parts["aten"])
    assert run["ops"]["new"]["ops_ms"]["mm"] > 0
    assert run["kernel_steps"] == 1 and set(run["kernels"]) == {"baseline", "new"}
    k = run["kernels"]["new"]
    assert set(k["groups"]) == set(bench_step.KERNEL_GROUPS) and k["self_ms"]["aten::mm"] > 0
    assert k["groups"]["GEMMs"] == pytest.approx(sum(k["self_ms"].get(g, 0.0) for g in bench_step.GEMMS))
    assert k["groups"]["compiled kernels"] == 0 and k["calls"]["aten::mm"] >= 1  # the eager path compiles nothing


@pytest.mark.skipif(preflight.cpp_compiler() is None, reason="no C++ compiler for torch.compile here")
@pytest.mark.xdist_group("fused_path")
def test_under_the_workers_part_and_op_timers_the_fused_path_runs_compiled_and_goes_on_compiling():
    """The fused path's step timed part by part and op by op, as the worker times it before its kernels: its compiled
    graphs run compiled (the short windows' softmax, inside the compiled attention half, is no op of the timers), and
    torch.compile goes on compiling after them: a new batch size gets its own graphs."""
    from mohge_studies.bench.step_worker import op_times, part_times
    from torch._dynamo.utils import counters

    from mohge.train.step import use_fused_path

    cfg = load_run_config(RUNS / "facts-mohge-best_renorm_lr5e3-s10" / "config.json")
    rt = Runtime(0, 1, torch.device("cpu"), None)

    def fused_step(batch: int):
        c = dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, batch_size=batch, fused=True))
        par = Replicated(c, rt, Path("/nonexistent"))
        model = par.build().train()
        use_fused_path(model, c.train)
        opt, meter = build_optimizer(model, c.train), WindowMeter()
        b = torch.randint(0, c.model.vocab_size, (batch, c.data_config.seq_len + 1))
        args = (0, par, opt, (b[:, :-1], b[:, 1:]), meter, bias_balanced(model), None)
        return model, opt, par, meter, args

    model, opt, par, meter, args = fused_step(24)
    trainer._step(*args)  # compiles
    parts = part_times(model, opt, par, meter, lambda: trainer._step(*args), 1)
    ops = op_times(trainer._step, *args)
    assert ops["ops_ms"]["mm"] > 0 and "_softmax" not in ops["ops_ms"]
    assert 0 < parts["aten"] < parts["step"] and parts["attention"] == 0  # the attention half: one compiled graph
    assert parts["experts"] > parts["router"] > 0  # the experts' GEMMs, forward and backward, by the fused function
    graphs = counters["stats"]["unique_graphs"]
    trainer._step(*fused_step(40)[-1])
    assert counters["stats"]["unique_graphs"] > graphs


def test_profiler_keys_fall_in_the_group_of_what_they_compute():
    kernel_group = bench_step.kernel_group
    assert kernel_group("aten::mm") == kernel_group("aten::addmm_") == "GEMMs"
    assert kernel_group("graph_1_cpp_fused__softmax_bitwise_not_clone_div_2") == "compiled kernels"
    assert kernel_group("mohge::topk_indices") == "custom ops"
    assert kernel_group("aten::exp") == "other aten ops" and kernel_group("aten::mul_") == "other aten ops"
    for key in ("_ClassSwiGLUBackward", "CompiledFunction", "Optimizer.step#AdamW.step", "graph_4"):
        assert kernel_group(key) == "Python and nodes"


def test_bad_counts_are_refused_before_any_work(capsys):
    with pytest.raises(SystemExit):
        main(["step", "--baseline", "HEAD", "--steps", "0"])
    assert "--steps and --repeats must be at least 1" in capsys.readouterr().err


NAMES = {"mohge": "MoHGE", "moe": "MoE-15", "moe_equal": "MoE-12"}


def doc_rows(rec: dict) -> list[str]:
    """The rows docs/speed.md shows from the record: tokens/s per run config, then where a step's time goes."""
    rows = []
    for run in rec["runs"]:
        tps = run["tokens_per_s"]
        rows.append(
            (
                f"| {NAMES[run['family']]} | {run['d_model']} | {tps['baseline']:,.0f} | {tps['new']:,.0f} | "
                f"**{run['ratio']:.2f}×** | {run['control_ratio']:.2f} | {'yes' if run['identical'] else 'NO'} |"
            ).replace(",", " ")
        )
    for run in rec["runs"]:
        if run["family"] != "moe_equal":
            rows.append(part_row(run))
    return rows


def part_row(run: dict) -> str:
    """One model's parts, baseline → this checkout, in ms: the step with the timer on, each part, and the rest (Python
    and the timer's own cost)."""
    base, new = (run["parts_ms"][side] for side in ("baseline", "new"))
    cols = ["step", "attention", "attention kernel", "router", "experts", "head and loss", "optimizer"]
    cells = [f"{base[c]:.0f} → {new[c]:.0f}" for c in cols]
    small = [p["embedding"] + p["other"] for p in (base, new)]
    rest = [p["step"] - p["aten"] for p in (base, new)]
    cells += [f"{small[0]:.0f} → {small[1]:.0f}", f"{rest[0]:.0f} → {rest[1]:.0f}"]
    return f"| {NAMES[run['family']]} {run['d_model']} | " + " | ".join(cells) + " |"


def test_speed_doc_quotes_the_recorded_step_benchmark():
    rec = json.loads(RECORD.read_text())
    text = " ".join((ROOT / "docs" / "speed.md").read_text().split())  # prose lines joined
    rows = (ROOT / "docs" / "speed.md").read_text().splitlines()
    for row in doc_rows(rec):
        assert row in rows, row
    host = rec["host"]
    assert f"{host['cpu']}, ATen CPU capability {host['cpu_capability']}" in text
    assert f"torch {host['torch']}" in text and all(u in text for u in ("amx_bf16", "avx512_bf16"))
    assert rec["identical"] and f"`{rec['baseline']['commit'][:8]}`" in text
    assert set(bench_step.DEFAULT_CONFIGS) == {r["config"] for r in rec["runs"]}
    (mohge32,) = (r for r in rec["runs"] if r["family"] == "mohge" and r["d_model"] == 32)
    calls = round(sum(mohge32["ops"]["new"]["calls"].values()), -2)
    tokens, batch = mohge32["tokens_per_step"], mohge32["setup"]["batch"]
    heads, groups = mohge32["setup"]["n_heads"], len(mohge32["setup"]["widths"])

    def n(x: float) -> str:  # thousands apart by a space, as the docs write them
        return f"{x:,.0f}".replace(",", " ")

    for words in (
        f"the median of {rec['timed_steps'] * rec['repeats']} steps each, {rec['repeats']} times {rec['timed_steps']}",
        f"the median of {mohge32['part_steps']} steps each under an op timer",
        f"about {n(calls)} aten calls a step",
        f"A step of {n(tokens)} tokens",
        f"solves {n(batch * heads)} separate",
        f"normalises {n(tokens * groups)} rows of {mohge32['setup']['experts'] // groups} experts",
        f"kernels over [{n(tokens)}, 514] tensors",
    ):
        assert words in text, words
    ratios = {(r["family"], r["d_model"]): r["ratio"] for r in rec["runs"]}
    target = (
        f"**{ratios['mohge', 32]:.2f}×** MoHGE, {ratios['moe', 32]:.2f}× MoE-15, {ratios['moe_equal', 32]:.2f}× MoE-12 "
        f"at d_model 32; {ratios['mohge', 64]:.2f}× MoHGE, {ratios['moe', 64]:.2f}× MoE-15 at 64 (eager, bit for bit)"
    )
    assert target in text and max(ratios.values()) < 2
