"""A test helper: a linear chain (``torch_dtr.sim.chains``) written as an operator log file, for the CLI tests."""

from __future__ import annotations

from pathlib import Path

from torch_dtr.sim import chains, log


def write_chain_log(path: Path, n: int) -> Path:
    with path.open("w") as f:
        w = log.Writer(f)
        w.annotate("START")
        for ins in chains.linear_chain(n).instrs:
            if type(ins) is log.Constant:
                w.constant(ins.name, ins.nbytes)
            elif type(ins) is log.Call:
                w.call(ins.name, ins.args, ins.results, ins.time_ns)
            else:
                w.release(ins.name)
    return path
