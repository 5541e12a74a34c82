"""Nothing survives an iteration; dropped tensors are freed for good or evicted; disable() leaves nothing."""

import gc
import weakref

import pytest
import torch
from torch.utils._python_dispatch import _get_current_dispatch_mode_stack

import torch_dtr
from torch_dtr.eager.tensor import DTRTensor


def _model():
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Dropout(0.1), torch.nn.Linear(64, 64),
        torch.nn.LayerNorm(64), torch.nn.Linear(64, 4),
    )


def test_ten_iterations_leave_no_growth():
    model = _model()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    x, y = torch.randn(16, 32), torch.randint(0, 4, (16,))
    torch_dtr.enable(budget="56KB")
    after = []
    for _ in range(10):
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        del loss
        gc.collect()
        st = torch_dtr.stats()
        after.append((st.resident_bytes, st.live_storages))
        assert st.resident_bytes == st.constant_bytes  # only constants remain
        assert st.live_storages == 0  # no record of a dead tensor
    assert len(set(after)) == 1, after
    assert torch_dtr.stats().evictions > 0
    torch_dtr.runtime().check()


@pytest.mark.python_front  # the Python front end's own objects
def test_released_payload_is_really_freed():
    w = torch.randn(256, 256, requires_grad=True)
    torch_dtr.enable(budget=None)
    y = torch.tanh(w * 2)
    payload = weakref.ref(y._cell.storage.payload)
    base = torch_dtr.stats().resident_bytes
    del y
    gc.collect()
    assert payload() is None
    assert torch_dtr.stats().resident_bytes == base - 256 * 256 * 4
    assert torch_dtr.stats().live_storages == 0


@pytest.mark.python_front  # the Python front end's own objects
def test_dropped_tensor_with_live_dependent_is_evicted_not_released():
    w = torch.randn(64, 64, requires_grad=True)
    torch_dtr.enable(budget=None)
    x = w * 1.0  # managed
    with torch.no_grad():  # no autograd graph holds a
        a = torch.tanh(x)
        b = a * 2  # b's recipe reads a
    sa = a._cell.storage
    del a
    st = torch_dtr.stats()
    assert st.drops == 1 and not sa.resident and not sa.released
    assert st.live_storages == 3  # a's record is kept for b's recipe
    torch_dtr.runtime().evict(b._cell.storage)
    assert torch.equal(torch_dtr.eager.peek(b), torch.tanh(w.detach()) * 2)  # recomputes a, then b
    del b
    st = torch_dtr.stats()
    assert st.live_storages == 1 and sa.released  # only x is left


def test_autograd_saved_tensors_keep_their_storage_until_backward():
    w = torch.randn(32, 32, requires_grad=True)
    torch_dtr.enable(budget=None)
    loss = torch.sigmoid(torch.ones(8, 32) @ w).sum()  # sigmoid saves its output for backward
    gc.collect()
    held = torch_dtr.stats().live_storages
    assert held >= 1
    loss.backward()
    del loss
    gc.collect()
    assert torch_dtr.stats().live_storages == 0
    assert torch_dtr.stats().resident_bytes == torch_dtr.stats().constant_bytes


@pytest.mark.python_front  # the Python front end's own objects
def test_disable_leaves_plain_pytorch():
    w = torch.randn(8, requires_grad=True)
    torch_dtr.enable(budget=None)
    y = w * 3
    assert type(y) is DTRTensor
    torch_dtr.disable()
    assert not _get_current_dispatch_mode_stack()
    z = w * 3
    assert type(z) is torch.Tensor
    # a managed tensor kept past disable() still works; ops on it give plain tensors
    assert type(y + 1) is torch.Tensor and torch.equal(y + 1, z + 1)
    (y.sum() + z.sum()).backward()
    assert type(w.grad) is torch.Tensor and torch.equal(w.grad, torch.full((8,), 6.0))
    del y, z
    gc.collect()
    assert torch_dtr.stats().live_storages == 0


def test_constants_stop_counting_when_they_die():
    torch_dtr.enable(budget=None)
    w = torch.randn(100, 100, requires_grad=True)
    y = w * 2
    assert torch_dtr.stats().constant_bytes == 100 * 100 * 4
    del w, y
    gc.collect()
    assert torch_dtr.stats().constant_bytes == 0 and torch_dtr.stats().resident_bytes == 0


def _held_loss_steps(budget):
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=1e-2)
    x, y = torch.randn(512, 32), torch.randint(0, 4, (512,))
    torch_dtr.enable(budget=budget)
    left = []
    for _ in range(3):
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        float(torch_dtr.unwrap(loss))  # the loop holds the loss (pinned) until the next one replaces it
        gc.collect()
        st = torch_dtr.stats()
        left.append((st.resident_bytes - st.constant_bytes, st.live_storages))
    torch_dtr.runtime().check()
    peak = torch_dtr.stats().peak_bytes
    torch_dtr.disable()
    return left, peak


def test_a_held_loss_read_as_a_float_keeps_nothing_but_itself_at_70_percent():
    # The bench's GPT-2 at 30% of its peak failed in step 2: the loop held step 1's loss, read with
    # float(unwrap(loss)), so pinned; its recipe (nll_loss) kept the log-softmax it reads, which a constant
    # change had pinned, resident through the next step. Here (before NOTE [ Lifetimes ] 5) the log-softmax's
    # 8 KiB stayed after every step at 70% of the peak.
    left, peak = _held_loss_steps(None)
    assert left == [(4, 1)] * 3
    left, _ = _held_loss_steps(int(peak * 0.7))
    assert torch_dtr.stats().evictions > 0
    assert left == [(4, 1)] * 3, "only the held 4-byte loss is left besides the constants"
