"""Expert placement: router order vs physical (expert-parallel) order.

The All-size Group-decoupling Allocation of MoHGE (arXiv 2604.23108; spec section 4) keeps the router's
group-contiguous expert order and the physical order as two index spaces joined by a fixed permutation:
physical index e_p = j*G + pos, where pos is the position of group g in R = [0, G-1, 1, G-2, ...].
Expert-parallel rank rho owns the contiguous physical block [rho*E/EP, (rho+1)*E/EP).

Legend: G groups, n experts per group, E = G*n experts, EP expert-parallel ranks.
"""

from __future__ import annotations


def interleave_order(G: int) -> list[int]:
    """R = [0, G-1, 1, G-2, ..., G/2-1, G/2]: smallest group next to largest (spec step P)."""
    if G % 2:
        raise ValueError(f"G={G}: the all-size interleave needs an even number of groups")
    order = []
    for i in range(G // 2):
        order += [i, G - 1 - i]
    return order


def group_of_physical(e_p: int, G: int) -> int:
    """Closed form of R[e_p mod G] (spec 4.1): r even -> r/2, r odd -> G - (r+1)/2."""
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
