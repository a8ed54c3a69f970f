import pytest
import torch

# Tests on "cuda" run only where a GPU is present (the device machine);
# CI has none and runs the CPU half.
CUDA = torch.cuda.is_available()
DEVICES = ["cpu"] + (["cuda"] if CUDA else [])
requires_cuda = pytest.mark.skipif(not CUDA, reason="needs a CUDA device")


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
