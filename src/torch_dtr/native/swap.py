"""The host tier of a native session (NOTE [ Native front end ] 6): the core's ``Tier`` bookkeeping and the
Python front end's copies (``eager/swap.py``), over the slots of the C++ front end instead of tensors."""

from __future__ import annotations

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

    def copy_out(self, s: Storage) -> Any:
        v = s.payload
        ext = self.ext
        was = ext.attached()  # the copies are not the program's ops (and must not be managed: no_grad ones would)
        if was:
            ext.attach(False)
        try:
            src = v.take()  # the bytes now belong to ``src`` (the slot holds none): kept alive until copied
            with torch.no_grad():
                host, event = self.copy_bytes_out(src, src, s.nbytes)
        finally:
            if was:
                ext.attach(True)
        return host, event, src.device, v

    def copy_in(self, s: Storage) -> Any:
        host, event, device, v = s.host
        ext = self.ext
        was = ext.attached()
        if was:
            ext.attach(False)
        try:
            with torch.no_grad():
                v.fill(self.copy_bytes_in(host, event, device))
        finally:
            if was:
                ext.attach(True)
        return v
