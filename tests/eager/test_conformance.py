"""Conformance on PyTorch's operator database, a deterministic subset: the first float32 sample of every
operator that supports float32 on CPU, in both modes (nothing evicted; everything evicted after every op),
bitwise against plain PyTorch. The full run (every sample, float32/float64/complex64) is
``python benchmarks/conformance.py``, which writes docs/conformance.md."""

from __future__ import annotations

import pytest
import torch

import torch_dtr

pytest.importorskip("expecttest")
import conformance  # noqa: E402

# deprecated operators in op_db warn when run; those warnings are PyTorch's, not the test's outcome
# op_db through the Python front end; tests/native/test_conformance_native.py runs it through the compiled one
pytestmark = [pytest.mark.filterwarnings("ignore::UserWarning"), pytest.mark.python_front]

# Known failures, each with the reason; strict, so that a fix is noticed and the entry removed.
KNOWN: dict[str, str] = {}
if tuple(int(v) for v in torch.__version__.split("+")[0].split(".")[:2]) < (2, 13):
    # measured on torch 2.11 (the GPU image, 2026-11-25): the CPU gradient of cumprod differed from plain's; on
    # 2.13 it is equal. Not analysed further without that version here (prod's difference, below, comes from
    # PyTorch's formula for wrapper subclasses; cumprod's may too).
    KNOWN["cumprod"] = "torch < 2.13: cumprod's gradient differs under any wrapper subclass (measured on 2.11)"

OPS = conformance.ops_for(torch.float32)


@pytest.mark.parametrize("op", OPS, ids=[conformance.name(o) for o in OPS])
def test_first_sample_bitwise_in_both_modes(op):
    name = conformance.name(op)
    if name in KNOWN:
        pytest.xfail(KNOWN[name])
    bad = []
    for _, sample in conformance.samples(op, torch.float32, 1):
        for mode in conformance.MODES:
            status, detail = conformance.check(op, sample, mode)
            if status in ("differs", "raises"):
                bad.append(f"{mode}: {status}: {detail}")
    assert not bad, "; ".join(bad)


DEVICE_OPS = [o for o in OPS if o.supports_autograd]


@pytest.mark.parametrize("op", DEVICE_OPS, ids=[conformance.name(o) for o in DEVICE_OPS])
def test_first_sample_bitwise_on_a_device_with_everything_evicted(op):
    """The device path (what runs on CUDA: the allocator's rounding and queries, out-of-memory retries) on CPU
    samples through the simulated allocator. It found that sizing an op on a sparse CSR tensor raised
    (sparse.sampled_addmm, as measured on an H100, where every op was sized even without a budget)."""
    name = conformance.name(op)
    if name in KNOWN:
        pytest.xfail(KNOWN[name])
    dev = torch_dtr.SimulatedDevice()
    for _, sample in conformance.samples(op, torch.float32, 1):
        status, detail = conformance.check(op, sample, "all_evicted", dev)
        assert status not in ("differs", "raises"), f"{status}: {detail}"


# Known differences on CUDA, measured on an H100 (2026-11-25) and an H200 (2026-11-26), torch 2.11: the gradients
# of cumprod and masked.cumprod differ by 1.2e-7 and 3.1e-5 in both modes, nothing evicted included, so not from a
# recomputation (the backward formula reached under the dispatch mode rounds otherwise); equal on torch 2.13's
# CPU. Checked, and marked xfail only when they still differ, so that a fix shows up as a pass.
CUDA_KNOWN: dict[str, str] = {n: "cumprod's gradient rounds otherwise under the mode on CUDA (torch 2.11)"
                              for n in ("cumprod", "masked.cumprod")}
CUDA_OPS = conformance.ops_for(torch.float32, "cuda") if torch.cuda.is_available() else []


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("op", CUDA_OPS, ids=[conformance.name(o) for o in CUDA_OPS])
def test_first_sample_bitwise_on_cuda_in_both_modes(op):
    name = conformance.name(op)
    torch.use_deterministic_algorithms(True)
    try:
        bad = []
        for _, sample in conformance.samples(op, torch.float32, 1, "cuda"):
            for mode in conformance.MODES:
                status, detail = conformance.check(op, sample, mode)
                if status in ("differs", "raises"):
                    bad.append(f"{mode}: {status}: {detail}")
        if bad and name in CUDA_KNOWN:
            pytest.xfail(f"{CUDA_KNOWN[name]}: {'; '.join(bad)}")
        assert not bad, "; ".join(bad)
    finally:
        torch.use_deterministic_algorithms(False)


class _Wrapper(torch.Tensor):
    """A wrapper subclass that only unwraps and rewraps: no torch-dtr at all."""

    @staticmethod
    def __new__(cls, t):
        w = torch.Tensor._make_wrapper_subclass(cls, t.size(), strides=t.stride(), dtype=t.dtype, device=t.device)
        w.inner = t
        return w

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        from torch.utils._pytree import tree_map

        def un(x):
            return x.inner if isinstance(x, _Wrapper) else x

        out = func(*tree_map(un, args), **tree_map(un, kwargs or {}))
        return tree_map(lambda x: _Wrapper(x) if isinstance(x, torch.Tensor) else x, out)


def test_prod_gradient_differs_for_any_wrapper_subclass_not_for_torch_dtr_alone():
    # docs/conformance.md: prod's gradient along a dim is not bitwise plain PyTorch's under torch-dtr. The
    # cause is PyTorch's: its autograd formula differs for wrapper subclasses; a do-nothing wrapper gives
    # exactly torch-dtr's gradient.
    import torch_dtr

    torch.manual_seed(0)
    x = torch.rand(5, 5, 5) * 2 - 1
    a = x.clone().requires_grad_()
    torch.prod(a, 0).sum().backward()
    b = _Wrapper(x.clone()).requires_grad_()
    torch.prod(b, 0).sum().backward()
    torch_dtr.enable(budget=None)
    try:
        c = x.clone().requires_grad_()
        torch.prod(c, 0).sum().backward()
    finally:
        torch_dtr.disable()
    assert not torch.equal(a.grad, b.grad.inner)
    assert torch.equal(c.grad, b.grad.inner)


def _run_wrapped(op, sample):
    """``conformance._run`` with every tensor argument in a do-nothing wrapper subclass (no torch-dtr)."""
    from torch.utils._pytree import tree_leaves, tree_map

    inp, args, kwargs = conformance._clone((sample.input, sample.args, sample.kwargs))

    def wrap(t):
        return _Wrapper(t.detach()).requires_grad_(t.requires_grad) if isinstance(t, torch.Tensor) else t

    inp, args, kwargs = tree_map(wrap, (inp, args, kwargs))
    leaves = [t for t in tree_leaves((inp, args, kwargs)) if isinstance(t, torch.Tensor) and t.requires_grad]
    torch.manual_seed(1)
    outs = [o for o in tree_leaves(op(inp, *args, **kwargs)) if isinstance(o, torch.Tensor)]
    diff = [o for o in outs if o.requires_grad]
    grads = torch.autograd.grad(diff, leaves, [torch.ones_like(o) for o in diff], allow_unused=True) if diff else []
    return [o.inner.detach() for o in outs], [None if g is None else g.inner for g in grads]


# docs/conformance.md's differing samples: a do-nothing wrapper subclass already differs from plain PyTorch
# there, and torch-dtr (nothing evicted) gives exactly the wrapper's values: PyTorch's subclass path
# (the complex pseudo-inverse is not in this list: any TorchDispatchMode makes it wrong, below; float32
# linalg.lstsq differs from run to run in plain PyTorch itself: conformance.NONDETERMINISTIC)
SUBCLASS_CASES = [("masked.prod", "", torch.float32, 16), ("masked.prod", "", torch.float32, 18)]


@pytest.mark.parametrize("name,variant,dtype,index", SUBCLASS_CASES,
                         ids=[f"{n}{'.' + v if v else ''}-{str(d)[6:]}-{i}" for n, v, d, i in SUBCLASS_CASES])
def test_differences_come_from_any_wrapper_subclass(name, variant, dtype, index):
    import torch_dtr

    op = next(o for o in conformance.op_db() if o.name == name and o.variant_test_name == variant)
    sample = dict(conformance.samples(op, dtype, index + 1))[index]
    plain_out, plain_grad = conformance._run(op, sample)
    wrap_out, wrap_grad = _run_wrapped(op, sample)
    torch_dtr.enable(budget=None)
    try:
        dtr_out, dtr_grad = conformance._run(op, sample)
    finally:
        torch_dtr.disable()
    pairs = list(zip(plain_out + plain_grad, wrap_out + wrap_grad, strict=True))
    assert any(a is not None and not torch.equal(a, b) for a, b in pairs), "the wrapper matches plain now"
    assert all((a is None and b is None) or torch.equal(a, b)
               for a, b in zip(wrap_out + wrap_grad, dtr_out + dtr_grad, strict=True))


def _complex_pinv_case():
    torch.manual_seed(0)
    a = torch.randn(5, 5, dtype=torch.complex64)
    return a, torch.linalg.pinv(a)


def test_complex_pinv_is_wrong_under_any_dispatch_mode_in_pytorch():
    # PyTorch 2.13 (pytorch/pytorch#198118): a dispatch mode excludes the Conjugate key, and pinv's kernel
    # multiplies a lazy conjugate view of its own. When this fails, PyTorch fixed it: then
    # NOTE [ Conjugate and negative keys ] can go.
    from torch.utils._python_dispatch import TorchDispatchMode

    class _Nothing(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))

    a, want = _complex_pinv_case()
    assert float((a @ want @ a - a).abs().max()) < 1e-4
    with _Nothing():
        bare = torch.linalg.pinv(a)
    assert float((a @ bare @ a - a).abs().max()) > 1e-2


@pytest.mark.parametrize("evict", [False, True])
def test_complex_pinv_and_lstsq_under_enable_are_bitwise_plain(evict):
    # torch-dtr switches the Conjugate and Negative keys back on for ops with complex arguments, on the first
    # run and on replays (NOTE [ Conjugate and negative keys ]): values and gradients bitwise plain, also when
    # everything evictable is evicted before the gradients.
    import torch_dtr

    def run():
        torch.manual_seed(0)
        a = torch.randn(5, 5, dtype=torch.complex64, requires_grad=True)
        ar = torch.randn(6, 4, dtype=torch.complex64, requires_grad=True)
        br = torch.randn(6, 2, dtype=torch.complex64)
        p = torch.linalg.pinv(a * 1.0)
        sol, res, _, _ = torch.linalg.lstsq(ar * 1.0, br, driver="gelsd")
        loss = (p.abs() ** 2).sum() + (sol.abs() ** 2).sum() + res.sum()
        if evict and torch_dtr.enabled():
            rt = torch_dtr.runtime()
            for s in list(rt.candidates):
                rt.evict(s)
        loss.backward()
        return [torch_dtr.unwrap(t).detach() for t in (p, sol, res, loss)] + [a.grad, ar.grad]

    want = run()
    torch_dtr.enable(budget=None)
    try:
        got = run()
        if evict:
            assert torch_dtr.stats().rematerializations + torch_dtr.stats().swaps_in > 0
    finally:
        torch_dtr.disable()
    assert all(torch.equal(g, w) for g, w in zip(got, want, strict=True))


def test_lstsq_outputs_are_never_recomputed():
    # linalg.lstsq's CPU driver gives other solutions from run to run in plain PyTorch (an uninitialized pivot
    # array, pytorch/pytorch#187411), so a recomputation could change a value the program already read: its
    # outputs are pinned (funcinfo._NOT_REPLAYABLE) and every read after evicting everything returns them.
    import torch_dtr

    torch.manual_seed(0)
    a, b = torch.randn(6, 4, requires_grad=True), torch.randn(6, 2)
    torch_dtr.enable()
    try:
        rt = torch_dtr.runtime()
        out = torch.linalg.lstsq(a * 1.0, b)
        first = torch_dtr.unwrap(out.solution).clone()
        for s in list(rt.candidates):
            rt.evict(s)
        remats: list[str] = []
        torch_dtr.listen(lambda kind, s: remats.append(s.op.name) if kind == "remat" and s.op else None)
        again = torch_dtr.unwrap(out.solution * 1.0)
        assert torch.equal(again, first)
        assert not any("lstsq" in n for n in remats), remats
        assert rt.evictions > 0  # a * 1.0 was evicted; the solution was not
    finally:
        torch_dtr.disable()
