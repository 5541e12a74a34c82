"""What learning a budget costs (NOTE [ Learned budgets ] 4 in src/torch_dtr/native/session.py): the first two
steps of a session, traced, against the same two steps with ``learn=False``; best of 3 rounds, interleaved.

    python benchmarks/learn_cost.py        # a few seconds; nothing else may run meanwhile (the [test] extra)
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

import torch_dtr

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "sim"))
from steps import lstm_cells  # noqa: E402 (the tests' LSTM-cell loop: many small ops; needs the [test] extra)


def mlp() -> Callable[[], None]:
    model = torch.nn.Sequential(*[torch.nn.Sequential(torch.nn.Linear(128, 128), torch.nn.GELU()) for _ in range(6)])
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(256, 128)

    def step() -> None:
        model(x).square().mean().backward()
        opt.step()
        opt.zero_grad()
    return step


def main() -> None:
    for make in (lstm_cells, mlp):
        best: dict[bool, float] = {}
        for _ in range(3):
            for learn in (False, True):
                torch.manual_seed(0)
                step = make()
                step()  # plain warm-up
                with torch_dtr.enable(budget=None, learn=learn):
                    t = time.perf_counter()
                    step()
                    step()
                    dt = time.perf_counter() - t
                    ops = torch_dtr.stats().ops
                best[learn] = min(best.get(learn, dt), dt)
        off, on = best[False], best[True]
        print(f"{make.__name__}: two steps, {ops} managed ops: learn=False {off * 1e3:.1f} ms, learning "
              f"{on * 1e3:.1f} ms ({on / off:.2f}x, +{(on - off) / ops * 1e6:.1f} us per op)")


if __name__ == "__main__":
    main()
