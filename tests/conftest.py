"""Shared test setup: the repository root on sys.path and the `slow` marker."""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def pytest_configure(config):
    config.addinivalue_line("markers", "slow: end-to-end runs that take tens of seconds (CI runs them too)")
