"""The facts source and the bits-stored endpoint (docs/method.md §12.4, mohge.evaluate.bits_stored)."""

import json
import math
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import tiny_run, train_tiny

from mohge.config import ConfigError, DataConfig
from mohge.data import facts, prepare, read_split
from mohge.data.tokenizer import check_tokenizer, encode, load_tokenizer, tokenizer_probe
from mohge.evaluate import bits_stored as bits
from mohge.evaluate import suite as ev

N = 1200  # more than build_tasks' 1000-document cap: the facts task must hold every fact
DATA = {
    "source": "facts",
    "vocab_size": 514,
    "seq_len": 25,
    "facts_num": N,
    "facts_epochs": 3,
    "facts_key_tokens": 256,
    "facts_value_tokens": 256,
}


def cfg(**over) -> DataConfig:
    return DataConfig.from_dict({**DATA, **over})


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("facts")
    prepare(cfg(), out)
    return out


def test_the_table_is_a_pure_function_of_the_seed():
    k1, v1 = facts.fact_table(cfg())
    k2, v2 = facts.fact_table(cfg())
    assert np.array_equal(k1, k2) and np.array_equal(v1, v2)
    k3, v3 = facts.fact_table(cfg(seed=1))
    assert not np.array_equal(v1, v3)
    assert k1.shape == (N, 2) and v1.shape == (N, 2)
    assert len({tuple(k) for k in k1}) == N  # distinct keys: a value is a function of its key
    assert k1.min() >= 0 and k1.max() < 256 and v1.min() >= 0 and v1.max() < 256
    # uniform values: every symbol appears, none far above its share (2400 draws over 256 symbols: mean 9.4)
    counts = np.bincount(v1.ravel(), minlength=256)
    assert counts.min() >= 1 and counts.max() < 30
    assert facts.bits_per_fact(cfg()) == 16.0 and facts.total_bits(cfg()) == N * 16.0


def test_preparation_is_deterministic_and_every_epoch_is_a_fresh_permutation(data_dir, tmp_path):
    again = tmp_path / "again"
    prepare(cfg(), again)
    meta, meta2 = (json.loads((d / "meta.json").read_text()) for d in (data_dir, again))
    assert [e["sha256"] for e in meta["shards"]["train"]] == [e["sha256"] for e in meta2["shards"]["train"]]
    assert meta["tokenizer"]["sha256"] == meta2["tokenizer"]["sha256"]
    assert meta["eot_id"] == 0 and meta["vocab_size"] == 514 and meta["split"]["total_bits"] == N * 16.0
    train = read_split(data_dir, "train").astype(np.int64)
    L = facts.fact_len(cfg())
    assert len(train) == 1 + 3 * N * L and train[0] == 0  # the shard opens with a lone end-of-text token
    rows = train[1:].reshape(3, N, L)
    assert (rows[..., -1] == 0).all()  # every fact ends with the end-of-text token
    want = Counter(map(tuple, bits.fact_rows(cfg())[:, 1:].numpy().tolist()))
    orders = []
    for e in range(3):
        assert Counter(map(tuple, rows[e, :, :-1].tolist())) == want  # each epoch: every fact exactly once
        orders.append(rows[e, :, 0] * 1000 + rows[e, :, 1])
    assert not np.array_equal(orders[0], orders[1]) and not np.array_equal(orders[1], orders[2])
    # val/test: one copy in table order
    test = read_split(data_dir, "test").astype(np.int64)[1:].reshape(N, L)
    assert np.array_equal(test[:, :-1], bits.fact_rows(cfg())[:, 1:].numpy())


def test_more_exposures_read_the_same_facts_in_the_same_first_epochs(data_dir, tmp_path):
    """The capacity study's long set (facts_epochs 400 against 200): the same table, the same test split, and its
    first epochs exactly the shorter set's train stream, so the two runs differ only in how long they train."""
    longer = tmp_path / "longer"
    prepare(cfg(facts_epochs=5), longer)
    short_train, long_train = (read_split(d, "train").astype(np.int64) for d in (data_dir, longer))
    assert len(long_train) == 1 + 5 * N * facts.fact_len(cfg())
    assert np.array_equal(long_train[: len(short_train)], short_train)
    assert np.array_equal(read_split(longer, "test"), read_split(data_dir, "test"))


def test_the_config_fixes_the_held_out_split_sizes(data_dir):
    """What plan time checks seq_len against (DataConfig.heldout_tokens) is what preparation writes."""
    meta = json.loads((data_dir / "meta.json").read_text())
    assert meta["tokens"]["val"] == meta["tokens"]["test"] == cfg().heldout_tokens == N * 5 + 1


def test_every_training_window_starts_with_the_scored_context(data_dir):
    from mohge.data.stream import TokenStream

    stream = TokenStream.open(data_dir, "train")
    S, n_windows = cfg().seq_len, 3 * N * 5 // cfg().seq_len
    x, y = stream.window_batch(0, n_windows, S, seed=0)  # what train.data_order: sequential reads, one epoch
    assert (x[:, 0] == 0).all() and (y[:, -1] == 0).all()  # <eot> first, whole facts, <eot> last
    scored = {tuple(r) for r in bits.fact_rows(cfg()).tolist()}
    assert all(tuple(row) in scored for row in x[:, :5].tolist())  # the window's first fact: exactly its scored row


def test_the_word_level_tokenizer_is_a_real_tokenizer_json(data_dir):
    tok = check_tokenizer(data_dir / "tokenizer.json", "<|endoftext|>", tokenizer_probe(cfg()))
    assert tok.get_vocab_size() == 514
    text = facts.fact_texts(cfg())[0]
    ids = encode(load_tokenizer(data_dir / "tokenizer.json"), f"<|endoftext|> {text}")
    assert ids == bits.fact_rows(cfg())[0].tolist()  # one token per symbol, ids as fact_rows says


@pytest.mark.parametrize(
    ("over", "key"),
    [
        ({"vocab_size": 600}, "data.vocab_size"),
        ({"seq_len": 24}, "data.seq_len"),
        ({"facts_num": 70000}, "data.facts_num"),
        ({"facts_key_len": 0}, "data.facts_key_len"),
        ({"facts_value_tokens": 1}, "data.facts_value_tokens"),
        ({"tokenizer_file": "x.json"}, "data.tokenizer_file"),
        ({"facts_nmu": 3}, "data.facts_nmu"),
        ({"facts_num": 4}, "data.seq_len"),  # val and test hold 4 x 5 + 1 tokens: no window of 26
    ],
)
def test_mistakes_are_refused_naming_the_key(over, key):
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        cfg(**over)


class Oracle(torch.nn.Module):
    """Knows every fact (or, with ``know=False``, only that values are uniform over the value tokens)."""

    def __init__(self, c: DataConfig, know: bool = True):
        super().__init__()
        self.w = torch.nn.Parameter(torch.zeros(1))
        keys, values = facts.fact_table(c)
        self.K, self.V, self.know = c.facts_key_tokens, c.facts_value_tokens, know
        self.table = {(int(a) + 2, int(b) + 2): (int(x), int(y)) for (a, b), (x, y) in zip(keys, values, strict=True)}
        self.vocab = facts.vocab_size(c)

    def _last(self, prefix: list[int]) -> torch.Tensor:
        """The logits [V] that follow ``prefix``: a fact's value tokens after its key, uniform values otherwise."""
        logits = torch.full((self.vocab,), -1e4)
        logits[2 + self.K : 2 + self.K + self.V] = 0.0  # uniform over the value tokens everywhere
        if self.know and len(prefix) >= 2:
            if (v := self.table.get((prefix[-2], prefix[-1]))) is not None:
                logits[2 + self.K + v[0]] = 60.0
            elif len(prefix) >= 3 and (v := self.table.get((prefix[-3], prefix[-2]))) is not None:
                logits[2 + self.K + v[1]] = 60.0
        return logits

    def forward(self, x_BS):
        return type("Out", (), {"logits": self.hidden(x_BS)[0]})()

    def hidden(self, x_BS, positions_BS=None, mask_BSS=None):
        """The model interface the adapter's prefix tree uses: each token's prefix is the tokens its mask lets it
        see (its ancestors and itself), or the row up to it; the "hidden state" is already the logits."""
        B, S = x_BS.shape
        rows = x_BS.tolist()
        out = torch.stack(
            [
                torch.stack(
                    [
                        self._last(
                            rows[b][: t + 1]
                            if mask_BSS is None
                            else [rows[b][j] for j in mask_BSS[b, t].nonzero().flatten().tolist()]
                        )
                        for t in range(S)
                    ]
                )
                for b in range(B)
            ]
        )
        return out, []

    def logits(self, x):
        return x


def test_an_oracle_stores_every_bit_and_a_uniform_model_none():
    c = cfg(facts_num=300)
    oracle = bits.bits_stored(Oracle(c), c, batch_size=64)
    assert oracle["bits_stored"] == pytest.approx(300 * 16.0, rel=1e-9) and oracle["recall"] == 1.0
    uniform = bits.bits_stored(Oracle(c, know=False), c, batch_size=64)
    assert uniform["bits_stored"] == pytest.approx(0.0, abs=1e-6) and uniform["recall"] == 0.0


RUN = tiny_run(
    data=DATA,
    model={"vocab_size": 514, "max_seq_len": 25},
    train={"steps": 6, "batch_size": 8, "data_order": "sequential"},
    eval={"tasks": ["mohge_facts"], "batch_size": 64, "limit": 0},
)


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    return train_tiny(tmp_path_factory.mktemp("run"), RUN)


def test_the_facts_task_holds_every_fact_uncapped(run, tmp_path):
    counts = ev.build_tasks(run[1], tmp_path, max_length=5)  # one fact a window
    assert counts["mohge_facts"] == N
    rows = [json.loads(line) for line in (tmp_path / "mohge_facts.jsonl").read_text().splitlines()]
    keys, values = facts.fact_table(cfg())
    assert rows[0] == {
        "context": "<|endoftext|> " + facts.key_text(keys[0]),
        "value": " " + facts.value_text(values[0]),
    }


def test_lm_eval_gives_the_direct_bits_and_the_oracle_all_of_them(run, tmp_path):
    from mohge.evaluate.lm_eval_adapter import MoHGELM
    from mohge.train.checkpoint import load_trained

    model_dir, data_dir = run
    metrics = ev.evaluate(model_dir, data_dir, tasks=["mohge_facts"], limit=0, batch_size=64, max_loss_batches=1)
    _, model = load_trained(model_dir)
    direct = bits.bits_stored(model, cfg())
    assert metrics["facts"]["facts"] == N
    assert metrics["facts"]["bits_stored"] == pytest.approx(direct["bits_stored"], rel=1e-6, abs=1e-3)
    assert metrics["facts"]["recall"] == direct["recall"]
    assert math.isfinite(direct["bits_stored"]) and direct["bits_stored"] < 0.1 * N * 16  # 6 steps: little stored
    # the oracle through lm-eval's route (our adapter, lm-eval's requests and aggregation)
    lm = MoHGELM(str(model_dir), device="cpu", batch_size=200)
    ev.go_offline()
    ev.build_tasks(data_dir, tmp_path, max_length=5)
    for know, want in ((True, N * 16.0), (False, 0.0)):
        lm.model = Oracle(cfg(), know=know)
        res = ev.run_lm_eval(lm, ["mohge_facts"], tmp_path)
        got = bits.from_lm_eval(res["mohge_facts"], cfg())
        assert got["bits_stored"] == pytest.approx(want, rel=1e-9, abs=1e-3)  # float32 log-softmax
        assert got["recall"] == (1.0 if know else 0.0)


def test_a_limited_facts_task_is_refused():
    with pytest.raises(ValueError, match="eval.limit"):
        bits.from_lm_eval({"perplexity": 2.0, "acc": 0.0, "n_samples": 10}, cfg())


def test_a_limited_facts_task_is_refused_at_plan_time():
    from mohge.config import RunConfig
    from mohge.config.preflight import check_run

    check_run(RunConfig.from_dict(RUN), inputs=False)
    with pytest.raises(ConfigError, match=r"eval\.limit=5"):
        check_run(RunConfig.from_dict({**RUN, "eval": {**RUN["eval"], "limit": 5}}), inputs=False)
