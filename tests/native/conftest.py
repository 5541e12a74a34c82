
import pytest


@pytest.fixture(autouse=True, scope="module")
def _python_reference_for_module_fixtures():
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TORCH_DTR_FRONT", "python")
        yield


@pytest.fixture(autouse=True)
def _python_reference(monkeypatch):
    """These tests hold the compiled front end (``torch_dtr.native.enable``) against the Python one, which they reach
    through ``torch_dtr.enable`` (subprocesses included): pinned here, as the default would choose the compiled one
    (NOTE [ Choosing the front end ])."""
    monkeypatch.setenv("TORCH_DTR_FRONT", "python")
    yield
