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
