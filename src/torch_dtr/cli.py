"""The ``torch-dtr`` command."""

from __future__ import annotations

import argparse
import sys

from .deps import MissingDependency


def _ratios(text: str) -> tuple[float, ...]:
    try:
        vals = tuple(float(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"cannot read ratios {text!r}; e.g. --ratios 0.5,0.3") from None
    if not vals or any(not 0 < v <= 1 for v in vals):
        raise argparse.ArgumentTypeError(f"ratios must be in (0, 1], got {text!r}; e.g. --ratios 0.5,0.3")
    return vals


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    from . import __version__

    try:
        torch = version("torch")
    except PackageNotFoundError:  # pragma: no cover - torch is a dependency
        torch = "not installed"
    return f"torch-dtr {__version__} (torch {torch})"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="torch-dtr", description="Dynamic Tensor Rematerialization for PyTorch: train "
                                "and run models under a memory budget")
    p.add_argument("--version", action="version", version=_version())
    sub = p.add_subparsers(dest="cmd", metavar="COMMAND")
    u = sub.add_parser("run", help="run a Python script under a budget, unchanged, and print what torch-dtr did",
                       usage="torch-dtr run [--budget B] [--swap] [--policy P] SCRIPT [ARGS ...]")
    u.add_argument("script", help="the Python script to run")
    u.add_argument("args", nargs=argparse.REMAINDER,
                   help="arguments for the script (options for torch-dtr go before SCRIPT)")
    u.add_argument("--budget", default=None, help="bytes or e.g. 8GiB (default: none; on CUDA torch-dtr then evicts "
                                                  "only when the device runs out of memory)")
    u.add_argument("--swap", action="store_true", help="a host-memory tier for evicted values")
    u.add_argument("--policy", default=None, help="the eviction policy (default: dtr_comp)")
    u.add_argument("--device", choices=("cpu",), default=None,
                   help="cpu: the budget bounds all the process's CPU tensor memory, optimizer state included "
                        "(default: on the CPU, what torch-dtr tracks; on CUDA, the device's allocator)")
    d = sub.add_parser("demo", help="train GPT-2 under budgets and compare memory and time with plain PyTorch")
    d.add_argument("--ratios", type=_ratios, default=(0.5, 0.3),
                   help="budgets as fractions of the unconstrained peak (default 0.5,0.3)")
    d.add_argument("--steps", type=int, default=4, help="measured steps per contender, over all rounds (default 4)")
    d.add_argument("--rounds", type=int, default=2, help="rounds in which the contenders take turns (default 2)")
    d.add_argument("--device", choices=("cpu", "cuda", "sim"), default="cpu",
                   help="cpu (default), cuda (budgets bound torch.cuda.max_memory_allocated), or sim (the CPU with "
                        "a simulated caching allocator)")
    b = sub.add_parser("bench", help="benchmark against plain PyTorch, checkpointing and torch.compile; writes "
                                     "benchmarks.md and plots")
    b.add_argument("--model", action="append", choices=("gpt2", "resnet50", "lstm", "gpt2-small"),
                   help="workload (repeatable; default: gpt2, resnet50, lstm, and gpt2-small on cuda)")
    b.add_argument("--device", choices=("cpu", "cuda", "sim"), default="cpu",
                   help="cpu (default: docs/benchmarks.md), cuda (docs/benchmarks-cuda.md), or sim (the cuda plan "
                        "on the CPU through a simulated caching allocator: docs/benchmarks-sim.md)")
    b.add_argument("--cap", default=None, help="cuda/sim: the memory cap for the largest-batch runs, e.g. 16GiB "
                                               "(default: plain PyTorch's max_memory_reserved at the base batch)")
    b.add_argument("--quick", action="store_true", help="tiny sizes, one round: a few minutes on 2 cores")
    b.add_argument("--out", default="torch-dtr-bench",
                   help="directory for benchmarks.md, benchmarks.json and img/ (default ./torch-dtr-bench; the "
                        "project's own records: --out docs from a checkout)")
    b.add_argument("--rounds", type=int, default=None, help="interleaved rounds per contender (default 3, quick 1)")
    s = sub.add_parser("simulate", help="replay a trace (torch-dtr record) or an operator log under budgets "
                                        "through the runtime's core and policies")
    s.add_argument("log", help="a trace written by torch-dtr record, or an operator log (the DTR prototype's format)")
    s.add_argument("--policy", action="append", help="policy name (repeatable; default: the default policy)")
    s.add_argument("--ratios", type=_ratios, default=None,
                   help="budgets as fractions of the no-eviction peak (default 0.1,0.2,...,1.0)")
    s.add_argument("--format", choices=("table", "json"), default="table")
    s.add_argument("--plot", default=None, help="write a PNG of overhead vs budget ratio here")
    s.add_argument("--baselines", action="store_true",
                   help="an operator log: also replay sqrt(n) checkpointing, and solve the exact optimum (Checkmate's "
                        "ILP with HiGHS) at each ratio where the log has at most 130 nodes (seconds each)")
    s.add_argument("--ilp-seconds", type=float, default=10.0,
                   help="with --baselines: the time limit of each exact solve (default 10; at the limit the best "
                        "schedule found is shown with its gap)")
    s.add_argument("--swap-gbps", type=float, default=None,
                   help="add a host tier with this copy bandwidth in GB/s (e.g. 12 for PCIe 3.0 x16): evicted values "
                        "are copied there when that is cheaper than recomputing them")
    s.add_argument("--host-budget", default=None, help="bytes the host tier may hold (default: unlimited), e.g. 8GiB")
    s.add_argument("--devices", type=int, default=None,
                   help="an operator log with shapes (torch-dtr record --kind log): partition it across this many "
                        "devices instead, and compare data parallel, fully sharded, tensor parallel, the planner's "
                        "and the exact (ILP) plan, each device replayed through the runtime at --ratios x data "
                        "parallel's per-device peak (default 0.5; seconds to minutes)")
    s.add_argument("--link-gbps", type=float, default=10.0,
                   help="with --devices: the bandwidth of the links between devices, GB/s (default 10)")
    s.add_argument("--iterations", type=int, default=1,
                   help="an operator log: replay it this many times as a training loop, each iteration following the "
                        "last one's plan (NOTE [ Iteration plans ]; a trace replays the steps it holds)")
    s.add_argument("--no-plans", action="store_true", help="decide every iteration afresh, without plans")
    s.add_argument("--smallest", action="store_true",
                   help="a trace: find the smallest budget at which the iteration trains (bisection over replays)")
    s.add_argument("--max-overhead", type=float, default=2.0,
                   help="with --smallest: a budget trains only if recomputation keeps the step within this multiple "
                        "of one pass (default 2.0; 0: any)")
    r = sub.add_parser("record", help="run a PyTorch script and trace one training iteration, for torch-dtr simulate",
                       usage="torch-dtr record --out TRACE [--iteration N] [--kind trace|log [--costs time|model]] "
                             "SCRIPT [ARGS ...]")
    r.add_argument("script", help="the Python script to run")
    r.add_argument("args", nargs=argparse.REMAINDER,
                   help="arguments for the script (options for torch-dtr go before SCRIPT)")
    r.add_argument("--out", "-o", required=True, help="file to write")
    r.add_argument("--iteration", type=int, default=2,
                   help="which iteration to record, counted in optimizer steps (default 2: after one warm-up)")
    r.add_argument("--kind", choices=("trace", "log"), default="trace",
                   help="trace (default): what the core is told while the compiled front end runs the iteration, which "
                        "replays to a live session's decisions at any budget; log: every aten op, in the DTR "
                        "prototype's operator-log format")
    r.add_argument("--costs", choices=("time", "model"), default=None,
                   help="--kind log only: each op's TIME measured (default) or modelled from FLOPs and bytes (a "
                        "trace has the modelled costs the live session uses)")
    args = p.parse_args(argv)
    if args.cmd is None:
        p.print_help()
        return 0
    if args.cmd == "simulate":
        from .core.policies import get_policy

        for name in args.policy or ():
            try:
                get_policy(name)
            except ValueError as e:
                p.error(f"--policy: {e}")
    try:
        return _run(p, args, argv)
    except BrokenPipeError:  # the output piped into `head`: stop quietly, as other commands do
        import os

        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141
    except MissingDependency as e:  # one line naming the extra to install, no traceback
        print(f"torch-dtr {args.cmd}: {e}", file=sys.stderr)
        return 2
    except (OSError, ValueError) as e:  # a missing file, a malformed log or trace: one line naming it
        from .sim.log import LogError
        from .sim.trace import TraceError

        if isinstance(e, (LogError, TraceError)) or (isinstance(e, OSError) and e.filename):
            print(f"torch-dtr {args.cmd}: {e}", file=sys.stderr)
            return 2
        raise


def _recorded(script: str, kind: str, done: dict) -> None:
    """What `torch-dtr record` did, in words, on stderr (its JSON summary goes to stdout)."""
    what = f"{done['ops']} {'managed ops' if kind == 'trace' else 'ops'}"  # (as `torch-dtr simulate` counts them)
    if done.get("complete"):
        how = (f"iteration {done['iteration']} of {script} ({what}); the script was stopped after its optimizer step "
               f"{done['iteration']}, so what it does later did not run")
    else:
        how = f"{script} ({what}): {done.get('note', 'the script ended first')}"
    print(f"torch-dtr record: wrote {done.get('out') or done.get('path')}: {how}. Replay it: torch-dtr simulate "
          f"{done.get('out') or done.get('path')}", file=sys.stderr)


def _run(p: argparse.ArgumentParser, args: argparse.Namespace, argv: list[str] | None) -> int:
    if args.cmd == "run":
        if args.policy is not None:
            from .core.policies import get_policy

            try:
                get_policy(args.policy)
            except (KeyError, ValueError) as e:
                p.error(f"--policy: {e}")
        from .runner import run_script

        return run_script(args.script, args.args, args.budget, swap=args.swap, policy=args.policy,
                          device=args.device)
    if args.cmd == "simulate":
        from .sim.command import main as simulate

        if args.swap_gbps is not None and not args.swap_gbps > 0:
            p.error(f"--swap-gbps must be > 0 (GB/s), got {args.swap_gbps}")
        from .core.errors import parse_budget

        host = None if args.host_budget is None else parse_budget(args.host_budget)
        if args.smallest:
            from .sim.command import smallest

            if args.max_overhead != 0 and not args.max_overhead >= 1:
                p.error(f"--max-overhead must be >= 1 (or 0: any), got {args.max_overhead}")
            return smallest(args.log, args.policy, args.max_overhead or None, args.format)
        if args.devices is not None:
            from .sim.command import partition

            if args.devices < 1 or not args.link_gbps > 0:
                p.error(f"--devices must be >= 1 and --link-gbps > 0, got {args.devices} and {args.link_gbps}")
            return partition(args.log, args.devices, args.link_gbps, args.ratios, args.format)
        if not args.ilp_seconds > 0:
            p.error(f"--ilp-seconds must be > 0, got {args.ilp_seconds}")
        if args.iterations < 1:
            p.error(f"--iterations must be >= 1, got {args.iterations}")
        return simulate(args.log, args.policy, args.ratios, args.format, args.plot, args.baselines,
                        args.swap_gbps, host, args.ilp_seconds, args.iterations, not args.no_plans)
    if args.cmd == "record":
        import json

        if args.iteration < 1:
            p.error(f"--iteration must be >= 1, got {args.iteration}")
        if args.kind == "trace":
            if args.costs is not None:
                p.error("--costs is for --kind log: a trace has the modelled costs the live session uses")
            from .tracer import trace_script

            done = trace_script(args.script, args.args, args.out, args.iteration)
        else:
            from .recorder import record_script

            done = record_script(args.script, args.args, args.out, args.iteration, args.costs or "time")
        print(json.dumps(done, indent=1))
        _recorded(args.script, args.kind, done)
        return 0
    if args.cmd == "bench":
        command = "torch-dtr " + " ".join(argv if argv is not None else sys.argv[1:])
        if args.device != "cpu":
            from .bench.gpu import main as bench_gpu
            from .deps import need_all
            from .eager.api import parse_budget

            need_all(("transformers", "tqdm"), "bench", "torch-dtr bench")
            default = ("gpt2", "resnet50", "lstm") + (("gpt2-small",) if args.device == "cuda" else ())
            try:
                cap = parse_budget(args.cap)
            except ValueError as e:
                p.error(f"--cap: {e}")
            return bench_gpu(tuple(args.model or default), args.device, args.quick, args.out, cap, command)
        if args.model and "gpt2-small" in args.model:
            p.error("--model gpt2-small is a GPU workload: use it with --device cuda (or sim)")
        from .bench.run import main as bench

        models = tuple(args.model or ("gpt2", "resnet50", "lstm"))
        return bench(models, args.quick, args.out, args.rounds, command)
    if args.cmd == "demo":
        if args.steps < 1 or args.rounds < 1:
            p.error(f"--steps and --rounds must be at least 1, got --steps {args.steps} --rounds {args.rounds}")
        if args.device != "cpu":
            from .demo import main_device

            return main_device(args.device, args.ratios, args.steps)
        from .demo import main as demo

        return demo(args.ratios, args.steps, args.rounds)
    return 2


if __name__ == "__main__":
    sys.exit(main())
