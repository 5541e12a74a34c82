"""Tenants: several models trained or served side by side in one session, each under its share of the budget.
``tenant_of`` and ``rebalance`` serve both front ends: a session (the Python front end's ``Front``, the compiled one's
``Session``) has ``dev``, ``total``, ``tenants``, ``shares``, ``spawn()``, and ``set_budget(n)`` (evicts to fit)."""

from __future__ import annotations

from typing import Any

from torch.utils._python_dispatch import _get_current_dispatch_mode

from . import front as _front
from .front import Front

# NOTE [ Tenants ]
#
# 1. ``with torch_dtr.tenant(name, share):`` runs this thread's managed ops on the tenant's own session (its
#    runtime, constants; the Python front end's own lock): what they compute is counted against, and evicted for,
#    the tenant's budget only. Ops outside any tenant scope belong to the session itself, the tenant "" of share 1.
#    The compiled front end keeps each tenant's state in the kernel by session number (front.cpp, ``Py``) and the
#    thread's tenant in a thread-local (``use``); a write to a constant is told to every tenant whose recipes read it.
# 2. Budgets: the session's budget (``enable``'s, or a ``budget()`` scope's) is the total; each tenant gets
#    total x share / sum of shares. A new tenant, ``set_share`` and a ``budget()`` scope rebalance at once,
#    lowering the budgets that shrink first (each tenant evicts to fit), then raising the others, so the
#    tenants never hold more than the total. Without a budget, tenants only keep separate accounts. With
#    ``swap=True`` their host tiers share the session's host budget (NOTE [ Host copies ] 8).
# 3. A managed tensor of one tenant read by an op of another becomes a constant there (its plain value,
#    pinned in its own tenant), as a tensor of an earlier session does (``Front.scan``).
# 4. ``torch_dtr.stats(name)`` gives a tenant's counters, ``stats()`` the session's own.
# 5. Not on a device whose allocator the budget follows (CUDA): one allocator count cannot be split among
#    tenants yet, so ``tenant()`` refuses there.


def _root(f: Front) -> Front:
    return f.session if f.session is not None else f


def tenant_of(session: Front, name: str, share: float | None) -> Front:
    """The tenant ``name`` of ``session`` (made on first use, share 1 unless given)."""
    if session.dev is not None:
        raise RuntimeError(f"torch_dtr: tenants on a device whose allocator the budget follows ({session.dev.name}) "
                           f"are not supported yet: one allocator count cannot be split among tenants. Run "
                           f"tenants on the CPU, or one session per process on the GPU")
    if share is not None and (isinstance(share, bool) or not isinstance(share, (int, float)) or not share > 0):
        raise ValueError(f"torch_dtr: a tenant's share must be a number > 0, got {share!r}")
    if name == "":
        if share is not None:
            session.shares[""] = float(share)
            rebalance(session)
        return session
    t = session.tenants.get(name)
    if t is None:
        t = session.spawn()
        t.session = session
        t.active = True
        session.tenants[name] = t
        session.shares[name] = 1.0 if share is None else float(share)
        rebalance(session)
    elif share is not None and session.shares[name] != share:
        session.shares[name] = float(share)
        rebalance(session)
    return t


def rebalance(session: Any) -> None:
    """Give every tenant its share of ``session.total`` (NOTE [ Tenants ] 2)."""
    fronts = {"": session, **session.tenants}
    total = session.total
    if total is None:
        for f in fronts.values():
            f.set_budget(None)
        return
    whole = sum(session.shares.values())
    new = {n: int(total * session.shares[n] / whole) for n in fronts}
    for n in sorted(fronts, key=lambda n: new[n] - (fronts[n].rt.budget or 0)):  # shrinking ones first
        fronts[n].set_budget(new[n])


def switch(front: Front) -> Any:
    """Make this thread's torch-dtr mode run ops on ``front``; returns what to restore."""
    mode = _get_current_dispatch_mode()
    if not isinstance(mode, _front._Mode) or _root(mode.front) is not _root(front):
        raise RuntimeError("torch_dtr: tenant() must run where the session's dispatch mode is the innermost one "
                           "(the thread that called enable(), or inside `with torch_dtr.attach():`), not inside "
                           "another dispatch mode")
    old, mode.front = mode.front, front
    return mode, old
