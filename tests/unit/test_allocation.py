"""Placement strategies: the all-size numbers of docs/method.md §4.2, MoDSE pairs, the FLOP-aware LPT, the errors."""

import itertools
import random

import pytest

from mohge.model.allocation import (
    PLACEMENTS,
    all_size_physical_of_router,
    check_placement,
    experts_of_rank,
    group_of_physical,
    interleave_order,
    lpt_rank_of_expert,
    physical_of_router,
    place,
    rank_of_physical,
)

WIDTHS = (384, 512, 640, 768, 896, 1024, 1152, 1280)
G, N = 8, 8
WIDTHS_E = [w for w in WIDTHS for _ in range(N)]  # router order, group-major


def width_sums(ranks, ep):
    return [sum(WIDTHS_E[e] for e in ids) for ids in experts_of_rank(ranks, ep)]


def groups_on(ranks, ep):
    return [sorted(e // N for e in ids) for ids in experts_of_rank(ranks, ep)]


def test_interleave_and_closed_form():
    assert interleave_order(8) == [0, 7, 1, 6, 2, 5, 3, 4]
    for g_count in (2, 4, 8, 10):
        R = interleave_order(g_count)
        assert [group_of_physical(e, g_count) for e in range(3 * g_count)] == [
            R[e % g_count] for e in range(3 * g_count)
        ]
    with pytest.raises(ValueError, match="G=7"):
        interleave_order(7)


def test_all_size_is_the_documented_permutation():
    phys = physical_of_router("all_size", WIDTHS_E, 4, experts_per_group=N)
    assert phys == all_size_physical_of_router(G, N)
    # Physical row j is [g0, g7, g1, g6, g2, g5, g3, g4] (docs/method.md §4.2).
    router_of = {p: e for e, p in enumerate(phys)}
    assert [router_of[p] // N for p in range(8)] == [0, 7, 1, 6, 2, 5, 3, 4]
    assert [router_of[p] % N for p in range(8, 16)] == [1] * 8
    assert place("all_size", WIDTHS_E, 4) == [rank_of_physical(p, 64, 4) for p in phys]


@pytest.mark.parametrize("ep, per_rank_sum", [(4, 13312), (8, 6656), (16, 3328), (32, 1664)])
def test_all_size_width_sums_match_method(ep, per_rank_sum):
    ranks = place("all_size", WIDTHS_E, ep)
    assert width_sums(ranks, ep) == [per_rank_sum] * ep


def test_all_size_rank_contents_match_method_table():
    assert all(g == sorted(list(range(8)) * 2) for g in groups_on(place("all_size", WIDTHS_E, 4), 4))
    assert all(g == list(range(8)) for g in groups_on(place("all_size", WIDTHS_E, 8), 8))
    assert groups_on(place("all_size", WIDTHS_E, 16), 16)[0] == [0, 1, 6, 7]
    for g in groups_on(place("all_size", WIDTHS_E, 32), 32):  # one complementary pair
        assert g[0] + g[1] == G - 1


def test_all_size_at_ep64_is_unbalanced():
    sums = width_sums(place("all_size", WIDTHS_E, 64), 64)
    assert sorted(set(sums)) == list(WIDTHS)
    assert max(sums) / (sum(sums) / 64) > 1.5


def test_contiguous_holds_whole_groups():
    ranks = place("contiguous", WIDTHS_E, 8)
    assert ranks == [e // 8 for e in range(64)]
    assert width_sums(ranks, 8) == [8 * w for w in WIDTHS]


def test_modse_pairs_pair_index_major():
    ranks = place("modse_pairs", WIDTHS_E, 8)
    # Rank 0 holds four (g0, g7) pairs: members 0..3 of group 0 and of group 7.
    assert experts_of_rank(ranks, 8)[0] == [0, 1, 2, 3, 56, 57, 58, 59]
    for r, g in enumerate(groups_on(ranks, 8)):
        p = r // 2  # pair type (p, G-1-p) fills two ranks
        assert g == [p] * 4 + [G - 1 - p] * 4
    for ep in (2, 4, 8, 16, 32):
        sums = width_sums(place("modse_pairs", WIDTHS_E, ep), ep)
        assert sums == [sums[0]] * ep  # equal parameter memory per rank
    # Physical order: each adjacent pair (2i, 2i+1) is (g, G-1-g) with the same member j.
    router_of = {p: e for e, p in enumerate(physical_of_router("modse_pairs", WIDTHS_E, 8))}
    for i in range(32):
        a, b = router_of[2 * i], router_of[2 * i + 1]
        assert a // N + b // N == G - 1 and a % N == b % N


def test_flop_lpt_equal_counts_and_balances_flops_not_tokens():
    rng = random.Random(0)
    load = [rng.randint(0, 3000) for _ in range(64)]
    for ep in (2, 4, 8, 16, 32):
        ranks = place("flop_lpt", WIDTHS_E, ep, load)
        assert [len(ids) for ids in experts_of_rank(ranks, ep)] == [64 // ep] * ep
        cost = [sum(load[e] * WIDTHS_E[e] for e in ids) for ids in experts_of_rank(ranks, ep)]
        contiguous = [
            sum(load[e] * WIDTHS_E[e] for e in ids) for ids in experts_of_rank(place("contiguous", WIDTHS_E, ep), ep)
        ]
        assert max(cost) <= max(contiguous)
        if ep <= 8:
            assert max(cost) / (sum(cost) / ep) < 1.02
    # Costs load x width = 60, 20, 20, 60: LPT pairs {0, 1} and {3, 2}, equal FLOPs but tokens 80 vs 40.
    widths, load = [1, 1, 2, 2], [60, 20, 10, 30]
    ranks = place("flop_lpt", widths, 2, load)
    assert ranks == [0, 0, 1, 1]
    flops = [sum(load[e] * widths[e] for e in range(4) if ranks[e] == r) for r in range(2)]
    tokens = [sum(load[e] for e in range(4) if ranks[e] == r) for r in range(2)]
    assert flops == [80, 80] and tokens == [80, 40]


def test_lpt_near_optimal_small_cases():
    rng = random.Random(1)
    for _ in range(30):
        cost = [rng.randint(1, 50) for _ in range(8)]
        ranks = lpt_rank_of_expert(cost, 2)
        got = max(sum(c for c, r in zip(cost, ranks, strict=True) if r == k) for k in range(2))
        best = min(
            max(sum(cost[i] for i in s), sum(cost) - sum(cost[i] for i in s))
            for s in itertools.combinations(range(8), 4)
        )
        assert got <= 4 / 3 * best + 1e-9  # Graham's bound (LPT with a cardinality limit stays close here)


@pytest.mark.parametrize("strategy", PLACEMENTS)
def test_every_strategy_is_a_permutation_with_equal_counts(strategy):
    load = list(range(64))
    for ep in (1, 2, 4, 8, 16, 32):
        phys = physical_of_router(strategy, WIDTHS_E, ep, load)
        check_placement(phys, ep)
        assert sorted(phys) == list(range(64))


def test_check_placement_rejects_bad_maps():
    with pytest.raises(AssertionError, match="permutation"):
        check_placement([0, 0, 1, 2], 2)


@pytest.mark.parametrize(
    "strategy, widths, ep, load, match",
    [
        ("contiguous", WIDTHS_E, 3, None, r"'contiguous' at ep_size=3.*divide num_experts=64"),
        ("all_size", WIDTHS_E, 5, None, r"'all_size' at ep_size=5"),
        ("all_size", [8, 8, 16, 16, 24, 24], 2, None, r"'all_size' at ep_size=2: .*even number of groups, got G=3"),
        ("modse_pairs", WIDTHS_E, 64, None, r"'modse_pairs' at ep_size=64: .*even number of experts per rank"),
        ("modse_pairs", [8, 8, 16, 16, 24, 24], 2, None, r"'modse_pairs' at ep_size=2: .*even number of groups"),
        ("flop_lpt", WIDTHS_E, 8, None, r"'flop_lpt' at ep_size=8: flop_lpt needs measured loads"),
        ("flop_lpt", WIDTHS_E, 8, [1] * 63, r"'flop_lpt' at ep_size=8: load_E has 63"),
        ("round_robin", WIDTHS_E, 8, None, r"'round_robin' is not one of"),
    ],
)
def test_errors_name_strategy_and_ep(strategy, widths, ep, load, match):
    with pytest.raises(ValueError, match=match):
        place(strategy, widths, ep, load)


def test_widths_must_be_group_major():
    with pytest.raises(ValueError, match="group-major with 2 equal widths"):
        place("all_size", [8, 16, 8, 16], 2, experts_per_group=2)
    with pytest.raises(ValueError, match="experts_per_group=3 does not divide"):
        place("modse_pairs", [8, 8, 16, 16], 2, experts_per_group=3)
    assert place("all_size", [8, 8, 16, 16], 2) == [0, 1, 0, 1]  # n inferred from the first run of widths
