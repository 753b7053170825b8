"""Shared pytest configuration: hardware markers and automatic skipping."""
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
