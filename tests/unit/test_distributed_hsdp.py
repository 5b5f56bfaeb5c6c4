"""HSDP with expert parallelism on 4 gloo processes: dense weights sharded over 2 ranks and replicated twice,
experts split over ep 2 (one expert shard each), against one process (one 4-process launch, about 30 s)."""

import pytest
import torch
from dist_support import DATA, log_rows, reference, rel, run_dict, torchrun, train_args, write
from safetensors.torch import load_file

from mohge.config import RunConfig
from mohge.data import DataConfig, prepare

pytestmark = pytest.mark.multiprocess  # torchrun or several gloo processes


def test_hsdp_replicate2_shard2_ep2_matches_one_process(tmp_path):
    prepare(DataConfig.from_dict(DATA), tmp_path / "data")
    run = run_dict(3, dp_shard=2, ep=2)
    config = write(tmp_path / "run.json", run)
    torchrun(4, train_args(config, tmp_path / "out", tmp_path / "data"))
    ref = reference(RunConfig.from_dict(run), tmp_path / "data", [4] * 3)
    rows = log_rows(tmp_path / "out")
    for r, want, gn in zip(rows, ref["loss"], ref["grad_norm"], strict=True):
        assert rel(r["loss"], want) < 1e-5 and rel(r["grad_norm"], gn) < 1e-4, (r["step"], r["loss"], want)
    final = load_file(tmp_path / "out" / "model.safetensors")
    for name, want in ref["state"].items():
        torch.testing.assert_close(final[name], want, rtol=1e-4, atol=2e-5, msg=name)
