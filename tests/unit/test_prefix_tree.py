"""The prefix tree the evaluation scores through: its nodes are the distinct prefixes, its rows hold each node's
ancestors before it, its masks are the ancestor relation, and the model run on packed rows gives each node the hidden
state of its prefix run alone (MHA and MLA)."""

import dataclasses

import pytest
import torch
from conftest import tiny_model_config

from mohge.evaluate.prefix_tree import PrefixTree
from mohge.model.transformer import LanguageModel


def _sequences(n: int = 40, vocab: int = 5, max_len: int = 12, seed: int = 0) -> list[list[int]]:
    """Random sequences over a small vocabulary: many share their first tokens."""
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, max_len + 1, (n,), generator=gen).tolist()
    return [torch.randint(0, vocab, (k,), generator=gen).tolist() for k in lengths]


def _tree(seqs):
    tree = PrefixTree()
    paths = [tree.add(s) for s in seqs]
    number = tree.freeze()
    prefix = {}  # pre-order number -> the prefix it stands for
    for s, path in zip(seqs, paths, strict=True):
        for k, node in enumerate(path):
            prefix[number[node]] = tuple(s[: k + 1])
    return tree, paths, number, prefix


def test_nodes_are_the_distinct_prefixes():
    """H0: the tree holds a prefix twice, misses one, or gives a node another token, depth or parent."""
    seqs = _sequences()
    tree, _, _, prefix = _tree(seqs)
    assert len(tree) == len({tuple(s[: k + 1]) for s in seqs for k in range(len(s))}) == len(prefix)
    assert sorted(prefix) == list(range(len(tree)))
    for node, p in prefix.items():
        assert tree.token[node] == p[-1] and tree.depth[node] == len(p) - 1
        assert (tree.parent[node] < 0) if len(p) == 1 else prefix[tree.parent[node]] == p[:-1]
        assert tree.size[node] == sum(q[: len(p)] == p for q in prefix.values())


@pytest.mark.parametrize("row_len", [12, 17, 40, 1000])
def test_rows_own_every_node_once_and_hold_its_ancestors_before_it(row_len):
    """H0: a node is owned by no row or by two, a row is longer than asked, or a row lacks an ancestor of one of its
    nodes (or holds it after the node)."""
    tree, _, _, prefix = _tree(_sequences())
    rows = tree.rows(row_len)
    owned = [n for r in rows for n in r.nodes[len(r.nodes) - r.owned :]]
    assert sorted(owned) == list(range(len(tree)))
    for r in rows:
        assert len(r.nodes) <= row_len and r.owned > 0
        at = {n: i for i, n in enumerate(r.nodes)}
        for i, n in enumerate(r.nodes):
            for a in tree.ancestors(n):
                assert at.get(a, len(r.nodes)) < i, (n, a)
    assert len(rows) > 1 or row_len == 1000


def test_row_masks_are_the_ancestor_relation_and_padding_sees_only_itself():
    """H0: in a packed batch, a token sees a token that is not its ancestor or itself, misses one, sees padding, or
    sits at a position other than its depth."""
    tree, _, _, prefix = _tree(_sequences())
    rows = tree.rows(17)
    ids, pos, mask = tree.batch(rows)
    assert ids.shape == pos.shape == mask.shape[:2] and mask.shape[1] == mask.shape[2]
    for b, r in enumerate(rows):
        n = len(r.nodes)
        for i, ni in enumerate(r.nodes):
            assert ids[b, i] == tree.token[ni] and pos[b, i] == tree.depth[ni]
            for j, nj in enumerate(r.nodes):
                assert bool(mask[b, i, j]) == (prefix[ni][: len(prefix[nj])] == prefix[nj]), (b, i, j)
            assert not mask[b, i, n:].any()
        for i in range(n, mask.shape[1]):  # padding: itself only
            assert mask[b, i].nonzero().flatten().tolist() == [i]


def test_refuses_rows_shorter_than_a_path_and_use_out_of_order():
    tree = PrefixTree()
    tree.add([1, 2, 3, 4])
    with pytest.raises(RuntimeError, match="before freeze"):
        tree.rows(8)
    tree.freeze()
    with pytest.raises(ValueError, match="row_len=3 must exceed the deepest node's depth 3"):
        tree.rows(3)
    with pytest.raises(RuntimeError, match="after freeze"):
        tree.add([5])


MLA = {"attention": "mla", "mla_q_head_dim": 8, "mla_rope_head_dim": 4, "mla_v_head_dim": 6, "mla_kv_lora_rank": 12}


@pytest.mark.parametrize("attention", ["mha", "mla"])
def test_packed_rows_give_each_prefix_its_hidden_state_run_alone(attention):
    """H0: a token run in a packed row (its depth as position, its ancestors as what it sees) gets a hidden state
    other than the last one of its prefix run alone as a causal sequence; MoE routing is per token, so the rows'
    other tokens change nothing."""
    cfg = tiny_model_config()
    if attention == "mla":
        cfg = dataclasses.replace(cfg, **MLA)
    model = LanguageModel(cfg).eval()
    seqs = _sequences(n=30, vocab=7, max_len=cfg.max_seq_len)
    tree, _, _, prefix = _tree(seqs)
    rows = tree.rows(40)
    ids, pos, mask = tree.batch(rows)
    with torch.no_grad():
        packed, _ = model.hidden(ids, pos, mask)
        for b, r in enumerate(rows):
            for i in range(len(r.nodes) - r.owned, len(r.nodes)):
                alone, _ = model.hidden(torch.tensor([prefix[r.nodes[i]]]))
                torch.testing.assert_close(packed[b, i], alone[0, -1], rtol=1e-5, atol=1e-5)
        # the default path is the causal one: the same logits as forward
        x, _ = model.hidden(ids[:, : cfg.max_seq_len])
        torch.testing.assert_close(model.logits(x), model(ids[:, : cfg.max_seq_len]).logits, rtol=0, atol=0)
    with pytest.raises(ValueError, match="together"):
        model.hidden(ids, positions_BS=pos)
    with pytest.raises(ValueError, match="exceeds max_seq_len"):
        model.hidden(ids, pos + cfg.max_seq_len, mask)
