"""A newer version of a storage is released while tensors still name an older version that forwards to it.

Handles (``Storage.refs``) are counted on the version a cell names. After an in-place write, cells move to
the newest version lazily (``Cell.current()``, on their next use), so the newest version's ``refs`` counts
only the cells that already moved. When those die and no recipe reads the newest version, ``drop_ref``
releases it (or, when a recipe reads it, drops it = evicts it) although cells on older versions are alive
and will follow ``forward`` to it on their next use:

- released: the next use raises ``InternalError: cannot rematerialize Storage(... released ...): it has no
  recipe`` (this script, with ``torch.unsafe_split``, whose outputs share a buffer but are not views of
  each other, so neither keeps the other alive);
- dropped: needless evictions and rematerializations even with ``budget=None``. ``nn.LSTMCell`` (gates
  from ``unsafe_split`` + ``sigmoid_``/``tanh_``) rematerializes its gate chain
  (addmm -> add_ -> unsafe_split -> sigmoid_ ... ) in backward: 90 rematerializations in one step of
  ``models.lstm_loop`` at budget=None.

Run: python tests/eager/repros/newest_version_released.py   (exit 1 while the bug is present)
"""

import gc
import sys

import torch

import torch_dtr


def main() -> bool:
    w = torch.randn(4, requires_grad=True)
    ref0, ref1 = torch.unsafe_split(w.detach() * 1, 2)
    ref0.sigmoid_()
    torch_dtr.enable(budget=None)
    try:
        a = w * 1
        c0, c1 = torch.unsafe_split(a, 2)  # one managed storage S, two cells on it
        c0.sigmoid_()  # new version S' of S; both cells still name S
        torch_dtr.eager.peek(c0)  # c0's cell moves to S' (S'.refs = 1)
        del c0  # S'.refs -> 0 and no recipe reads S' -> S' released
        gc.collect()
        try:
            got = torch_dtr.unwrap(c1.sum())  # c1's cell follows S.forward -> S' (released)
        except AssertionError as e:  # torch_dtr InternalError
            print("BUG:", e)
            return False
    finally:
        torch_dtr.disable()
    ok = torch.equal(got, ref1.sum())
    print("OK" if ok else f"BUG: wrong value {got} vs {ref1.sum()}")
    return ok


def lstm_remats_at_unlimited_budget() -> int:
    torch.manual_seed(0)
    cell = torch.nn.LSTMCell(4, 3)
    x = torch.randn(2, 4)
    torch_dtr.enable(budget=None)
    try:
        h, c = cell(x)
        (h.sum() + c.sum()).backward()
        return torch_dtr.stats().rematerializations
    finally:
        torch_dtr.disable()


if __name__ == "__main__":
    ok = main()
    n = lstm_remats_at_unlimited_budget()
    print("nn.LSTMCell forward+backward at budget=None: rematerializations =", n)
    sys.exit(0 if ok else 1)
