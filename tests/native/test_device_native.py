"""The compiled front end's budget on a device allocator's count (NOTE [ Native front end ] 8).

On the CPU the count is the front end's own CPU allocator's (`Blocks`, which counts the bytes it hands out), behind
the same ``Device`` interface as CUDA's caching allocator: everything the program allocates while it is installed
counts, optimizer state and plain tensors included. Each test runs plain first, then at the budget its name says
(a fraction of plain's peak count).
"""

from __future__ import annotations

import gc

import pytest
import torch

import torch_dtr
from torch_dtr import native
from torch_dtr.eager.device import Device

pytestmark = pytest.mark.skipif(not native.available(), reason="the C++ front end cannot be built here")


@pytest.fixture(autouse=True)
def _off():
    yield
    native.disable()
    native.load().cpu_blocks(False)
    gc.collect()


class BlocksDevice(Device):
    """The CPU as a device: the count of the native front end's CPU allocator."""

    name = "cpu-blocks"

    def owns(self, t: torch.Tensor) -> bool:
        return t.device.type == "cpu"

    def usage(self) -> tuple[int, int]:
        now, peak = native.load().cpu_blocks_usage()
        return int(now), int(peak)


def _train(budget=None, device=None, steps=3, capacity=None):
    """An MLP with Adam, built and trained while the counting allocator is installed; returns the losses, the
    parameters, the allocator's peak count over the steps above its count before them, and the session.
    ``budget`` and ``capacity`` (the allocator's: more raises OutOfMemoryError) count above the count before."""
    ext = native.load()
    ext.cpu_blocks(True)
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.Tanh()) for _ in range(8)],
                                torch.nn.Linear(256, 1))
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    xs = [torch.randn(2048, 256) for _ in range(steps)]  # activations of 2 MiB, 2.3 MiB of parameters
    gc.collect()
    base = ext.cpu_blocks_usage()[0]
    ext.cpu_blocks_reset_peak()
    s = None
    if capacity is not None:
        ext.cpu_blocks_capacity(base + capacity)
    if budget is not None or device is not None:
        s = native.enable(None if budget is None else base + budget, device=device)
    losses = []
    try:
        for x in xs:
            loss = model(x).pow(2).mean()
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            losses.append(float(loss.detach()))
            del loss
    finally:
        native.disable()
        ext.cpu_blocks_capacity(-1)
    peak = ext.cpu_blocks_usage()[1] - base
    return losses, [p.detach().clone() for p in model.parameters()], peak, s


def test_the_budget_bounds_the_allocators_count_at_60_with_a_device_and_not_without():
    losses, params, plain_peak, _ = _train()
    budget = int(plain_peak * 0.6)
    got, got_params, peak, s = _train(budget, BlocksDevice())
    assert got == losses and all(torch.equal(a, b) for a, b in zip(got_params, params, strict=True))
    st = s.rt.stats()
    assert st.evictions > 0 and st.syncs > 0
    # the guarantee: the count as the core keeps it never passes the budget after an op; the allocator's own count
    # may pass it only by an op's scratch memory and what plain code allocated since the last query
    assert peak <= budget * 1.02, (peak, budget, plain_peak)
    # without the device the same budget bounds only the values the front end counts: Adam's state, the
    # gradients and what the model held before are not in it, and the allocator's count passes the budget
    _, _, loose, s2 = _train(budget, None)
    assert s2.rt.stats().syncs == 0
    assert loose > budget * 1.05, (loose, budget)


class PreparingDevice(BlocksDevice):
    """Counts ``prepare()`` calls and whether this thread's ops were managed during them."""

    def __init__(self) -> None:
        self.prepared = 0
        self.managed_then = None

    def prepare(self) -> None:
        self.prepared += 1
        self.managed_then = native.load().is_managed(torch.ones(2, requires_grad=True) * 2)


def test_enable_with_a_budget_prepares_the_device_once_before_managing_and_not_without_one():
    # NOTE [ Device memory ] 8: libraries' per-thread workspaces must exist before the first allocator query
    dev = PreparingDevice()
    native.enable("1GiB", device=dev)
    native.disable()
    assert dev.prepared == 1 and dev.managed_then is False
    native.enable(None, device=dev)
    native.disable()
    assert dev.prepared == 1


def test_plain_ops_outputs_on_the_device_count_as_outside_at_the_next_managed_op():
    # NOTE [ Device memory ] 2: what plain ops make on the device counts against the budget from the next managed
    # op on, as the Python front end counts it, not from the next allocator query (up to 64 managed ops later)
    native.load().cpu_blocks(True)
    w = torch.randn(256, 256, requires_grad=True)
    x = torch.randn(1024, 256)
    s = native.enable("1GiB", device=BlocksDevice())
    mem = s.rt.memory
    h = x @ w  # the first managed op queries the allocator
    before, syncs = mem.outside, s.rt.stats().syncs
    kept = [x * k for k in range(3)]  # plain ops (nothing requires grad), 1 MiB each
    view = kept[0][:10]  # a view makes no memory
    # (factory ops such as torch.ones never reach this front end's kernel: what they make waits for a query)
    h = torch.tanh(h)  # (a managed op that fits: no query)
    h = h @ w
    assert s.rt.stats().syncs == syncs
    assert mem.outside == before + 3 * (1 << 20), (mem.outside - before)
    native.disable()
    del kept, view, h
    # without a budget nothing is counted (no decision reads it)
    s = native.enable(None, device=BlocksDevice())
    h = x @ w
    before = s.rt.memory.outside
    kept = [x * k for k in range(3)]
    h = h @ w
    assert s.rt.memory.outside == before and len(kept) == 3


class CountingDevice(BlocksDevice):
    """Counts its queries."""

    def __init__(self) -> None:
        self.calls = 0

    def usage(self) -> tuple[int, int]:
        self.calls += 1
        return super().usage()


def test_the_core_queries_the_device_every_64_ops_and_after_each_optimizer_step():
    _, _, plain_peak, _ = _train()
    dev = CountingDevice()
    _, _, _, s = _train(int(plain_peak * 2), dev, steps=3)
    st = s.rt.stats()
    per_step = st.ops / 3
    assert st.syncs == dev.calls
    # every 64 ops that reserve, at most (ops that fit skip the core), and once after each step
    assert 3 <= st.syncs <= st.ops / 64 + 3 + 1, (st.syncs, st.ops, per_step)


def test_no_budget_with_a_device_queries_it_at_most_every_64_ops():
    dev = CountingDevice()
    _, _, _, s = _train(None, dev)
    st = s.rt.stats()
    assert st.evictions == 0 and dev.calls == st.syncs <= st.ops / 64 + 1


def test_out_of_memory_evicts_and_retries_with_no_budget_at_a_capacity_of_70():
    losses, params, plain_peak, _ = _train()
    capacity = int(plain_peak * 0.7)
    with pytest.raises(torch.OutOfMemoryError, match="Tried to allocate"):  # the capacity bites plain PyTorch
        _train(capacity=capacity)
    got, got_params, peak, s = _train(None, BlocksDevice(), capacity=capacity)
    assert got == losses and all(torch.equal(a, b) for a, b in zip(got_params, params, strict=True))
    st = s.rt.stats()
    assert st.oom_retries > 0 and st.oom_evicted_bytes >= st.oom_retries * (1 << 20) and st.rematerializations > 0
    assert peak <= capacity


class LaidOutDevice(BlocksDevice):
    """A device that knows its layout (as CUDA's allocator does, NOTE [ Device memory ] 4): one segment whose blocks
    are the session's evictable values in address order. Records each layout it gives, and the evictions after."""

    def __init__(self) -> None:
        self.events: list[tuple] = []

    def segments(self):
        rt = native._SESSION.rt
        blocks = sorted((s.payload.data_ptr, s.nbytes, s.sid, s.locks) for s in rt.candidates  # (the large pool)
                        if s.payload.data_ptr and s.nbytes > 1 << 20)
        free = min(k for k, b in enumerate(blocks) if not b[3])  # the first block not held by the op in flight
        self.events.append(("layout", [(a, n) for a, n, _, _ in blocks], {b[2]: k for k, b in enumerate(blocks)}, free))
        return [(False, [(a, n, True) for a, n, _, _ in blocks])]

    def listen(self, kind, s):
        if kind == "evict":
            self.events.append(("evict", s.sid))


def test_out_of_memory_evicts_a_run_of_adjacent_blocks_first_where_the_device_knows_its_layout():
    losses, params, plain_peak, _ = _train()
    capacity = int(plain_peak * 0.7)
    dev = LaidOutDevice()
    native_enable = native.enable

    def enable(*a, **k):  # listen to the core's evictions from the start
        s = native_enable(*a, **k)
        s.rt.listen(dev.listen)
        return s

    native.enable = enable
    try:
        got, got_params, _, s = _train(None, dev, capacity=capacity)
    finally:
        native.enable = native_enable
    assert got == losses and all(torch.equal(a, b) for a, b in zip(got_params, params, strict=True))
    assert s.rt.stats().oom_retries > 0
    layouts = 0
    for i, e in enumerate(dev.events):
        if e[0] != "layout":
            continue
        layouts += 1
        _, blocks, index, free = e
        after = dev.events[i + 1] if i + 1 < len(dev.events) else None
        assert after is not None and after[0] == "evict", "an eviction follows the layout's reading"
        # this MLP's requests fit one 2 MiB block: the cheapest window is the first block in address order that the
        # op in flight does not hold, where the policy alone picks by score
        assert all(n == 2 << 20 for _, n in blocks) and index[after[1]] == free, (blocks, index, after, free)
    assert layouts == s.rt.stats().oom_retries > 0


def test_without_a_device_out_of_memory_is_raised_as_plain_pytorch_raises_it():
    _, _, plain_peak, _ = _train()
    with pytest.raises(torch.OutOfMemoryError, match="Tried to allocate"):  # a budget far above: nothing evicted
        _train(int(plain_peak * 10), None, capacity=int(plain_peak * 0.7))


def _step_over_held_values(mode, capacity=True):
    """A first Adam step (its state is new memory) while the program holds four 2 MiB managed values it can
    recompute (from the input: a value computed from the parameters would have to come back before the step
    writes them), under an allocator capacity with room for half of Adam's state (``capacity=False``: none); mode
    "plain", "native" (no device: no retries) or "device". Returns the parameters after the step, the held
    values and the session."""
    ext = native.load()
    ext.cpu_blocks(True)
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(256, 256) for _ in range(4)])
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    x = torch.randn(2048, 256)
    s = None if mode == "plain" else native.enable(None, device=BlocksDevice() if mode == "device" else None)
    try:
        with torch.no_grad():  # managed (NOTE [ Managed vs constant ] 5), recomputable from x, which no step writes
            held = [torch.tanh(x * (k + 1)) for k in range(4)]
        model(x).sum().backward()
        state = 2 * sum(p.numel() * p.element_size() for p in model.parameters())
        if capacity:
            ext.cpu_blocks_capacity(ext.cpu_blocks_usage()[0] + state // 2)
        opt.step()
    finally:
        ext.cpu_blocks_capacity(-1)
        native.disable()
    return [p.detach().clone() for p in model.parameters()], [h.detach().clone() for h in held], s


def test_an_optimizer_step_that_runs_out_of_memory_evicts_held_values_and_runs_again():
    for mode in ("plain", "native"):  # plain PyTorch, and the native front end without a device, raise
        with pytest.raises(torch.OutOfMemoryError, match="Tried to allocate"):
            _step_over_held_values(mode)
    params, held, s = _step_over_held_values("device")
    st = s.rt.stats()
    assert st.oom_retries > 0 and st.evictions > 0
    # the step's result and the held values (recomputed where evicted) equal a plain run with room
    want_params, want_held, _ = _step_over_held_values("plain", capacity=False)
    assert all(torch.equal(a, b) for a, b in zip(params, want_params, strict=True))
    assert all(torch.equal(a, b) for a, b in zip(held, want_held, strict=True))


@pytest.mark.parametrize("bad", [torch.device("cpu"), "cuda"])
def test_a_device_that_is_not_an_allocator_is_refused(bad):
    with pytest.raises(TypeError, match="device must be a torch_dtr device"):
        native.enable("1GiB", device=bad)


def test_a_simulated_device_lays_out_the_compiled_front_ends_values():
    """The out-of-memory windows need each value's place in the simulated layout (``Device.locate``)."""
    with torch_dtr.SimulatedDevice(None) as dev:
        s = native.enable(None, device=dev)
        try:
            w = torch.randn(64, 64, requires_grad=True)
            ys = [(w * k).exp() for k in range(4)]
            s.flush()
            addrs = [dev.locate(x.payload.data_ptr) for x in s.rt.candidates if x.payload is not None]
            used = {a for _, blocks in dev.segments() for a, _, u in blocks if u}
            assert len(addrs) >= len(ys) and all(addrs) and set(addrs) <= used, (addrs, used)
            # counted as the allocator counts them: 512-byte blocks
            assert all(x.nbytes % 512 == 0 for x in s.rt.candidates)
        finally:
            native.disable()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.xfail(strict=True, reason="measured on an H200 (docs/gpu/notes.md, 2026-11-27): max_memory_allocated "
                   "passed the 60% budget by 40.1 MB, at 64 MiB allocations made inside a backward op (no dispatch "
                   "sees them: NOTE [ Device memory ] 3); strict, so that a fix shows")
def test_cuda_the_budget_bounds_max_memory_allocated_at_60():
    # (activations dominate: with batch 4096 and the inputs made up front, 60% was infeasible on an H100, since
    # parameters, gradients, AdamW's state, the inputs and cuBLAS's workspaces cannot be evicted)
    def run(budget):
        torch.manual_seed(0)
        model = torch.nn.Sequential(*[torch.nn.Sequential(torch.nn.Linear(1024, 1024), torch.nn.GELU())
                                      for _ in range(8)], torch.nn.Linear(1024, 1)).cuda()
        opt = torch.optim.AdamW(model.parameters())
        g = torch.Generator(device="cuda").manual_seed(1)
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        s = native.enable(budget) if budget is not None else None
        losses = []
        for _ in range(3):
            loss = model(torch.randn(8192, 1024, device="cuda", generator=g)).pow(2).mean()
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            losses.append(float(loss.detach()))
        native.disable()
        torch.cuda.synchronize()
        return losses, torch.cuda.max_memory_allocated(), s

    losses, peak, _ = run(None)
    budget = int(peak * 0.6)
    got, got_peak, s = run(budget)
    assert got == losses
    assert s.rt.stats().evictions > 0
    assert got_peak <= budget, (got_peak, budget)


def test_a_copy_back_that_finds_the_simulated_device_full_evicts_and_retries():
    """As tests/eager/test_host_tier.py's test of the same name, under the compiled front end: no budget, a
    simulated device of 5.25 MiB; ``a`` is copied out (host copies are not the device's), plain allocations then leave
    less room than ``a`` needs, so copying it back runs out of memory, evicts ``b`` and retries."""
    mib = 1 << 20
    with torch_dtr.SimulatedDevice(21 * mib // 4, scale=1 / 64, expandable=True) as dev:  # (pages round up)
        g = torch.Generator().manual_seed(0)
        x, w = torch.randn(512, 512, generator=g), torch.randn(512, 512, generator=g)  # 1 MiB each
        want = (x @ w).sum()
        s = native.enable(None, device=dev, swap=True, swap_gbps=1000)
        try:
            with torch.no_grad():  # managed for inference
                a = x @ w
                b = x + 1
                with native._core_locked(s.ext):
                    s.flush()
                    s.rt.evict(s.ext.storage_of(a))  # a matmul costs more than a copy at 1 TB/s: copied out
                st = native.stats()
                assert st["swaps_out"] == 1 and st["evictions"] == 1, st
                assert dev.allocated() < 4 * mib, "the host copy is not the device's"
                fill = torch.empty(3 * mib // 2, dtype=torch.uint8)  # plain: the device holds 4.5 of 5 MiB now
                got = a.sum()
            st = native.stats()
            assert st["swaps_in"] == 1 and st["oom_retries"] >= 1, st
            assert not s.ext.storage_of(b).resident
            assert torch.equal(got, want)
            assert dev.max_allocated() <= 5 * mib
            del fill
        finally:
            native.disable()


def _lstm_on(budget: int | None, capped: bool) -> tuple[int, int, torch_dtr.Stats | None, list[torch.Tensor]]:
    """The bench's quick LSTM loop, 3 AdamW steps on a simulated allocator with expandable segments at scale 1/1024
    (pages of 2 KiB and 20 KiB: to a 3 MiB program what a GPU's are to a 3 GiB one); ``capped``: the device holds
    at most ``budget``. Its peak allocated and reserved bytes, stats and parameters after the steps."""
    from torch_dtr.bench.workloads import SIZES, build

    torch.manual_seed(0)
    with torch_dtr.SimulatedDevice(budget if capped else None, expandable=True, scale=1 / 1024) as dev:
        model, batches, step = build("lstm", SIZES["lstm"]["quick"], 3, seed=0)
        if budget is not None:  # (the compiled front end, the default: this folder pins the Python one)
            torch_dtr.enable(budget=budget, device=dev, learn=False, front="native")
        try:
            for i, b in enumerate(batches):
                torch.manual_seed(100 + i)
                step(model, b)
            st = torch_dtr.stats() if budget is not None else None
        finally:
            torch_dtr.disable()
        return dev.max_allocated(), dev.peak_reserved, st, [p.detach().clone() for p in model.parameters()]


def test_a_device_capped_at_the_budget_holds_no_more_than_it_at_80_percent():
    """Issue 52: a budget bounds the allocator's allocated count; what the device holds (reserved) can pass it, as
    evictions leave holes later requests cannot use. With the device's capacity set to the budget (on CUDA
    ``torch.cuda.set_per_process_memory_fraction``), an allocation that would pass it makes the allocator unmap its
    free pages, then torch-dtr evict and run the op again: the device holds at most the budget, with plain's
    parameters (docs/fragmentation.md measures the bench's models so)."""
    allocated, _, _, want = _lstm_on(None, False)
    budget = int(0.8 * allocated)
    _, free_reserved, st, got = _lstm_on(budget, capped=False)
    assert st is not None and st.evictions > 0 and all(torch.equal(a, b) for a, b in zip(got, want, strict=True))
    assert free_reserved > budget, "on the allocated count alone the device holds more than the budget"
    peak, reserved, st, got = _lstm_on(budget, capped=True)
    assert st is not None and st.oom_retries > 0, "the cap made the allocator refuse, and torch-dtr evict and retry"
    assert peak <= budget and reserved <= budget, (peak, reserved, budget)
    assert all(torch.equal(a, b) for a, b in zip(got, want, strict=True))
