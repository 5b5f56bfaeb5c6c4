"""The end-of-text id comes from the tokenizer, not a constant: a given tokenizer.json whose end token is not id 0
(GPT-2 style: the last id; or another name, via data.eot_token) is prepared, trained on, evaluated and exported,
and every reader uses the tokenizer's id (docs/method.md §12.3)."""

import json
import math
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from conftest import tiny_run, train_tiny
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from mohge.config import ConfigError, RunConfig
from mohge.data import DataConfig, prepare
from mohge.data.graded import LEVEL_SEP
from mohge.data.prepare import main as data_main
from mohge.data.tokenizer import encode

TEXTS = [f"the dogs see a cat.\n{i}+{i % 7}={i + i % 7}\nbirds sang over quiet rivers {i * 13}" for i in range(300)]
# name -> (special tokens trained first, tokens added after the merges, data.eot_token)
TOKENIZERS = {
    "eot_last": (["<pad>", "<unk>"], ["<|endoftext|>"], "<|endoftext|>"),  # GPT-2 style: the end token is the last id
    "named_eos": (["<unk>", "</s>", "<s>"], [], "</s>"),  # another name, at id 1
}


class Req:
    """The part of lm-eval's Instance the adapter reads."""

    def __init__(self, *args):
        self.args = args


def given_tokenizer(path: Path, specials: list[str], appended: list[str]) -> Tokenizer:
    """A byte-level BPE that is not ours: its special tokens in another order, some added after the merges."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=290,
        special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(TEXTS, trainer=trainer)
    tok.add_special_tokens(appended)
    tok.save(str(path))
    return tok


@pytest.fixture(scope="module", params=sorted(TOKENIZERS))
def trained(request, tmp_path_factory):
    specials, appended, eot_token = TOKENIZERS[request.param]
    root = tmp_path_factory.mktemp(request.param)
    tok = given_tokenizer(root / "given.json", specials, appended)
    n, eot = tok.get_vocab_size(), tok.token_to_id(eot_token)
    assert eot != 0 and (eot == n - 1) == (request.param == "eot_last")
    data = {"seq_len": 24, "vocab_size": n, "tokenizer_file": str(root / "given.json"), "eot_token": eot_token}
    run = tiny_run(data=data, model={"vocab_size": n}, eval={"tasks": ["mohge_ppl"], "batch_size": 4, "limit": 2})
    model_dir, data_dir = train_tiny(root, run)
    return {"root": root, "model": model_dir, "data": data_dir, "eot": eot, "eot_token": eot_token, "run": run}


def test_shards_end_every_document_with_the_tokenizers_eot_id(trained):
    meta = json.loads((trained["data"] / "meta.json").read_text())
    eot = trained["eot"]
    assert meta["eot_id"] == meta["tokenizer"]["eot_id"] == eot
    assert meta["tokenizer"]["eot_token"] == trained["eot_token"] and meta["tokenizer"]["kind"] == "file"
    for split in ("train", "val", "test"):
        for e in meta["shards"][split]:
            ids = np.fromfile(trained["data"] / e["file"], dtype=meta["dtype"])
            levels = np.fromfile(trained["data"] / e["levels"]["file"], dtype=np.int8)
            assert e["docs"] > 0 and (ids == eot).sum() == e["docs"] and ids[-1] == eot
            assert not (ids == 0).any()  # id 0 is <pad> / <unk> here: never written
            assert (levels[ids == eot] == LEVEL_SEP).all()


def test_lm_eval_adapter_uses_the_eot_id(trained):
    from mohge.evaluate.lm_eval_adapter import MoHGELM

    lm = MoHGELM(str(trained["model"]), device="cpu", batch_size=3)
    eot = trained["eot"]
    assert lm.eot_token_id == lm.prefix_token_id == eot
    text = "the dogs see a cat.\n12+5="
    ids = encode(lm.tok, text)
    with torch.no_grad():
        logp = F.log_softmax(lm.model(torch.tensor([[eot, *ids]])).logits[0].float(), -1)
    direct = sum(logp[i, [eot, *ids][i + 1]].item() for i in range(len(ids)))
    assert lm.loglikelihood_rolling([Req(text)])[0] == pytest.approx(direct, abs=1e-4)  # first window: EOT first
    (ll_empty, _) = lm.loglikelihood([Req("", text)])[0]  # an empty context is the end token
    assert ll_empty == pytest.approx(direct, abs=1e-4)


def test_hf_export_uses_the_eot_id(trained):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from mohge.evaluate import hf_export
    from mohge.evaluate.lm_eval_adapter import MoHGELM

    out = trained["root"] / "hf"
    assert hf_export.main(["--ckpt", str(trained["model"]), "--out", str(out)]) == 0
    eot = trained["eot"]
    cfg = json.loads((out / "config.json").read_text())
    gen = json.loads((out / "generation_config.json").read_text())
    assert cfg["bos_token_id"] == cfg["eos_token_id"] == cfg["pad_token_id"] == eot
    assert gen["bos_token_id"] == gen["eos_token_id"] == gen["pad_token_id"] == eot
    tok = AutoTokenizer.from_pretrained(out)
    assert tok.eos_token == tok.bos_token == tok.pad_token == trained["eot_token"]
    assert tok.eos_token_id == tok.bos_token_id == tok.pad_token_id == eot
    text = f"a cat.\n12+5=17 {trained['eot_token']}  x"  # the end token's literal inside a text stays text
    assert tok(text)["input_ids"] == encode(MoHGELM(str(trained["model"]), device="cpu").tok, text)
    assert eot not in tok(text)["input_ids"]
    # transformers' generate on the export (it stops at the config's eos) = the adapter's greedy batches
    hf = AutoModelForCausalLM.from_pretrained(out, trust_remote_code=True).eval()
    tok.padding_side = "left"
    prompts = ["1+1=", "the dogs see a cat.\n", "7"]
    enc = tok(prompts, return_tensors="pt", padding=True)
    ids = hf.generate(**enc, max_new_tokens=6, do_sample=False)
    texts = [tok.decode(g[enc["input_ids"].shape[1] :], skip_special_tokens=True) for g in ids]
    lm = MoHGELM(str(trained["model"]), device="cpu", batch_size=3, max_gen_toks=6)
    assert lm.generate_until([Req(p, {"until": []}) for p in prompts]) == texts


def test_evaluate_runs_on_the_given_tokenizer(trained, tmp_path):
    from mohge.evaluate import suite as ev

    out = tmp_path / "metrics.json"
    args = ["--ckpt", str(trained["model"]), "--data", str(trained["data"]), "--out", str(out)]
    args += ["--tasks", "mohge_ppl", "--limit", "2", "--device", "cpu", "--task-data", str(tmp_path / "t")]
    assert ev.main(args) == 0
    metrics = json.loads(out.read_text())
    assert math.isfinite(metrics["tasks"]["mohge_ppl"]["word_perplexity"]) and metrics["test"]["tokens"] > 0


def test_training_refuses_data_whose_eot_id_disagrees_with_its_tokenizer(trained, tmp_path):
    from mohge.train.trainer import train

    data = tmp_path / "data"
    shutil.copytree(trained["data"], data)
    meta = json.loads((data / "meta.json").read_text())
    (data / "meta.json").write_text(json.dumps({**meta, "eot_id": 0}))
    with pytest.raises(ConfigError, match=rf"meta.json: eot_id=0, but .* the id {trained['eot']}"):
        train(RunConfig.from_dict(trained["run"]), tmp_path / "model", data=str(data))


def test_a_tokenizer_without_the_eot_token_is_refused_naming_the_key(tmp_path, caplog):
    tok = given_tokenizer(tmp_path / "given.json", ["<pad>"], [])  # no <|endoftext|>
    cfg = {"source": "graded", "graded_num_docs": 20, "vocab_size": tok.get_vocab_size()}
    cfg["tokenizer_file"] = str(tmp_path / "given.json")
    with pytest.raises(ConfigError, match=r"data.eot_token='<\|endoftext\|>': .*given.json has no such token"):
        prepare(DataConfig.from_dict(cfg), tmp_path / "o")
    (tmp_path / "c.json").write_text(json.dumps({**cfg, "eot_token": "</s>"}))
    assert data_main(["tokenizer", "--config", str(tmp_path / "c.json"), "--out", str(tmp_path / "o2")]) == 2
    errors = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
    assert len(errors) == 1 and "\n" not in errors[0] and "data.eot_token='</s>'" in errors[0]
    with pytest.raises(ConfigError, match="data.eot_token='': expected a non-empty string"):
        DataConfig.from_dict({**cfg, "eot_token": ""})


def test_our_bpe_puts_the_configured_eot_token_at_id_zero(tmp_path):
    cfg = {"source": "graded", "graded_num_docs": 30, "eot_token": "</s>", "seq_len": 16}
    meta = prepare(DataConfig.from_dict(cfg), tmp_path)
    assert meta["eot_id"] == 0 and meta["tokenizer"]["eot_token"] == "</s>"
    assert Tokenizer.from_file(str(tmp_path / "tokenizer.json")).token_to_id("</s>") == 0
