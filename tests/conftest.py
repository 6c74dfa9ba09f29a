"""Shared fixtures: one real verifier per test session (its workers start in ~0.2 s, but reuse is cheaper)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from populora_env.verifier import Verifier

CRUXEVAL = Path(
    os.environ.get(
        "POPULORA_CRUXEVAL", Path(__file__).resolve().parents[2] / "shared/data/cruxeval/cruxeval.jsonl"
    )
)


@pytest.fixture(scope="session")
def verifier():
    """The real verifier with default (full) isolation and language guards."""
    with Verifier(timeout=2.0) as v:
        yield v


@pytest.fixture(scope="session")
def bare_verifier():
    """The real verifier with the language guards off: only the kernel layers stand between a program
    and the machine, so hostile programs exercise the actual boundary."""
    with Verifier(timeout=2.0, language_guards=False) as v:
        yield v
