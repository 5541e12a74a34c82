"""Work the compiled front end does not manage, said once per session: torch.compile's compiled kernels and
torch.func's transforms.

# NOTE [ Unmanaged regions ]
#
# 1. A torch.compile region's kernels run on plain tensors below dispatch: what they compute is not managed
#    (never evicted; not counted on the CPU, counted as memory outside torch-dtr's reach on CUDA). When dynamo
#    starts compiling a frame while a session runs, a warning says so, once per session (dynamo's start callback).
#    A region compiled before ``enable()`` and only run under it is not seen (as with the Python front end, NOTE
#    [ Compiled regions ] 2).
# 2. Inside torch.func's transforms (vmap, grad, vjp, jvp and what is built on them) ops run on functorch's
#    wrapped tensors, which the kernel passes through: their work is outside the budget too. While a session runs,
#    the transforms' implementations are wrapped to warn once per session (the Python front end's list,
#    NOTE [ Compiled regions ] 3).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

from ..eager.front import _TRANSFORMS

COMPILED = ("torch_dtr: a torch.compile region is compiled while torch_dtr runs; what its compiled kernels compute is "
            "not managed (never evicted, not counted in the budget on the CPU; on CUDA counted as memory outside "
            "torch-dtr's reach), unless the backend runs aten ops (backend='eager'), which torch-dtr manages. Leave "
            "room for it in the budget (NOTE [ Unmanaged regions ]).")
TRANSFORMS = ("torch_dtr: ops inside torch.func transforms (vmap, grad, vjp, jvp, jacrev, ...) are not managed: what "
              "they compute is outside torch-dtr's budget (never evicted; not counted on the CPU, counted as memory "
              "outside its reach on CUDA). Run the transform outside torch_dtr.enable(), or leave room for it in the "
              "budget (NOTE [ Unmanaged regions ]).")


def watch(session: Any) -> Callable[[], None]:
    """Warn once per ``session`` (its ``warned``: a set of what was said) when a region starts that it does not
    manage; returns the function that stops watching (``disable()``)."""

    def say(what: str) -> None:
        if session.active and what not in session.warned:
            session.warned.add(what)
            warnings.warn(what, RuntimeWarning, stacklevel=4)

    def compiling(_args: Any) -> None:
        say(COMPILED)

    def wrapped(orig: Any) -> Any:
        def transform(*args: Any, **kwargs: Any) -> Any:
            say(TRANSFORMS)
            return orig(*args, **kwargs)

        return transform

    handler = _callbacks()
    if handler is not None:
        handler.register_start_callback(compiling)
    for mod, name, orig in _TRANSFORMS:
        setattr(mod, name, wrapped(orig))

    def stop() -> None:
        if handler is not None:
            try:
                handler.remove_start_callback(compiling)
            except ValueError:  # already gone
                pass
        for mod, name, orig in _TRANSFORMS:
            setattr(mod, name, orig)

    return stop


def _callbacks() -> Any:
    try:
        from torch._dynamo.callback import callback_handler
    except ImportError:  # a torch without dynamo's callbacks: compiled regions go unsaid
        return None
    return callback_handler if hasattr(callback_handler, "register_start_callback") else None
