"""Views, in-place ops, randomness, tensor behaviour and the public API, against plain PyTorch."""

import threading

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from util import came_back, evict_all, plain

import torch_dtr
from torch_dtr.eager.tensor import DTRTensor


# ---------------------------------------------------------------- budgets
@pytest.mark.parametrize(
    "text,expected",
    [(1234, 1234), ("512MB", 512 * 10**6), ("3GiB", 3 * 2**30), ("1.5 GB", 1_500_000_000), ("2kib", 2048),
     ("10 b", 10), ("0.5MiB", 2**19), (None, None)],
)
def test_parse_budget(text, expected):
    assert torch_dtr.parse_budget(text) == expected


@pytest.mark.parametrize("bad", ["3 gigs", "GiB", "-1MB", "1e9", "", -5, 2.5, True])
def test_parse_budget_rejects(bad):
    with pytest.raises(ValueError) as e:
        torch_dtr.parse_budget(bad)
    assert repr(bad) in str(e.value) or str(bad) in str(e.value)
    assert "3GiB" in str(e.value)


def test_enable_rejects_bad_options():
    with pytest.raises(ValueError, match="unknown policy 'nope'.*dtr_eq"):
        torch_dtr.enable("1GiB", policy="nope")
    assert not torch_dtr.enabled()
    first = torch_dtr.enable("1GiB")
    with pytest.warns(RuntimeWarning, match="that session is disabled first"):  # a notebook cell run again
        second = torch_dtr.enable("2GiB")
    assert not first.active and second.active and torch_dtr.stats().budget_bytes == 2 << 30


# ---------------------------------------------------------------- views and in-place ops
def _views_program(w):
    x = torch.arange(48, dtype=torch.float32).reshape(6, 8) / 7
    h = x @ w  # managed: w requires grad
    evict_all()
    v = h[:, 2:5]
    t = h.t()
    v.mul_(2)  # a write through a view changes h and t
    evict_all()
    u = torch.sigmoid(h) * 3
    u.add_(1.0)
    u.relu_()
    evict_all()
    col = t[1]  # a view of a transposed view
    evict_all()
    s = (t.sum(0) * 2).sum() + u.sum() + v.sum() + col.sum()
    s.backward()
    return [s, h, v, t, u, col]


@pytest.mark.python_front  # the Python front end's own objects
def test_views_and_inplace_match_plain_under_eviction():
    torch.manual_seed(0)
    w = torch.randn(8, 5, requires_grad=True)
    ref = plain(_views_program(w))
    ref_grad = w.grad.clone()
    w.grad = None
    torch_dtr.enable(budget=None)
    got = _views_program(w)
    st = torch_dtr.stats()
    assert st.evictions > 0 and came_back(st) > 0
    assert all(type(g) is DTRTensor for g in got)
    got = plain(got)
    assert type(w.grad) is torch.Tensor
    for a, b in zip(ref, got, strict=True):
        assert torch.equal(a, b)
    assert torch.equal(ref_grad, w.grad)
    torch_dtr.runtime().check()


def test_old_version_recomputed_for_recipes_that_read_it():
    """A recipe that read a tensor before an in-place write still recomputes the old value."""
    w = torch.randn(4, 4, requires_grad=True)
    torch_dtr.enable(budget=None)
    with torch.no_grad():
        pass
    h = torch.ones(4, 4) @ w  # managed
    y = h * 2  # reads h before the write
    h.add_(100)  # new version of h's storage
    evict_all()
    expected = (torch.ones(4, 4) @ w.detach()) * 2
    assert torch.equal(torch_dtr.unwrap(y), expected)
    assert torch.equal(torch_dtr.unwrap(h), torch.ones(4, 4) @ w.detach() + 100)


def test_write_to_constant_from_managed_value_stays_plain():
    w = torch.randn(3, requires_grad=True)
    buf = torch.zeros(3)
    torch_dtr.enable(budget=None)
    m = w * 2
    out = buf.copy_(m)
    assert out is buf and type(buf) is torch.Tensor
    assert torch.equal(buf, w.detach() * 2)


# ---------------------------------------------------------------- randomness
def test_dropout_masks_identical_after_eviction():
    torch.manual_seed(3)
    w = torch.randn(64, 64, requires_grad=True)
    torch_dtr.enable(budget=None, swap=False)  # recomputation itself is tested
    torch.manual_seed(7)
    d = F.dropout(torch.ones(32, 64) @ w, p=0.5, training=True)
    first = plain(d)
    after = torch.rand(3)  # the program's random stream continues
    rt = torch_dtr.runtime()
    before = rt.rematerializations
    evict_all()
    again = plain(d)
    assert rt.rematerializations > before
    assert torch.equal(first, again)
    torch_dtr.disable()
    torch.manual_seed(7)
    ref = F.dropout(torch.ones(32, 64) @ w.detach(), p=0.5, training=True)
    assert torch.equal(ref, first)
    # replaying did not disturb the program's stream
    torch.manual_seed(7)
    F.dropout(torch.ones(32, 64), p=0.5, training=True)
    assert torch.equal(torch.rand(3), after)


def test_random_op_with_explicit_generator_replays():
    g = torch.Generator().manual_seed(11)
    w = torch.randn(16, requires_grad=True)
    torch_dtr.enable(budget=None)
    x = torch.bernoulli(torch.sigmoid(w), generator=g)
    first = plain(x)
    evict_all()
    assert torch.equal(first, plain(x))


def test_recomputed_exactly_once():
    w = torch.randn(16, 16, requires_grad=True)
    torch_dtr.enable(budget=None, swap=False)  # recomputation itself is tested
    a = torch.tanh(torch.ones(4, 16) @ w)
    b = a * 3
    evict_all()
    rt = torch_dtr.runtime()
    n = rt.rematerializations
    plain(b)
    # b needs a, a needs the matmul's output (evicted when its last handle died): three recipes, once each
    assert rt.rematerializations - n == 3
    plain(b)  # now resident: nothing runs again
    assert rt.rematerializations - n == 3


# ---------------------------------------------------------------- behaviour as a tensor
@pytest.mark.python_front  # the Python front end's own objects
def test_managed_tensor_behaves_like_a_tensor(capsys):
    w = torch.tensor([[1.0, -2.0], [3.0, 4.0]], requires_grad=True)
    torch_dtr.enable(budget=None)
    y = w * 2
    assert type(y) is DTRTensor and y.shape == (2, 2) and y.dtype == torch.float32
    evict_all()
    print(y)
    assert "dtr_tensor([[ 2., -4.]" in capsys.readouterr().out
    assert y[1, 0].item() == 6.0
    assert y.tolist() == [[2.0, -4.0], [6.0, 8.0]]
    assert np.array_equal(y.detach().numpy(), np.array([[2.0, -4.0], [6.0, 8.0]], dtype=np.float32))
    with pytest.raises(RuntimeError, match="requires grad"):
        y.numpy()
    assert torch.equal(torch_dtr.unwrap(y > 0), torch.tensor([[True, False], [True, True]]))
    assert bool((y == y).all())
    assert torch_dtr.unwrap(torch.ones(2)) is not None and type(torch_dtr.unwrap(torch.ones(2))) is torch.Tensor


@pytest.mark.python_front  # the Python front end's own objects
def test_outputs_of_plain_ops_stay_plain():
    torch_dtr.enable(budget=None)
    x = torch.randn(3, 3)
    assert type(x @ x) is torch.Tensor
    p = torch.randn(3, requires_grad=True)
    assert type(p * 2) is DTRTensor
    assert type(p.t()) is torch.Tensor  # a view of a constant stays plain
    with torch.no_grad():  # NOTE [ Managed vs constant ] 5: inference is managed, views and writes are not
        assert type(p * 2) is DTRTensor and type(x @ x) is DTRTensor
        assert type(p.t()) is torch.Tensor and type(x.add_(1)) is torch.Tensor
        assert type(torch.zeros(3)) is torch.Tensor, "a factory reads no tensor: it stays a constant"
    opt = torch.optim.SGD([p], lr=0.1)
    p.grad = torch.ones(3)
    seen = []
    handle = opt.register_step_pre_hook(lambda *_: seen.append(torch_dtr.eager.front._ACTIVE.stepping))
    opt.step()  # inside step() nothing is managed: the optimizer's state and updates stay plain
    handle.remove()
    assert seen == [True] and not torch_dtr.eager.front._ACTIVE.stepping


# ---------------------------------------------------------------- infeasible budgets
def test_infeasible_budget_raises_with_numbers_then_recovers():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10))
    x = torch.randn(64, 256)
    torch_dtr.enable(budget="100KB")
    with pytest.raises(torch_dtr.BudgetError) as e:
        model(x).sum().backward()
    msg = str(e.value)
    assert "budget 97.66 KiB (100000 B)" in msg and "needs" in msg and "at least" in msg
    torch_dtr.disable()
    assert not torch_dtr.enabled()
    model.zero_grad()
    torch_dtr.enable(budget="2MB")
    model(x).sum().backward()
    assert all(type(p.grad) is torch.Tensor for p in model.parameters())
    assert torch_dtr.stats().peak_bytes <= 2_000_000


def test_budget_scope_nests_and_restores():
    w = torch.randn(128, 128, requires_grad=True)
    with torch_dtr.budget("10MB"):
        assert torch_dtr.stats().budget_bytes == 10_000_000
        a = torch.ones(64, 128) @ w
        with torch_dtr.budget("200KB"):
            assert torch_dtr.stats().budget_bytes == 200_000
            b = torch.tanh(a) @ w
            c = torch.tanh(b) @ w
            assert torch_dtr.stats().resident_bytes <= 200_000
        assert torch_dtr.stats().budget_bytes == 10_000_000
        assert torch.isfinite(torch_dtr.unwrap(c)).all()
    assert not torch_dtr.enabled()


# ---------------------------------------------------------------- long chains
def test_long_chain_rematerializes_without_recursion_error():
    w = torch.ones(64, requires_grad=True)
    size = 64 * 4
    torch_dtr.enable(budget=None, swap=False)  # recomputation itself is tested
    x = w * 1.0
    for _ in range(20_000):
        x = x * 1.0001
    rt = torch_dtr.runtime()
    # the smallest budget that can hold the chain's working set: constants + input + output
    rt.budget = rt.memory.constants + 3 * size
    evict_all()
    rt.reset_peak()
    got = plain(x)
    assert rt.rematerializations >= 20_000
    assert rt.memory.peak <= rt.budget
    expected = torch.ones(64)
    for _ in range(20_000):
        expected = expected * 1.0001
    assert torch.equal(got, expected)


# ---------------------------------------------------------------- threads
def test_backward_on_another_thread():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.Tanh(), torch.nn.Linear(64, 1))
    x = torch.randn(16, 32)
    model(x).sum().backward()
    ref = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    torch_dtr.enable(budget=None)
    loss = model(x).sum()
    evict_all()
    errors = []

    def work():
        try:
            loss.backward()  # this thread has no dispatch mode: the subclass routes to the runtime
        except BaseException as e:  # noqa: BLE001
            errors.append(e)

    t = threading.Thread(target=work)
    t.start()
    t.join()
    assert not errors
    for r, p in zip(ref, model.parameters(), strict=True):
        assert type(p.grad) is torch.Tensor and torch.equal(r, p.grad)


@pytest.mark.python_front  # the Python front end's own objects
def test_an_evicted_in_place_chain_comes_back_in_one_buffer():
    # y = x * 2 then three in-place ops (an activation written in place, as LSTMCell's gates and dropout's
    # bernoulli_ are): every old version is read only by the next write's recipe, so the replay writes in
    # place as the first run did (NOTE [ Planned rematerialization ] 6) and needs one buffer, not two
    torch.manual_seed(0)
    x = torch.randn(128, 128, requires_grad=True)
    with torch.no_grad():
        want = (x * 2).sigmoid_().mul_(3).add_(1)
    torch_dtr.enable(budget=None, swap=False)  # recomputation itself is tested
    try:
        y = x * 2
        y.sigmoid_()
        y.mul_(3)
        y.add_(1)
        assert type(y) is DTRTensor
        rt = torch_dtr.runtime()
        assert evict_all() == 1  # the newest version; the older ones were never resident beside it
        base = rt.memory.tracked  # x (a constant) and nothing else
        one = 128 * 128 * 4
        with torch_dtr.budget(base + one):  # room for one 64 KiB buffer
            rt.reset_peak()
            got = plain(y)
        assert rt.rematerializations == 4 and rt.memory.peak <= base + one
        rt.check()
    finally:
        torch_dtr.disable()
    assert torch.equal(got, want)


def test_foreach_writes_in_place_to_managed_tensors_are_kept():
    # ``torch._foreach_mul_(ts, 3)`` writes a list argument; the Python front end read only a single tensor as
    # written, so each value kept the recipe of what it was before and came back as that once evicted (silently,
    # until 2026-11-30). Under no_grad (ops on plain tensors are managed there), then every storage evicted.
    base = torch.arange(4096.0) + 1
    want = [base * k * 3 + base for k in (1, 2)]
    torch_dtr.enable(budget=None)
    try:
        with torch.no_grad():
            ts = [base * k for k in (1, 2)]
            torch._foreach_mul_(ts, 3.0)
            torch._foreach_add_(ts, [base, base])
            evict_all()
            got = [plain(t) for t in ts]
    finally:
        torch_dtr.disable()
    assert all(torch.equal(g, w) for g, w in zip(got, want, strict=True))
