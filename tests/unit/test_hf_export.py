"""Hugging Face export: the transformers model computes mohge's logits, loads from a plain folder with
trust_remote_code (no mohge import), caches keys/values and handles left padding; the tokenizer is ours."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import tiny_model_config, tiny_run, train_tiny

from mohge.data.tokenizer import EOT_ID, encode, load_tokenizer
from mohge.evaluate import hf_export
from mohge.model import LanguageModel

MLA = {"attention": "mla", "mla_q_head_dim": 8, "mla_rope_head_dim": 4, "mla_v_head_dim": 6, "mla_kv_lora_rank": 12}
FAMILIES = {
    "mohge": {},
    "mohge-softmax-renorm": {"router": {"group_score": "softmax", "gate_mode": "product_renorm", "group_topk": 1}},
    "moe": {"ffn": {"kind": "moe", "expert_widths": [32], "placement": "contiguous"}, "router": {"topk": 2}},
    "moe-probs-gate": {
        "ffn": {"kind": "moe", "expert_widths": [32], "placement": "contiguous"},
        "router": {"topk": 2, "flat_gate": "probs"},
    },
    "hmoe": {"ffn": {"kind": "hmoe"}, "router": {"topk": 2}},
    "modse": {"ffn": {"kind": "modse", "placement": "modse_pairs"}, "router": {"topk": 2}},
    "dense-tied": {"ffn": {"kind": "dense"}, "tie_embeddings": True},
    "mla": MLA,
}


@pytest.mark.parametrize("family", FAMILIES)
def test_hf_model_gives_mohge_logits(family):
    model = LanguageModel(tiny_model_config(**FAMILIES[family])).eval()
    hf = hf_export.to_hf_model(model, 16, eot_id=EOT_ID)
    x_BS = torch.randint(0, 97, (3, 16))
    with torch.no_grad():
        ref, got = model(x_BS).logits, hf(x_BS).logits
    assert (ref - got).abs().max().item() <= 1e-5


@pytest.mark.parametrize(
    ("knob", "buffer", "span"),
    [("expert_bias_rate", "expert_bias_E", 0.3), ("group_bias_rate", "group_bias_G", 3.0)],  # §5.6, §5.7
)
def test_hf_model_selects_with_the_trained_selection_bias(knob, buffer, span):  # docs/method.md §5.6-5.7
    model = LanguageModel(tiny_model_config(router={knob: 1e-2})).eval()
    x_BS = torch.randint(0, 97, (3, 16))
    with torch.no_grad():
        unbiased = model(x_BS).logits
        for layer in model.moe_layers():
            bias = getattr(layer.router, buffer)
            bias.copy_(torch.linspace(-span, span, len(bias)))
        ref = model(x_BS).logits
        got = hf_export.to_hf_model(model, 16, eot_id=EOT_ID)(x_BS).logits
    assert (ref - unbiased).abs().max().item() > 1e-4  # the bias changes the routing (10x the tolerance below)
    assert (ref - got).abs().max().item() <= 1e-5


@pytest.mark.parametrize("family", ["mohge", "mla"])
def test_kv_cache_and_left_padding_match_the_full_forward(family):
    model = LanguageModel(tiny_model_config(**FAMILIES[family])).eval()
    hf = hf_export.to_hf_model(model, 16, eot_id=EOT_ID)
    x_S = torch.randint(1, 97, (12,))
    with torch.no_grad():
        full = hf(x_S[None]).logits[0]
        out = hf(x_S[None, :7], use_cache=True)  # prefix, then one token at a time through the cache
        steps = [out.logits[0]]
        for t in range(7, 12):
            out = hf(x_S[None, t : t + 1], cache=out.cache, use_cache=True)
            steps.append(out.logits[0])
        assert torch.allclose(torch.cat(steps), full, atol=1e-5)
        # a batch of a short row left-padded beside a long one: each row as if alone
        short = x_S[:5]
        ids = torch.stack([torch.cat([torch.full((7,), EOT_ID), short]), x_S])
        mask = torch.stack([torch.cat([torch.zeros(7), torch.ones(5)]), torch.ones(12)]).long()
        batched = hf(ids, attention_mask=mask).logits
        assert torch.allclose(batched[0, 7:], hf(short[None]).logits[0], atol=1e-5)
        assert torch.allclose(batched[1], full, atol=1e-5)


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    root = tmp_path_factory.mktemp("hf")
    model_dir, data_dir = train_tiny(root, tiny_run(data={"seq_len": 24}))
    assert hf_export.main(["--ckpt", str(model_dir), "--out", str(root / "hf")]) == 0
    return model_dir, root / "hf"


def test_export_folder_loads_with_auto_classes(exported, tmp_path):
    model_dir, out = exported
    files = {p.name for p in out.iterdir()}
    assert {
        "config.json",
        "model.safetensors",
        "configuration_mohge.py",
        "modeling_mohge.py",
        "tokenizer.json",
    } <= files
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["auto_map"] == {
        "AutoConfig": "configuration_mohge.MoHGEConfig",
        "AutoModelForCausalLM": "modeling_mohge.MoHGEForCausalLM",
    }
    assert cfg["max_position_embeddings"] == 24 and cfg["model_type"] == "mohge"
    # a fresh interpreter that cannot import mohge loads the folder by the Auto classes alone
    script = f"""
import sys, json, torch
sys.modules["mohge"] = None  # any import of mohge fails
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedTokenizerFast
m = AutoModelForCausalLM.from_pretrained({str(out)!r}, trust_remote_code=True).eval()
tok = AutoTokenizer.from_pretrained({str(out)!r}, trust_remote_code=True)
assert isinstance(tok, PreTrainedTokenizerFast)
text = "a cat.\\n12+5=17 <|endoftext|>  x"
ids = tok(text)["input_ids"]
with torch.no_grad():
    logits = m(torch.tensor([[0, *ids]])).logits[0]
print(json.dumps({{"ids": ids, "logits": logits.tolist(),
                  "bos": tok.bos_token_id, "eos": tok.eos_token_id, "pad": tok.pad_token_id,
                  "decoded": tok.decode(ids)}}))
"""
    res = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        check=False,
        stdin=subprocess.DEVNULL,
    )
    assert res.returncode == 0, res.stderr[-2000:]
    got = json.loads(res.stdout.strip().splitlines()[-1])
    tok = load_tokenizer(model_dir / "tokenizer.json")
    text = "a cat.\n12+5=17 <|endoftext|>  x"
    assert got["ids"] == encode(tok, text)
    assert got["bos"] == got["eos"] == got["pad"] == EOT_ID and got["decoded"] == text
    from mohge.train.checkpoint import load_trained

    _, model = load_trained(model_dir)
    with torch.no_grad():
        ref = model(torch.tensor([[EOT_ID, *got["ids"]]])).logits[0]
    assert (ref - torch.tensor(got["logits"])).abs().max().item() <= 1e-5


def test_export_refuses_a_foreign_folder(exported, tmp_path):
    (tmp_path / "notes.txt").write_text("mine")
    assert hf_export.main(["--ckpt", str(exported[0]), "--out", str(tmp_path)]) == 2
    assert (tmp_path / "notes.txt").read_text() == "mine"
    with pytest.raises(ValueError, match="--out="):
        hf_export.export(exported[0], tmp_path)


def test_export_replaces_an_earlier_export(exported):
    model_dir, out = exported
    before = (out / "model.safetensors").read_bytes()
    hf_export.export(model_dir, out)
    assert (out / "model.safetensors").read_bytes() == before
    assert not list(Path(out).parent.glob(".tmp-*"))


def test_transformers_generate_equals_the_adapter(exported):
    """transformers' own generate (left padding, its cache) on the export = the mohge adapter's greedy batches."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from mohge.evaluate.lm_eval_adapter import MoHGELM

    model_dir, out = exported
    hf = AutoModelForCausalLM.from_pretrained(out, trust_remote_code=True).eval()
    tok = AutoTokenizer.from_pretrained(out, trust_remote_code=True)
    tok.padding_side = "left"
    prompts = ["1+1=", "the dogs see a cat.\n", "7"]
    enc = tok(prompts, return_tensors="pt", padding=True)
    gen = hf.generate(**enc, max_new_tokens=6, do_sample=False, pad_token_id=tok.pad_token_id)
    texts = [tok.decode(g[enc["input_ids"].shape[1] :], skip_special_tokens=True) for g in gen]
    lm = MoHGELM(str(model_dir), device="cpu", batch_size=3, max_gen_toks=6)

    class Req:
        def __init__(self, *args):
            self.args = args

    assert lm.generate_until([Req(p, {"until": []}) for p in prompts]) == texts


def test_export_files_are_shared_0644(exported):
    """save_pretrained writes model.safetensors through a 0600 temporary file: the export gives every file the mode
    a plain open would (0666 less the umask)."""
    _, out = exported
    umask = os.umask(0)
    os.umask(umask)
    modes = {p.name: p.stat().st_mode & 0o777 for p in out.iterdir() if p.is_file()}
    assert modes and all(m == 0o666 & ~umask for m in modes.values()), modes


def test_the_tokenizer_loads_quietly(exported, tmp_path):
    """The export's tokenizer is a plain PreTrainedTokenizerFast (tokenizer_config.json: TokenizersBackend): it
    loads with no prompt and no warning by its class, running no remote code, and, as lm-eval loads it, by
    AutoTokenizer with trust_remote_code=True (which runs only configuration_mohge.py). transformers 5.24's
    AutoTokenizer resolves the model's AutoConfig first, so without trust_remote_code it asks about config.json's
    custom code whatever the tokenizer files say (docs/evaluation.md)."""
    _, out = exported
    assert json.loads((out / "tokenizer_config.json").read_text())["tokenizer_class"] == "TokenizersBackend"
    script = f"""
import sys, warnings
warnings.simplefilter("always")
sys.modules["mohge"] = None
from transformers import AutoTokenizer, PreTrainedTokenizerFast
a = PreTrainedTokenizerFast.from_pretrained({str(out)!r})
b = AutoTokenizer.from_pretrained({str(out)!r}, trust_remote_code=True)
assert a("a cat.")["input_ids"] == b("a cat.")["input_ids"]
print("ok", type(a).__name__, type(b).__name__)
"""
    res = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, cwd=tmp_path, stdin=subprocess.DEVNULL
    )
    assert res.returncode == 0, res.stderr[-2000:]
    assert res.stdout.startswith("ok") and res.stderr.strip() == "", res.stderr


def test_an_exported_config_naming_the_gate_by_its_alias_loads_as_its_name(tmp_path):
    """An exported config.json may say gate_mode code_exact (an alias): the export's own configuration class reads
    it as softmax_topk_probs, the name its forward pass compares with, and its alias table is mohge's."""
    from mohge.core.vocab import GATE_MODE_ALIASES
    from mohge.evaluate import configuration_mohge

    assert configuration_mohge.GATE_MODE_ALIASES == GATE_MODE_ALIASES
    configuration_mohge.MoHGEConfig(gate_mode="product_renorm").save_pretrained(tmp_path)
    cfg = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**cfg, "gate_mode": "code_exact"}))
    assert configuration_mohge.MoHGEConfig.from_pretrained(tmp_path).gate_mode == "softmax_topk_probs"
    assert configuration_mohge.MoHGEConfig().gate_mode == "softmax_topk_probs"
