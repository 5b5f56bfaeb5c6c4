"""Routing traces: the format (one writer, the readers, their errors), synthetic traces, and the tracer of a
trained model (documented keys, counts that add up to T*K per layer, levels, the replay .npz)."""

import json
import re
from pathlib import Path

import numpy as np
import pytest
from conftest import tiny_run, train_tiny

from mohge.data import DataConfig, TokenStream, prepare
from mohge.evaluate import traces
from mohge.evaluate.suite import main as evaluate_main
from mohge.evaluate.traces import (
    TraceError,
    load_replay,
    load_trace,
    replay_arrays,
    routing_from_counts,
    synthetic_trace,
    write_trace,
)

RUN = tiny_run(
    name="tiny-trace",
    model={"n_layers": 3, "ffn": {"num_experts": 12, "dense_layers": 1}},
    train={"steps": 2, "ckpt_every": 2, "log_every": 1},
    eval={"batch_size": 4, "trace_batches": 2},
)
DATA = RUN["data"]
KEYS = {"model", "family", "d_model", "expert_widths", "num_experts", "experts_per_group", "topk", "layers"}


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> tuple[Path, Path]:
    return train_tiny(tmp_path_factory.mktemp("run"), RUN)


def test_trace_keys_and_counts(run, tmp_path):
    model, data = run
    out = tmp_path / "trace.json"
    assert evaluate_main(["trace", "--ckpt", str(model), "--data", str(data), "--out", str(out)]) == 0
    t = json.loads(out.read_text())
    assert KEYS <= set(t)
    assert (t["model"], t["family"], t["d_model"], t["num_experts"], t["experts_per_group"], t["topk"]) == (
        "tiny-trace",
        "mohge",
        32,
        12,
        3,
        2,
    )
    assert t["expert_widths"] == [16, 32, 48, 64]
    T = len(TokenStream.open(data, "test")) - 1  # every target position of the test split, once
    assert t["tokens"] == T
    assert [row["layer"] for row in t["layers"]] == [0, 1]  # the two MoE layers (layer 0 of the net is dense)
    levels = TokenStream.open(data, "test").levels[1:]
    for row in t["layers"]:
        assert set(row) == {"layer", "counts", "group_counts", "counts_by_level"}
        assert len(row["counts"]) == 12 and sum(row["counts"]) == T * 2
        assert row["group_counts"] == [sum(row["counts"][3 * g : 3 * g + 3]) for g in range(4)]
        assert set(row["counts_by_level"]) == {"easy", "medium", "hard"}
        for lv, name in enumerate(("easy", "medium", "hard")):
            assert sum(row["counts_by_level"][name]) == 2 * int((levels == lv).sum())
        per_expert = np.sum([row["counts_by_level"][k] for k in ("easy", "medium", "hard")], axis=0)
        assert (per_expert <= np.array(row["counts"])).all()
    back = load_trace(out)  # what the tracer writes, the reader takes
    assert back.num_experts == 12 and back.layers[1].counts == t["layers"][1]["counts"] and back.topk == 2


def test_trace_npz_replay_arrays(run, tmp_path):
    model, data = run
    trace = traces.trace_checkpoint(model, data, tmp_path / "t.json")
    z = np.load(tmp_path / "t.npz")
    n = 2 * 4 * 16  # trace_batches full batches of batch_size x seq_len
    assert sorted(z.files) == ["gates_0", "gates_1", "idx_0", "idx_1", "levels"]
    assert z["idx_0"].shape == (n, 2) and z["idx_0"].dtype == np.int32
    assert z["gates_1"].dtype == np.float32 and np.allclose(z["gates_1"].sum(1), 1.0, atol=1e-5)
    assert z["levels"].shape == (n,)
    assert trace["layers"][0]["counts"] == json.loads((tmp_path / "t.json").read_text())["layers"][0]["counts"]


def test_the_eval_sections_heldout_batches_bound_the_trace(run, tmp_path):
    """H0 'the trace reads the whole test split whatever eval.heldout_batches says' fails: a run config with
    heldout_batches 1 traces one batch of eval.batch_size sequences; --max-batches 0 reads the whole split."""
    model, data = run
    cfg = json.loads((model / "config.json").read_text())
    cfg["eval"] = {**cfg["eval"], "heldout_batches": 1}
    (tmp_path / "run.json").write_text(json.dumps(cfg))
    one = traces.trace_checkpoint(model, data, tmp_path / "one.json", npz=False, eval_config=tmp_path / "run.json")
    assert one["tokens"] == cfg["eval"]["batch_size"] * cfg["data"]["seq_len"]
    whole = traces.trace_checkpoint(
        model, data, tmp_path / "all.json", npz=False, max_batches=0, eval_config=tmp_path / "run.json"
    )
    assert whole["tokens"] == len(TokenStream.open(data, "test")) - 1


def test_trace_without_levels_and_max_batches(run, tmp_path):
    model, _ = run
    words = "the cat and the dog sat on a mat while birds sang in trees above quiet rivers".split()
    (tmp_path / "t.txt").write_text("\n".join(" ".join(words[i:] + words[:i]) for i in range(200)))
    plain = DataConfig.from_dict(
        {"source": "text", "text_files": [str(tmp_path / "t.txt")], "vocab_size": 300, "seq_len": 16}
    )
    prepare(plain, tmp_path / "plain")
    from mohge.train.checkpoint import load_trained

    cfg, net = load_trained(model)
    trace, raw = traces.collect_trace(net, cfg, tmp_path / "plain", batch_size=4, max_batches=1, keep_batches=0)
    assert trace["tokens"] == 4 * 16 and raw == {}
    assert all(sum(r["counts"]) == 4 * 16 * 2 and r["counts_by_level"] == {} for r in trace["layers"])


def test_synthetic_trace_shares_and_replay():
    pop = [8, 4, 2, 1, 1, 2, 4, 8]
    trace, replay = synthetic_trace(pop, tokens=600, topk=4, noise=0.0, seed=3, num_layers=2)
    assert trace.num_experts == 64 and trace.experts_per_group == 8 and trace.tokens == 600 and trace.topk == 4
    for lay in trace.layers:
        c = np.array(lay.counts).reshape(8, 8)
        assert c.sum() == 2400
        assert (c.max(1) - c.min(1)).max() <= 1  # uniform within groups up to rounding
        np.testing.assert_allclose(c.sum(1) / 2400, np.array(pop) / sum(pop), atol=8 / 2400)
        idx, gates = replay[lay.layer]
        assert idx.shape == gates.shape == (600, 4)
        assert all(len(set(row)) == 4 for row in idx.tolist())  # distinct experts per token
        np.testing.assert_array_equal(np.bincount(idx.ravel(), minlength=64), lay.counts)
        np.testing.assert_allclose(gates.sum(1), 1.0, rtol=1e-6)
    # Exactly uniform when the shares divide: all_size EP=8 is then exactly balanced.
    exact, _ = synthetic_trace([1, 1, 2, 2, 4, 4, 1, 1], tokens=512, topk=4, noise=0.0)
    assert np.array(exact.layers[0].counts).reshape(8, 8).std(1).max() == 0
    noisy, _ = synthetic_trace(pop, tokens=4096, topk=6, noise=0.1, seed=1)
    c = np.array(noisy.layers[0].counts).reshape(8, 8)
    ratio = c / (4096 * 6 * np.array(pop)[:, None] / sum(pop) / 8)  # against the noise-free count
    assert ratio.min() > 0.88 and ratio.max() < 1.12 and ratio.std() > 0.03
    with pytest.raises(ValueError, match="group_popularity"):
        synthetic_trace([1, 2, 3])


def test_routing_from_counts_exact_and_errors():
    counts = [5, 0, 3, 4, 0, 6]
    idx, gates = routing_from_counts(counts, 3, seed=1)
    assert idx.shape == (6, 3)
    np.testing.assert_array_equal(np.bincount(idx.ravel(), minlength=6), counts)
    assert all(len(set(r)) == 3 for r in idx.tolist())
    with pytest.raises(ValueError, match="multiple of topk=4"):
        routing_from_counts(counts, 4)
    with pytest.raises(ValueError, match="more than the T=6"):
        routing_from_counts([7, 5, 6], 3)


def test_trace_round_trip_and_replay(tmp_path):
    trace, replay = synthetic_trace([1, 2, 3, 4], tokens=40, topk=2, expert_widths=[8, 16, 24, 32], experts_per_group=2)
    path = write_trace(trace, tmp_path / "t.json", replay_arrays(replay))
    back = load_trace(path)
    assert back == trace
    rep = load_replay(back)
    np.testing.assert_array_equal(rep[0][0], replay[0][0])
    (tmp_path / "t.npz").unlink()
    assert load_replay(back) is None


@pytest.mark.parametrize(
    "mutate, match",
    [
        (lambda d: d.pop("d_model"), "missing key 'd_model'"),
        (lambda d: d.update(num_experts=10), "num_experts=10 must equal"),
        (lambda d: d["layers"][0].update(counts=[1, 2]), r"layers\[0\]: 'counts' has 2 entries"),
        (lambda d: d["layers"][0]["counts"].__setitem__(0, -1), "non-negative"),
        (lambda d: d.update(layers=[]), "'layers' is empty"),
        (lambda d: d.update(expert_widths=[0, 4]), "expert_widths"),
        (lambda d: d["layers"].append(dict(d["layers"][0])), "duplicate layer"),
    ],
)
def test_bad_traces_name_file_and_key(tmp_path, mutate, match):
    trace, _ = synthetic_trace([1, 1], tokens=8, topk=1, expert_widths=[4, 8], experts_per_group=2)
    data = trace.to_json()
    mutate(data)
    p = tmp_path / "bad.json"
    p.write_text(json.dumps(data))
    with pytest.raises(TraceError, match=match) as err:
        load_trace(p)
    assert "bad.json" in str(err.value)


def test_missing_and_malformed_trace_files(tmp_path):
    with pytest.raises(TraceError, match="nope.json.*does not exist"):
        load_trace(tmp_path / "nope.json")
    (tmp_path / "x.json").write_text("{not json")
    with pytest.raises(TraceError, match="x.json.*not valid JSON"):
        load_trace(tmp_path / "x.json")


def test_reader_accepts_extra_keys_and_int32_replay(tmp_path):
    # mohge.evaluate.traces writes more than the reader needs (family, split, group_counts, counts_by_level, levels).
    trace, replay = synthetic_trace([1, 1], tokens=10, topk=1, expert_widths=[4, 8], experts_per_group=2)
    data = trace.to_json() | {"family": "mohge", "split": "test"}
    data["layers"][0] |= {"group_counts": [5, 5], "counts_by_level": {}}
    (tmp_path / "t.json").write_text(json.dumps(data))
    idx, gates = replay[0]
    np.savez(tmp_path / "t.npz", idx_0=idx.astype(np.int32), gates_0=gates, levels=np.zeros(10, np.int8))
    back = load_trace(tmp_path / "t.json")
    assert back.layers[0].counts == trace.layers[0].counts
    rep = load_replay(back)
    assert rep[0][0].dtype == np.int64 and rep[0][0].tolist() == idx.tolist()


def test_writer_refuses_what_the_reader_would(tmp_path):
    trace, _ = synthetic_trace([1, 1], tokens=8, topk=1, expert_widths=[4, 8], experts_per_group=2)
    data = trace.to_json()
    data["layers"][0]["counts"] = [1, 2]
    with pytest.raises(TraceError, match=re.escape("layers[0]: 'counts' has 2 entries")):
        write_trace(data, tmp_path / "t.json")
    assert not (tmp_path / "t.json").exists()


def test_a_workflow_model_folder_is_traced_with_its_studys_eval_section(run, tmp_path):
    """Without --eval-config, work/<study>/runs/<run> keeps the raw routing of the study's eval.trace_batches
    (results/<study>/runs/<run>/config.json), as the workflow traces it, not the model folder's own."""
    import shutil

    model, data = run
    run_cfg = json.loads((model / "config.json").read_text())
    folder = Path(shutil.copytree(model, tmp_path / "work" / "s" / "runs" / run_cfg["name"]))
    study = tmp_path / "results" / "s" / "runs" / run_cfg["name"]
    study.mkdir(parents=True)
    (study / "config.json").write_text(json.dumps({**run_cfg, "eval": {**run_cfg["eval"], "trace_batches": 1}}))
    traces.trace_checkpoint(folder, data, tmp_path / "t.json")
    assert np.load(tmp_path / "t.npz")["idx_0"].shape[0] == 1 * 4 * 16  # the model folder's own says 2 batches
