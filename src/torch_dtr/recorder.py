"""Record the aten ops of a PyTorch program as an operator log (``sim/log.py``'s format) for the simulator.

    with record("step.log"):          # one training iteration
        loss = model(x).sum(); loss.backward(); opt.step()

``record_script`` runs a script and keeps only one iteration, cut at optimizer steps (``torch-dtr record``).
A PyTorch driver of the simulator's input, so it sits on top of both ``eager/`` (operator facts) and
``sim/`` (the log format), like the CLI; ``sim/`` itself imports no torch.
"""

from __future__ import annotations

import os
import threading
import time
import weakref
from collections import deque
from pathlib import Path
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from . import native as _native
from .eager import front as _front
from .eager.costs import model_cost
from .eager.funcinfo import info
from .eager.recipe import flat_outputs
from .runner import run_main
from .sim.log import Result, Writer

# NOTE [ Recording ]
#
# 1. Names: every tensor *object* the mode sees gets a name (``x0``, ``x1``, ...), kept while the
#    object lives. Storages are keyed by their data pointer (by StorageImpl for empty ones); a storage
#    record lists the unreleased names on it. ``peak_live_bytes`` sums the storages with such a name.
# 2. Constants are per storage: an unnamed input whose storage has no live name is a ``CONSTANT`` with
#    the storage's bytes. An unnamed input on a storage that has a live name (a view made before
#    recording, a tensor rewrapped in C++) is a ``COPY`` of the first live name there: no op, no bytes.
# 3. An op with new tensor outputs is a ``CALL``: ``ARGS`` are its tensor inputs (positional, then
#    keyword, lists flattened), ``TIME`` the op's ``perf_counter_ns`` time (CUDA synchronized around
#    ops whose first tensor input is on CUDA). A result is a view
#    (``ALIAS i``) when its storage is that of ``ARGS[i]`` (schema-annotated or not); ``MEMORY`` is the
#    storage's bytes (as the prototype's logs write for views too). A second fresh result on a storage
#    another result of the same call already has gets ``MEMORY 0``.
# 4. Mutations: an op writing inputs (schema ``a!`` arguments: ``add_``, ``out=``, foreach lists; args
#    whose ``_version`` moved; ``native_batch_norm``'s running stats in training) is a ``MUTATE`` listing
#    the written ARGS indices. Outputs that are input objects (``add_`` returns ``self``) are not new.
#    An op that both writes and returns new tensors (training batch norm) is a ``CALL`` (its TIME) and
#    then a ``MUTATE`` of TIME 0, so CALL+MUTATE lines outnumber such ops by one each.
# 5. Ops that neither write nor return a new tensor (``item``, profiler markers) are not logged.
# 6. Releases: ``RELEASE`` a name when its Python object dies (a weakref callback). PyTorch keeps the
#    object of a tensor that autograd saved alive (PyObject preservation) until the graph frees it, and
#    a saved *output* is saved as an ``aten.detach`` of it, a view this mode records; so a name is never
#    released before its last use (tests/sim/test_record.py checks this). Callbacks only queue; the
#    queue is written before the next op's lines and at exit. Tensors alive at exit are not released:
#    they are the iteration's outputs (loss, grads, parameters).
# 7. ``ANNOTATE START`` heads the log (unless ``annotate_start=False``); ``ANNOTATE BACKWARD`` precedes
#    the first logged op that runs inside the autograd engine (``torch._C._current_graph_task_id()``).



def _dtr_running() -> bool:
    """Whether a torch-dtr session runs, on either front end (the recorder logs plain aten ops)."""
    if _front.active() is not None:
        return True
    s = _native._SESSION
    return s is not None and s.active

class _Ref(weakref.ref):
    __slots__ = ("name", "ident")


class _Storage:
    __slots__ = ("key", "nbytes", "names")

    def __init__(self, key: int, nbytes: int) -> None:
        self.key = key
        self.nbytes = nbytes
        self.names: dict[str, None] = {}  # unreleased names on this storage, in order of naming


def _storage(t: torch.Tensor) -> tuple[int, int]:
    """(key, nbytes) of ``t``'s untyped storage; the key is its data pointer, or -StorageImpl for empty ones."""
    try:
        st = t.untyped_storage()
    except (RuntimeError, NotImplementedError):  # sparse and other storage-less layouts
        return -id(t), 0
    p = st.data_ptr()
    return (p if p else -st._cdata), st.nbytes()


def _flatten(x: Any, slot: int | str, flat: list[torch.Tensor], slots: dict[int | str, list[int]]) -> None:
    if isinstance(x, torch.Tensor):
        slots[slot] = [len(flat)]
        flat.append(x)
    elif type(x) is list or type(x) is tuple:
        idx = []
        for y in x:
            if isinstance(y, torch.Tensor):
                idx.append(len(flat))
                flat.append(y)
        if idx:
            slots[slot] = idx


_OPNAMES: dict[Any, str] = {}


class Recorder(TorchDispatchMode):
    """Writes every aten op run inside it to ``path``; see NOTE [ Recording ]. ``summary()`` after exit."""

    def __init__(self, path: str | os.PathLike, *, annotate_start: bool = True, costs: str = "time") -> None:
        super().__init__()
        if costs not in ("time", "model"):
            raise ValueError(f"torch_dtr: record costs must be 'time' (measured) or 'model' (FLOPs and bytes, the "
                             f"same in every run), got {costs!r}")
        self.path = Path(path)
        self.model = costs == "model"
        self.annotate_start = annotate_start
        self.names: dict[int, tuple[_Ref, str]] = {}  # id(tensor) -> (weakref, name)
        self.recs: dict[str, _Storage] = {}  # unreleased name -> its storage record
        self.storages: dict[int, _Storage] = {}  # storage key -> record (while a name on it is unreleased)
        self.pending: deque[_Ref] = deque()  # names whose objects died, not yet written
        self.lock = threading.RLock()
        self.f: Any = None
        self.w: Writer | None = None
        self.n = 0
        self.backward = False
        self.count = {"ops": 0, "calls": 0, "mutates": 0, "constants": 0, "copies": 0, "releases": 0}
        self.live = self.peak = 0

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        return False  # as eager.front._Mode: no torch._disable_dynamo wrapper around every op

    # ------------------------------------------------------------------ enter / exit
    def __enter__(self) -> Recorder:
        if _dtr_running():
            raise RuntimeError("torch_dtr: record() cannot run while torch_dtr is enabled; call "
                               "torch_dtr.disable() first (the recorder logs plain aten ops)")
        self.f = self.path.open("w", encoding="utf-8")
        self.w = Writer(self.f)
        if self.annotate_start:
            self.w.annotate("START")
        super().__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        super().__exit__(*exc)
        with self.lock:
            self._drain()
            for ref, _ in self.names.values():  # objects still alive are outputs: never released
                ref.name = ""
            self.names.clear()
            self.f.close()
            self.f = None

    def name(self, t: torch.Tensor) -> str | None:
        """The log's name of tensor object ``t`` while recording (``None`` if not seen yet)."""
        e = self.names.get(id(t))
        return e[1] if e is not None and e[0]() is t else None

    def summary(self) -> dict[str, Any]:
        return {"path": str(self.path), **self.count, "peak_live_bytes": self.peak}

    # ------------------------------------------------------------------ names
    def _died(self, ref: _Ref) -> None:
        self.pending.append(ref)  # any thread, any time: written under the lock at the next op or exit

    def _drain(self) -> None:
        while self.pending:
            ref = self.pending.popleft()
            name = ref.name
            if not name:
                continue
            e = self.names.get(ref.ident)
            if e is not None and e[0] is ref:
                del self.names[ref.ident]
            self.w.release(name)
            self.count["releases"] += 1
            rec = self.recs.pop(name)
            del rec.names[name]
            if not rec.names:  # the log frees the storage here
                self.live -= rec.nbytes
                if self.storages.get(rec.key) is rec:
                    del self.storages[rec.key]

    def _bind(self, t: torch.Tensor, rec: _Storage) -> str:
        name = f"x{self.n}"
        self.n += 1
        ref = _Ref(t, self._died)
        ref.name, ref.ident = name, id(t)
        self.names[id(t)] = (ref, name)
        self.recs[name] = rec
        rec.names[name] = None
        return name

    def _input(self, t: torch.Tensor, key: int, nbytes: int) -> str:
        e = self.names.get(id(t))
        if e is not None and e[0]() is t:
            return e[1]
        rec = self.storages.get(key)
        if rec is not None and rec.names:
            src = next(iter(rec.names))
            name = self._bind(t, rec)
            self.w.copy(name, src)
            self.count["copies"] += 1
            return name
        rec = self.storages[key] = _Storage(key, nbytes)
        name = self._bind(t, rec)
        self.w.constant(name, nbytes, tuple(t.shape))
        self.count["constants"] += 1
        self._grow(nbytes)
        return name

    def _grow(self, nbytes: int) -> None:
        self.live += nbytes
        if self.live > self.peak:
            self.peak = self.live

    # ------------------------------------------------------------------ ops
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[override]
        kwargs = kwargs or {}
        if _dtr_running():
            raise RuntimeError("torch_dtr: torch_dtr.enable() was called inside record(); the recorder logs "
                               "plain aten ops and cannot run together with the DTR runtime")
        flat: list[torch.Tensor] = []
        slots: dict[int | str, list[int]] = {}
        for i, a in enumerate(args):
            _flatten(a, i, flat, slots)
        for k, a in kwargs.items():
            _flatten(a, k, flat, slots)
        versions = [t._version for t in flat]
        cuda = bool(flat) and flat[0].is_cuda
        if cuda:
            torch.cuda.synchronize()
        t0 = time.perf_counter_ns()
        out = func(*args, **kwargs)
        if cuda:
            torch.cuda.synchronize()
        dt = time.perf_counter_ns() - t0
        if self.model:  # NOTE [ Modelled costs ]: the same log in every run
            dt = max(1, round(1e9 * model_cost(func, args, kwargs, flat_outputs(out), "cuda" if cuda else "cpu")))
        fi = info(func)
        written = {i for i, (t, v) in enumerate(zip(flat, versions, strict=True)) if t._version != v}
        for m in fi.mutated:
            written.update(slots.get(m[0] if m[0] < len(args) else m[1], ()))
        if fi.hidden_writes and fi.arg(fi.training, args, kwargs):
            for h in fi.hidden_writes:
                written.update(slots.get(h[0] if h[0] < len(args) else h[1], ()))
        with self.lock:
            ins = {id(t) for t in flat}
            new = [o for o in flat_outputs(out) if isinstance(o, torch.Tensor) and id(o) not in ins
                   and self.name(o) is None]
            if not new and not written:
                return out
            self._log(func, flat, new, sorted(written), dt)
        return out

    def _log(self, func: Any, flat: list[torch.Tensor], new: list[torch.Tensor], written: list[int], dt: int) -> None:
        w = self.w
        if self.pending:
            self._drain()
        if not self.backward and torch._C._current_graph_task_id() != -1:
            self.backward = True
            w.annotate("BACKWARD")
        op = _OPNAMES.get(func)
        if op is None:
            op = _OPNAMES[func] = str(func).removeprefix("aten.")
        keys = [_storage(t) for t in flat]
        names = [self._input(t, k, b) for t, (k, b) in zip(flat, keys, strict=True)]
        self.count["ops"] += 1
        if new:
            where = {k: i for i, (k, _) in reversed(list(enumerate(keys)))}  # storage -> first arg on it
            fresh: dict[int, _Storage] = {}
            results = []
            for o in new:
                key, nbytes = _storage(o)
                i = where.get(key)
                if i is not None:  # a view of ARGS[i], annotated in the schema or not
                    name = self._bind(o, self.recs[names[i]])
                    results.append(Result(name, nbytes, i, tuple(o.shape)))
                elif key in fresh:  # shares the storage of an earlier result of this call
                    results.append(Result(self._bind(o, fresh[key]), 0, -1, tuple(o.shape)))
                else:
                    rec = fresh[key] = self.storages[key] = _Storage(key, nbytes)
                    self._grow(nbytes)
                    results.append(Result(self._bind(o, rec), nbytes, -1, tuple(o.shape)))
            w.call(op, names, results, dt)
            self.count["calls"] += 1
        if written:
            w.mutate(op, names, written, 0 if new else dt)
            self.count["mutates"] += 1


def record(path: str | os.PathLike, *, annotate_start: bool = True, costs: str = "time") -> Recorder:
    """A context manager that logs every aten op run inside it to ``path`` (NOTE [ Recording ]). ``costs``:
    each op's ``TIME`` measured (``"time"``) or modelled from FLOPs and bytes (``"model"``: the same log in
    every run, as the live runtime's default costs)."""
    return Recorder(path, annotate_start=annotate_start, costs=costs)


class _Stop(BaseException):
    """Ends the recorded script after its iteration (a BaseException: ``except Exception`` lets it pass)."""


def record_script(script: str, argv: list[str], out: str, iteration: int = 2, costs: str = "time") -> dict[str, Any]:
    """Run ``script`` as ``__main__`` with ``sys.argv = [script, *argv]`` and log its ``iteration``-th
    training iteration (1-based) to ``out``: the ops after optimizer step ``iteration - 1`` finished, up to
    and including step ``iteration``; iteration 1 starts at the script's first op. The script is stopped
    once that step is done. Without any optimizer step the whole script is logged (``whole_script``).

    Returns ``Recorder.summary()`` plus ``iteration``, ``steps`` (optimizer steps seen), ``complete`` (the
    iteration ended with its step), ``whole_script`` and, when the log is not the asked iteration, ``note``.
    """
    if iteration < 1:
        raise ValueError(f"torch_dtr: iteration must be >= 1, got {iteration}")
    from torch.optim.optimizer import register_optimizer_step_post_hook

    # Recording starts at the first op: until a step is seen, the script may have none (then the whole
    # script is the log). Step 1 ends that warm-up recording; a new recorder, entered after step
    # ``iteration - 1``, truncates ``out`` and logs until step ``iteration``.
    rec: list[Recorder | None] = [record(out, costs=costs)]  # the recorder running now
    last = [rec[0]]  # the recorder that wrote ``out`` last
    steps = [0]

    def stop_current() -> None:
        r, rec[0] = rec[0], None
        if r is not None:
            r.__exit__(None, None, None)

    def step_hook(opt: Any, a: Any, k: Any) -> None:
        steps[0] += 1
        if steps[0] == iteration:
            stop_current()
            raise _Stop
        if steps[0] == 1:
            stop_current()
        if steps[0] == iteration - 1:
            rec[0] = last[0] = record(out, costs=costs).__enter__()

    handle = register_optimizer_step_post_hook(step_hook)
    try:
        rec[0].__enter__()
        code = run_main(script, argv, _Stop)
        if code not in (None, 0):
            raise SystemExit(code)
    finally:
        handle.remove()
        stop_current()
    n = steps[0]
    summary = {**last[0].summary(), "iteration": iteration, "steps": n, "complete": n >= iteration,
               "whole_script": n == 0}
    if n == 0:
        summary["note"] = "the script made no optimizer step: the log holds the whole script"
    elif n < iteration - 1:
        summary["note"] = f"the script made only {n} optimizer steps: the log holds iteration 1"
    elif n < iteration:
        summary["note"] = f"the script ended before optimizer step {iteration}: the log holds the ops after step {n}"
    return summary
