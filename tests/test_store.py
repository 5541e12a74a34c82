"""torch_dtr.Store: recomputable values of any kind under a budget, without a torch op (NOTE [ Recomputables ])."""

from __future__ import annotations

import gc
import subprocess
import sys
import textwrap

import pytest

from torch_dtr.core import BudgetError
from torch_dtr.store import Store, Value


class Blob:
    """A value that knows its bytes (like a NumPy array), built from a seed: a stand-in for decoded data."""

    def __init__(self, seed: int, n: int) -> None:
        self.data = bytes((seed * 31 + i) % 251 for i in range(n))
        self.nbytes = n

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Blob) and self.data == other.data


def test_a_pipeline_of_decoded_and_augmented_samples_stays_within_budget_and_recomputes_equal_values():
    """A cache of decoded/augmented samples: 20 samples of 3 stages under a budget for about 6 of them."""
    calls: dict[str, int] = {"decode": 0, "augment": 0}

    def decode(raw: bytes) -> Blob:
        calls["decode"] += 1
        return Blob(raw[0], 1000)

    def augment(img: Blob, k: int) -> Blob:
        calls["augment"] += 1
        return Blob(img.data[0] + k, 1000)

    store = Store(budget=20 * 64 + 6 * 2000)
    raws = [store.constant(bytes([i]) * 64) for i in range(20)]
    # nbytes given: reserved before each run, so the budget holds throughout (NOTE [ Recomputables ] 2)
    augs = [store.compute(augment, store.compute(decode, r, nbytes=1000), 3, nbytes=1000) for r in raws]
    st = store.stats()
    assert st.peak_bytes <= st.budget_bytes and st.evictions > 0
    assert sum(a.resident for a in augs) < 20, "some samples were evicted"
    for i, a in enumerate(augs):  # every sample, read again: recomputed where evicted, equal to a fresh one
        assert a.get() == Blob(Blob(i, 1000).data[0] + 3, 1000)
    st = store.stats()
    assert st.rematerializations > 0 and st.peak_bytes <= st.budget_bytes
    assert calls["augment"] + calls["decode"] == 40 + st.rematerializations, calls
    store.rt.check()


def test_features_for_retrieval_recomputed_exactly_once_when_evicted():
    """A cache of expensive features: evicting one and reading it recomputes it once, not its input."""
    runs: list[int] = []

    def features(doc: str, dim: int) -> list[float]:
        runs.append(len(doc))
        return [float((ord(c) * 7 + i) % 13) for i, c in zip(range(dim), doc * dim, strict=False)]

    store = Store(budget=None)
    docs = [store.constant(f"document {i} " * 10) for i in range(4)]
    feats = [store.compute(features, d, 64, nbytes=64 * 8) for d in docs]
    want = [f.get() for f in feats]
    store.rt.evict(feats[2]._s)
    assert not feats[2].resident
    n = len(runs)
    assert feats[2].get() == want[2] and len(runs) == n + 1, "recomputed exactly once"
    assert store.stats().rematerializations == 1


def test_without_nbytes_the_budget_is_kept_right_after_each_run():
    store = Store(budget=3000)
    vs = [store.compute(lambda i=i: bytes([i]) * 1000) for i in range(6)]
    st = store.stats()
    assert st.resident_bytes <= 3000 and st.peak_bytes <= 4000, "over by at most the value just made"
    assert [v.get()[0] for v in vs] == list(range(6))


def test_a_released_intermediate_keeps_its_recipe_not_its_bytes():
    store = Store(budget=None)
    a = store.compute(lambda: b"x" * 100)
    b = store.compute(lambda v: v + b"y", a)
    a.release()  # b's recipe reads a: a is dropped (evicted), its recipe kept
    st = store.stats()
    assert st.drops == 1 and st.resident_bytes == 101
    store.rt.evict(b._s)
    assert b.get() == b"x" * 100 + b"y", "b recomputed through a's recipe"
    del b
    gc.collect()
    assert store.stats().live_storages == 0, "nothing outlives its last handle"


def test_budget_errors_and_bad_input_say_what_to_do():
    store = Store(budget="1KB")
    with pytest.raises(BudgetError, match="needs 2.00 KiB more"):
        store.compute(lambda: b"z" * 2048, nbytes=2048)
    with pytest.raises(TypeError, match="cannot tell the bytes of a dict value"):
        store.compute(lambda: {"a": 1})
    with pytest.raises(TypeError, match="needs a function first"):
        store.compute(3)
    with pytest.raises(ValueError, match="cannot read budget"):
        Store(budget="lots")
    other = Store()
    v = other.constant(b"abc")
    with pytest.raises(ValueError, match="another Store"):
        store.compute(lambda x: x, v)
    v.release()
    with pytest.raises(ValueError, match="was released"):
        v.get()
    assert isinstance(other.compute(lambda: b"q"), Value)


def test_a_budget_that_shrinks_evicts_at_once():
    store = Store(budget=None)
    vs = [store.compute(lambda i=i: bytes([i]) * 1000) for i in range(10)]
    store.set_budget(4000)
    assert store.stats().resident_bytes <= 4000 and sum(v.resident for v in vs) == 4
    assert [v.get()[0] for v in vs] == list(range(10))


def test_the_store_imports_no_torch():
    from core.test_no_torch import BLOCK_TORCH

    code = BLOCK_TORCH + textwrap.dedent("""
        from torch_dtr.store import Store
        s = Store(budget=1000)
        v = s.compute(lambda: b"a" * 600)
        w = s.compute(lambda: b"b" * 600)
        assert not v.resident and v.get() == b"a" * 600
        assert "torch" not in sys.modules
        print("ok")
    """)
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0 and p.stdout.strip() == "ok", p.stderr


def test_tenants_share_a_total_that_is_halved_and_restored():
    from torch_dtr.store import Pool

    pool = Pool(total=20_000)
    a, b = pool.store("a"), pool.store("b", share=1)
    assert pool.budgets() == {"a": 10_000, "b": 10_000}
    va = [a.compute(lambda i=i: bytes([i]) * 1000, nbytes=1000) for i in range(9)]
    vb = [b.compute(lambda i=i: bytes([i + 100]) * 1000, nbytes=1000) for i in range(9)]
    assert all(v.resident for v in va + vb)
    pool.set_total(10_000)  # halved: each tenant evicts to 5,000 at once
    st = pool.stats()
    assert st["a"].resident_bytes <= 5_000 and st["b"].resident_bytes <= 5_000 and st["a"].evictions == 4
    pool.set_share("a", 3)  # a gets 7,500, b 2,500 (b shrinks first, so the total is never passed)
    st = pool.stats()
    assert st["a"].budget_bytes == 7_500 and st["b"].resident_bytes <= 2_500
    pool.set_total(20_000)
    assert [v.get()[0] for v in va] == list(range(9)) and [v.get()[0] for v in vb] == list(range(100, 109))
    assert sum(s.resident_bytes for s in pool.stats().values()) <= 20_000
    pool.set_total(500)  # everything of both tenants is evictable: a's budget is 375 B, b's 125 B
    assert sum(s.resident_bytes for s in pool.stats().values()) == 0
    with pytest.raises(BudgetError):
        a.constant(b"k" * 400)  # a constant of 400 B does not fit a's 375
    pool.store("c")  # a third tenant: the others shrink to make room
    assert pool.budgets() == {"a": 300, "b": 100, "c": 100}
    with pytest.raises(ValueError, match="share must be a number > 0"):
        pool.set_share("a", 0)
    with pytest.raises(KeyError, match="no tenant 'd'"):
        pool.set_share("d", 1)
