"""Public API of the eager front end: listeners, exported errors, managed tensors after their session ended."""

from __future__ import annotations

import pytest
import torch

import torch_dtr
from torch_dtr.eager.tensor import DTRTensor


@pytest.mark.python_front  # the Python front end's own objects
def test_listen_sees_every_op_and_evictions_then_stops():
    w = torch.randn(64, 64, requires_grad=True)
    torch_dtr.enable(budget=None)
    try:
        kinds: list[str] = []
        stop = torch_dtr.listen(lambda kind, s: kinds.append(kind))
        y = (w * 2).tanh()
        ops = torch_dtr.runtime().ops
        assert kinds.count("op") == ops >= 2  # mul, tanh (and what autograd saves of them)
        torch_dtr.runtime().evict(y._cell.storage)
        assert kinds[-1] == "evict"
        stop()
        y.sum().backward()
        assert torch_dtr.runtime().ops > ops and kinds.count("op") == ops and "remat" not in kinds
    finally:
        torch_dtr.disable()
    with pytest.raises(RuntimeError, match="needs an enabled runtime"):
        torch_dtr.listen(lambda kind, s: None)


@pytest.mark.python_front  # the Python front end's own objects
@pytest.mark.parametrize("event,swap", [("remat", {"swap": False}), ("swapin", {"swap": True, "swap_gbps": 1000})])
def test_a_listener_can_stop_a_thrashing_run_and_the_runtime_stays_usable(event, swap):
    class Cap(Exception):
        pass

    w = torch.randn(32, 32, requires_grad=True)
    torch_dtr.enable(budget=None, **swap)  # values come back by recomputation, or from their copies
    try:
        rt = torch_dtr.runtime()

        def cap(kind, s):
            if kind == event:
                raise Cap

        a = (w * 3).exp()
        b = a * 2
        rt.evict(a._cell.storage)
        rt.evict(b._cell.storage)
        stop = torch_dtr.listen(cap)
        with pytest.raises(Cap):
            b.sum()
        stop()
        assert torch.equal(torch_dtr.unwrap(b), (w.detach() * 3).exp() * 2)
        rt.check()
    finally:
        torch_dtr.disable()


def test_errors_are_exported():
    assert issubclass(torch_dtr.ConstantChangedError, RuntimeError)
    assert issubclass(torch_dtr.InternalError, AssertionError)
    assert issubclass(torch_dtr.BudgetError, RuntimeError)


@pytest.mark.python_front  # the Python front end's own objects
def test_managed_tensor_from_an_ended_session_computes_plain():
    w = torch.randn(16, 16, requires_grad=True)
    torch_dtr.enable(budget=None)
    y = w * 2
    torch_dtr.disable()
    assert type(y) is DTRTensor
    z = y + 1  # no mode: the tensor's own (ended) session runs it on plain values
    assert type(z) is not DTRTensor and torch.equal(z, w.detach() * 2 + 1)


def test_budget_scope_whose_entry_fails_leaves_the_old_budget():
    w = torch.randn(64, 64, requires_grad=True)
    torch_dtr.enable(budget="1GiB")
    try:
        y = w * 2  # w (16 KiB) is now a constant: 1 KB cannot be kept
        with pytest.raises(torch_dtr.BudgetError, match="the new budget"):
            with torch_dtr.budget("1KB"):
                pass
        assert torch_dtr.stats().budget_bytes == 2**30
        assert torch.equal(torch_dtr.unwrap(y), w.detach() * 2)
    finally:
        torch_dtr.disable()


def test_after_disable_every_held_value_reads_even_when_the_old_budget_could_not_hold_them_all():
    torch.manual_seed(0)
    w = torch.randn(256, 256, requires_grad=True)
    budget = 6 * 256 * 256 * 4  # six of the twenty values the program holds
    torch_dtr.enable(budget=budget)
    xs, y = [], w
    for _ in range(20):
        y = torch.tanh(y @ w)
        xs.append(y)
    assert torch_dtr.stats().evictions > 0
    torch_dtr.disable()
    got = [x.detach().clone() for x in xs]  # each read pins its value: 20 of them no longer fit the budget
    with torch.no_grad():
        y, want = w, []
        for _ in range(20):
            y = torch.tanh(y @ w)
            want.append(y)
    assert all(torch.equal(a, b) for a, b in zip(got, want, strict=True))
    assert torch_dtr.stats().budget_bytes == budget, "stats() still reports the ended session's budget"
