"""A budget in one retry (issue 51; NOTE [ Learned budgets ] in src/torch_dtr/native/session.py): each program trains
its first steps without a budget, ``stats().learned_budget`` is read, and a fresh session trains the same program
at that budget (the first retry), its parameters compared with plain PyTorch's bitwise. Then the route without
a step that finished: a budget of a tenth of the peak, and each BudgetError's ``budget`` tried next, counted until
the steps train. Then the test suite's hostile programs and model zoo, once without a budget and once at what that
session learned (``held_out``). Writes docs/learned-budgets.md.

    python benchmarks/learned_budget.py            # about 8 minutes on 2 cores (the [test] extra: tests/eager)
    python benchmarks/learned_budget.py --quick    # small sizes
    python benchmarks/learned_budget.py --margin 0 # learned budgets without sim/trace.py's MARGIN (printed only)
"""

from __future__ import annotations

import argparse
import datetime
import platform
import sys
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import torch
import torch.nn as nn

import torch_dtr
from torch_dtr.bench.workloads import SIZES, build
from torch_dtr.core.errors import fmt_bytes
from torch_dtr.sim import trace

ROOT = Path(__file__).resolve().parent.parent
STEPS = 4  # steps each session trains: the learned budget is read after the first two (LEARN_STEPS)
Program = Callable[[], tuple[Callable[[int], None], list[torch.Tensor]]]  # -> (step(i), parameters)


def _bench(name: str, quick: bool) -> Program:
    def make() -> tuple[Callable[[int], None], list[torch.Tensor]]:
        model, batches, step = build(name, SIZES[name]["quick" if quick else "full"], STEPS, seed=0)
        return (lambda i: step(model, batches[i])), list(model.parameters())
    return make


def _hf(kind: str) -> Program:
    def make() -> tuple[Callable[[int], None], list[torch.Tensor]]:
        import transformers

        torch.manual_seed(0)
        g = torch.Generator().manual_seed(1)
        if kind == "mixtral":
            cfg = transformers.MixtralConfig(hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                                             num_attention_heads=4, num_key_value_heads=2, num_local_experts=4,
                                             num_experts_per_tok=2, vocab_size=512, max_position_embeddings=128)
            model = transformers.MixtralForCausalLM(cfg)
            batches = [{"input_ids": (ids := torch.randint(0, 512, (4, 64), generator=g)), "labels": ids}
                       for _ in range(STEPS)]
        else:
            cfg = transformers.BartConfig(d_model=128, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
                                          decoder_attention_heads=4, encoder_ffn_dim=256, decoder_ffn_dim=256,
                                          vocab_size=512, max_position_embeddings=128)
            model = transformers.BartForConditionalGeneration(cfg)
            batches = [{"input_ids": torch.randint(3, 512, (4, 64), generator=g),
                        "labels": torch.randint(3, 512, (4, 32), generator=g)} for _ in range(STEPS)]
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)

        def step(i: int) -> None:
            torch.manual_seed(10 + i)  # dropout draws the same masks in every session
            model(**batches[i]).loss.backward()
            opt.step()
            opt.zero_grad()
        return step, list(model.parameters())
    return make


def _mlp(width: int) -> Program:
    def make() -> tuple[Callable[[int], None], list[torch.Tensor]]:
        torch.manual_seed(0)
        model = nn.Sequential(*[nn.Sequential(nn.Linear(width, width), nn.GELU()) for _ in range(8)],
                              nn.Linear(width, 10))
        opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
        x, y = torch.randn(256, width), torch.randint(0, 10, (256,))

        def step(_i: int) -> None:
            nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
            opt.zero_grad()
        return step, list(model.parameters())
    return make


def programs(quick: bool) -> dict[str, Program]:
    return {"bench gpt2": _bench("gpt2", quick), "bench resnet50": _bench("resnet50", quick),
            "bench lstm (4 lengths)": _bench("lstm", quick), "mixtral (top-2 of 4 experts)": _hf("mixtral"),
            "bart (seq2seq)": _hf("bart"), "mlp 8x512": _mlp(128 if quick else 512)}


def _train(make: Program, budget: int | None, steps: int = STEPS) -> tuple[list[torch.Tensor], Any, int]:
    """Train ``steps`` steps (each session from the same state); (parameters, stats, steps done before an error)."""
    step, params = make()
    done = 0
    st = None
    try:
        with torch_dtr.enable(budget=budget):
            for i in range(steps):
                step(i)
                done += 1
            st = torch_dtr.stats()
    except torch_dtr.BudgetError as e:
        return [], e, done
    return [p.detach().clone() for p in params], st, done


def measure(name: str, make: Program) -> dict[str, Any]:
    step, params = make()
    for i in range(STEPS):
        step(i)
    plain = [p.detach().clone() for p in params]
    t = time.perf_counter()
    _, learned, _ = _train(make, None, 2)
    learn_s = time.perf_counter() - t
    row: dict[str, Any] = {"name": name, "peak": learned.peak_bytes, "floor": learned.floor_bytes,
                           "smallest": learned.learned_budget, "learn_s": learn_s}
    got, st, done = _train(make, learned.learned_budget)
    row["retry"] = {"done": done, "ok": not isinstance(st, Exception),
                    "bitwise": bool(got) and all(torch.equal(a, b) for a, b in zip(got, plain, strict=True)),
                    "peak": getattr(st, "peak_bytes", None), "evictions": getattr(st, "evictions", None),
                    "remats": getattr(st, "rematerializations", None)}
    budget, tries = max(1, learned.peak_bytes // 10), 0
    while tries < 30:
        tries += 1
        _, st, done = _train(make, budget)
        if not isinstance(st, Exception):
            break
        budget = st.budget
    row["failing"] = {"tries": tries, "budget": budget, "ok": not isinstance(st, Exception)}
    print(f"{name}: peak {fmt_bytes(row['peak'])}, learned {fmt_bytes(row['smallest'] or 0)}, retry {row['retry']}, "
          f"from 10%: {row['failing']}", flush=True)
    return row


def held_out() -> list[dict[str, Any]]:
    """The test suite's hostile programs and model zoo (tests/eager: whole programs, some without an optimizer, and
    21 architectures for 3 SGD steps): each runs once without a budget, in a session of its own, and again at the
    ``learned_budget`` that session's stats give once it ended, compared with plain PyTorch bitwise."""
    sys.path[:0] = [str(ROOT / "tests" / "eager"), str(ROOT / "tests")]
    import harness
    import test_programs
    import zoo

    def under(run: Callable[[], Any], budget: int | None) -> tuple[Any, Any]:
        with torch_dtr.enable(budget=budget):
            got = run()
        return got, torch_dtr.stats()  # (the session that ended)

    cases: list[tuple[str, Callable[[], Any], Callable[[Any, Any], bool]]] = []
    def equal(a: list[torch.Tensor], b: list[torch.Tensor]) -> bool:
        return all(torch.equal(x, y) for x, y in zip(a, b, strict=True))

    for name, prog in test_programs.PROGRAMS.items():
        cases.append((name, partial(prog, test_programs.Marks(False)), equal))
    for name, builder in zoo.ZOO.items():
        cases.append((f"zoo: {name}", partial(harness._train, builder, "sgd", 3), _same_run))
    rows = []
    for name, run, same in cases:
        want = run()
        _, st = under(run, None)
        row: dict[str, Any] = {"name": name, "peak": st.peak_bytes, "floor": st.floor_bytes,
                               "steps": st.traced_steps, "learned": st.learned_budget}
        if st.learned_budget is not None:
            try:
                got, at = under(run, st.learned_budget)
                row |= {"ok": True, "bitwise": same(got, want), "within": at.peak_bytes <= st.learned_budget,
                        "evictions": at.evictions}
            except torch_dtr.BudgetError as e:
                row |= {"ok": False, "suggests": e.budget}
        print(f"{name}: {row}", flush=True)
        rows.append(row)
    return rows


def _same_run(a: Any, b: Any) -> bool:
    import harness

    try:
        harness.assert_same(b, a)
    except AssertionError:
        return False
    return True


def _held_out_lines(rows: list[dict[str, Any]]) -> list[str]:
    lines = ["", "## Held-out and hostile programs", "",
             "The test suite's hostile programs (tests/eager/test_programs.py: whole programs, several without an "
             "optimizer step, where the session learns from all it ran) and its model zoo (tests/eager/zoo.py, 3 SGD "
             "steps each): one run without a budget, then one at the `learned_budget` of that session, compared with "
             "plain PyTorch bitwise (losses, gradients, parameters).", "",
             "| program | steps traced | learned (of peak; of the single-op floor) | first retry at it | bitwise | "
             "peak within it |", "| --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        if r["learned"] is None:
            lines.append(f"| {r['name']} | {r['steps']} | nothing learned | - | - | - |")
            continue
        learned = f"{fmt_bytes(r['learned'])} ({r['learned'] / r['peak']:.0%}; {r['learned'] / r['floor']:.2f}x)"
        if r["ok"]:
            lines.append(f"| {r['name']} | {r['steps']} | {learned} | trained | {'yes' if r['bitwise'] else 'NO'} | "
                         f"{'yes' if r['within'] else 'NO'} |")
        else:
            lines.append(f"| {r['name']} | {r['steps']} | {learned} | BudgetError (it quotes "
                         f"{fmt_bytes(r['suggests'] or 0)}) | - | - |")
    ok = sum(bool(r.get("ok") and r["bitwise"] and r["within"]) for r in rows)
    lines += ["", f"{ok} of {len(rows)} trained at the first retry, bitwise, within the budget."]
    return lines


def write(rows: list[dict[str, Any]], quick: bool, seconds: float, others: list[dict[str, Any]]) -> Path:
    lines = ["# A budget in one retry (issue 51)", "",
             f"{datetime.date.today()}, {platform.machine()} CPU ({torch.get_num_threads()} threads), Python "
             f"{platform.python_version()}, torch {torch.__version__}, compiled front end; `python "
             f"benchmarks/learned_budget.py{' --quick' if quick else ''}` ({seconds / 60:.1f} min).", "",
             f"Each program trains its first 2 steps without a budget; `torch_dtr.stats().learned_budget` then gives "
             f"the smallest budget at which the replay of those steps trains within 2x one pass, plus "
             f"{trace.MARGIN:.0%} for the steps after them (NOTE [ Traces ] 5; `--margin 0` prints what the first "
             f"retry does without it). A fresh session trains {STEPS} steps at that budget (steps 3-{STEPS} are not in "
             f"the trace: the bench's LSTM loop draws another sequence length for each), its parameters compared with "
             f"plain PyTorch's after the same steps. Then, without a finished step: a budget of a tenth of the peak, "
             f"and each BudgetError's `budget` tried next until {STEPS} steps train.", "",
             "| program | no-budget peak | single-op floor | learned (of peak) | first retry at it | its peak, "
             "evictions, recomputations | bitwise | from 10% by BudgetError.budget: tries, budget |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        rt, fl = r["retry"], r["failing"]
        s = r["smallest"] or 0
        retry = f"trained {rt['done']} steps" if rt["ok"] else f"BudgetError at step {rt['done'] + 1}"
        lines.append(f"| {r['name']} | {fmt_bytes(r['peak'])} | {fmt_bytes(r['floor'])} | {fmt_bytes(s)} "
                     f"({s / r['peak']:.0%}) | {retry} | "
                     + (f"{fmt_bytes(rt['peak'])}, {rt['evictions']}, {rt['remats']}" if rt["ok"] else "-")
                     + f" | {'yes' if rt['bitwise'] else 'no' if rt['ok'] else '-'} | {fl['tries']}, "
                     f"{fmt_bytes(fl['budget'])}{'' if fl['ok'] else ' (still failing)'} |")
    tries = [r["failing"]["tries"] for r in rows]
    ok = sum(r["retry"]["ok"] and r["retry"]["bitwise"] for r in rows)
    lines += ["", f"What it shows: after two steps without a budget, one retry at the learned budget trained {ok} of "
              f"{len(rows)} programs here, bitwise, within the budget. Without a finished step, a BudgetError can only "
              f"quote what the step so far needs (the replay of its trace up to the op that failed): {min(tries)}-"
              f"{max(tries)} tries from a tenth of the peak, because a failing step reads new weights and makes new "
              f"activations after the op that failed, which no trace of it contains."]
    if others:
        lines += _held_out_lines(others)
    out = ROOT / "docs" / "learned-budgets.md"
    out.write_text("\n".join(lines) + "\n")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--no-held-out", action="store_true", help="leave out the test suite's programs (4 minutes)")
    ap.add_argument("--margin", type=float, default=None,
                    help=f"a learned budget's margin instead of {trace.MARGIN} (the table is printed, docs/ untouched)")
    args = ap.parse_args()
    if args.margin is not None:
        trace.MARGIN = args.margin
    t = time.perf_counter()
    rows = [measure(name, make) for name, make in programs(args.quick).items()]
    others = [] if args.no_held_out else held_out()
    if args.margin is None:
        print(f"wrote {write(rows, args.quick, time.perf_counter() - t, others)}")
    else:
        ok = sum(r["retry"]["ok"] and r["retry"]["bitwise"] for r in rows)
        ok += sum(bool(r.get("ok") and r["bitwise"] and r["within"]) for r in others)
        print(f"margin {args.margin}: the first retry trained {ok} of {len(rows) + len(others)} programs")


if __name__ == "__main__":
    main()
