"""A traced iteration replays to the live session's decisions (NOTE [ Traces ]): the same program, traced once
without a budget, then run live at each budget in a session of its own, and replayed at the same budgets; the
outcome, evictions and recomputations must be equal."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from collections.abc import Callable

import pytest
import torch
from steps import PROGRAMS, Step, fresh, gpt2, lstm_cells

import torch_dtr
from torch_dtr.sim.trace import read_trace, simulate_trace, trace_peak

pytestmark = pytest.mark.skipif(not torch_dtr.native.available(), reason="traces come from the compiled front end")


def _live(make: Callable[[], Step], budget: int) -> tuple:
    step = fresh(make)
    try:
        with torch_dtr.enable(budget=budget):
            step()
            st = torch_dtr.stats()
    except torch_dtr.BudgetError:
        return ("oom",)
    return ("ok", st.evictions, st.rematerializations)


@pytest.mark.parametrize("make", PROGRAMS)
def test_a_traced_iteration_replays_to_the_live_sessions_decisions_at_every_budget(tmp_path, make):
    path = tmp_path / "step.trace"
    step = fresh(make)
    with torch_dtr.enable(budget=None, trace=path):
        step()
        live_peak = torch_dtr.stats().peak_bytes
    trace = read_trace(path)
    peak = trace_peak(trace)
    assert peak == live_peak, "the trace replayed without a budget peaks where the live session did"
    seen = []
    for ratio in (0.3, 0.45, 0.6, 0.75, 0.9):
        budget = int(ratio * peak)
        o = simulate_trace(trace, budget=budget, thrash_at=None)
        replayed = ("ok", o.evictions, o.rematerializations) if o.status == "ok" else (o.status,)
        live = _live(make, budget)
        assert replayed == live, f"ratio {ratio}: replay {replayed}, live {live}"
        seen.append(live)
    assert any(s[0] == "ok" and s[1] > 0 for s in seen), f"no budget evicted and trained: {seen}"


@pytest.mark.parametrize("make", [gpt2, lstm_cells])
def test_traced_steps_replay_to_the_live_sessions_decisions_with_iteration_plans(tmp_path, make):
    # four optimizer steps: the trace's ["S"] rows are the boundaries the live session's steps make, so the replay's
    # plans (NOTE [ Iteration plans ]) are the live session's, and so are its decisions
    path = tmp_path / "steps.trace"
    step = fresh(make)
    with torch_dtr.enable(budget=None, trace=path):
        for _ in range(4):
            step()
    trace = read_trace(path)
    assert sum(row[0] == "S" for row in trace.rows) == 4
    peak = trace_peak(trace)
    for ratio in (0.45, 0.6, 0.75):
        budget = int(ratio * peak)
        o = simulate_trace(trace, budget=budget, thrash_at=None)
        step = fresh(make)
        try:
            with torch_dtr.enable(budget=budget):
                for _ in range(4):
                    step()
                st = torch_dtr.stats()
            live = ("ok", st.evictions, st.rematerializations, st.planned, st.diverged)
        except torch_dtr.BudgetError:
            live = ("oom",)
        replayed = (("ok", o.evictions, o.rematerializations, o.planned, o.diverged) if o.status == "ok"
                    else (o.status,))
        assert replayed == live, f"ratio {ratio}: replay {replayed}, live {live}"
        assert live[0] == "oom" or live[3] >= 1


def test_bad_traces_and_options_are_refused_clearly(tmp_path):
    not_a_trace = tmp_path / "x.log"
    not_a_trace.write_text('{"INSTRUCTION": "CALL"}\n')
    with pytest.raises(ValueError, match="is not a torch-dtr trace"):
        read_trace(not_a_trace)
    with pytest.raises(ValueError, match="trace= needs the compiled front end"):
        torch_dtr.enable(budget=None, front="python", trace=tmp_path / "t")
    assert not torch_dtr.enabled()
    with pytest.raises(ValueError, match="exactly one of ratio"):
        simulate_trace(read_trace(_write_small(tmp_path)))


def _write_small(tmp_path) -> str:
    path = tmp_path / "small.trace"
    w = torch.randn(32, 32, requires_grad=True)
    with torch_dtr.enable(trace=path):
        (w @ w).tanh().sum().backward()
    return str(path)


SCRIPT = textwrap.dedent(
    """
    import sys
    import torch, torch.nn as nn
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    x = torch.randn(512, 32); y = torch.randint(0, 4, (512,))
    for step in range(4):
        loss = nn.functional.cross_entropy(model(x), y)
        opt.zero_grad(); loss.backward(); opt.step()
    print("SCRIPT-END", file=sys.stderr)
    """
)


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "torch_dtr.cli", *args], capture_output=True, text=True,
                          timeout=600, check=False)


def test_torch_dtr_record_traces_the_second_iteration_and_simulate_replays_it(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    out = tmp_path / "step2.trace"
    p = _cli("record", "--out", str(out), str(script))
    assert p.returncode == 0, p.stderr
    summary = json.loads(p.stdout)
    assert summary["complete"] and summary["steps"] == 2 and summary["ops"] > 10
    assert "SCRIPT-END" not in p.stderr  # stopped after the traced iteration
    p = _cli("simulate", str(out), "--format", "json", "--ratios", "1.0,0.8")
    assert p.returncode == 0, p.stderr
    full, low = json.loads(p.stdout)
    assert full["status"] == "ok" and full["overhead"] == 1.0 and full["peak_bytes"] == summary["peak_bytes"]
    assert low["status"] == "ok" and low["evictions"] > 0 and low["peak_bytes"] <= low["budget"]
    p = _cli("simulate", str(out), "--smallest", "--format", "json")
    assert p.returncode == 0, p.stderr
    (best,) = json.loads(p.stdout)
    assert 0 < best["budget"] < summary["peak_bytes"] and best["overhead"] <= 2.0
    p = _cli("record", "--out", str(out), "--costs", "model", str(script))
    assert p.returncode == 2 and "--costs is for --kind log" in p.stderr


def test_a_script_without_the_asked_iteration_says_so(tmp_path):
    from torch_dtr.tracer import trace_script

    script = tmp_path / "plain.py"
    script.write_text("import torch\nx = torch.ones(3, requires_grad=True)\n(x * 2).tanh().sum().backward()\n")
    with pytest.raises(RuntimeError, match="never began"):
        trace_script(str(script), [], tmp_path / "t.trace", iteration=2)
    s = trace_script(str(script), [], tmp_path / "t.trace", iteration=1)
    assert s["ops"] >= 3 and "whole script" in s["note"] and not torch_dtr.enabled()
    own = tmp_path / "own.py"
    own.write_text("import torch, torch_dtr\ntorch_dtr.enable(budget='1GiB')\nx = torch.ones(3, requires_grad=True)\n"
                   "(x * 2).sum().backward()\n")
    with pytest.warns(RuntimeWarning, match="enable\\(\\) while a session runs"), \
            pytest.raises(RuntimeError, match="enabled a torch-dtr session of its own"):
        trace_script(str(own), [], tmp_path / "t.trace", iteration=1)
    assert not torch_dtr.enabled()


@pytest.mark.parametrize("make", [gpt2, lstm_cells])
def test_the_smallest_budget_the_replay_finds_is_where_the_live_session_trains(tmp_path, make):
    # (lstm_cells: its backward sums each weight's gradients in place, which the traced session keeps in place and
    # a session under a budget keeps as versions with recipes: the trace must say that a version would have one)
    from torch_dtr.sim.trace import smallest_trace_budget

    path = tmp_path / "step.trace"
    step = fresh(make)
    with torch_dtr.enable(trace=path):
        step()
    trace = read_trace(path)
    tol = 4096
    budget, o = smallest_trace_budget(trace, max_overhead=None, tolerance=tol)
    assert o.status == "ok" and o.budget == budget < trace_peak(trace)
    assert _live(make, budget) == ("ok", o.evictions, o.rematerializations)
    assert _live(make, budget - tol) == ("oom",)
    with pytest.raises(ValueError, match="max_overhead must be >= 1"):
        smallest_trace_budget(trace, max_overhead=0.5)


@pytest.fixture(scope="module")
def small_trace_text(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("trace") / "small.trace"
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with torch_dtr.enable(trace=path):
        model(torch.randn(8, 16)).square().mean().backward()
        opt.step()
    return path.read_text()


def test_a_damaged_trace_gets_a_clear_error_never_a_crash(tmp_path, small_trace_text):
    """A truncated or edited trace: ``read_trace`` and the replay raise ``TraceError`` (the file and the line or
    row) or replay it; nothing else (hypothesis draws the damage)."""
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    from torch_dtr.core import BudgetError
    from torch_dtr.sim.trace import TraceError

    lines = small_trace_text.splitlines(keepends=True)
    values = st.one_of(st.integers(-3, 10**6), st.text(max_size=5), st.none(), st.lists(st.integers(0, 50), max_size=3),
                       st.floats(allow_nan=False, allow_infinity=False))

    @settings(max_examples=300, deadline=None, derandomize=True,  # (the same examples in every run)
              suppress_health_check=[HealthCheck.function_scoped_fixture])
    @given(cut=st.integers(0, len(small_trace_text)), line=st.integers(1, len(lines) - 1),
           field=st.integers(0, 11), value=values, drop=st.integers(1, len(lines) - 1), how=st.integers(0, 2))
    def damaged(cut, line, field, value, drop, how):
        text = list(lines)
        if how == 0:
            body = small_trace_text[:cut]
        elif how == 1:  # one field of one row replaced
            row = json.loads(text[line])
            row[min(field, len(row) - 1)] = value
            text[line] = json.dumps(row) + "\n"
            body = "".join(text)
        else:  # one row left out
            del text[drop]
            body = "".join(text)
        path = tmp_path / "damaged.trace"
        path.write_text(body)
        try:
            trace = read_trace(path)
            simulate_trace(trace, budget=10**9, thrash_at=None)
            simulate_trace(trace, budget=20_000, thrash_at=None)
        except (TraceError, BudgetError) as e:
            assert "torch_dtr" in str(e)

    damaged()
    with pytest.raises(TraceError, match=r"small.trace:\d+: not a JSON row"):
        (tmp_path / "small.trace").write_text(small_trace_text[:-5])
        read_trace(tmp_path / "small.trace")


def test_simulate_and_record_mistakes_get_one_line(tmp_path, small_trace_text):
    from torch_dtr.cli import main

    (tmp_path / "cut.trace").write_text(small_trace_text[: len(small_trace_text) // 2])
    for args, said in ((["simulate", str(tmp_path / "none.trace")], "No such file"),
                       (["simulate", str(tmp_path / "cut.trace")], "cut.trace:"),
                       (["record", "--out", str(tmp_path / "x.trace"), str(tmp_path / "none.py")], "No such file")):
        p = _cli(*args)
        assert p.returncode == 2 and said in p.stderr and "Traceback" not in p.stderr, p.stderr
    with pytest.raises(SystemExit) as e:
        main(["simulate", str(tmp_path / "cut.trace"), "--policy", "nope"])
    assert e.value.code == 2
