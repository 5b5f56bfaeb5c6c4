"""lm-eval from its own tools: `lm_eval --model hf` on the exported model and `mohge lm-eval --model
mohge` on the trained folder give the same scores on every local task of the smoke model (tasks built for its
context: no request longer than it, so neither route raises or truncates); the adapter's model_args, device
fallback and batched generation; the task YAMLs load as shipped with --include_path."""

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml
from conftest import ROOT, tiny_run, train_tiny
from mohge_studies.config.runs import merge_config, plan

from mohge.core.knobs import ConfigError, to_dict
from mohge.core.resources import TASKS
from mohge.data.tokenizer import EOT_ID, encode
from mohge.evaluate import hf_export
from mohge.evaluate import suite as ev

TASK_CONFIGS = TASKS  # the shipped task definitions (package data)
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
    ev.build_tasks(data, root / "work" / "mohge_tasks", max_length=24)
    return {"root": root, "model": model, "data": data, "hf": root / "hf", "tasks": root / "work" / "mohge_tasks"}


@pytest.fixture(scope="module")
def smoke(tmp_path_factory) -> dict[str, Path]:
    """configs/smoke.yaml's graded-mohge-s0, trained (12 steps), exported, its tasks built for its context."""
    root = tmp_path_factory.mktemp("smoke")
    config = {}
    for name in ("config.yaml", "smoke.yaml"):
        config = merge_config(config, yaml.safe_load((ROOT / "configs" / name).read_text()))
    run = plan(config, preflight=False)["graded-mohge-s0"]
    model, data = train_tiny(root, to_dict(run))
    hf_export.export(model, root / "hf")
    ev.build_tasks(data, root / "work" / "mohge_tasks", max_length=hf_export.context_length(run))
    return {"root": root, "model": model, "hf": root / "hf", "tasks": root / "work" / "mohge_tasks"}


@pytest.fixture(scope="module")
def lm(trained):
    from mohge.evaluate.lm_eval_adapter import MoHGELM

    return MoHGELM(str(trained["model"]), device="cpu", batch_size=4, max_gen_toks=6)


def _scores(out: Path, tasks) -> tuple[dict, dict]:
    """(results per task, per-task list of the filtered responses of every sample, in doc order)."""
    (results,) = out.rglob("results_*.json")
    samples = {}
    for task in tasks:
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


@pytest.mark.slow  # two real lm-eval processes, each indexing lm-eval's built-in tasks: about two minutes here
def test_hf_route_and_mohge_route_give_equal_scores_on_every_task_of_the_smoke_model(smoke):
    """The two command lines run side by side over every task built for the smoke model, every document: lm-eval's
    own `lm_eval` on the HF export (documents from the default ./mohge_tasks of the working directory) and
    `mohge lm-eval` on the trained folder (documents named by --metadata). Neither raises; accuracies are
    identical and every log-likelihood equal to 1e-6. The tasks had documents longer than the context (dropped by
    the builder, counted in tasks.json): without that, `lm_eval --model hf` stops on an assert."""
    built = json.loads((smoke["tasks"] / "tasks.json").read_text())
    tasks = sorted(built["docs"])
    assert set(tasks) == set(ev.LOCAL_TASKS) - {ev.FACTS_TASK} and built["max_length"] == 32  # facts data only
    assert sum(built["dropped"].values()) > 0  # the smoke model's context is shorter than some documents
    common = ["--include_path", str(TASK_CONFIGS), "--tasks", ",".join(tasks), "--log_samples", "--device", "cpu"]
    hf_cmd = [str(Path(sys.executable).parent / "lm_eval"), "--model", "hf"]
    # logits_cache=False: lm-eval 0.4.13's hf model otherwise shares one forward pass among requests whose context
    # + continuation[:-1] tokens coincide and, where their continuations differ in length, gathers the shorter
    # one's log-probs at the leading positions of the longer one's (on this model: graded_hard doc 14, 0.25 nats)
    hf_args = f"pretrained={smoke['hf']},trust_remote_code=True,logits_cache=False"
    hf_cmd += ["--model_args", hf_args, "--output_path", "out_hf"]
    mohge_cmd = [sys.executable, "-m", "mohge", "lm-eval", "--model", "mohge"]
    mohge_cmd += ["--model_args", f"pretrained={smoke['model']}", "--output_path", "out_mohge"]
    mohge_cmd += ["--metadata", json.dumps({"task_data": str(smoke["tasks"])})]
    env = {**os.environ, **OFFLINE}
    work = smoke["tasks"].parent
    procs = [
        subprocess.Popen(cmd + common, cwd=work, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for cmd in (hf_cmd, mohge_cmd)
    ]
    logs = [p.communicate(timeout=2400)[0] for p in procs]  # minutes on a loaded machine (HFLM: batch size 1)
    for p, log in zip(procs, logs, strict=True):
        assert p.returncode == 0, log[-3000:]
    (hf_res, hf_samples), (mohge_res, mohge_samples) = (_scores(work / o, tasks) for o in ("out_hf", "out_mohge"))
    assert set(hf_res) == set(mohge_res) == set(tasks)
    for task in tasks:
        keys = [k for k, v in hf_res[task].items() if isinstance(v, float) and "stderr" not in k]
        assert keys and set(keys) <= set(mohge_res[task])
        for k in keys:
            if k.startswith("acc"):
                assert hf_res[task][k] == mohge_res[task][k], (task, k)
            else:
                assert math.isclose(hf_res[task][k], mohge_res[task][k], rel_tol=1e-6), (task, k)
        a, b = _flat(hf_samples[task]), _flat(mohge_samples[task])
        assert len(a) == len(b) == len(_flat(hf_samples[task])) > 0
        assert len(hf_samples[task]) == built["docs"][task]  # every document scored
        assert all(math.isclose(x, y, rel_tol=1e-6, abs_tol=1e-9) for x, y in zip(a, b, strict=True)), task
    assert math.isfinite(hf_res["mohge_ppl"]["bits_per_byte,none"])


def test_unknown_model_args_are_refused(trained):
    from mohge.evaluate.lm_eval_adapter import MoHGELM

    for arg in ("torch_dtype=bfloat16", "max_lenght=16", "dtype=float16"):
        with pytest.raises(ValueError, match=arg.split("=")[0]):
            MoHGELM.create_from_arg_string(f"pretrained={trained['model']},{arg}", {"device": "cpu"})
    with pytest.raises(ValueError, match="disagree"):
        MoHGELM.create_from_arg_string(f"pretrained={trained['model']},dtype=float32,precision=bf16", {})
    with pytest.raises(ValueError, match="max_length"):
        MoHGELM.create_from_arg_string(f"pretrained={trained['model']},max_length=4096", {"device": "cpu"})
    ok = MoHGELM.create_from_arg_string(f"pretrained={trained['model']},max_length=16", {"batch_size": "auto"})
    assert ok.max_length == 16 and ok.batch_size == 16


def test_dtype_is_hflms_name_for_precision(trained):
    """`dtype=` as lm-eval's hf model takes it (float32 / bfloat16), an alias of precision."""
    from mohge.evaluate.lm_eval_adapter import MoHGELM

    args = f"pretrained={trained['model']}"
    assert MoHGELM.create_from_arg_string(f"{args},dtype=bfloat16", {"device": "cpu"}).autocast == torch.bfloat16
    assert MoHGELM.create_from_arg_string(f"{args},dtype=float32", {"device": "cpu"}).autocast is None
    assert MoHGELM.create_from_arg_string(f"{args},dtype=bf16,precision=bf16", {}).autocast == torch.bfloat16


def test_lm_eval_help_names_the_mohge_model_and_its_model_args(capsys):
    from mohge.evaluate import harness as cli
    from mohge.evaluate.lm_eval_adapter import MODEL_ARGS

    with pytest.raises(SystemExit) as err:
        cli.main(["--help"])
    out = capsys.readouterr().out
    assert err.value.code == 0 and "--model mohge" in out and "usage: lm-eval" in out
    assert all(f"\n  {arg} " in out for arg in MODEL_ARGS), out


@pytest.mark.parametrize(
    ("args", "own"),
    [
        (["--tasks", "mohge_ppl,mohge_cloze"], True),
        (["run", "-t", "mohge_ppl", "mohge_graded_easy"], True),
        (["--tasks", "mohge_ppl,hellaswag"], False),  # a built-in task: lm-eval's index is needed
        (["--tasks", str(TASKS / "mohge_ppl.yaml")], False),  # a file, resolved by lm-eval itself
        (["--tasks", "mohge_ppl", "--config", "run.yaml"], False),  # the config may name more tasks
        (["ls", "tasks"], False),
        (["--model", "mohge"], False),
    ],
)
def test_builtin_tasks_are_indexed_unless_every_named_task_is_under_the_include_path(args, own):
    from mohge.evaluate import harness as cli

    assert cli._own_tasks_only([*args, "--include_path", str(TASKS)]) is own


def test_inside_the_run_a_task_manager_indexes_no_builtin_task_and_afterwards_it_does():
    """What `mohge lm-eval` changes while lm-eval runs on the shipped tasks alone: a TaskManager built with lm-eval's
    defaults indexes the include path and not lm-eval's own tasks; the default is lm-eval's again afterwards, and
    where the run needs a built-in task nothing changes."""
    from lm_eval.tasks import TaskManager

    from mohge.evaluate import harness as cli

    saved = TaskManager.__init__.__defaults__
    with cli._builtin_tasks_indexed(False):
        inside = set(TaskManager(include_path=str(TASKS)).all_tasks)
    assert "mohge_ppl" in inside and "hellaswag" not in inside
    assert TaskManager.__init__.__defaults__ == saved
    with cli._builtin_tasks_indexed(True):
        assert TaskManager.__init__.__defaults__ == saved


def test_a_cuda_device_falls_back_to_the_cpu_without_cuda(trained, monkeypatch, caplog):
    from mohge.evaluate.lm_eval_adapter import MoHGELM

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


def test_requests_sharing_prefixes_score_as_whole_sequences(lm):
    """H0: running each distinct prefix once (the prefix tree, packed rows) changes a score. Every request is also
    scored alone, as a whole sequence (``share_context=false``): log-likelihoods equal to 1e-5 and the same greedy
    flags, over choices of one token and of several, choices sharing their first tokens, a context cut to the model's
    length, a context of its own, and enough long documents that the tree fills several rows (so rows repeat
    ancestors they do not own), at batch sizes that split the rows of one forward apart."""
    from mohge.evaluate.prefix_tree import PrefixTree

    L = lm.max_length
    gen = torch.Generator().manual_seed(0)
    docs = [
        ([5, 6, 7], [[8], [9], [10, 11], [12, 13, 14]]),
        ([3], [[4, 5], [6], [7, 8, 9]]),
        (list(range(1, L + 6)), [[2], [3, 4]]),  # longer than the context: the left is cut
        ([9, 9, 9, 9, 9], [[1, 2, 3, 4], [1, 2, 3, 5]]),  # choices sharing three tokens
        ([11, 12], [[13]]),  # a context of its own
    ]
    for _ in range(12):  # documents of one template opening, long enough to need several rows
        ctx = [20, 21, 22] + torch.randint(1, 40, (L - 8,), generator=gen).tolist()
        docs.append((ctx, [torch.randint(1, 40, (k,), generator=gen).tolist() for k in (1, 3, 4)]))
    requests = [(None, ctx, cont) for ctx, conts in docs for cont in conts]
    lm.share_context = False
    try:
        alone = [lm._loglikelihood_tokens([r], disable_tqdm=True)[0] for r in requests]
    finally:
        lm.share_context = True
    tree = PrefixTree()
    for _, ctx, cont in requests:
        tree.add((ctx + cont)[-(L + 1) : -1])
    tree.freeze()
    rows = tree.rows(lm.tree_row_contexts * L)
    assert len(rows) > 2 and any(len(r.nodes) > r.owned for r in rows[1:])  # rows that repeat ancestors
    for batch_size in (4, 3, 1):
        lm.batch_size = batch_size
        try:
            shared = lm._loglikelihood_tokens(requests, disable_tqdm=True)
        finally:
            lm.batch_size = 4
        assert [g for _, g in shared] == [g for _, g in alone], batch_size
        for (a, _), (b, _) in zip(alone, shared, strict=True):
            assert math.isclose(a, b, rel_tol=1e-5, abs_tol=1e-5), (batch_size, a, b)


def test_bench_eval_runs_fewer_tokens_sharing_contexts_and_changes_no_accuracy(trained, tmp_path):
    """H0: computing each context once changes an accuracy or runs as many tokens as scoring every request whole.
    ``mohge bench eval`` on the tiny model: equal accuracies, the shared path's real tokens fewer than the whole
    path's, the record's bound their ratio, and the distinct prefixes no more than the shared path runs."""
    from mohge_studies.bench.evaluation import main as bench_eval

    out = tmp_path / "eval.json"
    argv = ["--ckpt", str(trained["model"]), "--data", str(trained["data"]), "--reps", "1", "--json", str(out)]
    assert bench_eval([*argv, "--tasks", "mohge_cloze", "mohge_graded_easy", "--limit", "20"]) == 0
    rec = json.loads(out.read_text())
    assert rec["accuracies_equal"] and rec["max_metric_difference"]["rel"] < 1e-5
    tokens = rec["tokens"]
    assert 0 < tokens["shared"]["real"] < tokens["whole"]["real"] <= tokens["whole"]["padded"]
    assert rec["token_bound"] == tokens["whole"]["real"] / tokens["shared"]["real"] > 1
    assert set(rec["median_s"]) == {"whole", "shared"} and rec["versions"]["lm_eval"]
    # every token the shared path runs is a distinct prefix or a repeat of one: the trie is no larger
    assert 0 < rec["prefix_tokens"] <= tokens["shared"]["real"]
    assert rec["prefix_bound"] == tokens["whole"]["real"] / rec["prefix_tokens"] >= rec["token_bound"]
    for path in ("whole", "shared"):
        assert 0 < rec["median_model_s"][path] < rec["median_s"][path]
    assert rec["bound_at_whole_cost"] > 1


def speed_doc_evaluation_row(rec: dict) -> tuple[str, str]:
    """The measured and explanation cells of docs/speed.md's evaluation row, from results/bench/eval_cpu.json."""
    med, tok, model = rec["median_s"], rec["tokens"], rec["median_model_s"]
    rel = rec["max_metric_difference"]["rel"]
    measured = (
        f"**{rec['speedup_whole_over_shared']:.2f}×** ({med['whole']:.1f} s → {med['shared']:.1f} s of thread CPU "
        f"time, {len(rec['tasks'])} tasks, both paths in one run, interleaved, on an {rec['machine']['cpu']} whose "
        f"ATen CPU capability is {rec['machine']['cpu_capability']}; "
        + ("every metric equal)" if rel == 0 else f"accuracies equal, every other metric within {rel:.1g} relative)")
    )
    verdict = "met" if rec["speedup_whole_over_shared"] >= 3 else "missed"

    def n(x: int) -> str:
        return f"{x:,}".replace(",", " ")

    why = (
        f"{verdict}: the shared path runs {n(tok['shared']['real'])} of the whole path's {n(tok['whole']['real'])} "
        f"tokens ({n(rec['prefix_tokens'])} distinct prefixes; the rest are repeats: the ancestors a packed row holds "
        f"before its own nodes, and the end-of-text token each rolling window starts from). Outside "
        f"the model, lm-eval and the adapter take {med['whole'] - model['whole']:.1f} s of the whole path's "
        f"{med['whole']:.1f} s, which no scoring scheme removes: computing each distinct prefix once at the whole "
        f"path's cost per token would reach {rec['bound_at_whole_cost']:.2f}×"
    )
    return measured, why


def test_speed_doc_quotes_the_recorded_evaluation_benchmark():
    """docs/speed.md's evaluation row, formatted from results/bench/eval_cpu.json."""
    rec = json.loads((ROOT / "results" / "bench" / "eval_cpu.json").read_text())
    text = " ".join((ROOT / "docs" / "speed.md").read_text().split())
    measured, why = speed_doc_evaluation_row(rec)
    assert measured in text
    assert why in text
    assert rec["accuracies_equal"] and rec["max_metric_difference"]["rel"] < 1e-6


def test_shipped_task_yamls_load_with_include_path(trained, monkeypatch):
    from lm_eval.tasks import TaskManager

    for path in TASK_CONFIGS.glob("mohge_*.yaml"):
        assert "@TASK_DATA@" not in path.read_text(), path
    manager = TaskManager(include_path=str(TASK_CONFIGS), include_defaults=False, metadata=dict(OFFLINE))
    monkeypatch.chdir(trained["tasks"].parent)  # the documented default: ./mohge_tasks
    counts = json.loads((trained["tasks"] / "tasks.json").read_text())["docs"]
    loaded = manager.load(sorted(counts))["tasks"]  # the tasks with documents that fit the model's context
    assert {name: len(list(task.test_docs())) for name, task in loaded.items()} == counts
    monkeypatch.chdir(trained["root"])  # elsewhere: the folder named by the task_data metadata
    named = TaskManager(
        include_path=str(TASK_CONFIGS), include_defaults=False, metadata={"task_data": "work/mohge_tasks"}
    )
    assert len(list(named.load(["mohge_cloze"])["tasks"]["mohge_cloze"].test_docs())) == counts["mohge_cloze"]
    with pytest.raises(ConfigError, match="mohge_tasks"):
        TaskManager(include_path=str(TASK_CONFIGS), include_defaults=False).load(["mohge_ppl"])
