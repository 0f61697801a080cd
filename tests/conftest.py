import pytest


def _have_gpu() -> bool:
    from engine.backend import cupy_or_none

    return cupy_or_none() is not None


def pytest_collection_modifyitems(config, items):
    if any("gpu" in item.keywords for item in items) and not _have_gpu():
        skip = pytest.mark.skip(reason="needs a CUDA GPU with CuPy")
        for item in items:
            if "gpu" in item.keywords:
                item.add_marker(skip)
