import gc
import os

import pytest

import torch_dtr

if os.environ.get("DTR_TEST_SWAP") == "1":  # every test with the host tier on (NOTE [ Swapping ])
    torch_dtr.enable.__kwdefaults__["swap"] = True


def _front() -> str:
    return os.environ.get("DTR_TEST_FRONT", "python")


@pytest.fixture(autouse=True, scope="module")
def _front_for_module_fixtures():
    """The same front end for fixtures that enable a session once per module (they run before ``_always_disable``)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TORCH_DTR_FRONT", _front())
        yield


@pytest.fixture(autouse=True)
def _always_disable(monkeypatch):
    """No test may leave the runtime enabled for the next one. These tests drive the Python front end (the
    fallback, NOTE [ Choosing the front end ]) through ``torch_dtr.enable``, subprocesses included;
    ``DTR_TEST_FRONT=native`` runs them against the compiled one instead."""
    monkeypatch.setenv("TORCH_DTR_FRONT", _front())
    yield
    torch_dtr.disable()
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
