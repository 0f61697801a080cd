"""The GPU tests' CuPy, as a fixture (imported only when a test asks for it: collection needs no GPU)."""
import pytest


@pytest.fixture(scope="module")
def cp():
    import cupy

    return cupy
