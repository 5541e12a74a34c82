import gc

import pytest

import torch_dtr


@pytest.fixture(autouse=True)
def _always_disable():
    """No test may leave the runtime enabled for the next one."""
    yield
    torch_dtr.disable()
    gc.collect()


