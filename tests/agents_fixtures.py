"""Shared fixtures for the LLM-agent tests: one tiny base built offline per test session.

Import the fixtures into a test module (``from tests.agents_fixtures import tiny_base_dir``); the lead owns
``conftest.py``.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from agents.base import TinyBaseConfig, build_tiny_base
from evolve.genome import torch_threads

__all__ = ["TEST_BASE_CONFIG", "one_torch_thread", "tiny_base_dir", "torch_threads"]

# Far smaller than the default base: builds in seconds, still a real Llama with a trained BPE tokenizer.
TEST_BASE_CONFIG = TinyBaseConfig(
    vocab_size=384,
    hidden_size=64,
    num_layers=2,
    num_heads=2,
    intermediate_size=128,
    max_position_embeddings=1024,
    corpus_documents=300,
    seq_len=128,
    batch_size=8,
    steps=20,
    warmup_steps=2,
)


@pytest.fixture(scope="session")
def tiny_base_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Directory of a tiny Llama base (HF format) built for this test session."""
    return build_tiny_base(
        tmp_path_factory.mktemp("tiny-base-cache"), TEST_BASE_CONFIG, progress=False, num_threads=1
    )


@pytest.fixture
def one_torch_thread() -> Iterator[None]:
    """Run a test with one torch intra-op thread (restored afterwards).

    Models this small gain nothing from intra-op threads, and on a shared, loaded machine OpenMP
    contention made 2 threads ~15x slower than 1 (measured on the development box).
    """
    with torch_threads(1):
        yield
