"""Eviction policies: small pure scoring functions. The runtime evicts the candidate with the LOWEST score.

Every policy sees the same features of a resident candidate ``t``:

- ``cost``: compute time of the recipe that produces ``t`` (seconds live, the log's time in simulation);
- ``nbytes``: bytes of its storage;
- ``staleness``: clock time since ``t`` was last read or written;
- ``extra``: a cost that depends on the policy's ``extra`` kind, computed by the runtime:

  * ``"uf"``: summed cost of the evicted components adjacent to ``t``, found through union-find
    (h_DTR^eq of the DTR paper: cheap, approximate because components are never split);
  * ``"exact"``: summed cost of the evicted neighbourhood e*(t), found by a graph walk (h_DTR);
  * ``"ancestors"``: summed cost of the evicted ancestors that rematerializing ``t`` would recompute (MSPS);
  * ``""``: always 0.

A policy is a frozen dataclass; register a new one with ``register``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

Score = Callable[[float, int, float, float], float]


@dataclass(frozen=True)
class Policy:
    name: str
    score: Score
    extra: str = ""  # "", "uf", "exact" or "ancestors"

    def __post_init__(self) -> None:
        if self.extra not in ("", "uf", "exact", "ancestors"):
            raise ValueError(f"torch_dtr: policy {self.name!r} has unknown extra kind {self.extra!r}")


def _h_dtr(cost: float, nbytes: int, staleness: float, extra: float) -> float:
    return (cost + extra) / (nbytes * staleness)


def _lru(cost: float, nbytes: int, staleness: float, extra: float) -> float:
    return 1.0 / staleness


def _size(cost: float, nbytes: int, staleness: float, extra: float) -> float:
    return 1.0 / nbytes


def _msps(cost: float, nbytes: int, staleness: float, extra: float) -> float:
    return (cost + extra) / nbytes


POLICIES: dict[str, Policy] = {}


def register(policy: Policy) -> Policy:
    POLICIES[policy.name] = policy
    return policy


register(Policy("dtr_eq", _h_dtr, "uf"))
register(Policy("dtr", _h_dtr, "exact"))
register(Policy("dtr_local", _h_dtr, ""))
register(Policy("lru", _lru, ""))
register(Policy("size", _size, ""))
register(Policy("msps", _msps, "ancestors"))

DEFAULT_POLICY = "dtr_eq"


def get_policy(policy: str | Policy) -> Policy:
    if isinstance(policy, Policy):
        return policy
    try:
        return POLICIES[policy]
    except (KeyError, TypeError):
        raise ValueError(
            f"torch_dtr: unknown policy {policy!r}; choose one of {sorted(POLICIES)} "
            f"(e.g. policy={DEFAULT_POLICY!r}) or pass a torch_dtr.Policy"
        ) from None
