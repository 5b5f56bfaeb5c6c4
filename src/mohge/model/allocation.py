"""Expert placement: router order vs physical (expert-parallel) order, and the strategies compared.

The All-size Group-decoupling Allocation of MoHGE (arXiv 2604.23108; docs/method.md §4) keeps the router's
group-contiguous expert order and the physical order as two index spaces joined by a fixed permutation:
physical index e_p = j*G + pos, where pos is the position of group g in R = [0, G-1, 1, G-2, ...].
Expert-parallel rank rho owns the contiguous physical block [rho*E/EP, (rho+1)*E/EP).

Every strategy below is such a permutation ``phys[e_r]`` (router id -> physical id); the rank of an expert
is then ``phys[e_r] // (E/EP)``. Four strategies are compared (docs/method.md §4.1):

* ``contiguous``: physical = router order, so each rank holds whole groups (what HMoE-style models get).
* ``all_size``: MoHGE's interleave (docs/method.md §4.1). Per-rank width sums are identical whenever E/EP is even
  (13312 / 6656 / 3328 / 1664 at EP 4 / 8 / 16 / 32 for the 3B widths), and per-rank FLOPs are identical
  for *any* group popularity when E/EP is a multiple of G and load is uniform within each group.
* ``modse_pairs``: MoDSE's expert pairs (g, G-1-g) of constant total width, pair-index-major: pair type
  (g0, g7) first (members j = 0..n-1), then (g1, g6), ... At EP=8 with 64 experts rank 0 holds four
  (g0, g7) pairs. Parameter memory is equal per rank; compute follows the popularity of the pair type.
* ``flop_lpt``: a FLOP-aware balancer: greedy longest-processing-time on measured cost tokens_e * width_e,
  each expert to the least-loaded rank that still has room, so every rank gets E/EP experts. It balances
  FLOPs, not token counts, and needs the loads (``load_E``).

Legend: G groups, n experts per group, E = G*n experts, EP expert-parallel ranks. ``widths_E`` is the
width of every expert in router (group-major) order.
"""

from __future__ import annotations

from collections.abc import Sequence

from mohge.config import PLACEMENTS  # the placement vocabulary, defined once in the config


def interleave_order(G: int) -> list[int]:
    """R = [0, G-1, 1, G-2, ..., G/2-1, G/2]: smallest group next to largest (docs/method.md §4.1)."""
    if G % 2:
        raise ValueError(f"G={G}: the all-size interleave needs an even number of groups")
    order = []
    for i in range(G // 2):
        order += [i, G - 1 - i]
    return order


def group_of_physical(e_p: int, G: int) -> int:
    """Closed form of R[e_p mod G] (docs/method.md §4.1): r even -> r/2, r odd -> G - (r+1)/2."""
    r = e_p % G
    return r // 2 if r % 2 == 0 else G - (r + 1) // 2


def all_size_physical_of_router(G: int, n: int) -> list[int]:
    """phys[e_r] for router id e_r = g*n + j: e_p = j*G + pos(g), pos(g) = 2g if g < G/2 else 2(G-1-g)+1."""
    pos = {g: p for p, g in enumerate(interleave_order(G))}
    return [j * G + pos[g] for g in range(G) for j in range(n)]


def rank_of_physical(e_p: int, num_experts: int, ep_size: int) -> int:
    """EP rank that owns physical expert e_p (contiguous blocks, as in Megatron)."""
    if num_experts % ep_size:
        raise ValueError(f"ep_size={ep_size} does not divide num_experts={num_experts}")
    return e_p // (num_experts // ep_size)


def modse_pairs_physical_of_router(G: int, n: int) -> list[int]:
    """phys[e_r] for MoDSE pairs: pair type p = (g_p, g_{G-1-p}), physical e_p = p*2n + 2j + (0 | 1)."""
    if G % 2:
        raise ValueError(f"G={G}: modse_pairs needs an even number of groups to pair (g, G-1-g)")
    phys = [0] * (G * n)
    for p in range(G // 2):
        for j in range(n):
            phys[p * n + j] = p * 2 * n + 2 * j  # member j of the small group of the pair
            phys[(G - 1 - p) * n + j] = p * 2 * n + 2 * j + 1  # member j of its complement
    return phys


def lpt_rank_of_expert(cost_E: Sequence[float], ep_size: int) -> list[int]:
    """Greedy LPT with a cardinality limit: experts by decreasing cost, each to the least-loaded rank with room.

    Ties (equal cost, equal rank load) go to the lower expert id and the lower rank, so the result is
    deterministic. Every rank ends with exactly E/EP experts.
    """
    E = len(cost_E)
    per_rank = E // ep_size
    load = [0.0] * ep_size
    room = [per_rank] * ep_size
    rank_of = [0] * E
    for e in sorted(range(E), key=lambda e: (-cost_E[e], e)):
        rho = min((r for r in range(ep_size) if room[r]), key=lambda r: (load[r], r))
        rank_of[e] = rho
        load[rho] += cost_E[e]
        room[rho] -= 1
    return rank_of


def _groups(widths_E: Sequence[int], experts_per_group: int | None) -> tuple[int, int]:
    """(G, n) of a group-major expert list; n inferred from the first run of equal widths when not given."""
    E = len(widths_E)
    n = experts_per_group
    if n is None:
        n = 1
        while n < E and widths_E[n] == widths_E[0]:
            n += 1
    if n <= 0 or E % n:
        raise ValueError(f"experts_per_group={n} does not divide num_experts={E}")
    for g in range(E // n):
        block = widths_E[g * n : (g + 1) * n]
        if len(set(block)) != 1:
            raise ValueError(
                f"experts {g * n}..{(g + 1) * n - 1} (group {g}) have widths {list(block)}: "
                f"widths_E must be group-major with {n} equal widths per group"
            )
    return E // n, n


def physical_of_router(
    strategy: str,
    widths_E: Sequence[int],
    ep_size: int,
    load_E: Sequence[float] | None = None,
    experts_per_group: int | None = None,
) -> list[int]:
    """The permutation router id -> physical id of ``strategy`` at ``ep_size`` ranks (module docstring).

    Raises a ValueError naming the strategy and the EP size when the rank count does not fit.
    """
    E = len(widths_E)
    where = f"placement {strategy!r} at ep_size={ep_size}"
    if strategy not in PLACEMENTS:
        raise ValueError(f"placement {strategy!r} is not one of {PLACEMENTS}")
    if ep_size <= 0 or E == 0 or E % ep_size:
        raise ValueError(f"{where}: ep_size must divide num_experts={E}")
    per_rank = E // ep_size
    if strategy == "contiguous":
        phys = list(range(E))
    elif strategy == "all_size":
        G, n = _groups(widths_E, experts_per_group)
        if G % 2:
            raise ValueError(f"{where}: all_size needs an even number of groups, got G={G}")
        phys = all_size_physical_of_router(G, n)
    elif strategy == "modse_pairs":
        G, n = _groups(widths_E, experts_per_group)
        if G % 2:
            raise ValueError(f"{where}: modse_pairs needs an even number of groups, got G={G}")
        if per_rank % 2:
            raise ValueError(f"{where}: modse_pairs needs an even number of experts per rank, got {per_rank}")
        phys = modse_pairs_physical_of_router(G, n)
    else:  # flop_lpt
        if load_E is None:
            raise ValueError(f"{where}: flop_lpt needs measured loads (load_E, tokens per expert)")
        if len(load_E) != E:
            raise ValueError(f"{where}: load_E has {len(load_E)} entries for {E} experts")
        if any(x < 0 for x in load_E):
            raise ValueError(f"{where}: load_E must be >= 0")
        rank_of = lpt_rank_of_expert([float(x) * w for x, w in zip(load_E, widths_E, strict=True)], ep_size)
        # Physical order: rank-major, router order inside a rank.
        order = sorted(range(E), key=lambda e: (rank_of[e], e))
        phys = [0] * E
        for e_p, e_r in enumerate(order):
            phys[e_r] = e_p
    check_placement(phys, ep_size)
    return phys


def check_placement(phys_E: Sequence[int], ep_size: int) -> None:
    """Invariants of every placement: a permutation (each expert placed exactly once), E/EP experts per rank."""
    E = len(phys_E)
    assert sorted(phys_E) == list(range(E)), "placement is not a permutation of the experts"
    per_rank = E // ep_size
    counts = [0] * ep_size
    for e_p in phys_E:
        counts[e_p // per_rank] += 1
    assert counts == [per_rank] * ep_size, f"unequal experts per rank: {counts}"


def place(
    strategy: str,
    widths_E: Sequence[int],
    ep_size: int,
    load_E: Sequence[float] | None = None,
    experts_per_group: int | None = None,
) -> list[int]:
    """rank_of_expert[e_r] (router order) for ``strategy`` at ``ep_size`` ranks; see :func:`physical_of_router`."""
    phys = physical_of_router(strategy, widths_E, ep_size, load_E, experts_per_group)
    per_rank = len(widths_E) // ep_size
    return [e_p // per_rank for e_p in phys]


def experts_of_rank(rank_of_expert: Sequence[int], ep_size: int) -> list[list[int]]:
    """Router ids held by each rank, ascending."""
    out: list[list[int]] = [[] for _ in range(ep_size)]
    for e, rho in enumerate(rank_of_expert):
        out[rho].append(e)
    return out
