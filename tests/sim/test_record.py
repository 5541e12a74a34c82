"""torch_dtr.record (recorder.py): logs of real training steps that read back and replay without use after release."""

from __future__ import annotations

import copy
import json
import textwrap
import threading
import time

import pytest
import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

import torch_dtr
from torch_dtr.recorder import record, record_script
from torch_dtr.sim import log


def lines(path) -> list[dict]:
    return [json.loads(x) for x in open(path, encoding="utf-8") if x.strip()]


def replay(path) -> dict:
    """Walk a log as the simulator does; assert every name is defined before use and unreleased at it."""
    log.read(path)  # validates the format
    refs: dict[str, int] = {}  # live name -> references
    ever: set[str] = set()
    out = {"ops": 0, "views": 0, "mutates": [], "backward": None, "calls_before_bw": 0}
    for no, d in enumerate(lines(path)):
        kind = d["INSTRUCTION"]
        if kind == "ANNOTATE":
            if d["ANNOTATION"] == "START":
                assert no == 0, "START must head the log"
            elif out["backward"] is None:
                out["backward"] = out["ops"]
            continue
        if kind in ("CALL", "MUTATE"):
            for a in d["ARGS"]:
                assert refs.get(a, 0) > 0, f"line {no + 1}: {a} used by {d['NAME']} but " + (
                    "released before" if a in ever else "never defined")
            out["ops"] += 1
        if kind == "CALL":
            for r in d["RESULT"]:
                assert r not in ever, f"line {no + 1}: {r} defined twice"
                refs[r] = 1
                ever.add(r)
            if out["backward"] is None:
                out["calls_before_bw"] += 1
        elif kind == "ALIAS":
            out["views"] += int(d["ALIAS"]) >= 0
        elif kind == "MUTATE":
            out["mutates"].append({**d, "at": out["ops"] - 1})
        elif kind == "CONSTANT":
            assert d["NAME"] not in ever
            refs[d["NAME"]] = 1
            ever.add(d["NAME"])
        elif kind == "COPY":
            assert refs.get(d["SRC"], 0) > 0, f"line {no + 1}: COPY from dead {d['SRC']}"
            assert d["DST"] not in ever
            refs[d["DST"]] = 1
            ever.add(d["DST"])
        elif kind == "RELEASE":
            assert refs.get(d["NAME"], 0) > 0, f"line {no + 1}: release of a dead or unknown {d['NAME']}"
            refs[d["NAME"]] -= 1
            if not refs[d["NAME"]]:
                del refs[d["NAME"]]
    out["live"] = set(refs)
    return out


class Count(TorchDispatchMode):
    """Counts the ops the recorder must log: new tensor outputs -> a CALL, a write -> a MUTATE."""

    def __init__(self) -> None:
        super().__init__()
        self.n = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        ins = {id(t) for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)}
        out = func(*args, **kwargs)
        new = any(isinstance(o, torch.Tensor) and id(o) not in ins for o in tree_leaves(out))
        writes = any(a.alias_info is not None and a.alias_info.is_write for a in func._schema.arguments)
        writes = writes or (func is torch.ops.aten.native_batch_norm.default and args[5])
        self.n += int(new) + int(bool(writes))
        return out


def mlp() -> nn.Module:
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))


def cnn() -> nn.Module:
    return nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU(), nn.Dropout(0.5), nn.Flatten(),
                         nn.Linear(4 * 6 * 6, 2))


def step(model: nn.Module, x: torch.Tensor, rec=None) -> dict:
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    opt.zero_grad()
    loss = model(x).square().mean()
    loss.backward()
    opt.step()
    if rec is None:
        return {}
    return {"loss": rec.name(loss), "grads": [rec.name(p.grad) for p in model.parameters()], "keep": loss}


@pytest.mark.parametrize("make,shape", [(mlp, (5, 8)), (cnn, (2, 3, 8, 8))], ids=["mlp", "cnn"])
def test_training_step(tmp_path, make, shape) -> None:
    torch.manual_seed(0)
    model, x = make(), torch.randn(shape)
    twin = copy.deepcopy(model)
    path = tmp_path / "step.log"
    with record(path) as rec:
        names = step(model, x, rec)
    counter = Count()
    with counter:
        step(twin, x)
    r = replay(path)
    L = log.read(path)
    assert r["ops"] == L.op_count() == counter.n > 20
    assert rec.summary()["calls"] + rec.summary()["mutates"] == r["ops"]
    assert r["views"] >= 1  # t() in linear, detach of saved outputs
    # BACKWARD after the forward, before the optimizer's in-place updates (the last MUTATEs, one per parameter)
    params = len(list(model.parameters()))
    sgd = r["mutates"][-params:]
    assert all(m["NAME"] == "add_.Tensor" and m["MUTATE"] == [0] for m in sgd)
    assert L.backward is not None and r["calls_before_bw"] > 3 and r["backward"] <= sgd[0]["at"]
    assert all(m["at"] < r["backward"] for m in r["mutates"][:-params])  # forward writes: BN, dropout
    # the iteration's outputs are never released
    assert names["loss"] in r["live"] and None not in names["grads"] and set(names["grads"]) <= r["live"]
    if make is cnn:  # batch norm's running stats (hidden writes) and dropout's bernoulli_
        bn = [m for m in r["mutates"] if m["NAME"] == "native_batch_norm.default"]
        assert len(bn) == 1 and bn[0]["MUTATE"] == [3, 4] and bn[0]["TIME"] == "0"
        assert any(m["NAME"].startswith("bernoulli_") for m in r["mutates"])


def _release_index(path, name: str) -> int | None:
    for i, d in enumerate(lines(path)):
        if d["INSTRUCTION"] == "RELEASE" and d["NAME"] == name:
            return i
    return None


def _first_use_after_backward(path, names: set[str]) -> int:
    seen_bw = False
    for i, d in enumerate(lines(path)):
        seen_bw = seen_bw or d.get("ANNOTATION") == "BACKWARD"
        if seen_bw and d["INSTRUCTION"] in ("CALL", "MUTATE") and names & set(d["ARGS"]):
            return i
    raise AssertionError(f"none of {names} is used in backward")


def test_saved_tensors_released_only_after_backward_uses_them(tmp_path) -> None:
    # Empirical: autograd keeps the Python object of a saved input alive (PyObject preservation), and saves an
    # output as an aten.detach view, so dropping the user's reference does not release it before backward.
    x = torch.randn(6, requires_grad=True)
    path = tmp_path / "saved.log"
    with record(path) as rec:
        y = x.exp()  # exp saves its output (as a detach of y)
        u = y.sin()  # sin saves its input y itself
        loss = u.sum()
        ny = rec.name(y)
        del y, u
        loss.backward()
    r = replay(path)
    rel = _release_index(path, ny)
    assert rel is not None and rel > _first_use_after_backward(path, {ny})  # cos(y) in sin's backward
    assert r["backward"] is not None
    # the exp output's detach alias (a different object) stays referenced until exp's backward read it
    detach = [d for d in lines(path) if d["INSTRUCTION"] == "CALL" and d["NAME"] == "detach.default"
              and d["ARGS"] == [ny]]
    assert detach
    saved = detach[0]["RESULT"][0]
    rel = _release_index(path, saved)
    assert rel is not None and rel > _first_use_after_backward(path, {saved})


def test_release_from_another_thread_is_queued(tmp_path) -> None:
    path = tmp_path / "thread.log"
    a = torch.ones(3)
    with record(path) as rec:
        b = a + 1
        nb = rec.name(b)
        box = [b]
        del b
        t = threading.Thread(target=box.clear)
        t.start()
        t.join()
        c = a * 2
    d = lines(path)
    rel, mul = _release_index(path, nb), next(i for i, x in enumerate(d) if x.get("NAME") == "mul.Tensor")
    assert rel is not None and rel < mul  # written in order, before the next op's lines
    assert rec.name(c) is None  # names are dropped at exit
    assert replay(path)["live"] >= {"x0"}  # the constant a is alive at exit: not released


def test_same_storage_is_a_copy_and_enable_conflicts(tmp_path) -> None:
    w = torch.randn(4, 4)
    v = w.t()  # made before recording: a second object on w's storage
    path = tmp_path / "copy.log"
    with record(path):
        (w + 1).sum()
        v.mul(2)  # COPY of w's name, not a second constant
    d = lines(path)
    assert sum(x["INSTRUCTION"] == "CONSTANT" for x in d) == 1
    assert [x for x in d if x["INSTRUCTION"] == "COPY"] == [{"DST": "x3", "INSTRUCTION": "COPY", "SRC": "x0"}]
    replay(path)
    torch_dtr.enable()
    try:
        with pytest.raises(RuntimeError, match="enabled"), record(tmp_path / "no.log"):
            pass
    finally:
        torch_dtr.disable()


SCRIPT = """
import sys
import torch
from torch import nn

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
steps = int(sys.argv[1])
for batch in (3, 5, 7)[:steps]:  # one batch size per iteration: x is 96, 160 or 224 bytes
    x = torch.randn(batch, 8)
    opt.zero_grad()
    loss = model(x).square().mean()
    loss.backward()
    opt.step()
open(sys.argv[2], "w").write("finished")
"""


def test_record_script_second_iteration(tmp_path) -> None:
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(SCRIPT))
    marker, out = tmp_path / "finished", tmp_path / "it2.log"
    s = record_script(str(script), ["3", str(marker)], str(out), iteration=2)
    assert s["complete"] and s["steps"] == 2 and not s["whole_script"] and "note" not in s
    assert not marker.exists()  # stopped after the second step
    d = lines(out)
    mems = {int(x["MEMORY"]) for x in d if x["INSTRUCTION"] == "MEMORY"}
    assert 160 in mems and not {96, 224} & mems  # the batch of iteration 2 only
    assert d[1]["INSTRUCTION"] == "CALL" and d[1]["NAME"] == "randn.default"  # the iteration's first op
    r = replay(out)
    assert [m["NAME"] for m in r["mutates"]] == ["add_.Tensor"] * 4  # exactly one SGD step
    assert r["ops"] == s["calls"] + s["mutates"] and s["peak_live_bytes"] > 0
    assert sum(x.get("ANNOTATION") == "START" for x in d) == 1

    s1 = record_script(str(script), ["3", str(marker)], str(tmp_path / "it1.log"), iteration=1)
    assert s1["complete"] and s1["steps"] == 1
    assert 96 in {int(x["MEMORY"]) for x in lines(tmp_path / "it1.log") if x["INSTRUCTION"] == "MEMORY"}


def test_record_script_without_optimizer_records_everything(tmp_path) -> None:
    script = tmp_path / "plain.py"
    script.write_text("import torch\nx = torch.ones(3)\ny = (x + 1).sum()\nprint(y.item())\n")
    s = record_script(str(script), [], str(tmp_path / "all.log"), iteration=2)
    assert s["whole_script"] and not s["complete"] and "whole script" in s["note"]
    assert s["calls"] == 3 and replay(tmp_path / "all.log")["ops"] == 3  # ones, add, sum


def test_gpt2_training_step(tmp_path) -> None:
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(n_layer=2, n_embd=64, n_head=2, vocab_size=100, n_positions=32)
    model = transformers.GPT2LMHeadModel(cfg)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    ids = torch.randint(0, 100, (2, 16))
    path = tmp_path / "gpt2.log"
    t0 = time.perf_counter()
    with record(path) as rec:
        opt.zero_grad()
        loss = model(ids, labels=ids).loss
        loss.backward()
        opt.step()
        nloss = rec.name(loss)
    assert time.perf_counter() - t0 < 30
    r = replay(path)
    L = log.read(path)
    assert L.backward is not None and L.op_count() == r["ops"] > 300
    assert nloss in r["live"] and r["views"] > 10 and len(r["mutates"]) > 10


def test_torch_dtr_record_stays_the_function() -> None:
    import torch_dtr

    assert callable(torch_dtr.record) and callable(torch_dtr.record)  # not shadowed by a submodule of that name
    assert torch_dtr.record is record


def test_modelled_costs_make_the_same_log_in_every_run(tmp_path):
    texts = []
    for i in range(2):
        torch.manual_seed(0)
        m = nn.Sequential(nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, 10))
        path = tmp_path / f"run{i}.log"
        with record(path, costs="model"):
            m(torch.randn(256, 64)).sum().backward()
        texts.append(path.read_text())
    assert texts[0] == texts[1]
    assert '"TIME":"0"' not in texts[0]  # every op costs something
    with pytest.raises(ValueError, match="costs must be 'time'"):
        record(tmp_path / "x.log", costs="flops")
