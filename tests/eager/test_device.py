"""Device memory without a GPU: budgets that bound the allocator's count, rare allocator queries, the
out-of-memory-driven mode and fragmentation, all driven through the simulated caching allocator
(NOTE [ Device memory ], NOTE [ Simulated allocator ]). The last tests run on a real GPU where there is one."""

from __future__ import annotations

import re

import pytest
import torch

import torch_dtr
from torch_dtr import SimulatedDevice
from torch_dtr.eager.device import Device, window

SCALE = 1 / 8  # the allocator's segment sizes scaled to these small tensors (rule 6)
WIDTH, DEPTH, BATCH, STEPS = 64, 32, 2048, 3


def _build() -> torch.nn.Module:
    torch.manual_seed(0)
    layers = [torch.nn.Sequential(torch.nn.Linear(WIDTH, WIDTH), torch.nn.Tanh()) for _ in range(DEPTH)]
    return torch.nn.Sequential(*layers, torch.nn.Linear(WIDTH, 10))


def _train(budget: int | None = None, cap: int | None = None, dtr: bool = True, sync_every: int = 64,
           expandable: bool = False, expandable_segments: bool | None = None) -> dict:
    """Three AdamW steps of an MLP whose activations dominate, everything made on the simulated device."""
    with SimulatedDevice(cap, scale=SCALE, expandable=expandable) as dev:
        model = _build()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        x = torch.randn(BATCH, WIDTH, generator=torch.Generator().manual_seed(1))
        t = torch.randint(0, 10, (BATCH,), generator=torch.Generator().manual_seed(2))
        if dtr:
            torch_dtr.enable(budget=budget, device=dev, sync_every=sync_every, expandable_segments=expandable_segments)
        losses = []
        try:
            for _ in range(STEPS):
                loss = torch.nn.functional.cross_entropy(model(x), t)
                loss.backward()
                opt.step()
                opt.zero_grad()
                losses.append(loss.detach().item())
        finally:
            if dtr:
                torch_dtr.disable()
        return {"losses": losses, "params": [p.detach().clone() for p in model.parameters()],
                "max_allocated": dev.max_allocated(), "max_reserved": dev.peak_reserved,
                "stats": torch_dtr.stats() if dtr else None}


@pytest.fixture(scope="module")
def plain() -> dict:
    return _train(dtr=False)


@pytest.fixture(scope="module")
def unbudgeted() -> dict:
    return _train(None)


def _same(a: dict, b: dict) -> None:
    assert a["losses"] == b["losses"]
    assert all(torch.equal(p, q) for p, q in zip(a["params"], b["params"], strict=True))


def test_no_budget_on_a_device_is_bitwise_plain_and_reports_device_bytes(plain, unbudgeted):
    _same(unbudgeted, plain)
    st = unbudgeted["stats"]
    assert st.evictions == 0 and st.oom_retries == 0
    # the peak counts the device's bytes outside torch-dtr too (parameters, optimizer state, gradients)
    assert st.peak_bytes >= 0.9 * plain["max_allocated"], (st.peak_bytes, plain["max_allocated"])


@pytest.mark.parametrize("ratio", [0.5, 0.3])
def test_budget_bounds_the_allocators_count_bitwise(plain, unbudgeted, ratio):
    """At 50% and 30% of plain's max_memory_allocated (or 1.25x the single-op floor where that is higher):
    the simulated allocator's own peak stays within the budget, and the run is bitwise plain's."""
    floor = unbudgeted["stats"].floor_bytes
    budget = max(int(plain["max_allocated"] * ratio), int(1.25 * floor))
    run = _train(budget)
    _same(run, plain)
    st = run["stats"]
    assert st.evictions > 0 and st.rematerializations + st.swaps_in > 0
    assert run["max_allocated"] <= budget, (
        f"allocator peak {run['max_allocated']} > budget {budget} ({budget / plain['max_allocated']:.0%} of plain's "
        f"peak, floor {floor})")
    assert st.outside_bytes > 0, "optimizer state and gradients are outside torch-dtr: counted, not ignored"


@pytest.mark.python_front  # its sync_every (the compiled front end's cadence: tests/native/test_device_native.py)
def test_the_allocator_is_queried_every_sync_every_ops_not_per_op(plain, unbudgeted):
    budget = max(int(plain["max_allocated"] * 0.5), int(1.25 * unbudgeted["stats"].floor_bytes))
    calls = []
    orig = SimulatedDevice.usage

    def counted(self):
        calls.append(1)
        return orig(self)

    SimulatedDevice.usage = counted  # type: ignore[method-assign]
    try:
        run = _train(budget, sync_every=64)
    finally:
        SimulatedDevice.usage = orig  # type: ignore[method-assign]
    st = run["stats"]
    assert len(calls) == st.syncs
    # every 64 ops, plus once after each optimizer step's plain allocations and before each eviction search
    # that would fail: a few per step, never one per op
    assert st.syncs <= st.ops / 64 + 4 * STEPS, (st.syncs, st.ops)
    assert run["max_allocated"] <= budget


def _plain_op_under_held_values(budget: int | None) -> tuple[list[float], int, torch_dtr.Stats | None]:
    """Managed values the program holds fill the budget; then a plain op (``zeros_like`` of a plain tensor, as an
    optimizer makes its state on its first step) allocates on the device."""
    with SimulatedDevice(None, scale=SCALE) as dev:
        w = torch.randn(BATCH, WIDTH, generator=torch.Generator().manual_seed(1)).requires_grad_()
        x = torch.randn(BATCH, WIDTH, generator=torch.Generator().manual_seed(2))
        if budget is not None:
            torch_dtr.enable(budget=budget, device=dev)
        try:
            held = [torch.tanh(w * (1 + i / 8)) for i in range(8)]
            state = [torch.zeros_like(x) for _ in range(2)]
            out = [h.sum().item() for h in held] + [s.sum().item() for s in state]
            st = torch_dtr.stats() if budget is not None else None
        finally:
            torch_dtr.disable()
        return out, dev.max_allocated(), st


def test_plain_ops_are_reserved_before_they_allocate_at_70_percent():
    """A plain op's outputs on the device are predicted and reserved before it runs, as a managed op's are: values
    are evicted for them (before, they passed the budget by up to their size until the next allocator query)."""
    plain, peak, _ = _plain_op_under_held_values(None)
    budget = int(0.7 * peak)
    got, held, st = _plain_op_under_held_values(budget)
    assert got == plain
    assert st.evictions > 0
    assert held <= budget, f"allocator peak {held} > budget {budget} by {held - budget} B"


def test_a_plain_op_that_cannot_fit_raises_before_it_allocates():
    with SimulatedDevice(None, scale=SCALE) as dev:
        x = torch.randn(BATCH, WIDTH)
        budget = x.untyped_storage().nbytes() * 3
        torch_dtr.enable(budget=budget, device=dev)
        with pytest.raises(torch_dtr.BudgetError, match=r"aten\.repeat\.default \(a plain op\)"):
            x.repeat(1, 4)
        torch_dtr.disable()
        assert dev.max_allocated() <= budget


def test_an_excess_nothing_could_reserve_is_said_and_counted_then_kept_free():
    """Memory no front end sees allocated (here a block taken from the simulated allocator directly) passes the
    budget: the next allocator query finds it, says so once, counts it in stats().excess_bytes, and keeps it free."""
    with SimulatedDevice(None, scale=SCALE) as dev:
        w = torch.randn(BATCH, WIDTH).requires_grad_()
        budget = 8 * w.untyped_storage().nbytes()
        torch_dtr.enable(budget=budget, device=dev)
        held = [torch.tanh(w * (1 + i / 8)) for i in range(6)]  # near the budget
        addr, _ = dev.alloc(2 * w.untyped_storage().nbytes())  # unseen: the budget is passed here
        with pytest.warns(RuntimeWarning, match=r"allocator held .* more than the budget"):
            more = [torch.tanh(w * (2 + i / 8)) for i in range(70)]  # past the next query
        st = torch_dtr.stats()
        torch_dtr.disable()
        dev.free(addr)
    assert st.excess_bytes > 0 and dev.max_allocated() - budget == st.excess_bytes, (st.excess_bytes, budget)
    assert len(held) + len(more) == 76


def test_budget_error_names_what_is_outside_and_suggests_a_budget_above_what_it_quotes():
    with SimulatedDevice(None, scale=SCALE) as dev:
        model = _build()
        x = torch.randn(BATCH, WIDTH)
        params = sum(p.numel() * 4 for p in model.parameters())
        torch_dtr.enable(budget=params // 2, device=dev)  # less than the parameters alone
        with pytest.raises(torch_dtr.BudgetError) as e:
            model(x).sum().backward()
        torch_dtr.disable()
    msg = str(e.value)
    assert "outside torch-dtr's reach" in msg and "optimizer state" in msg, msg
    budget = params // 2
    need = int(re.search(r"at least .*? \((\d+) B\) is needed", msg).group(1))
    floor = re.search(r"single-op floor so far is ([0-9.]+) (KiB|MiB)", msg)
    suggested = int(re.search(r"enable\(budget=(\d+)\)", msg).group(1))
    assert need > budget, f"the error says {need} B are needed, yet the budget is {budget} B: {msg}"
    assert suggested >= need, msg
    if floor:
        assert suggested >= float(floor.group(1)) * {"KiB": 2**10, "MiB": 2**20}[floor.group(2)], msg
    assert f"torch_dtr.budget({suggested})" in msg, "the scoped form is suggested too"


def test_out_of_memory_driven_mode_trains_where_plain_runs_out(plain):
    """No budget: nothing is evicted until the allocator fails; then torch-dtr evicts and retries."""
    cap = int(plain["max_allocated"] * 0.7)
    with pytest.raises(torch.OutOfMemoryError):
        _train(cap=cap, dtr=False)
    run = _train(None, cap=cap)
    _same(run, plain)
    st = run["stats"]
    assert st.oom_retries > 0 and st.oom_evicted_bytes > 0 and st.evictions > 0
    assert run["max_allocated"] <= cap
    # fragmentation under eviction, as the simulated allocator carves blocks
    assert run["max_reserved"] / run["max_allocated"] <= 1.1, (run["max_reserved"], run["max_allocated"])


def test_simulated_expandable_segments_map_pages_and_keep_freed_ones():
    """NOTE [ Simulated allocator ] 5, as PyTorch's allocator does it: pages of 20 MiB in the large pool, mapped
    where a request reaches; freed blocks stay mapped (reserved) until empty_cache, which unmaps whole pages only."""
    mib = 1 << 20
    with SimulatedDevice("200MiB", expandable=True) as dev:
        a, _ = dev.alloc(30 * mib)
        b, _ = dev.alloc(30 * mib)
        assert b == a + 30 * mib and dev.reserved() == 60 * mib, "one range: 3 pages of 20 MiB for 60 MiB"
        dev.free(a)
        assert dev.reserved() == 60 * mib, "a freed block's pages stay mapped"
        c, _ = dev.alloc(40 * mib)
        assert c == b + 30 * mib and dev.reserved() == 100 * mib, "the 30 MiB hole is too small: pages at the end"
        d, _ = dev.alloc(20 * mib)
        assert d == a and dev.reserved() == 100 * mib and dev.allocated() == 90 * mib, "best fit: the hole"
        assert dev.reserved() / dev.allocated() > 1.1, "reserved exceeds allocated by the hole's rest"
        dev.empty_cache()
        assert dev.reserved() == 100 * mib, "the hole's 10 MiB rest holds no whole page: nothing unmapped"
        dev.free(c)
        e, _ = dev.alloc(50 * mib)
        assert e == c and dev.reserved() == 120 * mib, "the free block at the end grows by the pages it lacks"
        dev.free(e)
        dev.free(b)
        dev.empty_cache()
        # free: [20, 160) MiB; the pages [20, 40) ... [140, 160) go: 140 MiB unmapped, the block d's page stays
        assert dev.reserved() == 20 * mib and dev.segments() == [(False, [(a, 20 * mib, True)])]
        f, _ = dev.alloc(mib // 2)  # the small pool: a range of its own, 2 MiB pages
        assert dev.reserved() == 22 * mib and f != a
        with pytest.raises(torch.OutOfMemoryError):
            dev.alloc(190 * mib)


def test_simulated_expandable_segment_prefers_a_block_that_cannot_grow():
    """A free block before the unmapped range gives way to a larger one that could grow less (rule 5), so that the
    end of the range stays free for what grows there."""
    mib = 1 << 20
    with SimulatedDevice(expandable=True) as dev:
        hole, _ = dev.alloc(12 * mib)  # maps the page [0, 20)
        keep, _ = dev.alloc(8 * mib)  # [12, 20)
        dev.free(hole)  # [0, 12) free
        tail, _ = dev.alloc(30 * mib)  # maps [20, 60): [20, 50) used, [50, 60) free before the unmapped range
        assert (keep, tail) == (hole + 12 * mib, hole + 20 * mib) and dev.reserved() == 60 * mib
        got, _ = dev.alloc(5 * mib)  # fits [50, 60) best (10 MiB), and [0, 12)
        assert got == hole, "the next larger block, which cannot grow, not the one before the unmapped range"
        got2, _ = dev.alloc(9 * mib)
        assert got2 == tail + 30 * mib and dev.reserved() == 60 * mib, "then the end's free block, without mapping"


def test_out_of_memory_with_expandable_segments_trains_too(plain):
    cap = int(plain["max_allocated"] * 0.6)
    run = _train(None, cap=cap, expandable=True)
    _same(run, plain)
    assert run["stats"].oom_retries > 0 and run["max_allocated"] <= cap


def _gpt2_on_expandable_segments(ratio: float | None, peak: int = 0) -> dict:
    """A small GPT-2 (4 layers, width 256, sequence 128, batch 4), AdamW, on the simulated allocator with expandable
    segments; a warm-up step, then two measured ones, under ``ratio`` x ``peak`` allocated bytes where given."""
    pytest.importorskip("transformers")
    from torch_dtr.bench.workloads import Size, build

    with SimulatedDevice(None, scale=1 / 8, expandable=True) as dev:
        model, batches, step = build("gpt2", Size(4, 4, 256, 128), 3, seed=0)
        budget = None if ratio is None else int(ratio * peak)
        if budget is not None:
            torch_dtr.enable(budget=budget, device=dev)
        try:
            losses = [step(model, batches[0])]
            dev.reset_peak()
            losses += [step(model, b) for b in batches[1:]]
            st = torch_dtr.stats() if budget is not None else None
        finally:
            if budget is not None:
                torch_dtr.disable()
        return {"losses": [x.item() for x in losses], "params": [p.detach().clone() for p in model.parameters()],
                "allocated": dev.max_allocated(), "reserved": dev.peak_reserved, "budget": budget, "stats": st}


def test_layout_aware_eviction_keeps_what_the_device_holds_near_the_budget_at_70(monkeypatch):
    """NOTE [ Layout-aware eviction ]: under 70% of plain's peak allocated bytes, evicting the cheapest window first
    keeps the pages the device maps within 1.06x the budget, where evicting by the policy alone leaves holes that
    later requests cannot use (1.3x); both bitwise equal to plain, the allocated count within the budget."""
    plain = _gpt2_on_expandable_segments(None)
    assert plain["reserved"] <= 1.05 * plain["allocated"]
    aware = _gpt2_on_expandable_segments(0.7, plain["allocated"])
    monkeypatch.setattr(SimulatedDevice, "cheap_layout", False)
    blind = _gpt2_on_expandable_segments(0.7, plain["allocated"])
    for run in (aware, blind):
        _same(run, plain)
        assert run["allocated"] <= run["budget"] and run["stats"].evictions > 0
    assert aware["reserved"] <= 1.06 * aware["budget"], aware["reserved"] / aware["budget"]
    assert blind["reserved"] >= 1.2 * blind["budget"], blind["reserved"] / blind["budget"]


def test_out_of_memory_retry_of_a_random_op_draws_what_plain_draws():
    """The simulated allocator fails where the op allocates, before it draws, as on CUDA; the retry then draws
    exactly what plain PyTorch draws."""
    def run(cap: int | None, dtr: bool) -> torch.Tensor:
        with SimulatedDevice(cap, scale=SCALE) as dev:
            torch.manual_seed(3)
            w = torch.randn(256, 256, requires_grad=True)
            if dtr:
                torch_dtr.enable(budget=None, device=dev)
            try:
                hs = [torch.nn.functional.dropout(w * (i + 1), 0.5) for i in range(12)]
                out = sum(h.sum() for h in hs)
                out.backward()
                return torch.stack([torch_dtr.unwrap(out).detach(), w.grad.sum()])
            finally:
                if dtr:
                    torch_dtr.disable()

    want = run(None, False)
    got = run(3 << 20, True)
    assert torch.equal(want, got)
    assert torch_dtr.stats().oom_retries > 0


# ---------------------------------------------------------------------------------------------- the allocator
def test_simulated_allocator_rounds_splits_merges_and_releases():
    with SimulatedDevice("64MiB") as dev:
        _, n = dev.alloc(4)
        assert n == 512 and dev.reserved() == 2 << 20, "a small request: 512 B from a 2 MiB small-pool segment"
        b, n = dev.alloc(3 << 20)
        assert n == 3 << 20 and dev.reserved() == (2 << 20) + (20 << 20), "1-10 MiB: a 20 MiB segment, split"
        c, n = dev.alloc(16 << 20)
        assert c == b + (3 << 20), "best fit: the rest of the 20 MiB segment"
        assert n == 17 << 20, "1 MiB would remain: not split (the large pool splits above 1 MiB), all 17 counted"
        d, n = dev.alloc(int(16.5 * 2**20))
        assert n == int(16.5 * 2**20) and dev.reserved() == (2 << 20) + (20 << 20) + (18 << 20), "> 10 MiB: 2 MiB pages"
        dev.free(c)
        assert dev.segments()[1][1][-1] == (c, 17 << 20, False), "the freed block merged with the free tail"
        dev.free(d)
        dev.empty_cache()
        assert dev.reserved() == (2 << 20) + (20 << 20), "the whole free segment was released"
        with pytest.raises(torch.OutOfMemoryError, match=r"Tried to allocate 50.00 MiB") as e:
            dev.alloc(50 << 20)
        assert Device.requested(e.value) == 50 << 20 and dev.ooms == 1
        with pytest.raises(torch.OutOfMemoryError, match="Simulated device out of memory"):
            torch.empty(50 << 20, dtype=torch.uint8)  # a real block, refused before the op writes it
        assert dev.ooms == 2 and dev.allocated() == 512 + (3 << 20)
    assert dev.max_allocated() == 512 + (3 << 20) + (17 << 20) + int(16.5 * 2**20), "its counts outlive the block"
    with pytest.raises(RuntimeError, match="enter the SimulatedDevice"):
        dev.alloc(4)


def test_simulated_allocator_counts_scratch_memory_but_not_host_copies():
    """It counts every block of the CPU allocator while entered (an op's scratch memory too, as CUDA's allocator
    counts a workspace), but the host tier's copies (NOTE [ Simulated allocator ] 7)."""
    x = torch.randn(256, 256)
    with SimulatedDevice() as dev:
        with dev.host_copies():
            host = x.clone()
        assert dev.allocated() == 0
        del host
        a = x + 256 * torch.eye(256)
        block = dev.allocated()
        y = torch.linalg.solve(a, x)  # its LU factors and pivots are scratch blocks, freed before it returns
        assert dev.allocated() == 2 * block and dev.max_allocated() > 2 * block, (dev.max_allocated(), block)
        del a, y
    with pytest.raises(RuntimeError, match="one at a time"), SimulatedDevice(), SimulatedDevice():
        pass
    with pytest.raises(RuntimeError, match="enter the SimulatedDevice before enabling"):
        torch_dtr.enable(budget=None, device=SimulatedDevice())
    assert not torch_dtr.enabled()


def test_simulated_allocator_follows_storages_not_tensors():
    with SimulatedDevice() as dev:
        x = torch.randn(1024, 256)  # 1 MiB: the small pool
        v = x[::2].t()  # a view: no new block
        assert dev.allocated() == 1 << 20
        y = x.exp().tanh_()  # one new block; the in-place op makes none
        assert dev.allocated() == 2 << 20
        del x
        assert dev.allocated() == 2 << 20, "the view keeps the storage alive"
        del v, y
        assert dev.allocated() == 0 and dev.max_allocated() == 2 << 20


def test_window_evicts_adjacent_blocks_where_scattered_evictions_would_not_coalesce():
    class S:
        def __init__(self, name, nbytes):
            self.name, self.nbytes = name, nbytes

        def __repr__(self):
            return self.name

    MiB = 1 << 20
    a, b, c, d = S("a", 4 * MiB), S("b", 3 * MiB), S("c", 2 * MiB), S("d", 6 * MiB)
    # segment 1: [a 4][pinned 2][free 1][b 3] ; segment 2: [c 2][free 2][pinned 1][d 6][free 1]
    seg1 = (False, [(0, 4 * MiB, True), (4 * MiB, 2 * MiB, True), (6 * MiB, MiB, False), (7 * MiB, 3 * MiB, True)])
    seg2 = (False, [(100 * MiB, 2 * MiB, True), (102 * MiB, 2 * MiB, False), (104 * MiB, MiB, True),
                    (105 * MiB, 6 * MiB, True), (111 * MiB, MiB, False)])
    ev = {0: a, 7 * MiB: b, 100 * MiB: c, 105 * MiB: d}
    assert window([seg1, seg2], ev, 4 * MiB) == [c], "c 2 + free 2: 2 MiB evicted (a alone: 4; free 1 + b 3: 3)"
    assert window([seg1], ev, 4 * MiB) == [b], "free 1 + b 3 evicts 3 MiB, a alone 4"
    assert window([seg1, seg2], ev, 7 * MiB) == [d], "d 6 + free 1"
    assert window([seg1, seg2], ev, 20 * MiB) == [], "no run that long, and no segment that can be emptied"
    seg3 = (True, [(200 * MiB, MiB // 2, True), (200 * MiB + MiB // 2, MiB // 2, False)])
    e = S("e", MiB // 2)
    assert window([seg1, seg3], {**ev, 200 * MiB: e}, 64 * MiB) == [e], \
        "a small-pool segment that can be emptied: the allocator releases it and reserves a new one"
    assert window([seg1, seg3], {**ev, 200 * MiB: e}, MiB // 4) == [], "a small request with a free small block"


def test_cuda_device_reads_the_allocator_through_the_calls_it_makes_on_a_gpu(monkeypatch):
    """What CudaDevice reads from PyTorch's CUDA allocator, with those calls replaced (no GPU here): the raw
    statistics dict, the snapshot's layout, PyTorch's out-of-memory message, the expandable-segments setting."""
    from torch_dtr import CudaDevice

    dev = CudaDevice(0)
    dev._stats = lambda i: {"allocated_bytes": {"all": {"current": 123 + i, "peak": 456}}}
    assert dev.usage() == (123, 456) and dev.allocated() == 123
    snap = [{"device": 0, "address": 4096, "segment_type": "large", "total_size": 3072,
             "blocks": [{"address": 4096, "size": 2048, "state": "active_allocated"},
                        {"address": 6144, "size": 1024, "state": "inactive"}]},
            {"device": 1, "address": 0, "segment_type": "small", "blocks": [{"size": 512, "state": "inactive"}]},
            {"device": 0, "address": 1 << 30, "segment_type": "small",
             "blocks": [{"size": 512, "state": "active_pending_free"}, {"size": 1536, "state": "inactive"}]}]
    monkeypatch.setattr(torch.cuda, "memory_snapshot", lambda include_traces=True: snap)
    assert dev.segments() == [(False, [(4096, 2048, True), (6144, 1024, False)]),
                              (True, [(1 << 30, 512, True), ((1 << 30) + 512, 1536, False)])]
    err = torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 MiB. GPU 0 has a total capacity of "
                                 "79.19 GiB of which 3.06 MiB is free.")
    assert Device.requested(err) == 20 << 20 and Device.requested(RuntimeError("no size")) == 0
    calls = []
    monkeypatch.setattr(torch.cuda.memory, "_set_allocator_settings", calls.append)
    monkeypatch.setattr(torch._C, "_accelerator_setAllocatorSettings", calls.append, raising=False)
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", "")
    assert dev.set_expandable(True) is False and calls == ["expandable_segments:True"]


# ---------------------------------------------------------------------------------------------- a real GPU
cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@cuda
@pytest.mark.parametrize("swap", [False, True])
def test_cuda_budget_bounds_max_memory_allocated_bitwise(swap):
    """With ``swap=True`` the copies out run on a side stream and their device bytes count until they land
    (NOTE [ Host copies ] 2); the copies are modelled at 1 TB/s so that most victims are swapped."""
    torch.use_deterministic_algorithms(True)
    try:
        # cuBLAS's workspaces (one per handle: the forward's thread and autograd's) are allocated by the
        # caching allocator on first use and counted by max_memory_allocated: 2 x 32 MiB with
        # CUBLAS_WORKSPACE_CONFIG=:4096:8, more than this model's activations. Made before either run, so
        # the budget is set against what the program itself needs above them.
        w = torch.ones(8, 8, device="cuda", requires_grad=True)
        (w @ w).sum().backward()
        base = {}

        def run(budget):
            torch.manual_seed(0)
            model = _build().cuda()
            opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
            x = torch.randn(BATCH, WIDTH, device="cuda")
            t = torch.randint(0, 10, (BATCH,), device="cuda")
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            base[budget] = torch.cuda.memory_allocated()
            if budget != "plain":
                torch_dtr.enable(budget=budget, **({"swap": True, "swap_gbps": 1000} if swap else {}))
            try:
                losses = []
                for _ in range(STEPS):
                    loss = torch.nn.functional.cross_entropy(model(x), t)
                    loss.backward()
                    opt.step()
                    opt.zero_grad()
                    losses.append(loss.detach().item())
            finally:
                torch_dtr.disable()
            return losses, torch.cuda.max_memory_allocated(), [p.detach().cpu() for p in model.parameters()]

        l0, peak0, p0 = run("plain")
        budget = int(base["plain"] + 0.6 * (peak0 - base["plain"]))  # 60% of what the program adds
        l1, peak1, p1 = run(budget)
        assert l1 == l0 and all(torch.equal(a, b) for a, b in zip(p0, p1, strict=True))
        assert peak1 <= budget, (peak1, budget)
        assert torch_dtr.stats().evictions > 0
        if swap:
            assert torch_dtr.stats().swaps_in > 0, torch_dtr.stats()
    finally:
        torch.use_deterministic_algorithms(False)


def test_expandable_segments_are_switched_for_the_session_and_back():
    with SimulatedDevice(None) as dev:
        torch_dtr.enable(budget=None, device=dev)  # automatic: only CUDA's allocator is switched
        assert not dev.expandable
        torch_dtr.disable()
        torch_dtr.enable(budget=None, device=dev, expandable_segments=True)
        assert dev.expandable
        torch_dtr.disable()
        assert not dev.expandable, "disable() restores the allocator's setting"
    with pytest.raises(ValueError, match="expandable_segments must be None"):
        torch_dtr.enable(expandable_segments="yes")
    with pytest.raises(TypeError, match="device must be a torch_dtr device"):
        torch_dtr.enable(device=torch.device("cpu"))
    with pytest.raises(ValueError, match="sync_every must be an int >= 1"):
        torch_dtr.enable(sync_every=0)


# ---------------------------------------------------------------------------------------------- rule 8
class _Preparing(SimulatedDevice):
    """Counts ``prepare()`` calls and whether the front end's mode was on during them."""

    def __init__(self, *a, **k) -> None:
        super().__init__(*a, **k)
        self.prepared = 0
        self.managed_then = None

    def prepare(self) -> None:
        self.prepared += 1
        self.managed_then = torch_dtr.enabled()


def test_enable_with_a_budget_prepares_the_device_once_before_managing_and_not_without_one():
    # NOTE [ Device memory ] 8: libraries' per-thread workspaces must exist before the first allocator query
    with _Preparing("64MiB") as dev:
        torch_dtr.enable(budget="32MiB", device=dev)
        torch_dtr.disable()
        assert dev.prepared == 1 and dev.managed_then is False
        torch_dtr.enable(device=dev)
        torch_dtr.disable()
        assert dev.prepared == 1


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_prepare_allocates_the_backward_threads_workspace_up_front():
    # after prepare(), a first backward matrix product allocates nothing that outlives it
    from torch_dtr.eager.device import CudaDevice

    dev = CudaDevice()
    dev.prepare()
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    a = torch.randn(64, 64, device="cuda", requires_grad=True)
    (a @ a).sum().backward()
    torch.cuda.synchronize()
    kept = torch.cuda.memory_allocated() - before
    del a
    assert kept <= 2 * 64 * 64 * 4 + 1024, kept  # a and its gradient, nothing of cuBLAS's
