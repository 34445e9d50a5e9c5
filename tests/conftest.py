"""Shared test setup: the repository root on sys.path and the one_thread fixture (the `slow` marker: pytest.ini)."""

import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture
def one_thread():
    """The tiny model gains nothing from intra-op threads; on a busy 2-core machine they spin."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)
