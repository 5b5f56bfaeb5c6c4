"""Routing traces: the documented keys, counts that add up to T*K per layer, levels, the replay .npz."""

import json
from pathlib import Path

import numpy as np
import pytest
from conftest import tiny_run, train_tiny

from mohge import traces
from mohge.data import DataConfig, TokenStream, prepare
from mohge.evaluate import main as evaluate_main

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


def test_trace_npz_replay_arrays(run, tmp_path):
    model, data = run
    trace = traces.write_trace(model, data, tmp_path / "t.json")
    z = np.load(tmp_path / "t.npz")
    n = 2 * 4 * 16  # trace_batches full batches of batch_size x seq_len
    assert sorted(z.files) == ["gates_0", "gates_1", "idx_0", "idx_1", "levels"]
    assert z["idx_0"].shape == (n, 2) and z["idx_0"].dtype == np.int32
    assert z["gates_1"].dtype == np.float32 and np.allclose(z["gates_1"].sum(1), 1.0, atol=1e-5)
    assert z["levels"].shape == (n,)
    assert trace["layers"][0]["counts"] == json.loads((tmp_path / "t.json").read_text())["layers"][0]["counts"]


def test_trace_without_levels_and_max_batches(run, tmp_path):
    model, _ = run
    words = "the cat and the dog sat on a mat while birds sang in trees above quiet rivers".split()
    (tmp_path / "t.txt").write_text("\n".join(" ".join(words[i:] + words[:i]) for i in range(200)))
    plain = DataConfig.from_dict(
        {"source": "text", "text_files": [str(tmp_path / "t.txt")], "vocab_size": 300, "seq_len": 16}
    )
    prepare(plain, tmp_path / "plain")
    from mohge.checkpoint import load_trained

    cfg, net = load_trained(model)
    trace, raw = traces.collect_trace(net, cfg, tmp_path / "plain", batch_size=4, max_batches=1, keep_batches=0)
    assert trace["tokens"] == 4 * 16 and raw == {}
    assert all(sum(r["counts"]) == 4 * 16 * 2 and r["counts_by_level"] == {} for r in trace["layers"])
