"""Shared fixtures: tiny random teachers of both architectures, tied and untied, with GQA; test_fsdp's world."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.helpers import TEACHER_KINDS, make_teacher

# One intra-op thread: on a shared 2-core machine two OpenMP threads per process made
# the LRC-core tests 10-20x slower under load (9.8 s vs 100-200 s measured).
torch.set_num_threads(1)


def pytest_collection_modifyitems(config, items):
    """`slurm` tests are opt-in: skipped unless the -m expression names them (`pytest -m slurm`),
    so plain `pytest` and `pytest -m "not slow"` skip them cleanly."""
    if "slurm" in (config.getoption("-m") or ""):
        return
    skip = pytest.mark.skip(reason="opt-in: run with `pytest -m slurm` (needs scripts/slurm-local)")
    for item in items:
        if "slurm" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(params=TEACHER_KINDS)
def teacher(request) -> torch.nn.Module:
    return make_teacher(request.param)


@pytest.fixture(scope="module", params=["llama-tied", "qwen2-untied"])
def world(request, tmp_path_factory) -> Path:
    """test_fsdp's world, shared with test_zero and test_teacher_recompute: a saved teacher, a corpus
    and a trained warm start (:func:`tests.launch.make_world`). Parametrise it indirectly to take
    one teacher kind. A module with its own ``world`` fixture (test_world, test_evaluate, ...) uses
    that one instead."""
    from tests.launch import make_world

    return make_world(tmp_path_factory.mktemp(request.param), request.param)


@pytest.fixture
def token_batch() -> torch.Tensor:
    g = torch.Generator().manual_seed(1)
    return torch.randint(0, 97, (2, 16), generator=g)
