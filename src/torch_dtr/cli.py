"""The ``torch-dtr`` command."""

from __future__ import annotations

import argparse
import sys


def _ratios(text: str) -> tuple[float, ...]:
    try:
        vals = tuple(float(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"cannot read ratios {text!r}; e.g. --ratios 0.5,0.3") from None
    if not vals or any(not 0 < v <= 1 for v in vals):
        raise argparse.ArgumentTypeError(f"ratios must be in (0, 1], got {text!r}; e.g. --ratios 0.5,0.3")
    return vals


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="torch-dtr", description="Dynamic Tensor Rematerialization for PyTorch")
    sub = p.add_subparsers(dest="cmd", required=True)
    d = sub.add_parser("demo", help="train GPT-2 under budgets and compare memory and time with plain PyTorch")
    d.add_argument("--ratios", type=_ratios, default=(0.5, 0.3),
                   help="budgets as fractions of the unconstrained peak (default 0.5,0.3)")
    d.add_argument("--steps", type=int, default=4, help="measured steps per contender (default 4)")
    b = sub.add_parser("bench", help="benchmark against plain PyTorch, checkpointing and torch.compile; writes "
                                     "benchmarks.md and plots")
    b.add_argument("--model", action="append", choices=("gpt2", "resnet50", "lstm"),
                   help="workload (repeatable; default: all)")
    b.add_argument("--quick", action="store_true", help="tiny sizes, one round: a few minutes on 2 cores")
    b.add_argument("--out", default="docs", help="directory for benchmarks.md, benchmarks.json and img/ (default docs)")
    b.add_argument("--rounds", type=int, default=None, help="interleaved rounds per contender (default 2, quick 1)")
    args = p.parse_args(argv)
    if args.cmd == "bench":
        from .bench.run import main as bench

        models = tuple(args.model or ("gpt2", "resnet50", "lstm"))
        command = "torch-dtr " + " ".join(argv if argv is not None else sys.argv[1:])
        return bench(models, args.quick, args.out, args.rounds, command)
    if args.cmd == "demo":
        from .demo import main as demo

        return demo(args.ratios, args.steps)
    return 2


if __name__ == "__main__":
    sys.exit(main())
