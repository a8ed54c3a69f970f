import random

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


def launch_orders(values):
    """The same shapes in increasing, decreasing and alternating order (the
    largest between every two others), so each launch follows calls at other
    shapes: cached launch state must not go stale between them."""
    up = sorted(values)
    alternating = [v for small in up[:-1] for v in (up[-1], small)] + [up[-1]]
    return {"increasing": up, "decreasing": up[::-1], "alternating": alternating}


def pytest_addoption(parser):
    parser.addoption("--shuffle-seed", type=int, default=None,
                     help="run the tests in a random order drawn from this seed (the GPU run uses it: "
                          "kernels' cached launch state must not depend on which tests ran before)")


def pytest_collection_modifyitems(config, items):
    seed = config.getoption("--shuffle-seed")
    if seed is not None:
        random.Random(seed).shuffle(items)
