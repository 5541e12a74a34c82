"""Operator logs in the DTR prototype's format: read, validate, write. Imports no torch.

The format (``../shared/dtr-logs/README.md`` in the project workspace; the DTR authors' instrumented
PyTorch wrote it): JSON lines, each with an ``INSTRUCTION``; numbers are decimal strings.

    ANNOTATE  ANNOTATION=START|BACKWARD     start of the measured iteration / of the backward pass
    CONSTANT  NAME                          a tensor that exists before the iteration; then its MEMORY line
    MEMORY    NAME, MEMORY                  storage bytes of NAME (follows CONSTANT, and each CALL result);
                                            our recorder adds SHAPE, the tensor's sizes (a list of ints)
    CALL      NAME, ARGS, RESULT, TIME(ns)  a pure op; each result then gets a MEMORY and an ALIAS line
    ALIAS     NAME, ALIAS                   -1: own storage; i >= 0: a view of ARGS[i]'s storage
    MUTATE    NAME, ARGS, MUTATE, TIME      an in-place op writing ARGS[i] for i in MUTATE (ints)
    COPY      DST, SRC                      a new reference DST to SRC's tensor
    COPY_FROM DST, SRC                      DST is rebound to SRC's tensor
    RELEASE   NAME                          one reference dropped

``read`` folds the MEMORY and ALIAS lines into the instruction they describe, so a log becomes a list of
the small frozen records below. Extra fields are ignored (our recorder adds some; see ``torch_dtr/recorder.py``).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any


class LogError(ValueError):
    """A malformed log line. The message names the file, the line number and what is wrong."""


@dataclass(frozen=True, slots=True)
class Result:
    name: str
    nbytes: int
    alias: int  # -1: own storage; i >= 0: shares the storage of the call's ARGS[i]
    shape: tuple[int, ...] | None = None  # the tensor's sizes, where the log gives them (SHAPE)


@dataclass(frozen=True, slots=True)
class Call:
    name: str
    args: tuple[str, ...]
    results: tuple[Result, ...]
    time_ns: int


@dataclass(frozen=True, slots=True)
class Mutate:
    name: str
    args: tuple[str, ...]
    mutated: tuple[int, ...]  # indices into args
    time_ns: int


@dataclass(frozen=True, slots=True)
class Constant:
    name: str
    nbytes: int
    shape: tuple[int, ...] | None = None


@dataclass(frozen=True, slots=True)
class Copy:
    dst: str
    src: str
    rebind: bool = False  # COPY_FROM: dst already named a tensor and now names src's


@dataclass(frozen=True, slots=True)
class Release:
    name: str


@dataclass(frozen=True, slots=True)
class Annotate:
    what: str  # "START" or "BACKWARD"


Instr = Call | Mutate | Constant | Copy | Release | Annotate


@dataclass(frozen=True)
class Log:
    """A whole log. ``start`` is the index in ``instrs`` of the first instruction of the measured
    iteration (0 when the log has no START annotation); ``backward`` the index of the BACKWARD marker
    (or ``None``)."""

    instrs: tuple[Instr, ...]
    start: int
    backward: int | None
    source: str = ""

    @property
    def measured(self) -> tuple[Instr, ...]:
        return self.instrs[self.start :]

    def op_count(self) -> int:
        return sum(1 for i in self.measured if type(i) is Call or type(i) is Mutate)

    def op_time_ns(self) -> int:
        return sum(i.time_ns for i in self.measured if type(i) is Call or type(i) is Mutate)


# ---------------------------------------------------------------------------------------------- reading
def _int(d: dict, key: str, where: str) -> int:
    v = d.get(key)
    if v is None:
        raise LogError(f"{where}: {d.get('INSTRUCTION')} has no {key!r} field")
    try:
        return int(v)
    except (TypeError, ValueError):
        raise LogError(f"{where}: {key} must be an integer (a decimal string), got {v!r}") from None


def _name(d: dict, key: str, where: str) -> str:
    v = d.get(key)
    if not isinstance(v, str) or not v:
        raise LogError(f"{where}: {d.get('INSTRUCTION')} needs a non-empty string {key!r}, got {v!r}")
    return v


def _names(d: dict, key: str, where: str) -> tuple[str, ...]:
    v = d.get(key)
    if not isinstance(v, list) or not all(isinstance(x, str) and x for x in v):
        raise LogError(f"{where}: {d.get('INSTRUCTION')} needs {key!r} as a list of tensor names, got {v!r}")
    return tuple(v)


def _parse(lines: Iterable[str], source: str) -> Iterator[tuple[int, Instr]]:
    """Yield (line number, instruction), folding MEMORY/ALIAS lines into their CALL or CONSTANT."""
    pending: dict[str, Any] | None = None  # the CALL or CONSTANT whose MEMORY/ALIAS lines are due
    pend_line = 0
    for no, raw in enumerate(lines, 1):
        where = f"{source}:{no}"
        if not raw.strip():
            continue
        try:
            d = json.loads(raw)
        except json.JSONDecodeError as e:
            raise LogError(f"{where}: not JSON ({e.msg} at column {e.colno}): {raw.strip()[:80]!r}") from None
        if not isinstance(d, dict) or "INSTRUCTION" not in d:
            raise LogError(f"{where}: a log line must be a JSON object with an 'INSTRUCTION' field, "
                           f"got {raw.strip()[:80]!r}")
        kind = d["INSTRUCTION"]
        if kind in ("MEMORY", "ALIAS"):
            name = _name(d, "NAME", where)
            if pending is None or name not in pending["due"]:
                raise LogError(f"{where}: {kind} for {name!r} does not follow a CALL or CONSTANT that produced it")
            due = pending["due"][name]
            if kind in due:
                raise LogError(f"{where}: second {kind} line for {name!r}")
            due[kind] = _int(d, kind, where)
            if kind == "MEMORY" and "SHAPE" in d:
                due["SHAPE"] = _shape(d["SHAPE"], name, where)
            low = -1 if kind == "ALIAS" else 0
            if due[kind] < low:
                raise LogError(f"{where}: {kind} of {name!r} must be >= {low}, got {due[kind]}")
            if kind == "ALIAS" and due[kind] >= len(pending.get("args", ())):
                raise LogError(f"{where}: ALIAS {due[kind]} of {name!r} is not an argument index of its CALL "
                               f"(it has {len(pending.get('args', ()))} arguments)")
            if all(("MEMORY" in v) + ("ALIAS" in v) == pending["need"] for v in pending["due"].values()):
                yield pend_line, _finish(pending)
                pending = None
            continue
        if pending is not None:
            kinds = ("MEMORY", "ALIAS")[: pending["need"]]
            missing = [f"{k} of {n!r}" for n, v in pending["due"].items() for k in kinds if k not in v]
            raise LogError(f"{where}: {kind} arrived before {', '.join(missing)} "
                           f"(due after line {pend_line})")
        if kind == "CALL":
            results = _names(d, "RESULT", where)
            if len(set(results)) != len(results):
                raise LogError(f"{where}: CALL {d.get('NAME')!r} lists a result twice: {list(results)}")
            pending = {"kind": kind, "name": _name(d, "NAME", where), "args": _names(d, "ARGS", where),
                       "results": results, "time": _int(d, "TIME", where), "need": 2,
                       "due": {r: {} for r in results}}
            pend_line = no
            if not results:
                yield no, _finish(pending)
                pending = None
        elif kind == "CONSTANT":
            name = _name(d, "NAME", where)
            pending = {"kind": kind, "name": name, "need": 1, "due": {name: {}}}
            pend_line = no
        elif kind == "MUTATE":
            args = _names(d, "ARGS", where)
            m = d.get("MUTATE")
            if not isinstance(m, list) or not m or not all(isinstance(i, int) and 0 <= i < len(args) for i in m):
                raise LogError(f"{where}: MUTATE needs 'MUTATE' as a non-empty list of argument indices "
                               f"below {len(args)}, got {m!r}")
            yield no, Mutate(_name(d, "NAME", where), args, tuple(m), _int(d, "TIME", where))
        elif kind in ("COPY", "COPY_FROM"):
            yield no, Copy(_name(d, "DST", where), _name(d, "SRC", where), kind == "COPY_FROM")
        elif kind == "RELEASE":
            yield no, Release(_name(d, "NAME", where))
        elif kind == "ANNOTATE":
            a = d.get("ANNOTATION")
            if a not in ("START", "BACKWARD"):
                raise LogError(f"{where}: ANNOTATION must be 'START' or 'BACKWARD', got {a!r}")
            yield no, Annotate(a)
        else:
            raise LogError(f"{where}: unknown INSTRUCTION {kind!r}; expected one of ANNOTATE, CONSTANT, MEMORY, "
                           f"CALL, ALIAS, MUTATE, COPY, COPY_FROM, RELEASE")
    if pending is not None:
        raise LogError(f"{source}: the log ends before the MEMORY/ALIAS lines of line {pend_line}")


def _shape(v: Any, name: str, where: str) -> tuple[int, ...]:
    if not isinstance(v, list) or not all(isinstance(i, int) and i >= 0 for i in v):
        raise LogError(f"{where}: SHAPE of {name!r} must be a list of sizes (ints >= 0), got {v!r}")
    return tuple(v)


def _finish(p: dict) -> Instr:
    if p["kind"] == "CONSTANT":
        d = p["due"][p["name"]]
        return Constant(p["name"], d["MEMORY"], d.get("SHAPE"))
    res = tuple(Result(r, p["due"][r]["MEMORY"], p["due"][r]["ALIAS"], p["due"][r].get("SHAPE"))
                for r in p["results"])
    return Call(p["name"], p["args"], res, p["time"])


def parse(lines: Iterable[str], source: str = "<log>") -> Log:
    instrs: list[Instr] = []
    start, backward, started = 0, None, False
    for no, ins in _parse(lines, source):
        if type(ins) is Annotate:
            if ins.what == "START":
                if started:
                    raise LogError(f"{source}:{no}: a second START annotation (one measured iteration per log)")
                start, backward, started = len(instrs), None, True
            elif backward is None:
                backward = len(instrs)
            continue
        instrs.append(ins)
    return Log(tuple(instrs), start, backward, source)


def read(path: str | Path) -> Log:
    """Read and validate a log file; a malformed line raises ``LogError`` with its line number."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"torch_dtr: no log file at {str(path)!r}")
    with path.open(encoding="utf-8") as f:
        return parse(f, str(path))


# ---------------------------------------------------------------------------------------------- writing
class Writer:
    """Writes instructions as log lines (the prototype's field names, numbers as decimal strings)."""

    def __init__(self, f: IO[str]) -> None:
        self.f = f

    def _w(self, **d: Any) -> None:
        self.f.write(json.dumps(d, separators=(",", ":"), sort_keys=True) + "\n")

    def annotate(self, what: str) -> None:
        self._w(INSTRUCTION="ANNOTATE", ANNOTATION=what)

    def constant(self, name: str, nbytes: int, shape: Iterable[int] | None = None) -> None:
        self._w(INSTRUCTION="CONSTANT", NAME=name)
        self._memory(name, nbytes, shape)

    def _memory(self, name: str, nbytes: int, shape: Iterable[int] | None) -> None:
        if shape is None:
            self._w(INSTRUCTION="MEMORY", NAME=name, MEMORY=str(nbytes))
        else:
            self._w(INSTRUCTION="MEMORY", NAME=name, MEMORY=str(nbytes), SHAPE=list(shape))

    def call(self, op: str, args: Iterable[str], results: Iterable[Result], time_ns: int, **extra: Any) -> None:
        results = list(results)
        self._w(INSTRUCTION="CALL", NAME=op, ARGS=list(args), RESULT=[r.name for r in results],
                TIME=str(int(time_ns)), **extra)
        for r in results:
            self._memory(r.name, r.nbytes, r.shape)
            self._w(INSTRUCTION="ALIAS", NAME=r.name, ALIAS=str(r.alias))

    def mutate(self, op: str, args: Iterable[str], mutated: Iterable[int], time_ns: int, **extra: Any) -> None:
        self._w(INSTRUCTION="MUTATE", NAME=op, ARGS=list(args), MUTATE=list(mutated), TIME=str(int(time_ns)),
                **extra)

    def copy(self, dst: str, src: str) -> None:
        self._w(INSTRUCTION="COPY", DST=dst, SRC=src)

    def release(self, name: str) -> None:
        self._w(INSTRUCTION="RELEASE", NAME=name)
