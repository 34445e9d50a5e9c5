"""Shared test setup: the repository root on sys.path, the `slow` marker, and the one_thread fixture."""

import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def pytest_configure(config):
    config.addinivalue_line("markers", "slow: end-to-end runs that take tens of seconds (CI runs them too)")


@pytest.fixture
def one_thread():
    """The tiny model gains nothing from intra-op threads; on a busy 2-core machine they spin."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)
