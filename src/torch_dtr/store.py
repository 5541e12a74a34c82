"""Recomputable values of any kind under a byte budget: the DTR runtime without PyTorch.

    store = torch_dtr.Store(budget="256MB")
    raw = store.constant(read_file(path))                 # pinned: never evicted
    img = store.compute(decode, raw)                      # managed: may be evicted, recomputed on use
    aug = store.compute(augment, img, 7, nbytes=2**20)    # plain arguments mix with values
    pixels = aug.get()                                    # the value, recomputed (recursively) if evicted
    store.stats()

A ``Value`` is a handle on one storage of the core runtime: the same eviction policies, union-find or exact
neighbourhoods, rematerialization plans, budget and ``BudgetError`` as PyTorch tensors under
``torch_dtr.enable``. It imports no torch (a test checks it).

NOTE [ Recomputables ]

1. ``compute(fn, *args)`` runs ``fn`` at once with every ``Value`` argument replaced by its value, and
   records the recipe: running ``fn`` again with the same arguments must give an equal value (a pure
   function; randomness seeded through the arguments). Its cost, for the policy, is the measured time of
   that first run unless ``cost=`` says otherwise.
2. Bytes: ``nbytes=`` (an int) is reserved before ``fn`` runs, so the budget holds throughout. Without it
   the value's size is read after the run (``v.nbytes`` of NumPy arrays and tensors, ``len`` of bytes,
   ``__sizeof__`` of strings, or ``nbytes=callable(value)``) and the budget is kept by evicting right after.
3. A value lives while its ``Value`` handle lives (or until ``release()``) or while a live recipe reads it
   (NOTE [ Lifetimes ] in the core): dropping the handle of an intermediate keeps its recipe, not its bytes.
4. ``get()`` returns the value itself, not a copy: do not change it in place (a recomputation would not
   see the change, or would undo it). ``constant(x)`` values are never evicted.
5. One lock per store: values may be computed and read from several threads.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from .core import Policy, Runtime, Stats, Storage
from .core.errors import parse_budget
from .core.policies import DEFAULT_POLICY

__all__ = ["Pool", "Store", "Value"]


def _size(value: Any, nbytes: int | Callable[[Any], int] | None) -> int:
    if callable(nbytes):
        n = nbytes(value)
    elif nbytes is not None:
        n = nbytes
    elif hasattr(value, "nbytes"):
        n = value.nbytes
    elif isinstance(value, (bytes, bytearray, memoryview)):
        n = len(value)
    elif isinstance(value, str):
        n = value.__sizeof__()
    else:
        raise TypeError(f"torch_dtr: cannot tell the bytes of a {type(value).__name__} value; give them: "
                        f"store.compute(fn, ..., nbytes=N) or nbytes=lambda v: ...")
    if isinstance(n, bool) or not isinstance(n, int) or n < 0:
        raise TypeError(f"torch_dtr: a value's bytes must be an int >= 0, got {n!r} for a {type(value).__name__}")
    return n


class Value:
    """A handle on a recomputable value of a ``Store`` (NOTE [ Recomputables ] 3)."""

    __slots__ = ("_store", "_s", "__weakref__")

    def __init__(self, store: Store, s: Storage) -> None:
        self._store = store
        self._s = s
        store.rt.add_ref(s)

    def get(self) -> Any:
        """The value, recomputed first if it was evicted (its evicted inputs too)."""
        s = self._alive()
        with self._store.lock:
            return self._store.rt.get(s)

    @property
    def resident(self) -> bool:
        return self._alive().resident

    @property
    def nbytes(self) -> int:
        return self._alive().nbytes

    def release(self) -> None:
        """Drop this handle now (as deleting the last reference to it does)."""
        s, self._s = self._s, None
        if s is not None:
            with self._store.lock:
                self._store.rt.drop_ref(s)

    def _alive(self) -> Storage:
        if self._s is None:
            raise ValueError("torch_dtr: this value was released; keep the Value (or compute it again) to read it")
        return self._s

    def __del__(self) -> None:
        try:
            self.release()
        except Exception:  # interpreter shutdown
            pass

    def __repr__(self) -> str:
        if self._s is None:
            return "Value(released)"
        state = "resident" if self._s.resident else "evicted"
        return f"Value({state}, {self._s.nbytes} B)"


class Store:
    """Recomputable values of any kind under one byte budget, evicted by a DTR policy."""

    def __init__(self, budget: int | str | None = None, *, policy: str | Policy = DEFAULT_POLICY) -> None:
        self.rt = Runtime(parse_budget(budget), policy)
        self.lock = threading.RLock()

    def constant(self, value: Any, *, nbytes: int | Callable[[Any], int] | None = None) -> Value:
        """A value that is never evicted (a loaded file, a model): counted against the budget."""
        n = _size(value, nbytes)
        with self.lock:
            self.rt.reserve(n, "a constant")
            return Value(self, self.rt.output(None, n, value))

    def compute(self, fn: Callable[..., Any], *args: Any, nbytes: int | Callable[[Any], int] | None = None,
                cost: float | None = None, name: str = "") -> Value:
        """``fn(*args)`` as a managed value (NOTE [ Recomputables ] 1-2)."""
        if not callable(fn):
            raise TypeError(f"torch_dtr: compute() needs a function first, got {type(fn).__name__}")
        for a in args:
            if isinstance(a, Value) and a._store is not self:
                raise ValueError("torch_dtr: a Value of another Store was passed to compute(); values of one "
                                 "recipe must share a store")
        name = name or getattr(fn, "__name__", "compute")
        ins = [a._alive() for a in args if isinstance(a, Value)]
        template = tuple(a._s if isinstance(a, Value) else a for a in args)

        def recipe() -> list[Any]:
            return [fn(*[a.payload if type(a) is Storage else a for a in template])]

        rt = self.rt
        with self.lock:
            held = rt.acquire(ins)
            try:
                if isinstance(nbytes, int):
                    rt.reserve(_size(None, nbytes), name)
                t0 = time.perf_counter()
                value = recipe()[0]
                took = time.perf_counter() - t0
                n = _size(value, nbytes)
                op = rt.ran(ins, took if cost is None else float(cost), recipe, name)
                s = rt.output(op, n, value)
                handle = Value(self, s)
            finally:
                rt.release(held)
            if not isinstance(nbytes, int):
                rt.reserve(0, name)  # NOTE [ Recomputables ] 2: evict for the bytes just made
        return handle

    def stats(self) -> Stats:
        with self.lock:
            return self.rt.stats()

    def set_budget(self, budget: int | str | None) -> None:
        """A new budget, kept at once by evicting (``BudgetError`` if it cannot be: the old one stays)."""
        with self.lock:
            self.rt.set_budget(parse_budget(budget))


class Pool:
    """Several stores (tenants) under one total budget, split by shares that can move at run time.

    ``pool.store(name, share)`` makes a tenant; its budget is ``total * share / sum(shares)``. Changing the
    total (``set_total``) or a share (``set_share``) lowers the budgets that shrink first (each tenant evicts
    to fit its new budget at once) and then raises the others, so the tenants' budgets never add up to more
    than the total. ``stats()`` gives each tenant's counters."""

    def __init__(self, total: int | str, *, policy: str | Policy = DEFAULT_POLICY) -> None:
        self.total = parse_budget(total)
        if self.total is None:
            raise ValueError("torch_dtr: a Pool needs a total budget, e.g. Pool(total='1GB')")
        self.policy = policy
        self.shares: dict[str, float] = {}
        self.stores: dict[str, Store] = {}

    def store(self, name: str, share: float = 1.0) -> Store:
        if name in self.stores:
            raise ValueError(f"torch_dtr: the pool has a tenant {name!r} already; choose another name")
        _check_share(share)
        self.shares[name] = float(share)
        self.stores[name] = Store(0, policy=self.policy)
        self._rebalance()
        return self.stores[name]

    def set_total(self, total: int | str) -> None:
        """A new total: tenants evict to fit their new budgets (``BudgetError``: nothing was changed)."""
        new = parse_budget(total)
        if new is None:
            raise ValueError("torch_dtr: a Pool's total cannot be None")
        old, self.total = self.total, new
        try:
            self._rebalance()
        except BaseException:
            self.total = old
            self._rebalance()
            raise

    def set_share(self, name: str, share: float) -> None:
        _check_share(share)
        if name not in self.shares:
            raise KeyError(f"torch_dtr: no tenant {name!r} in the pool (tenants: {sorted(self.shares)})")
        old, self.shares[name] = self.shares[name], float(share)
        try:
            self._rebalance()
        except BaseException:
            self.shares[name] = old
            self._rebalance()
            raise

    def budgets(self) -> dict[str, int]:
        whole = sum(self.shares.values())
        return {n: int(self.total * s / whole) for n, s in self.shares.items()}  # type: ignore[operator]

    def _rebalance(self) -> None:
        new = self.budgets()
        order = sorted(new, key=lambda n: new[n] - (self.stores[n].rt.budget or 0))  # shrinking ones first
        for n in order:
            self.stores[n].set_budget(new[n])

    def stats(self) -> dict[str, Stats]:
        return {n: s.stats() for n, s in self.stores.items()}


def _check_share(share: float) -> None:
    if isinstance(share, bool) or not isinstance(share, (int, float)) or not share > 0:
        raise ValueError(f"torch_dtr: a tenant's share must be a number > 0, got {share!r}")
