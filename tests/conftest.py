import os
import random
import re
import subprocess
import sys

import pytest
import torch
from hypothesis import HealthCheck, settings
from torch.utils._python_dispatch import TorchDispatchMode

# Tests on "cuda" run only where a GPU is present (the device machine);
# CI has none and runs the CPU half.
CUDA = torch.cuda.is_available()
DEVICES = ["cpu"] + (["cuda"] if CUDA else [])
requires_cuda = pytest.mark.skipif(not CUDA, reason="needs a CUDA device")

# Property tests (tests/test_*_properties.py). "ci", the default: 50 fixed
# examples, so the suite stays fast on two cores and CI is reproducible. "gpu":
# many random examples on every device present, for the GPU machine; select it
# with MAKE_INPLACE_HYPOTHESIS_PROFILE=gpu or pytest --hypothesis-profile=gpu.
_SLOW_OK = [HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much]
settings.register_profile("ci", max_examples=50, deadline=None, derandomize=True, database=None,
                          suppress_health_check=_SLOW_OK, print_blob=True)
settings.register_profile("gpu", max_examples=200, deadline=None, database=None,
                          suppress_health_check=_SLOW_OK, print_blob=True)
settings.load_profile(os.environ.get("MAKE_INPLACE_HYPOTHESIS_PROFILE", "ci"))


class DispatchRecorder(TorchDispatchMode):
    """Records the ops dispatched under it, as "namespace.op.overload" strings."""

    def __init__(self):
        super().__init__()
        self.seen = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.seen.append(str(func))
        return func(*args, **(kwargs or {}))


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
    yield
    # Cached blocks of one test would starve the others when several pytest
    # workers share one GPU.
    if torch.cuda.is_initialized():
        torch.cuda.empty_cache()


def launch_orders(values):
    """The same shapes in increasing and decreasing order, and alternating:
    every pair as larger, smaller, larger again. Each launch follows calls at
    other shapes, so cached launch state must not go stale between them."""
    up = sorted(values)
    alternating = []
    for i, small in enumerate(up):
        for large in up[i + 1:]:
            for v in (large, small, large):
                if not alternating or alternating[-1] != v:
                    alternating.append(v)
    return {"increasing": up, "decreasing": up[::-1], "alternating": alternating}


def device_mismatch(op: str, name: str, t: torch.Tensor, ref_name: str, ref: torch.Tensor) -> str:
    """The shared validation's message (make_inplace/ops/_common.py) as a regex: the op, both
    arguments and their devices, and the fix."""
    return (rf"^make_inplace\.{re.escape(op)}: {name} is on {re.escape(str(t.device))}, but {ref_name} is on "
            rf"{re.escape(str(ref.device))}; all tensor arguments must be on one device: "
            rf"move {name} with \.to\({ref_name}\.device\)$")


def pytest_addoption(parser):
    parser.addoption("--shuffle-seed", type=int, default=None,
                     help="run the tests in a random order drawn from this seed (the GPU run uses it: "
                          "kernels' cached launch state must not depend on which tests ran before)")


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "fresh_process: runs in a pytest subprocess of its own, so a memory measurement "
                   "does not depend on the caching allocator's history left by other tests")


_IN_FRESH_PROCESS = "MAKE_INPLACE_TEST_IN_FRESH_PROCESS"


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem):
    """A fresh_process test runs again, alone, in a new interpreter; this one reports its outcome."""
    if pyfuncitem.get_closest_marker("fresh_process") is None or os.environ.get(_IN_FRESH_PROCESS):
        return None
    # The same interpreter, working directory and import path as this run.
    node = f"{pyfuncitem.path}::{pyfuncitem.nodeid.split('::', 1)[1]}"
    path = os.pathsep.join(p for p in sys.path if p)
    result = subprocess.run(
        [sys.executable, "-m", "pytest", node, "-q", "-p", "no:cacheprovider", "-p", "no:randomly"],
        env={**os.environ, _IN_FRESH_PROCESS: "1", "PYTHONPATH": path},
        capture_output=True, text=True, timeout=600,
    )
    if result.returncode != 0:
        pytest.fail(f"in a fresh process:\n{result.stdout[-4000:]}{result.stderr[-2000:]}", pytrace=False)
    return True


def pytest_collection_modifyitems(config, items):
    seed = config.getoption("--shuffle-seed")
    if seed is not None:
        random.Random(seed).shuffle(items)
