"""Random state saved before a random op, so that recomputing it draws exactly what it drew."""

from __future__ import annotations

from typing import Any

import torch

# NOTE [ RNG replay ]
#
# 1. An op tagged ``nondeterministic_seeded`` (dropout's ``bernoulli_``, ``native_dropout``, ``randn_like``,
#    ...) saves the state of the generator it draws from right before it first runs: the ``generator=``
#    argument when given, else the default generator of the op's device (CPU or that CUDA device).
# 2. Recomputing it sets that state, runs the op, and restores the state the program had, so the replay
#    draws exactly what the first run drew and the program's own random stream is left untouched.


class RngState:
    """The state of the one generator an op draws from: an explicit generator, a CUDA device's default
    generator, or the CPU's default generator."""

    __slots__ = ("generator", "device", "saved")

    def __init__(self, generator: torch.Generator | None, device: torch.device | None, saved: torch.Tensor) -> None:
        self.generator = generator
        self.device = device  # a CUDA device, or None for the CPU's default generator
        self.saved = saved

    @classmethod
    def before(cls, args: tuple, kwargs: dict) -> RngState:
        """The state the op ``func(*args, **kwargs)`` will draw from, saved now (NOTE [ RNG replay ] 1)."""
        gen = kwargs.get("generator")
        if gen is not None:
            return cls(gen, None, gen.get_state())
        for a in args:
            if isinstance(a, torch.Tensor):
                if a.device.type == "cuda":
                    return cls(None, a.device, torch.cuda.get_rng_state(a.device))
                break
        return cls(None, None, torch.get_rng_state())

    def _get(self) -> torch.Tensor:
        if self.generator is not None:
            return self.generator.get_state()
        if self.device is not None:
            return torch.cuda.get_rng_state(self.device)
        return torch.get_rng_state()

    def _set(self, state: torch.Tensor) -> None:
        if self.generator is not None:
            self.generator.set_state(state)
        elif self.device is not None:
            torch.cuda.set_rng_state(state, self.device)
        else:
            torch.set_rng_state(state)

    def restore(self) -> None:
        """Set the generator back to the saved state (before retrying the op's first run)."""
        self._set(self.saved)

    def replay(self, func: Any, args: tuple, kwargs: dict) -> Any:
        """Run ``func`` from the saved state and give the program its own state back (NOTE [ RNG replay ] 2)."""
        now = self._get()
        self._set(self.saved)
        try:
            return func(*args, **kwargs)
        finally:
            self._set(now)
