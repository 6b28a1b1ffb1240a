"""Shared test fixtures. Tiers (see DESIGN.md) are pytest markers declared in pyproject.toml."""
from __future__ import annotations

import os
import socket

import psutil
import pytest


def _has_cuda() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except Exception:
        return False


def _has_engine_extra() -> bool:
    import importlib.util

    return all(importlib.util.find_spec(m) for m in ("torch", "safetensors", "tokenizers"))


def pytest_collection_modifyitems(config, items):
    """Tiers a machine cannot run are skipped with the reason: the engine extra (tier 3 and the
    `engine` marker) in a core install (`pip install -e ".[test]"`), CUDA (tier 5) without a GPU."""
    engine = _has_engine_extra()
    no_engine = pytest.mark.skip(reason='needs the engine extra: pip install torch -e ".[engine]"')
    cuda = _has_cuda()
    no_gpu = pytest.mark.skip(reason="needs a CUDA GPU (tier 5); run on the GPU machine")
    for item in items:
        if not engine and ("embedded" in item.keywords or "engine" in item.keywords):
            item.add_marker(no_engine)
        if not cuda and "gpu" in item.keywords:
            item.add_marker(no_gpu)


@pytest.fixture
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(autouse=True)
def no_process_left_behind():
    """Every test must end every process it started (children of this pytest process)."""
    me = psutil.Process(os.getpid())
    before = {p.pid for p in me.children(recursive=True)}
    yield
    import time

    deadline = time.monotonic() + 5
    while True:
        left = [p for p in me.children(recursive=True) if p.pid not in before and p.is_running()
                and p.status() != psutil.STATUS_ZOMBIE]
        if not left or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    for p in left:
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass
    assert not left, f"test left processes behind: {[(p.pid, p.name()) for p in left]}"
