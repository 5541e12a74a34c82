"""A log replayed as a training loop runs it (NOTE [ Replaying a log ] 9) and the plans that the repeated iterations
follow (NOTE [ Iteration plans ] in core/plan.py)."""

from __future__ import annotations

import pytest

from torch_dtr.sim import log, replay

C, R, M, Rel = log.Call, log.Result, log.Mutate, log.Release


def _training_log(layers: int = 16, act: int = 4096, weight: int = 1024) -> log.Log:
    """One SGD step of a ``layers``-deep chain: weights are constants, the backward reads every activation in
    reverse and makes a weight gradient per layer, which the step writes into its weight and releases."""
    ins: list = [log.Constant("x", act)] + [log.Constant(f"w{i}", weight) for i in range(layers)]
    prev = "x"
    for i in range(layers):
        ins.append(C("linear", (prev, f"w{i}"), (R(f"a{i}", act, -1),), 100 + 10 * (i % 3)))
        prev = f"a{i}"
    ins.append(C("loss", (prev,), (R("g", act, -1),), 50))
    for i in reversed(range(layers)):
        src = f"a{i - 1}" if i else "x"
        ins.append(C("grad_w", ("g", src), (R(f"dw{i}", weight, -1),), 120))
        ins.append(C("grad_x", ("g", f"w{i}"), (R("g2", act, -1),), 110))
        ins += [Rel("g"), log.Copy("g", "g2"), Rel("g2"), Rel(f"a{i}")]
    for i in range(layers):
        ins += [M("sgd_", (f"w{i}", f"dw{i}"), (0,), 5), Rel(f"dw{i}")]
    ins.append(Rel("g"))
    return log.Log(tuple(ins), 0, None, "training chain")


def test_a_log_replayed_as_a_loop_keeps_its_constants_and_peak() -> None:
    lg = _training_log()
    once = replay.simulate(lg, budget=10**9)
    three = replay.simulate(lg, budget=10**9, iterations=3)
    assert once.status == three.status == "ok"
    assert three.peak_bytes == once.peak_bytes  # the constants are made once, every iteration's values die
    assert three.ops == 3 * once.ops
    # the second iteration follows the first's plan, which is no cheaper here (nothing is evicted): the third runs
    # without it (rule 5 of the plans' note)
    assert (three.planned, three.diverged) == (1, 0)


@pytest.mark.parametrize("ratio", [0.6, 0.7, 0.9])
def test_planned_iterations_cost_no_more_than_the_dynamic_policy(ratio: float) -> None:
    lg = _training_log()
    peak = replay.no_eviction_peak(lg)
    planned = replay.simulate(lg, ratio=ratio, peak=peak, iterations=6, thrash_at=None)
    dynamic = replay.simulate(lg, ratio=ratio, peak=peak, iterations=6, thrash_at=None, plans=False)
    assert planned.status == dynamic.status == "ok"
    assert planned.diverged == 0 and planned.planned >= 1
    assert dynamic.planned == 0
    assert planned.peak_bytes <= planned.budget
    # six iterations: the first without a plan (what the dynamic policy costs), the second with it, then the cheaper
    # (here the plan: 1.212 against 1.290 at 0.6, 1.118 against 1.131 at 0.7 over the six)
    assert planned.overhead <= dynamic.overhead
    assert len(planned.per_iteration) == len(dynamic.per_iteration) == 6
    assert planned.per_iteration[0] == dynamic.per_iteration[0]  # the first iteration has no plan
    assert planned.per_iteration[-1] <= dynamic.per_iteration[-1]
    if ratio < 0.9:
        assert planned.overhead < dynamic.overhead and planned.planned == 5


def test_iterations_must_be_positive() -> None:
    with pytest.raises(ValueError, match="iterations must be >= 1"):
        replay.simulate(_training_log(), budget=10**9, iterations=0)


def test_cli_replays_a_log_as_a_loop_with_and_without_plans(tmp_path):
    import json
    import subprocess
    import sys

    from chainlog import write_chain_log

    path = write_chain_log(tmp_path / "chain.log", 40)

    def run(*extra: str):
        p = subprocess.run([sys.executable, "-m", "torch_dtr.cli", "simulate", str(path), "--format", "json",
                            "--ratios", "0.5", "--iterations", "4", *extra],
                           capture_output=True, text=True, timeout=120, check=False)
        assert p.returncode == 0, p.stderr
        (row,) = json.loads(p.stdout)
        return row

    planned, fresh = run(), run("--no-plans")
    assert len(planned["per_iteration"]) == len(fresh["per_iteration"]) == 4
    assert planned["planned"] >= 1 and fresh["planned"] == 0
    assert planned["ops"] == fresh["ops"]
    p = subprocess.run([sys.executable, "-m", "torch_dtr.cli", "simulate", str(path), "--iterations", "0"],
                       capture_output=True, text=True, timeout=120, check=False)
    assert p.returncode == 2 and "--iterations must be >= 1, got 0" in p.stderr


def _mlp5_log(path) -> log.Log:
    """The forward and backward of a 5-layer tanh MLP (benchmarks/simulation.py's ``mlp5``), recorded live."""
    import torch

    from torch_dtr.recorder import record

    torch.manual_seed(0)
    mlp = torch.nn.Sequential(*[m for _ in range(5) for m in (torch.nn.Linear(64, 64), torch.nn.Tanh())],
                              torch.nn.Linear(64, 10))
    x, y = torch.randn(2048, 64), torch.randint(0, 10, (2048,))
    with record(path, costs="model"):
        torch.nn.functional.cross_entropy(mlp(x), y).backward()
    return log.read(path)


def test_a_planned_iteration_recomputes_ahead_of_need_what_the_exact_optimum_recomputes(tmp_path) -> None:
    # NOTE [ Iteration plans ] 7: at 0.7 of its peak, recomputing on demand evicts a gradient that the op reading an
    # activation also reads, and recomputes it later; the plan brings the activation back one op earlier, where it
    # fits, as Checkmate's optimum does
    from torch_dtr.sim import checkmate

    lg = _mlp5_log(tmp_path / "mlp5.log")
    peak = replay.no_eviction_peak(lg)
    budget = int(0.7 * peak)
    opt = checkmate.solve(checkmate.graph_from_log(lg), budget, time_limit=60.0)
    assert opt.status == "optimal"
    best = 1 + (opt.compute - opt.base) / lg.op_time_ns()  # the optimum's recomputations over the log's op time
    planned = replay.simulate(lg, budget=budget, iterations=4, thrash_at=None)
    dynamic = replay.simulate(lg, budget=budget, iterations=4, thrash_at=None, plans=False)
    assert planned.status == dynamic.status == "ok" and planned.peak_bytes <= budget
    assert planned.ahead > 0 and dynamic.ahead == 0
    assert planned.per_iteration[-1] == pytest.approx(best, rel=1e-9)
    assert dynamic.per_iteration[-1] > best * 1.05  # on demand: 1.265 against 1.171
