"""``torch_dtr.enable()`` as a new user meets it: it runs the compiled front end (NOTE [ Choosing the front end ]),
with the API the README documents, and plain PyTorch's results bit for bit. Where the compiled front end cannot be
built, the Python one runs instead, with one warning."""

from __future__ import annotations

import gc
import threading
import warnings

import pytest
import torch

import torch_dtr
from torch_dtr import native

needs_native = pytest.mark.skipif(not native.available(), reason="the C++ front end cannot be built here")


@pytest.fixture(autouse=True)
def _default_front(monkeypatch):
    monkeypatch.delenv("TORCH_DTR_FRONT", raising=False)
    yield
    torch_dtr.disable()
    gc.collect()


def _mlp():
    torch.manual_seed(0)
    return torch.nn.Sequential(*[torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.Tanh()) for _ in range(12)])


def _train(model, steps=3, batch=512):
    """Losses, gradients of the last step and final parameters, as plain tensors."""
    opt = torch.optim.AdamW(model.parameters())
    torch.manual_seed(1)
    x, y = torch.randn(batch, 64), torch.randn(batch, 64)
    losses = []
    for _ in range(steps):
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        losses.append(torch_dtr.unwrap(loss).detach().clone())
        grads = [p.grad.clone() for p in model.parameters()]
        opt.step()
        opt.zero_grad()
    return losses, grads, [p.detach().clone() for p in model.parameters()]


def _same(a, b):
    return all(torch.equal(x, y) for xs, ys in zip(a, b, strict=True) for x, y in zip(xs, ys, strict=True))


def _peak() -> int:
    with torch_dtr.enable(budget=None):
        _train(_mlp(), steps=1)
        return torch_dtr.stats().peak_bytes


@needs_native
def test_enable_runs_the_compiled_front_end_bitwise_within_half_the_peak():
    plain = _train(_mlp())
    budget = _peak() // 2
    s = torch_dtr.enable(budget=budget)
    assert s.front == "native" and torch_dtr.front() == "native" and torch_dtr.enabled()
    out = _train(_mlp())
    st = torch_dtr.stats()
    torch_dtr.disable()
    assert _same(out, plain)
    assert isinstance(st, torch_dtr.Stats) and st.budget_bytes == budget
    assert st.peak_bytes <= budget and st.evictions > 0 and st.rematerializations > 0
    after = torch_dtr.stats()  # the last session's counters after disable()
    assert not torch_dtr.enabled() and (after.peak_bytes, after.rematerializations) == (st.peak_bytes,
                                                                                      st.rematerializations)


@needs_native
def test_mse_loss_is_sized_by_its_rule_so_a_budget_of_40_percent_holds_without_a_warning():
    # CPU mse_loss returns a view of its elementwise buffer (its meta kernel says 4 B: NOTE [ Size prediction ] 8)
    budget = int(_peak() * 0.4)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a prediction that fell short warns
        with torch_dtr.enable(budget=budget):
            _train(_mlp(), batch=384)  # a batch no earlier test ran: its sizes are not cached yet
            st = torch_dtr.stats()
    assert st.peak_bytes <= budget and st.rematerializations > 0


@needs_native
def test_an_op_sized_by_its_data_is_sized_by_its_rule_on_its_inputs_within_1_1mb():
    w = torch.randn(256, 256, requires_grad=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with torch_dtr.enable(budget=1_150_000):
            before = native.stats()
            a = (w * 2).relu()
            b = a * 3
            idx = torch.nonzero(b)  # about 512 KiB of int64 pairs, known only from the data
            after = native.stats()
            st = torch_dtr.stats()
    assert after["sizes_unpredicted"] == before["sizes_unpredicted"]
    assert st.evictions > 0 and st.peak_bytes <= 1_150_000  # room made before it ran
    assert torch.equal(torch_dtr.unwrap(idx), torch.nonzero((w.detach() * 2).relu() * 3))


@torch.library.custom_op("dtr_test::positives", mutates_args=(), device_types="cpu")
def _positives(x: torch.Tensor) -> torch.Tensor:  # a size known only from the data, and no fake kernel
    return x[x > 0].clone()


@needs_native
def test_an_op_nothing_can_size_is_counted_and_warned_about_and_evicted_for_at_once_within_1_1mb():
    w = torch.randn(256, 256, requires_grad=True)
    with torch_dtr.enable(budget=1_150_000):
        before = native.stats()["sizes_unpredicted"]
        a = (w * 2).relu()
        b = a * 3
        with pytest.warns(RuntimeWarning, match="cannot predict the output size of dtr_test.positives"):
            picked = _positives(b * 1)
        assert native.stats()["sizes_unpredicted"] == before + 1
        st = torch_dtr.stats()
        assert st.evictions > 0 and st.resident_bytes <= 1_150_000  # evicted for right after it
        assert torch.equal(torch_dtr.unwrap(picked), _positives((w.detach() * 2).relu() * 3))


@needs_native
def test_enable_is_a_context_manager_that_disables_on_an_exception():
    with pytest.raises(ZeroDivisionError):
        with torch_dtr.enable(budget="1GiB") as s:
            assert torch_dtr.enabled() and s.front == "native"
            1 / 0  # noqa: B018
    assert not torch_dtr.enabled() and not s.active


@needs_native
def test_enable_again_after_a_budget_error_starts_a_new_session_with_a_warning():
    w = torch.randn(256, 256, requires_grad=True)
    torch_dtr.enable(budget=1000)
    with pytest.raises(torch_dtr.BudgetError, match=r"torch_dtr.enable\(budget="):  # names the public calls
        (w * 2).sum()
    with pytest.warns(RuntimeWarning, match="that session is disabled first"):
        torch_dtr.enable(budget=None)  # a notebook cell run again
    y = (w * 2).sum()
    assert torch.equal(torch_dtr.unwrap(y), (w.detach() * 2).sum()) and torch_dtr.enabled()


@needs_native
def test_a_budget_scope_inside_a_session_sets_and_restores_the_budget():
    with torch_dtr.enable(budget="1GiB"):
        with torch_dtr.budget("64MiB"):
            assert torch_dtr.stats().budget_bytes == 64 << 20
            with pytest.raises(ValueError, match="outermost scope"), torch_dtr.budget("32MiB", swap=True):
                pass
        assert torch_dtr.stats().budget_bytes == 1 << 30
    with torch_dtr.budget("8MiB"):  # outside a session: a session for the scope
        assert torch_dtr.enabled() and torch_dtr.front() == "native"
    assert not torch_dtr.enabled()


@needs_native
def test_a_worker_thread_attached_trains_under_the_session_at_half_the_peak_bitwise():
    plain = _train(_mlp())
    budget = _peak() // 2
    out: list = []
    errors: list = []

    def work():
        try:
            with torch_dtr.attach():
                out.append(_train(_mlp()))
        except BaseException as e:  # pragma: no cover - reported below
            errors.append(e)

    with torch_dtr.enable(budget=budget):
        t = threading.Thread(target=work)
        t.start()
        t.join()
        st = torch_dtr.stats()
    assert not errors, errors
    assert _same(out[0], plain)
    assert st.peak_bytes <= budget and st.rematerializations > 0  # the worker's ops were managed


@needs_native
def test_listen_unwrap_reset_peak_and_runtime_act_on_the_compiled_session():
    w = torch.randn(64, 64, requires_grad=True)
    with torch_dtr.enable(budget=None):
        kinds: list[str] = []
        stop = torch_dtr.listen(lambda kind, s: kinds.append(kind))
        y = (w * 2).tanh()
        assert native.is_managed(y)
        rt = torch_dtr.runtime()
        assert rt is native.current().rt
        plain = torch_dtr.unwrap(y)
        assert not native.is_managed(plain) and torch.equal(plain, (w.detach() * 2).tanh())
        stop()
        assert "op" in kinds
        torch_dtr.reset_peak()
        assert torch_dtr.stats().peak_bytes == torch_dtr.stats().resident_bytes


def test_the_simulated_allocator_runs_on_the_default_and_python_options_choose_the_python_front_end():
    with torch_dtr.SimulatedDevice("64MiB") as dev:
        with torch_dtr.enable(budget="32MiB", device=dev) as s:
            assert s.front == "native"
        with torch_dtr.enable(budget=None, front="python", device=dev) as s:
            assert s.front == "python"
    with torch_dtr.enable(budget=None, costs="time") as s:
        assert s.front == "python"
    with pytest.raises(ValueError, match="needs the Python front end"):
        torch_dtr.enable(budget=None, front="native", costs="time")
    with pytest.raises(ValueError, match="front must be one of"):
        torch_dtr.enable(front="fast")
    with pytest.raises(TypeError, match="unexpected keyword"):
        torch_dtr.enable(budgte="1GiB")
    assert not torch_dtr.enabled()


def test_torch_dtr_front_in_the_environment_chooses_the_python_front_end(monkeypatch):
    monkeypatch.setenv("TORCH_DTR_FRONT", "python")
    with torch_dtr.enable(budget=None) as s:
        assert s.front == "python" and type(torch.ones(2, requires_grad=True) * 2) is torch_dtr.DTRTensor
    monkeypatch.setenv("TORCH_DTR_FRONT", "gpu")
    with pytest.raises(ValueError, match="TORCH_DTR_FRONT must be one of"):
        torch_dtr.enable()


def test_where_the_compiled_front_end_cannot_be_built_the_python_one_runs_with_one_warning(monkeypatch):
    from torch_dtr import api

    def cannot():
        raise native.NativeUnavailable("torch_dtr.native: the C++ front end could not be built (no compiler)")

    monkeypatch.setattr(native, "load", cannot)
    monkeypatch.setattr(api, "_WARNED_FALLBACK", False)
    plain = _train(_mlp(), steps=1)
    with pytest.warns(RuntimeWarning, match="The Python front end runs instead"):
        s = torch_dtr.enable(budget=None)
    assert s.front == "python"
    out = _train(_mlp(), steps=1)
    torch_dtr.disable()
    assert _same(out, plain)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        torch_dtr.enable(budget=None)  # said once
    torch_dtr.disable()


def test_torch_dtr_native_is_reachable_as_an_attribute():
    import importlib

    assert importlib.import_module("torch_dtr").native is native


@needs_native
def test_setting_data_of_managed_tensors_to_temporaries_keeps_their_values_at_no_budget():
    x = torch.randn(64, 64, requires_grad=True)
    with torch_dtr.enable(budget=None):
        t = x * 2
        t.data = torch.zeros_like(t)  # a managed temporary, dead right after (it was read freed: a crash)
        u = x * 3
        u.data = torch.ones(5)  # a plain one, of another shape
        v = x * 4
        v.data = x.detach() * 5
        gc.collect()
        churn = [(x * k).exp() for k in range(8)]  # new values take the freed memory
        assert torch.equal(t, torch.zeros(64, 64)) and torch.equal(u * 2, torch.full((5,), 2.0))
        assert torch.equal(v, x.detach() * 5) and len(churn) == 8


@needs_native
def test_torch_func_transforms_and_compiling_a_region_are_said_once_per_session_and_stay_bitwise():
    from torch.func import grad, vmap

    w = torch.randn(32, 32)
    x = torch.randn(16, 32)

    def f(v):
        return (v @ w).tanh().sum()

    def g(v):
        return (v * 2).sin() @ w

    plain_func, plain_compiled = vmap(grad(f))(x), g(x)
    for _ in range(2):  # each session says it again, once
        torch._dynamo.reset()
        compiled = torch.compile(g, backend="eager")
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            with torch_dtr.enable(budget="64MiB"):
                got = [vmap(grad(f))(x), vmap(grad(f))(x), compiled(x), compiled(x)]
                got = [torch_dtr.unwrap(t) for t in got]
        said = [str(c.message) for c in caught if str(c.message).startswith("torch_dtr:")]
        assert sum("torch.func transforms" in m for m in said) == 1, said
        assert sum("a torch.compile region is compiled" in m for m in said) == 1, said
        assert all(torch.equal(t, plain_func) for t in got[:2]) and all(torch.equal(t, plain_compiled) for t in got[2:])


@needs_native
def test_a_value_evicted_and_unwrapped_from_python_is_recomputed_below_autograd():
    x = torch.randn(32, 32, requires_grad=True)
    with torch_dtr.enable(budget=None):
        y = x.abs() * 1  # abs's kernel calls abs_out, which autograd refuses for inputs that require grad
        z = x.abs()
        h = native.current()
        h.rt.evict(h.ext.storage_of(z))
        assert torch.equal(torch_dtr.unwrap(z), x.detach().abs()) and torch.equal(torch_dtr.unwrap(y), x.detach().abs())


@needs_native
def test_the_size_and_cost_caches_stay_bounded_when_a_scalar_changes_every_call():
    x = torch.randn(4, 4, requires_grad=True)
    with torch_dtr.enable(budget="1MiB"):
        for i in range(20_500):  # a new scalar each time: a new call signature each time
            x * (1.0 + i / 100_000)
        counters = native.stats()
    assert 0 < counters["size_cache"] <= 20_000 and 0 < counters["cost_cache"] <= 20_000


@needs_native
def test_a_budget_error_says_how_to_find_a_budget_for_the_whole_step():
    """Issue 51's complaint (a dozen tries, each suggestion covering only the op that failed): the message names
    the route to one number for the whole step: the step learned in the session (NOTE [ Learned budgets ]), or,
    where the session does not learn, a trace replayed by ``torch-dtr simulate --smallest``."""
    w = torch.randn(256, 256, requires_grad=True)
    routes = ((True, "torch_dtr.stats().learned_budget"), (False, "torch-dtr simulate step.trace --smallest"))
    for learn, route in routes:
        with pytest.raises(torch_dtr.BudgetError) as err, torch_dtr.enable(budget=300_000, learn=learn):
            (w @ w).tanh().sum().backward()
        msg = str(err.value)
        assert f"torch_dtr.enable(budget={err.value.budget})" in msg and route in msg, (learn, msg)
        assert not torch_dtr.enabled()


@pytest.mark.parametrize("front", ["native", "python"])
def test_training_steps_follow_the_plan_of_the_step_before_bitwise_within_the_budget(front, monkeypatch):
    # NOTE [ Iteration plans ]: each optimizer step ends an iteration; the next follows its plan while it matches
    if front == "native" and not native.available():
        pytest.skip("the C++ front end cannot be built here")
    monkeypatch.setenv("TORCH_DTR_FRONT", front)
    plain = _train(_mlp(), steps=5)
    budget = _peak() // 2
    with torch_dtr.enable(budget=budget):
        assert torch_dtr.front() == front
        out = _train(_mlp(), steps=5)
        st = torch_dtr.stats()
    assert _same(out, plain)
    # the plan first (step 2), then without it (step 3), then the one that recomputed less (steps 4, 5); the copies
    # of the parameters after the last step are not that plan's iteration: they leave it, and are counted
    assert (st.iterations, st.diverged) == (5, 1) and st.planned >= 1
    assert st.peak_bytes <= budget and st.evictions > 0 and st.rematerializations > 0


@pytest.mark.parametrize("front", ["native", "python"])
def test_a_followed_plan_brings_back_values_ahead_of_need_bitwise_within_55_percent_of_the_peak(front, monkeypatch):
    # NOTE [ Iteration plans ] 7: after an op, an evicted input of the plan's next ops is recomputed if it fits now
    if front == "native" and not native.available():
        pytest.skip("the C++ front end cannot be built here")
    monkeypatch.setenv("TORCH_DTR_FRONT", front)
    plain = _train(_mlp(), steps=5)
    budget = int(_peak() * 0.55)
    with torch_dtr.enable(budget=budget):
        out = _train(_mlp(), steps=5)
        st = torch_dtr.stats()
    assert _same(out, plain)
    assert st.planned >= 1 and st.ahead > 0 and st.peak_bytes <= budget
