"""Evaluation: deterministic task documents, the lm-eval adapter's scores, lm-eval end to end offline."""

import contextlib
import json
import math
import os
import shutil
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from conftest import tiny_run, train_tiny

from mohge.data import DataConfig, prepare
from mohge.data.tokenizer import EOT_ID, encode
from mohge.evaluate import suite as ev
from mohge.train.checkpoint import write_manifest

RUN = tiny_run(
    data={"seq_len": 24, "graded_num_docs": 200},
    eval={"tasks": ["mohge_ppl"], "batch_size": 8, "limit": 3},
)
DATA = RUN["data"]


class Req:
    """The part of lm-eval's Instance the adapter reads."""

    def __init__(self, *args):
        self.args = args


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> tuple[Path, Path]:
    return train_tiny(tmp_path_factory.mktemp("run"), RUN)


@pytest.fixture(scope="module")
def lm(run):
    from mohge.evaluate.lm_eval_adapter import MoHGELM

    return MoHGELM(str(run[0]), device="cpu", batch_size=3)


def test_task_documents_are_deterministic_and_well_formed(run, tmp_path):
    _, data = run
    counts = ev.build_tasks(data, tmp_path / "a", max_length=10**6)
    ev.build_tasks(data, tmp_path / "b", max_length=10**6)
    assert set(counts) == set(ev.LOCAL_TASKS) - {ev.FACTS_TASK}  # every task but the facts source's
    for name in counts:
        assert (tmp_path / "a" / f"{name}.jsonl").read_bytes() == (tmp_path / "b" / f"{name}.jsonl").read_bytes()
    docs = {n: [json.loads(x) for x in (tmp_path / "a" / f"{n}.jsonl").read_text().splitlines()] for n in counts}
    for name in counts:
        if name == "mohge_ppl":
            assert all(d["text"] for d in docs[name])
            continue
        for d in docs[name]:
            assert 0 <= d["gold"] < len(d["choices"]) and len(set(d["choices"])) == len(d["choices"])
    assert all(len(d["choices"]) == 4 for d in docs["mohge_graded_hard"])
    for d in docs["mohge_graded_easy"]:
        assert d["choices"][d["gold"]] in d["context"]  # the right answer copies an earlier line
        assert all(c not in d["context"] for i, c in enumerate(d["choices"]) if i != d["gold"])
    for d in docs["mohge_graded_medium"]:
        a, b = (c.split(" ") for c in d["choices"])
        assert len(a) == len(b) and sum(x != y for x, y in zip(a, b, strict=True)) == 1  # only the verb differs
    for d in docs["mohge_graded_hard"]:
        assert d["context"].endswith("=")


def test_passages_merge_paragraphs():
    text = "a" * 50 + "\n\n" + "b" * 60 + "\n\n" + "c" * 10
    assert ev.passages(text, 100) == ["a" * 50 + "\n\n" + "b" * 60 + "\n\n" + "c" * 10]
    assert ev.passages("x\ny", 100) == ["x\ny"]


def test_adapter_scores_match_direct_computation(lm):
    ctx, cont = "the dogs see a cat.\n", "12+5="
    text = ctx + cont
    ids = encode(lm.tok, text)
    assert len(ids) + 1 <= lm.max_length + 1  # one window: no truncation
    with torch.no_grad():
        logp = F.log_softmax(lm.model(torch.tensor([[EOT_ID, *ids]])).logits[0].float(), -1)
        logp_bare = F.log_softmax(lm.model(torch.tensor([ids])).logits[0].float(), -1)
    direct = sum(logp[i, ([EOT_ID, *ids])[i + 1]].item() for i in range(len(ids)))
    # as lm-eval's HF model: the trailing "\n" of the context moves to the continuation, the pair is encoded whole
    # and split at the context's length, and nothing is put before a non-empty context
    ctx_len = len(encode(lm.tok, ctx.rstrip()))
    cont_ll = sum(logp_bare[i, ids[i + 1]].item() for i in range(ctx_len - 1, len(ids) - 1))
    (ll, _), (ll_empty, _) = lm.loglikelihood([Req(ctx, cont), Req("", text)])
    assert ll == pytest.approx(cont_ll, abs=1e-4)
    assert ll_empty == pytest.approx(direct, abs=1e-4)  # an empty context is <|endoftext|>
    assert lm.loglikelihood_rolling([Req(text)])[0] == pytest.approx(direct, abs=1e-4)
    long_text = "\n".join([text] * 12)  # longer than max_length (24 tokens): several windows
    assert len(encode(lm.tok, long_text)) > 2 * lm.max_length
    rolling = lm.loglikelihood_rolling([Req(long_text), Req(text)])
    assert rolling[1] == pytest.approx(direct, abs=1e-4) and rolling[0] < rolling[1] < 0


def test_generate_until_is_greedy_and_stops(lm):
    out = lm.generate_until([Req("1+1=", {"until": ["\n"], "max_gen_toks": 5}), Req("the", {"max_gen_toks": 3})])
    assert len(out) == 2 and "\n" not in out[0]
    assert len(encode(lm.tok, out[1])) <= 3
    assert lm.generate_until([Req("the", {"max_gen_toks": 3})]) == [out[1]]  # deterministic


def test_lm_eval_end_to_end_offline(run, tmp_path, monkeypatch):
    model, data = run
    monkeypatch.delenv("HF_DATASETS_OFFLINE", raising=False)
    out = tmp_path / "metrics.json"
    code = ev.main(
        [
            "--ckpt",
            str(model),
            "--data",
            str(data),
            "--out",
            str(out),
            "--tasks",
            "mohge_ppl",
            "mohge_graded_hard",
            "--limit",
            "4",
            "--device",
            "cpu",
            "--task-data",
            str(tmp_path / "t"),
        ]
    )
    assert code == 0 and os.environ["HF_DATASETS_OFFLINE"] == "1"
    metrics = json.loads(out.read_text())
    ppl, hard = metrics["tasks"]["mohge_ppl"], metrics["tasks"]["mohge_graded_hard"]
    assert math.isfinite(ppl["word_perplexity"]) and ppl["bits_per_byte"] > 0 and ppl["n_samples"] == 4
    assert 0 <= hard["acc"] <= 1 and "acc_stderr" in hard and "acc_norm" in hard
    for split in ("val", "test"):
        assert metrics[split]["tokens"] > 0 and metrics[split]["ppl"] == pytest.approx(math.exp(metrics[split]["loss"]))


def test_scores_do_not_depend_on_lm_evals_environment_report_which_is_not_run(run, lm, tmp_path, monkeypatch):
    """run_lm_eval skips lm-eval's ``add_env_info`` (torch's environment report, results fields it does not read):
    the scores are those of lm-eval's own ``simple_evaluate`` with the report, and lm-eval's module is restored."""
    import lm_eval.evaluator as evaluator

    reports = []
    monkeypatch.setattr(evaluator, "add_env_info", lambda results: reports.append(results))
    ev.build_tasks(run[1], tmp_path, max_length=lm.max_length)
    tasks = ["mohge_graded_hard", "mohge_cloze"]
    skipped = ev.run_lm_eval(lm, tasks, tmp_path, limit=4)
    assert reports == [] and evaluator.add_env_info.__name__ == "<lambda>"
    monkeypatch.setattr(ev, "_without_env_info", contextlib.nullcontext)
    assert ev.run_lm_eval(lm, tasks, tmp_path, limit=4) == skipped and len(reports) == 1
    assert all(skipped[t]["n_samples"] == 4 for t in tasks)


def test_config_tasks_skip_what_the_data_cannot_build(run, tmp_path):
    model, _ = run
    words = "the cat and the dog sat on a mat while birds sang in trees above quiet rivers".split()
    (tmp_path / "t.txt").write_text("\n\n".join(" ".join(words[i:] + words[:i]) for i in range(300)))
    cfg = {"source": "text", "text_files": [str(tmp_path / "t.txt")], "vocab_size": 300, "seq_len": 24}
    prepare(DataConfig.from_dict(cfg), tmp_path / "plain")
    copy = Path(shutil.copytree(model, tmp_path / "model"))
    run_cfg = json.loads((copy / "config.json").read_text())
    run_cfg["eval"]["tasks"] = ["mohge_ppl", "mohge_graded_hard"]
    # evaluation refuses data a model was not trained on: this copy says it was trained on `plain`
    run_cfg["data"] = json.loads((tmp_path / "plain" / "meta.json").read_text())["config"]
    shutil.copy(tmp_path / "plain" / "tokenizer.json", copy / "tokenizer.json")
    (copy / "config.json").write_text(json.dumps(run_cfg))
    write_manifest(copy, list(json.loads((copy / "manifest.json").read_text())["files"]))  # re-seal the edit
    metrics = ev.evaluate(copy, tmp_path / "plain", limit=2, device="cpu", max_loss_batches=1)
    assert list(metrics["tasks"]) == ["mohge_ppl"] and metrics["lm_eval"]["skipped"] == ["mohge_graded_hard"]
    with pytest.raises(ValueError, match="mohge_graded_hard"):
        ev.evaluate(copy, tmp_path / "plain", tasks=["mohge_graded_hard"], device="cpu")


def test_hub_tasks_need_allow_hub(run, tmp_path):
    with pytest.raises(ValueError, match="--allow-hub"):
        ev.evaluate(run[0], run[1], tasks=["hellaswag"], device="cpu")
    assert "mmlu" in ev.standard_tasks()


def test_build_tasks_cli(run, tmp_path, capsys):
    model, data = run
    args = ["build-tasks", "--data", str(data), "--out", str(tmp_path / "a"), "--max-docs", "5"]
    assert ev.main([*args, "--ckpt", str(model)]) == 0
    assert all(n <= 5 for n in json.loads(capsys.readouterr().out).values())
    assert json.loads((tmp_path / "a" / "tasks.json").read_text())["max_length"] == 24  # the model's seq_len
    with pytest.raises(SystemExit) as err:  # the builder must know the model's context
        ev.main(args)
    assert err.value.code == 2 and "--ckpt" in capsys.readouterr().err


def test_tasks_are_built_for_the_models_context(run, tmp_path):
    """A choice document is kept only when every choice, as the tokens lm-eval scores (TemplateLM's pair encoding,
    the adapter's own), fits in max_length: the same documents then give one answer on both lm-eval routes."""
    from mohge.evaluate.lm_eval_adapter import MoHGELM

    model, data = run
    full = ev.build_tasks(data, tmp_path / "full", max_length=10**6)
    lm = MoHGELM(str(model), device="cpu", max_length=8)
    cut = ev.build_tasks(data, tmp_path / "cut", max_length=8)
    dropped = json.loads((tmp_path / "cut" / "tasks.json").read_text())["dropped"]
    assert dropped and "mohge_ppl" not in dropped  # rolling perplexity is scored in windows: never dropped
    for name, n in full.items():
        assert cut.get(name, 0) + dropped.get(name, 0) == n, name
        if name == "mohge_ppl" or name not in cut:
            continue
        for line in (tmp_path / "cut" / f"{name}.jsonl").read_text().splitlines():
            doc = json.loads(line)
            for c in doc["choices"]:
                n_cont = len(lm._encode_pair(doc["context"], c)[1])
                assert n_cont == ev.continuation_tokens(lm.tok, doc["context"], c, lm.eot) and n_cont <= 8
    assert ev.continuation_tokens(lm.tok, "a b ", "c", lm.eot) == len(lm._encode_pair("a b ", "c")[1])
    with pytest.raises(ValueError, match="max_length"):
        ev.build_tasks(data, tmp_path / "bad", max_length=0)


def test_a_continuation_longer_than_the_context_is_refused_naming_the_task(lm):
    """Where lm-eval's hf model stops on a bare assert, the adapter says which task and document, and the lengths."""

    class Inst(Req):
        task_name, doc_id = "mohge_graded_easy", 7

    long = " ".join(["cat"] * (2 * lm.max_length))
    with pytest.raises(ValueError, match=r"task mohge_graded_easy doc 7: a continuation of \d+ tokens .* 24 tokens"):
        lm.loglikelihood([Inst("the", " " + long)])
    with pytest.raises(ValueError, match="longer than"):
        lm.loglikelihood([Inst("", long)])
    assert lm.loglikelihood([Inst("the dog", " sat")])[0][0] < 0  # what fits is scored


def test_cli_without_a_subcommand_needs_ckpt_data_out(capsys):
    with pytest.raises(SystemExit) as err:
        ev.main(["--data", "d", "--out", "o"])
    assert err.value.code == 2 and "--ckpt" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        ev.main(["build-tasks", "--data", "d", "--out", "o", "--bogus"])


def test_the_printed_summary_is_a_table_of_every_reported_metric_not_the_json():
    from mohge.evaluate.suite import summary_table

    metrics = {
        "tasks": {
            "mohge_cloze": {"acc": 0.555, "acc_stderr": 0.0352, "n_samples": 200, "name": "mohge_cloze"},
            "mohge_ppl": {"bits_per_byte": 2.4074, "bits_per_byte_stderr": "N/A", "n_samples": 160},
        },
        "val": {"loss": 4.3766, "ppl": 79.5699, "tokens": 131215},
    }
    lines = summary_table(metrics).splitlines()
    assert lines[0].split() == ["task", "metric", "value", "stderr", "n"]
    assert lines[1].split() == ["mohge_cloze", "acc", "0.5550", "0.0352", "200"]
    assert lines[2].split() == ["mohge_ppl", "bits_per_byte", "2.4074", "—", "160"]
    assert [line.split()[:3] for line in lines[3:]] == [["val", "split", "loss"], ["val", "split", "ppl"]]
    assert not any("{" in line for line in lines)


def test_an_unknown_task_is_refused_in_one_line_before_the_model_loads(tmp_path):
    """Not "needs the HF hub": a name that is neither a local task nor a standard one is named, with the local tasks;
    the refusal comes before the model folder is read (here it does not exist)."""
    with pytest.raises(ev.ConfigError, match=r"^task 'mohge_nonsense': unknown \(local tasks: mohge_ppl, mohge_cloze"):
        ev.evaluate(tmp_path / "no-model", tmp_path / "no-data", tasks=["mohge_nonsense"], device="cpu")
    with pytest.raises(ev.ConfigError, match=r"^task 'hellaswag': .*--allow-hub"):
        ev.evaluate(tmp_path / "no-model", tmp_path / "no-data", tasks=["hellaswag"], device="cpu")


def test_an_unknown_task_with_the_hub_allowed_is_refused_by_lm_evals_index(tmp_path, monkeypatch):
    """With --allow-hub any task lm-eval knows may run; one it does not know is refused in one line, before lm-eval
    evaluates anything (lm=None would fail there)."""
    import lm_eval.tasks

    class Index:  # lm-eval's TaskManager as run_lm_eval reads it: the names it knows
        def __init__(self, **kwargs):
            self.all_tasks = ["hellaswag", "lambada_openai", *ev.LOCAL_TASKS]

    monkeypatch.setattr(lm_eval.tasks, "TaskManager", Index)
    with pytest.raises(ev.ConfigError, match=r"^task 'mohge_nonsense': unknown to lm-eval .*local tasks: mohge_ppl"):
        ev.run_lm_eval(None, ["lambada_openai", "mohge_nonsense"], tmp_path, allow_hub=True)


def _as_workflow_lays_it_out(model: Path, root: Path, eval_section: dict) -> Path:
    """The model folder at work/<study>/runs/<run> and its run config, with ``eval_section``, at
    results/<study>/runs/<run>/config.json: what the train rule and the run_config rule write."""
    run_cfg = json.loads((model / "config.json").read_text())
    folder = Path(shutil.copytree(model, root / "work" / "s" / "runs" / run_cfg["name"]))
    study = root / "results" / "s" / "runs" / run_cfg["name"]
    study.mkdir(parents=True)
    (study / "config.json").write_text(json.dumps({**run_cfg, "eval": {**run_cfg["eval"], **eval_section}}))
    return folder


def test_a_workflow_model_folder_is_evaluated_with_its_studys_eval_section(run, tmp_path, caplog):
    """Without --eval-config, work/<study>/runs/<run> is evaluated with results/<study>/runs/<run>/config.json's eval
    section, as the workflow evaluates it (not the model folder's own); the log says which one."""
    from mohge.config import load_run_config
    from mohge.config.provenance import code_version
    from mohge.core.knobs import to_dict

    model, data = run
    folder = _as_workflow_lays_it_out(model, tmp_path, {"limit": 2})
    study = tmp_path / "results" / "s" / "runs" / folder.name / "config.json"
    with caplog.at_level("INFO", logger="mohge.evaluate"):
        metrics = ev.evaluate(folder, data, device="cpu", max_loss_batches=1)
    assert metrics["lm_eval"]["limit"] == 2  # the model folder's own says 3
    assert metrics["code"]["config_sha256"] == code_version(to_dict(load_run_config(study)))["config_sha256"]
    assert f"eval section: {study} (the study's" in caplog.text
    caplog.clear()
    with caplog.at_level("INFO", logger="mohge.evaluate"):
        assert ev.evaluate(model, data, device="cpu", max_loss_batches=1)["lm_eval"]["limit"] == 3
    assert "(the model folder's own" in caplog.text


def test_the_studys_heldout_batches_bound_the_val_and_test_loss(run, tmp_path):
    """H0 'eval.heldout_batches is ignored' fails: a study's eval section with heldout_batches 1 gives a val and test
    loss over one batch of eval.batch_size sequences each; an explicit max_loss_batches (0 = all) overrides it."""
    model, data = run
    folder = _as_workflow_lays_it_out(model, tmp_path, {"limit": 1, "heldout_batches": 1, "tasks": []})
    cfg = json.loads((folder / "config.json").read_text())
    one = cfg["eval"]["batch_size"] * cfg["data"]["seq_len"]
    metrics = ev.evaluate(folder, data, device="cpu")
    assert metrics["val"]["tokens"] == metrics["test"]["tokens"] == one
    whole = ev.evaluate(folder, data, device="cpu", max_loss_batches=0)
    assert whole["val"]["tokens"] > one and whole["test"]["tokens"] > one


def test_a_route_override_prints_the_flops_per_token_it_serves(run, tmp_path, capsys):
    model, data = run
    out = tmp_path / "m.json"
    argv = ["--ckpt", str(model), "--data", str(data), "--out", str(out), "--max-loss-batches", "1", "--limit", "1"]
    assert ev.main([*argv, "--device", "cpu", "--route-override", "topk=1"]) == 0
    text = capsys.readouterr().out
    served = json.loads(out.read_text())["route_override"]
    assert served["flops_per_token"] > 0 and 0 < served["params_per_token"] < served["flops_per_token"]
    assert f"{served['flops_per_token']:.4g}" in text and "flops/token" in text
    # the count of mohge bench inference on the same validation windows (the eval section's batch of 8, one batch)
    from mohge_studies.bench.inference import routed_pass

    from mohge.evaluate.route_override import RouteOverride, apply_route_override
    from mohge.train.checkpoint import load_trained

    cfg, net = load_trained(model, "cpu")
    apply_route_override(net, cfg.model, RouteOverride(topk=1))
    tokens = routed_pass(net, cfg, data, "val", batch_size=8, max_batches=1)
    assert served["tokens"] == len(tokens["flops"])
    assert served["flops_per_token"] == pytest.approx(float(tokens["flops"].mean()), rel=1e-12)
    assert ev.main([*argv, "--device", "cpu"]) == 0
    trained = json.loads(out.read_text())
    assert "route_override" not in trained
