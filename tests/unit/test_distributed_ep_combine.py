"""The EP combine (mohge.train.distributed.ep_layer.combine_slots): fp32 accumulation in slot order, rounded once,
whatever order the rows arrive in; its gradients likewise (one process: the combine is local to a rank)."""

import torch

from mohge.train.distributed.ep_layer import combine_slots

T, K, D = 127, 4, 64


def problem():
    g = torch.Generator().manual_seed(0)
    rows_AD = (torch.randn(T * K, D, generator=g) * 3).to(torch.bfloat16)  # slot (t, k) at t * K + k
    gates_TK = torch.softmax(torch.randn(T, K, generator=g), dim=-1)
    dest_A = torch.randint(0, 4, (T * K,), generator=g)  # a destination rank per slot, as dispatch sorts them
    orders = [torch.argsort(dest_A, stable=True), torch.randperm(T * K, generator=g), torch.arange(T * K)]
    return rows_AD, gates_TK, orders


def fp32_fixed_order(rows_AD, gates_TK):
    rows = rows_AD.view(T, K, D).float()
    y = rows[:, 0] * gates_TK[:, 0, None]
    for k in range(1, K):
        y = y + rows[:, k] * gates_TK[:, k, None]
    return y.to(rows_AD.dtype)


def bf16_index_add(back_AD, order_A, gates_TK):  # the combine this replaces
    gate_A = gates_TK.reshape(-1)[order_A].to(back_AD.dtype)
    tok_A = torch.div(order_A, K, rounding_mode="floor")
    return back_AD.new_zeros(T, D).index_add(0, tok_A, back_AD * gate_A[:, None])


def test_combine_accumulates_in_fp32_in_slot_order_whatever_the_arrival_order():
    rows_AD, gates_TK, orders = problem()
    want = fp32_fixed_order(rows_AD, gates_TK)
    for order_A in orders:
        y = combine_slots(rows_AD[order_A], order_A, gates_TK)
        assert y.dtype == torch.bfloat16 and torch.equal(y, want)
    # the bf16 index_add (rounding after every slot) differs from it: the test can tell the two apart
    assert not torch.equal(bf16_index_add(rows_AD[orders[0]], orders[0], gates_TK), want)


def test_combine_gradients_do_not_depend_on_the_arrival_order():
    rows_AD, gates_TK, orders = problem()
    dy = torch.randn(T, D, generator=torch.Generator().manual_seed(1)).to(torch.bfloat16)
    grads = []
    for order_A in orders:
        rows = rows_AD.clone().requires_grad_(True)
        gates = gates_TK.clone().requires_grad_(True)
        (combine_slots(rows[order_A], order_A, gates).float() * dy.float()).sum().backward()
        grads.append((rows.grad, gates.grad))
    for rows_grad, gates_grad in grads[1:]:
        assert torch.equal(rows_grad, grads[0][0]) and torch.equal(gates_grad, grads[0][1])
    assert gates_TK.grad is None and grads[0][1].dtype == torch.float32
