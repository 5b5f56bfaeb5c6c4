"""lm-eval from its own tools: `lm_eval --model hf` on the exported model and `python -m mohge.lm_eval --model
mohge` on the trained folder give equal scores on the shipped local tasks; the adapter's model_args, device
fallback and batched generation; the task YAMLs load as shipped with --include_path."""

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import ROOT, tiny_run, train_tiny

from mohge import evaluate as ev
from mohge import hf_export
from mohge.tokenizer import EOT_ID, encode

TASKS = ("mohge_ppl", "mohge_cloze", "mohge_graded_hard", "mohge_graded_medium")
TASK_CONFIGS = ROOT / "configs" / "tasks"
OFFLINE = {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}


class Req:
    """The part of lm-eval's Instance the adapter reads."""

    def __init__(self, *args):
        self.args = args


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("routes")
    model, data = train_tiny(root, tiny_run(data={"seq_len": 24, "graded_num_docs": 200}))
    hf_export.export(model, root / "hf")
    ev.build_tasks(data, root / "work" / "mohge_tasks")
    return {"root": root, "model": model, "data": data, "hf": root / "hf", "tasks": root / "work" / "mohge_tasks"}


@pytest.fixture(scope="module")
def lm(trained):
    from mohge.lm_eval_model import MoHGELM

    return MoHGELM(str(trained["model"]), device="cpu", batch_size=4, max_gen_toks=6)


def _scores(out: Path) -> tuple[dict, dict]:
    """(results per task, per-task list of the filtered responses of every sample, in doc order)."""
    (results,) = out.rglob("results_*.json")
    samples = {}
    for task in TASKS:
        (path,) = out.rglob(f"samples_{task}_*.jsonl")
        rows = sorted((json.loads(x) for x in path.read_text().splitlines()), key=lambda r: r["doc_id"])
        samples[task] = [r["filtered_resps"] for r in rows]
    return json.loads(results.read_text())["results"], samples


def _flat(x) -> list[float]:
    """Every number in a sample's responses (lm-eval may store them as strings); booleans are left out."""
    if isinstance(x, list | tuple):
        return [v for item in x for v in _flat(item)]
    if isinstance(x, bool):
        return []
    try:
        return [float(x)]
    except (TypeError, ValueError):
        return []


@pytest.mark.slow  # two real lm-eval processes, each indexing lm-eval's built-in tasks: about a minute here
def test_hf_route_and_mohge_route_give_equal_scores(trained):
    """The two command lines run side by side: lm-eval's own `lm_eval` on the HF export (documents from the
    default ./mohge_tasks of the working directory) and `python -m mohge.lm_eval` on the trained folder
    (documents named by --metadata)."""
    common = ["--include_path", str(TASK_CONFIGS), "--tasks", ",".join(TASKS), "--limit", "3", "--log_samples"]
    common += ["--device", "cpu"]
    hf_cmd = [str(Path(sys.executable).parent / "lm_eval"), "--model", "hf"]
    hf_cmd += ["--model_args", f"pretrained={trained['hf']},trust_remote_code=True", "--output_path", "out_hf"]
    mohge_cmd = [sys.executable, "-m", "mohge.lm_eval", "--model", "mohge"]
    mohge_cmd += ["--model_args", f"pretrained={trained['model']}", "--output_path", "out_mohge"]
    mohge_cmd += ["--metadata", json.dumps({"task_data": str(trained["tasks"])})]
    env = {**os.environ, **OFFLINE}
    work = trained["tasks"].parent
    procs = [
        subprocess.Popen(cmd + common, cwd=work, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for cmd in (hf_cmd, mohge_cmd)
    ]
    logs = [p.communicate(timeout=600)[0] for p in procs]
    for p, log in zip(procs, logs, strict=True):
        assert p.returncode == 0, log[-3000:]
    (hf_res, hf_samples), (mohge_res, mohge_samples) = _scores(work / "out_hf"), _scores(work / "out_mohge")
    assert set(hf_res) == set(mohge_res) == set(TASKS)
    for task in TASKS:
        keys = [k for k, v in hf_res[task].items() if isinstance(v, float) and "stderr" not in k]
        assert keys and set(keys) <= set(mohge_res[task])
        for k in keys:
            assert math.isclose(hf_res[task][k], mohge_res[task][k], rel_tol=1e-6), (task, k)
        a, b = _flat(hf_samples[task]), _flat(mohge_samples[task])
        assert len(a) == len(b) > 0
        assert all(math.isclose(x, y, rel_tol=1e-6, abs_tol=1e-9) for x, y in zip(a, b, strict=True)), task
    assert math.isfinite(hf_res["mohge_ppl"]["bits_per_byte,none"])


def test_unknown_model_args_are_refused(trained):
    from mohge.lm_eval_model import MoHGELM

    for arg in ("dtype=bfloat16", "max_lenght=16"):
        with pytest.raises(ValueError, match=arg.split("=")[0]):
            MoHGELM.create_from_arg_string(f"pretrained={trained['model']},{arg}", {"device": "cpu"})
    with pytest.raises(ValueError, match="max_length"):
        MoHGELM.create_from_arg_string(f"pretrained={trained['model']},max_length=4096", {"device": "cpu"})
    ok = MoHGELM.create_from_arg_string(f"pretrained={trained['model']},max_length=16", {"batch_size": "auto"})
    assert ok.max_length == 16 and ok.batch_size == 16


def test_a_cuda_device_falls_back_to_the_cpu_without_cuda(trained, monkeypatch, caplog):
    from mohge.lm_eval_model import MoHGELM

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    lm = MoHGELM.create_from_arg_string(f"pretrained={trained['model']}", {"device": "cuda:0", "batch_size": 1})
    assert lm.device == torch.device("cpu") and next(lm.model.parameters()).device.type == "cpu"
    assert "CUDA is not available" in caplog.text


@torch.no_grad()
def _greedy_reference(lm, context: str, until: list[str], max_new: int) -> str:
    """Greedy decoding with mohge's own model, recomputing the whole sequence every step (no cache, no batch)."""
    ids, new, text = encode(lm.tok, context)[-(lm.max_length - max_new) :], [], ""
    for _ in range(max_new):
        nxt = int(lm.model(torch.tensor([ids + new])).logits[0, -1].argmax())
        if nxt == EOT_ID:
            break
        new.append(nxt)
        text = lm.tok_decode(new)
        if any(u in text for u in until):
            break
    for u in until:
        text = text.split(u, 1)[0]
    return text


def test_batched_cached_generation_equals_unbatched_greedy(lm):
    contexts = ["1+1=", "the dogs see a cat.\n", "a", "12+5=17\n30+4=", "the cat", "x" * 30]
    reqs = [Req(c, {"until": ["\n"] if i % 2 else [], "max_gen_toks": 6}) for i, c in enumerate(contexts)]
    batched = lm.generate_until(reqs)
    assert batched == [_greedy_reference(lm, r.args[0], r.args[1]["until"], 6) for r in reqs]
    assert any(batched)  # a model that says nothing would make the comparison empty
    lm.batch_size = 1
    try:
        assert lm.generate_until(reqs) == batched
    finally:
        lm.batch_size = 4
    with pytest.raises(ValueError, match="max_gen_toks"):
        lm.generate_until([Req("a", {"max_gen_toks": lm.max_length})])


def test_shipped_task_yamls_load_with_include_path(trained, monkeypatch):
    from lm_eval.tasks import TaskManager

    for path in TASK_CONFIGS.glob("mohge_*.yaml"):
        assert "@TASK_DATA@" not in path.read_text(), path
    manager = TaskManager(include_path=str(TASK_CONFIGS), include_defaults=False, metadata=dict(OFFLINE))
    monkeypatch.chdir(trained["tasks"].parent)  # the documented default: ./mohge_tasks
    counts = json.loads((trained["tasks"] / "tasks.json").read_text())["docs"]
    assert set(counts) == set(ev.LOCAL_TASKS) - {ev.FACTS_TASK}  # mohge_facts: facts data only (test_facts.py)
    loaded = manager.load(list(counts))["tasks"]
    assert {name: len(list(task.test_docs())) for name, task in loaded.items()} == counts
    monkeypatch.chdir(trained["root"])  # elsewhere: the folder named by the task_data metadata
    named = TaskManager(
        include_path=str(TASK_CONFIGS), include_defaults=False, metadata={"task_data": "work/mohge_tasks"}
    )
    assert len(list(named.load(["mohge_cloze"])["tasks"]["mohge_cloze"].test_docs())) == counts["mohge_cloze"]
    with pytest.raises(FileNotFoundError, match="mohge_tasks"):
        TaskManager(include_path=str(TASK_CONFIGS), include_defaults=False).load(["mohge_ppl"])
