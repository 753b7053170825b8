"""Shared pytest configuration: hardware markers, automatic skipping, the build's feature table."""
import importlib.util
from pathlib import Path

import pytest
import torch


def pytest_configure(config):
    config.addinivalue_line("markers", "cuda: needs a CUDA GPU")
    config.addinivalue_line("markers", "sm90: needs compute capability 9.0")


def _has_sm90():
    if not torch.cuda.is_available():
        return False
    return any(torch.cuda.get_device_capability(i) == (9, 0) for i in range(torch.cuda.device_count()))


def pytest_collection_modifyitems(config, items):
    has_cuda = torch.cuda.is_available()
    has_sm90 = _has_sm90()
    skip_cuda = pytest.mark.skip(reason="needs a CUDA GPU")
    skip_sm90 = pytest.mark.skip(reason="needs compute capability 9.0")
    for item in items:
        if item.get_closest_marker("cuda") is not None and not has_cuda:
            item.add_marker(skip_cuda)
        if item.get_closest_marker("sm90") is not None and not has_sm90:
            item.add_marker(skip_sm90)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """A partial build (FLASH_ATTN_CUTE_HDIMS / _DTYPES / _PASSES) skips the tests of the kernels it
    left out, with the reason, instead of failing them. Under torch.compile the NotImplementedError
    reaches the test wrapped in a dynamo error that quotes it."""
    outcome = yield
    report = outcome.get_result()
    exc = call.excinfo
    if report.when == "call" and exc is not None and "flash_attn_cute: this build has no" in str(exc.value):
        report.outcome = "skipped"
        report.longrepr = (str(item.path), item.location[1] or 0, f"Skipped: {exc.value}")


@pytest.fixture(scope="session")
def features():
    """csrc/features.py, the build's feature table (not an installed module)."""
    path = Path(__file__).resolve().parent.parent / "csrc" / "features.py"
    spec = importlib.util.spec_from_file_location("_flash_attn_cute_features", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
