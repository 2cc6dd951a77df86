"""Fixtures shared by the test suite."""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def root_dir() -> Path:
    """The repository root (scenarios/, README.md)."""
    return ROOT
