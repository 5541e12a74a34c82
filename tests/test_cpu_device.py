"""``enable(budget, device="cpu")``: the budget bounds the process's tensor memory (NOTE [ The CPU as a device ]).

Each test trains plain PyTorch first, then under torch-dtr at the budget its name says: a fraction of the whole count
(every block the session's CPU allocator handed out, plus the parameters made before it) that a run with the device
and no budget measured.
"""

from __future__ import annotations

import gc

import pytest
import torch

import torch_dtr
from torch_dtr import native

pytestmark = pytest.mark.skipif(not native.available(), reason="the C++ front end cannot be built here")


@pytest.fixture(autouse=True)
def _off():
    yield
    torch_dtr.disable()
    gc.collect()


def _train(budget=None, device=None, enable=True, steps=3):
    """An MLP with AdamW, built before the session (its parameters are not the allocator's blocks); returns the
    losses, the parameters, and the device and stats of the session."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.Tanh()) for _ in range(8)],
                                torch.nn.Linear(256, 1))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    xs = [torch.randn(2048, 256) for _ in range(steps)]  # activations of 2 MiB, 2.3 MiB of parameters
    gc.collect()
    s = torch_dtr.enable(budget, device=device) if enable else None
    losses = []
    for x in xs:
        loss = model(x).pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(float(loss.detach()))
        del loss
    dev = s.handle.dev if s is not None else None
    st = torch_dtr.stats() if s is not None else None
    torch_dtr.disable()
    return losses, [p.detach().clone() for p in model.parameters()], dev, st


def test_device_cpu_at_75_of_the_whole_count_bounds_it_bitwise_and_a_tracked_budget_does_not():
    losses, params, _, _ = _train(enable=False)
    _, _, dev, st = _train(None, "cpu")
    whole = dev.max_allocated()
    n_params = sum(p.numel() * 4 for p in params)
    # the parameters and inputs were made before the session: counted once managed ops read them, beside the blocks
    assert dev.foreign == n_params + 3 * 2048 * 256 * 4 and st.evictions == 0
    assert st.peak_bytes == whole  # stats() reads the allocator's own peak
    # AdamW's two moments and the gradients are blocks too: the whole count is more than what torch-dtr tracks
    # (the parameters, inputs and managed values)
    tracked = _train(None, None)[3].peak_bytes
    assert whole > tracked + 2 * n_params, (whole, tracked, n_params)
    budget = int(whole * 0.75)
    got, got_params, dev, st = _train(budget, "cpu")
    assert got == losses and all(torch.equal(a, b) for a, b in zip(got_params, params, strict=True))
    assert st.evictions > 0 and st.rematerializations > 0 and st.syncs > 0
    # kept from the first step on: the allocator refuses a block past it, and the op evicts and runs again
    # (NOTE [ The CPU as a device ] 7)
    assert dev.max_allocated() <= budget and st.excess_bytes == 0, (dev.max_allocated(), budget, whole)
    assert dev.budget is None  # disable() lifted the allocator's capacity
    # without the device a budget bounds only what torch-dtr tracks: at 60% of its tracked peak, AdamW's state and
    # the gradients lie outside, and the allocator's count passes it
    loose = int(tracked * 0.6)
    native.load().cpu_blocks_reset_peak()
    _, _, dev2, st2 = _train(loose, None)
    assert dev2 is None and st2.syncs == 0 and st2.peak_bytes <= loose
    counted = native.load().cpu_blocks_usage()[1] + dev.foreign  # the blocks' peak, and what was made before
    assert counted > loose * 1.05, (counted, loose)


def test_device_cpu_below_the_optimizers_memory_raises_a_budget_error_that_names_it():
    _, _, dev, _ = _train(None, "cpu")
    n_params = dev.foreign
    with pytest.raises(torch_dtr.BudgetError, match="outside torch-dtr's reach"):
        _train(2 * n_params, "cpu")  # less than parameters, AdamW's moments and the gradients


def test_device_cpu_refuses_what_it_cannot_keep_with_a_clear_error():
    with pytest.raises(ValueError, match="not a device torch-dtr knows by name"):
        torch_dtr.enable("1GiB", device="gpu")
    with pytest.raises(ValueError, match="Python front end was chosen"):
        torch_dtr.enable("1GiB", device="cpu", front="python")
    with pytest.raises(ValueError, match="host tier"):
        torch_dtr.enable("1GiB", device="cpu", swap=True)
    assert not torch_dtr.enabled()


def test_device_cpu_with_a_compiled_model_at_90_of_its_count_lifts_the_capacity_and_stays_within_5_percent():
    # NOTE [ The CPU as a device ] 8: compiled kernels allocate outside any op the session can run again; with the
    # capacity on they raised OutOfMemoryError here
    pytest.importorskip("torch_dtr.inductor")

    def run(budget):
        torch._dynamo.reset()
        torch.manual_seed(0)
        model = torch.nn.Sequential(*[torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.GELU())
                                      for _ in range(3)])
        opt = torch.optim.AdamW(model.parameters())
        run = torch.compile(model)
        xs = [torch.randn(2048, 256) for _ in range(4)]
        s = torch_dtr.enable(budget, device="cpu")
        try:
            for i, x in enumerate(xs):
                if i == 2:  # the steady steps: AdamW's state exists and the region's plan has settled (as
                    torch_dtr.reset_peak()  # tests/inductor/test_regions.py measures them)
                run(x).pow(2).mean().backward()
                opt.step()
                opt.zero_grad()
        finally:
            torch_dtr.disable()
            torch._dynamo.reset()
        return s.handle.dev

    whole = run(None).max_allocated()
    budget = int(whole * 0.9)
    dev = run(budget)
    assert dev.soft and dev.max_allocated() <= budget * 1.05, (dev.max_allocated(), budget, whole)


def test_device_cpu_capacity_binds_the_sessions_thread_and_not_a_thread_left_unattached():
    # NOTE [ The CPU as a device ] 7: a thread not attach()ed allocates as without torch-dtr
    import threading

    torch_dtr.enable("8MiB", device="cpu")
    got: dict = {}

    def work():
        try:
            got["sum"] = float(torch.ones(4 << 20).sum())  # 16 MiB, twice the budget (freed before it returns)
        except Exception as e:  # (reported below)
            got["e"] = e

    th = threading.Thread(target=work)
    th.start()
    th.join()
    assert got == {"sum": 4 << 20}
    # in the session's thread a factory is no op that can evict and run again: the capacity's error, named
    with pytest.raises(torch.OutOfMemoryError, match="device='cpu'"):
        torch.ones(4 << 20)
