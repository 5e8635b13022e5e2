import numpy as np
import pytest

import qlinear

ISAS = qlinear.cpu_info()["available_isas"]


@pytest.fixture(params=ISAS)
def isa(request):
    """Runs a test once per ISA level this machine has (scalar included)."""
    previous = qlinear.cpu_info()["active_isa"]
    qlinear.set_isa(request.param)
    yield request.param
    qlinear.set_isa(previous)


@pytest.fixture
def rng():
    return np.random.default_rng(1234)
