"""Small training programs whose steps the trace and learned-budget tests run: each ``make()`` returns a step
(forward, backward, an optimizer's step); ``fresh`` gives the same weights, inputs and random state every time."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

Step = Callable[[], None]


def mlp() -> Step:
    model = torch.nn.Sequential(*[torch.nn.Sequential(torch.nn.Linear(128, 128), torch.nn.GELU()) for _ in range(6)],
                                torch.nn.Linear(128, 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    x, y = torch.randn(256, 128), torch.randint(0, 10, (256,))

    def step() -> None:
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
        opt.zero_grad()
    return step


def cnn() -> Step:  # batch norm's running statistics are written by the managed forward
    layers: list[torch.nn.Module] = []
    for c_in, c_out in ((3, 16), (16, 16), (16, 32)):
        layers += [torch.nn.Conv2d(c_in, c_out, 3, padding=1), torch.nn.BatchNorm2d(c_out), torch.nn.ReLU()]
    model = torch.nn.Sequential(*layers, torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(32, 10))
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    x, y = torch.randn(8, 3, 24, 24), torch.randint(0, 10, (8,))

    def step() -> None:
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
        opt.zero_grad()
    return step


def lstm_cells() -> Step:  # many small ops, a loop over time
    cell, head = torch.nn.LSTMCell(64, 64), torch.nn.Linear(64, 64)
    opt = torch.optim.SGD([*cell.parameters(), *head.parameters()], lr=0.01)
    xs = torch.randn(24, 16, 64)

    def step() -> None:
        h = c = torch.zeros(16, 64)
        loss = torch.zeros(())
        for x in xs:
            h, c = cell(x, (h, c))
            loss = loss + head(h).square().mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
    return step


def moe() -> Step:  # routing: which rows reach which expert depends on the data
    gate = torch.nn.Linear(64, 4)
    experts = torch.nn.ModuleList(torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.GELU(),
                                                      torch.nn.Linear(128, 64)) for _ in range(4))
    opt = torch.optim.SGD([*gate.parameters(), *experts.parameters()], lr=0.01)
    x = torch.randn(256, 64)

    def step() -> None:
        h = x
        for _ in range(2):
            weights, chosen = gate(h).softmax(-1).topk(2, dim=-1)
            out = torch.zeros_like(h)
            for e, expert in enumerate(experts):
                rows, slot = (chosen == e).nonzero(as_tuple=True)
                out = out.index_add(0, rows, expert(h[rows]) * weights[rows, slot, None])
            h = h + out
        h.square().mean().backward()
        opt.step()
        opt.zero_grad()
    return step


def gpt2() -> Step:
    transformers = pytest.importorskip("transformers")
    cfg = transformers.GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=256, n_positions=64)
    model = transformers.GPT2LMHeadModel(cfg)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    ids = torch.randint(0, 256, (4, 64))

    def step() -> None:
        model(ids, labels=ids).loss.backward()
        opt.step()
        opt.zero_grad()
    return step


def fresh(make: Callable[[], Step]) -> Step:
    """The program with the same weights, inputs and random state every time, after one plain warm-up step."""
    torch.manual_seed(0)
    step = make()
    step()
    return step


PROGRAMS = [mlp, cnn, lstm_cells, moe, gpt2]
