"""Eviction policies: small pure scoring functions. The runtime evicts the candidate with the LOWEST score.

Every policy sees the same features of a resident candidate ``t``:

- ``cost``: compute time of the recipe that produces ``t`` (seconds live, the log's time in simulation);
- ``nbytes``: bytes of its storage;
- ``staleness``: clock time since ``t`` was last read or written;
- ``extra``: the feature of the policy's ``extra`` kind, kept by the tracker registered for that kind
  (``trackers.py``: ``"uf"``, ``"exact"``, ``"ancestors"``, ``"chain"``, or ``""`` for none). For
  ``"chain"`` it is a ``Chain`` (not a float): ``nbhd``, the union-find neighbourhood cost (as ``"uf"``);
  ``path``, the recipe cost along the costliest evicted path above ``t`` (what bringing ``t`` back
  recomputes at least, beyond its own recipe); ``length``, the storages on the longest evicted chain
  through ``t`` once it is evicted (>= 1).

The policies:

- ``dtr_eq`` (h_DTR^eq), ``dtr`` (h_DTR), ``dtr_local``: ``(cost + extra) / (nbytes *
  staleness)`` with the ``"uf"``, ``"exact"`` and no neighbourhood (the DTR paper's heuristics);
- ``dtr_chain``: ``(cost + nbhd + path) * sqrt(length) / (nbytes * staleness)``: h_DTR^eq, plus the cost
  of really bringing ``t`` back (``path``: the neighbourhood blurs it once union-find components grow),
  times a penalty for long evicted chains. It was the default until 2026-11-25: on the DTR authors' logs
  it beats h_DTR^eq at 0.2 to 0.4 x the peak, but replaying 24 logs (the shared ones, the tests' models
  and the bench's workloads, recorded) at 0.2 to 0.9 it is worse than h_DTR^eq in 53 of 240 cells (54 since
  NOTE [ Lifetimes ] 3's exception; e.g.
  the tree RNN at 0.3: thrash vs 1.25; ``benchmarks/policy_grid.py``), and no variant tried (without the path or
  the length term, thresholds on the length, switching by memory pressure) was never worse while keeping
  its wins (docs/decisions.md, The default policy). Live, the tests' models' smallest feasible budgets
  differ by at most 2 points of the peak between the two. So the default is h_DTR^eq again;
- ``dtr_comp`` (the default since 2026-11-25, afternoon): h_DTR's formula with exact evicted neighbourhoods
  kept incrementally (the ``"comp"`` tracker, NOTE [ Exact components ]): ``dtr``'s choices (the same
  recomputations on the bench's three workloads) at ``dtr_eq``'s search cost. Live it recomputes less than
  ``dtr_eq`` on GPT-2, ResNet-50 and the LSTM loop (``benchmarks/policy_live.py``) and lowers the tests'
  models' smallest budgets (LSTM loop 53% -> 45% of its peak); replaying 26 logs at 0.2-0.9 it is better in 6
  cells and worse in 2 (docs/decisions.md, The default policy, again);
- ``lru``: ``1 / staleness``; ``size``: ``1 / nbytes``;
- ``msps``: ``(cost + extra) / nbytes`` with ``"ancestors"`` (Chen et al.'s MSPS, as in the DTR paper).

A policy is a frozen dataclass; register a new one with ``register`` (and a new kind of feature with
``trackers.register_tracker``).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .trackers import TRACKERS, Chain

Score = Callable[[float, int, float, Any], float]  # extra: a float, or a ``Chain`` for the "chain" kind


@dataclass(frozen=True)
class Policy:
    name: str
    score: Score
    extra: str = ""  # a kind registered in trackers.TRACKERS
    # an ``extra`` no real one is below, for which the score is no larger than with any real one (the score
    # never decreases as ``extra`` grows): the search skips a candidate's ``extra`` when even this bound
    # cannot beat the best so far, so it chooses exactly as without it. None: no such bound (always compute)
    extra_floor: Any = None
    # the score is h_DTR's formula, (cost + extra) / (nbytes x staleness): the eviction search computes it
    # inline instead of calling ``score`` for every candidate (the same float operations, so the same choice)
    h_dtr: bool = False

    def __post_init__(self) -> None:
        if self.extra not in TRACKERS:
            raise ValueError(f"torch_dtr: policy {self.name!r} has unknown extra kind {self.extra!r}; "
                             f"known kinds: {sorted(TRACKERS)} (add one with trackers.register_tracker)")


def _h_dtr(cost: float, nbytes: int, staleness: float, extra: float) -> float:
    return (cost + extra) / (nbytes * staleness)


def _lru(cost: float, nbytes: int, staleness: float, extra: float) -> float:
    return 1.0 / staleness


def _size(cost: float, nbytes: int, staleness: float, extra: float) -> float:
    return 1.0 / nbytes


def _msps(cost: float, nbytes: int, staleness: float, extra: float) -> float:
    return (cost + extra) / nbytes


def _h_chain(cost: float, nbytes: int, staleness: float, extra: Chain) -> float:
    return (cost + extra.nbhd + extra.path) * math.sqrt(extra.length) / (nbytes * staleness)


POLICIES: dict[str, Policy] = {}


def register(policy: Policy) -> Policy:
    POLICIES[policy.name] = policy
    return policy


register(Policy("dtr_eq", _h_dtr, "uf", 0.0, h_dtr=True))  # extra: a sum of costs, >= 0
register(Policy("dtr", _h_dtr, "exact", 0.0, h_dtr=True))
register(Policy("dtr_local", _h_dtr, "", h_dtr=True))
register(Policy("dtr_comp", _h_dtr, "comp", 0.0, h_dtr=True))  # exact neighbourhoods kept incrementally
register(Policy("lru", _lru, ""))
register(Policy("size", _size, ""))
register(Policy("msps", _msps, "ancestors", 0.0))
register(Policy("dtr_chain", _h_chain, "chain"))

DEFAULT_POLICY = "dtr_comp"  # see dtr_chain and dtr_comp above for why


def get_policy(policy: object) -> Policy:  # (anything: a wrong type gets the message below)
    if isinstance(policy, Policy):
        return policy
    try:
        return POLICIES[policy]  # type: ignore[index]
    except (KeyError, TypeError):
        raise ValueError(
            f"torch_dtr: unknown policy {policy!r}; choose one of {sorted(POLICIES)} "
            f"(e.g. policy={DEFAULT_POLICY!r}) or pass a torch_dtr.Policy"
        ) from None
