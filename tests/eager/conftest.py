import gc
import os
import sys

import pytest

import torch_dtr

if os.environ.get("DTR_TEST_SWAP") == "1":  # every test with the host tier on (NOTE [ Swapping ])
    torch_dtr.enable.__kwdefaults__["swap"] = True


# NOTE [ One behavioural suite ]
# Every test here runs against both front ends (NOTE [ Choosing the front end ]): "default", what
# ``torch_dtr.enable()`` chooses for the test's options (the compiled front end, or the Python one where a test
# asks for one of its own options), and "python", the fallback, forced. ``DTR_TEST_FRONT=default`` (or ``python``)
# runs one of them.
# Tests marked ``python_front`` test the Python front end's own internals (``DTRTensor``, its size cache)
# and run on it alone; tests marked ``front_free`` drive no front end (a probe of the shared size rules) and run
# once. The front end is set per module (``TORCH_DTR_FRONT``, which subprocesses inherit), so that
# fixtures which enable a session once per module run on it too.
FRONTS = [f for f in ("default", "python") if (os.environ.get("DTR_TEST_FRONT") or f) == f]


@pytest.fixture(autouse=True, scope="module", params=FRONTS)
def dtr_front(request):
    """The front end the module's tests drive through ``torch_dtr.enable``."""
    with pytest.MonkeyPatch.context() as mp:
        if request.param == "python":
            mp.setenv("TORCH_DTR_FRONT", "python")
        else:
            mp.delenv("TORCH_DTR_FRONT", raising=False)
        yield request.param


def pytest_collection_modifyitems(config, items):
    """A ``python_front`` test runs once, on the Python front end; a ``front_free`` one once, on the first front."""
    keep, drop = [], []
    for item in items:
        params = getattr(getattr(item, "callspec", None), "params", {})
        front = params.get("dtr_front")
        if ((item.get_closest_marker("python_front") is not None and front == "default")
                or (item.get_closest_marker("front_free") is not None and front not in (None, FRONTS[0]))):
            drop.append(item)
        else:
            keep.append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep


@pytest.fixture(autouse=True)
def _always_disable(dtr_front):
    """No test may leave the runtime enabled for the next one, nor its managed tensors alive: pytest keeps a raising
    test's exception (``sys.last_value``, for post-mortem debugging), whose frames hold them (an xfailed BudgetError's
    did, and ``torch_dtr.native.passthrough()`` in a later test refused to run)."""
    yield
    torch_dtr.disable()
    for name in ("last_type", "last_value", "last_traceback", "last_exc"):
        if hasattr(sys, name):
            delattr(sys, name)
    gc.collect()




def pytest_terminal_summary(terminalreporter, exitstatus, config):
    """List the cases that ran at another budget than their name says (test_equivalence's fallbacks)."""
    lines = []
    for reports in terminalreporter.stats.values():
        for rep in reports:
            for name, value in getattr(rep, "user_properties", ()):
                if name == "budget_fallback" and getattr(rep, "when", "call") == "call":
                    lines.append(f"{rep.nodeid}: {value}")
    if lines:
        terminalreporter.section("budgets that fell back (the case ran at another budget than its name)")
        for line in sorted(lines):
            terminalreporter.write_line(line)
