"""The host tier of a native session (NOTE [ Native front end ] 6): the core's ``Tier`` bookkeeping and the
Python front end's copies (``eager/swap.py``), over the slots of the C++ front end instead of tensors."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch

from ..core import Storage
from ..eager.swap import HostTier


class NativeTier(HostTier):
    """A swapped value's bytes leave its slot for a host copy, and come back into the same slot, so the handles
    and recipes that name the slot see them again. The copy is the ``Value`` (the core's payload) plus the
    Python front end's host copy of the bytes."""

    def __init__(self, ext: Any, cuda: bool, budget: int | None, bandwidth: float | None = None) -> None:
        super().__init__(cuda, budget, bandwidth)
        self.ext = ext

    @contextlib.contextmanager
    def _below(self) -> Iterator[None]:
        """The copies are not the program's ops (and must not be managed: ``no_grad`` ones would be)."""
        ext = self.ext
        was = ext.attached()
        if was:
            ext.attach(False)
        try:
            with torch.no_grad():
                yield
        finally:
            if was:
                ext.attach(True)

    def copy_out(self, s: Storage) -> Any:
        v = s.payload
        with self._below():
            src = v.take()  # the bytes now belong to ``src`` (the slot holds none): kept alive until copied
            host, event = self.copy_bytes_out(src, src, s.nbytes)
        return host, event, src.device, v

    def copy_in(self, s: Storage) -> Any:
        host, event, device, v = s.host

        def run() -> torch.Tensor:
            with self._below():
                return self.copy_bytes_in(host, event, device)

        # the device may be full although the budget holds: evict and retry (NOTE [ Host copies ] 7)
        flat = run() if self.oom is None else self.oom(run, s.nbytes, None)
        with self._below():
            v.fill(flat)
        return v
