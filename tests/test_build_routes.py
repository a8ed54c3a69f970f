"""The three build routes compile the same sources into working libraries.

setuptools: the library this test session imported (pip install -e . built it).
JIT: a fresh torch.utils.cpp_extension.load build, forced by the env variable.
CMake: a configure + build whose library torch.ops.load_library loads with
no make_inplace import at all.
Each route's library runs square_matmul_ in a subprocess and is checked there.
"""

import os
import shutil
import subprocess
import sys
import textwrap

import pytest
import torch

import make_inplace
from make_inplace import _loader, _sources

pytestmark = pytest.mark.build_routes

ROOT = _sources.SOURCE_ROOT

CHECK_OP = textwrap.dedent(
    """
    import torch
    x = torch.randn(6, 9, dtype=torch.float64); w = torch.randn(9, 9, dtype=torch.float64)
    expected = x @ w.t()
    torch.ops.make_inplace.square_matmul_(x, w, transpose=True)
    assert torch.allclose(x, expected), "wrong values"
    assert x._version == 1, "version counter not bumped"
    print("OK", torch.ops.make_inplace.build_backends())
    """
)


def run_python(code, env=None, timeout=900):
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env={**os.environ, **(env or {})},
        capture_output=True, text=True, timeout=timeout,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return result


def test_setuptools_route_library_is_the_one_loaded():
    loaded = _loader.load()
    if os.environ.get(_loader.FORCE_JIT_ENV) != "1":
        assert os.path.dirname(loaded) == _sources.PACKAGE_DIR and os.path.basename(loaded).startswith("_C")
    assert "cpu" in make_inplace.build_backends()


def test_jit_route_builds_and_announces_itself(tmp_path):
    env = {_loader.FORCE_JIT_ENV: "1", "TORCH_EXTENSIONS_DIR": str(tmp_path), "MAX_JOBS": "2"}
    result = run_python("import make_inplace\n" + CHECK_OP, env)
    assert "JIT-building" in result.stderr
    assert "OK" in result.stdout
    assert any(name.startswith("make_inplace_jit") for name in os.listdir(tmp_path))


@pytest.mark.skipif(shutil.which("cmake") is None, reason="cmake not installed")
def test_cmake_route_loads_without_the_python_package(tmp_path):
    build = tmp_path / "build"
    prefix = torch.utils.cmake_prefix_path
    generator = ["-G", "Ninja"] if shutil.which("ninja") else []
    with_cuda = "ON" if torch.cuda.is_available() else "OFF"
    subprocess.run(
        ["cmake", "-S", ROOT, "-B", str(build), f"-DCMAKE_PREFIX_PATH={prefix}", f"-DMAKE_INPLACE_WITH_CUDA={with_cuda}"]
        + generator, check=True, capture_output=True, timeout=300,
    )
    subprocess.run(["cmake", "--build", str(build), "-j", "2"], check=True, capture_output=True, timeout=1800)
    library = build / "libmake_inplace_ops.so"
    assert library.exists()
    code = f"import torch\ntorch.ops.load_library({str(library)!r})\n" + CHECK_OP + (
        "\nimport sys\nassert 'make_inplace' not in sys.modules"
    )
    result = subprocess.run([sys.executable, "-c", code], cwd=str(tmp_path), capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "OK" in result.stdout
