"""A session learns the budget its program needs (NOTE [ Learned budgets ] in native/session.py): after the steps it
traced, ``stats().learned_budget`` is a budget at which a fresh session trains the same steps, bitwise as plain;
a BudgetError quotes one budget (``BudgetError.budget``), the learned one where it is known."""

from __future__ import annotations

import io
import pickle

import pytest
import torch
from steps import PROGRAMS, Step, fresh, mlp

import torch_dtr
from torch_dtr.native import session as native_session

pytestmark = pytest.mark.skipif(not torch_dtr.native.available(), reason="the compiled front end learns budgets")


def _params(step: Step) -> list[torch.Tensor]:
    """The parameters the step's optimizer updates (the optimizer is a variable the step closes over)."""
    (opt,) = [c.cell_contents for c in step.__closure__ or () if isinstance(c.cell_contents, torch.optim.Optimizer)]
    return opt.param_groups[0]["params"]


def _run(make, budget: int | None, steps: int = 3) -> tuple[list[torch.Tensor], object]:
    step = fresh(make)
    with torch_dtr.enable(budget=budget):
        for _ in range(steps):
            step()
        st = torch_dtr.stats()
    return [p.detach().clone() for p in _params(step)], st


@pytest.mark.parametrize("make", PROGRAMS)
def test_a_fresh_session_trains_at_the_smallest_budget_the_unbudgeted_steps_learned(make):
    plain_step = fresh(make)
    for _ in range(3):
        plain_step()
    plain = [p.detach().clone() for p in _params(plain_step)]
    _, learned = _run(make, None)
    assert learned.traced_steps == native_session.LEARN_STEPS
    smallest = learned.learned_budget
    assert smallest is not None and learned.floor_bytes <= smallest < learned.peak_bytes, (smallest, learned)
    params, st = _run(make, smallest)  # the first retry, at the number learned
    assert st.evictions > 0 and st.peak_bytes <= smallest, st
    assert all(torch.equal(a, b) for a, b in zip(params, plain, strict=True)), "not bitwise equal to plain"


def test_learning_stops_after_its_steps_and_the_per_op_path_is_untraced_again():
    step = fresh(mlp)
    with torch_dtr.enable(budget=None) as s:
        h = s.handle
        step()
        assert h.trace is not None and h.learned is None
        step()
        assert h.trace is None and h.learned is not None and h.learner.rows is None
        n = len(h.learned.rows)
        step()
        assert len(h.learned.rows) == n and torch_dtr.stats().traced_steps == 2


def test_a_program_without_optimizer_steps_stops_being_traced_after_the_rows_kept_and_learns_from_them(monkeypatch):
    monkeypatch.setattr(native_session, "LEARN_ROWS", 50)
    w = torch.randn(64, 64, requires_grad=True)
    with torch_dtr.enable(budget=None) as s:
        h = s.handle
        x = torch.randn(8, 64)
        for _ in range(40):
            x = (x @ w).tanh()
        assert h.trace is None and h.learner.rows is None  # stopped at the rows kept
        st = torch_dtr.stats()
        assert st.traced_steps == 0 and len(h.learned.rows) == 50  # learned from the rows it kept
        assert st.floor_bytes <= st.learned_budget <= st.peak_bytes, st


def _two_backwards() -> list[torch.Tensor]:
    """No optimizer: two losses backward through one graph (the first retains it)."""
    torch.manual_seed(0)
    net = torch.nn.Sequential(*[torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.GELU()) for _ in range(6)])
    h = net(torch.randn(128, 64))
    h.square().mean().backward(retain_graph=True)
    first = [p.grad.clone() for p in net.parameters()]
    h.abs().mean().backward()
    return first + [p.grad.clone() for p in net.parameters()]


def test_a_program_without_an_optimizer_learns_from_all_it_ran_and_trains_at_the_first_retry():
    plain = _two_backwards()
    with torch_dtr.enable(budget=None):
        _two_backwards()
    learned = torch_dtr.stats()  # (the session that ended)
    assert learned.traced_steps == 0 and learned.floor_bytes <= learned.learned_budget < learned.peak_bytes, learned
    with torch_dtr.enable(budget=learned.learned_budget):
        got = _two_backwards()
        st = torch_dtr.stats()
    assert st.evictions > 0 and st.peak_bytes <= learned.learned_budget, st
    assert all(torch.equal(a, b) for a, b in zip(got, plain, strict=True)), "not bitwise equal to plain"


def test_a_budget_error_quotes_the_learned_budget_once_steps_were_traced():
    _, learned = _run(mlp, None, steps=2)
    step = fresh(mlp)
    with torch_dtr.enable(budget=None):
        step()
        step()
        assert torch_dtr.stats().learned_budget == learned.learned_budget
        with pytest.raises(torch_dtr.BudgetError) as e, torch_dtr.budget(learned.learned_budget // 4):
            step()
    err = e.value
    assert err.budget == learned.learned_budget
    msg = str(err)
    assert f"Budget to try: {torch_dtr.core.errors.fmt_bytes(err.budget)} ({err.budget} B; the budget learned" in msg
    assert "2 step(s) this session traced" in msg and f"torch_dtr.enable(budget={err.budget})" in msg
    again = pickle.loads(pickle.dumps(err))
    assert again.budget == err.budget and str(again) == msg


def test_a_budget_error_in_the_first_step_quotes_what_the_step_so_far_needs():
    step = fresh(mlp)
    with pytest.raises(torch_dtr.BudgetError) as e, torch_dtr.enable(budget=20_000):
        step()
    err = e.value
    assert err.budget is not None and err.budget > 20_000
    assert "the rest of the step may need more" in str(err) and "stats().learned_budget" in str(err)
    # the budget it quotes holds for everything up to the op that failed
    step = fresh(mlp)
    with pytest.raises(torch_dtr.BudgetError) as again, torch_dtr.enable(budget=err.budget):
        step()
    assert again.value.budget > err.budget  # (this MLP reads a new layer's weights at every op: it fails later)


def test_the_python_front_end_learns_nothing_and_says_the_op_s_need():
    step = fresh(mlp)
    with torch_dtr.enable(budget=None, front="python"):
        step()
        step()
        assert torch_dtr.stats().learned_budget is None
    step = fresh(mlp)
    with pytest.raises(torch_dtr.BudgetError) as e, torch_dtr.enable(budget=20_000, front="python"):
        step()
    assert e.value.budget is not None and "10% above what this op needs" in str(e.value)


def _round_trip() -> list[torch.Tensor]:
    """Two AdamW steps, then model and optimizer saved, loaded into fresh ones (the old ones still alive), and a
    third step there: the third step holds more than the traced ones."""
    torch.manual_seed(0)

    def net_() -> torch.nn.Module:
        return torch.nn.Sequential(*[torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.Tanh()) for _ in range(6)])

    net = net_()
    opt = torch.optim.AdamW(net.parameters(), lr=1e-2)
    losses = []
    for _ in range(2):
        loss = net(torch.randn(512, 64)).square().mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(float(loss.detach()))
    buf = io.BytesIO()
    torch.save({"model": net.state_dict(), "opt": opt.state_dict()}, buf)
    buf.seek(0)
    state = torch.load(buf, weights_only=True)
    torch.manual_seed(1)
    net2 = net_()
    net2.load_state_dict(state["model"])
    opt2 = torch.optim.AdamW(net2.parameters(), lr=1e-2)
    opt2.load_state_dict(state["opt"])
    x = torch.randn(2048, 64)  # a larger batch too
    loss = net2(x).square().mean()
    loss.backward()
    opt2.step()
    losses.append(float(loss.detach()))
    return [torch.tensor(losses), *(p.detach().clone() for p in net2.parameters())]


def test_a_peak_that_rises_after_the_traced_steps_is_added_to_the_learned_budget(monkeypatch):
    # NOTE [ Learned budgets ] 5
    want = _round_trip()
    with torch_dtr.enable():
        _round_trip()
    st = torch_dtr.stats()
    assert st.traced_steps == 2 and st.learned_budget is not None
    with torch_dtr.enable(budget=st.learned_budget):
        got = _round_trip()
        at = torch_dtr.stats()
    assert all(torch.equal(a, b) for a, b in zip(got, want, strict=True))
    assert at.evictions > 0 and at.peak_bytes <= st.learned_budget
    # without rule 5, what the traced steps alone need does not train the third step
    stop = native_session.Session._stop_learning

    def forget(self):
        stop(self)
        self._peak_learned = None

    monkeypatch.setattr(native_session.Session, "_stop_learning", forget)
    with torch_dtr.enable():
        _round_trip()
    alone = torch_dtr.stats().learned_budget
    assert alone < st.learned_budget
    with pytest.raises(torch_dtr.BudgetError), torch_dtr.enable(budget=alone):
        _round_trip()
