"""Synthetic logs: the unit-cost linear chain of the DTR paper's theorem (forward and backward).

A chain of ``n`` forward ops ``x_i = f(x_{i-1})`` from a constant ``x_0``, then the backward pass
``g_n = f'(x_n)``, ``g_i = f'(g_{i+1}, x_i)``, each forward value released after its backward use and each
gradient after the next. Every op costs 1 and every tensor takes ``size`` bytes. The DTR paper proves
that with a budget of O(sqrt(n)) tensors, h_DTR-style eviction recomputes only O(n) ops in all.
"""

from __future__ import annotations

from .log import Call, Constant, Log, Release, Result


def linear_chain(n: int, size: int = 1, time_ns: int = 1) -> Log:
    if n < 1:
        raise ValueError(f"torch_dtr: a chain needs n >= 1 ops, got {n}")
    ins: list = [Constant("x0", size)]
    for i in range(1, n + 1):
        ins.append(Call("f", (f"x{i - 1}",), (Result(f"x{i}", size, -1),), time_ns))
    backward = len(ins)
    ins.append(Call("df", (f"x{n}",), (Result(f"g{n}", size, -1),), time_ns))
    ins.append(Release(f"x{n}"))
    for i in range(n - 1, 0, -1):
        ins.append(Call("df", (f"g{i + 1}", f"x{i}"), (Result(f"g{i}", size, -1),), time_ns))
        ins.append(Release(f"g{i + 1}"))
        ins.append(Release(f"x{i}"))
    return Log(tuple(ins), 0, backward, f"linear-chain-{n}")
