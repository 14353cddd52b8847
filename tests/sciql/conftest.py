"""sciql tests share one setting: tiny networks run with one intra-op thread."""
import pytest
import torch


@pytest.fixture(autouse=True)
def _one_thread():
    """Tiny networks: one intra-op thread (two threads on a loaded 2-core machine are ~20x slower here)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
