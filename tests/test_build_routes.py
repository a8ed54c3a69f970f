"""The build routes read one config (build_config.json) and build working libraries.

Agreement (seconds, no compiling): setup.py's extension, the JIT loader's
cpp_extension.load call, CMake's targets (its file API) and the MindSpore
bridge's compiler commands list the same sources, flags and CUDA arch default.
Builds (minutes, marked build_routes): the setuptools library this session
imported; a fresh JIT build; a CMake build that torch.ops.load_library loads
with no make_inplace import. Each built library runs square_matmul_ in a
subprocess and is checked there.
"""

import glob
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import textwrap

import pytest
import torch
from torch.utils import cpp_extension

import make_inplace
from make_inplace import _loader, _sources

ROOT = _sources.SOURCE_ROOT
CONFIG = _sources.config()
TORCH_INCLUDE = cpp_extension.include_paths()[0]
TORCH_STD = _sources.torch_cxx_standard(TORCH_INCLUDE)

# torch's CMake config needs a full CUDA toolkit when torch is a CUDA build,
# even for a CPU-only library (e.g. the CUDA wheel of torch on a machine with nvcc alone).
CMAKE_SKIP = (
    "cmake not installed" if shutil.which("cmake") is None
    else "a CUDA build of torch without a full CUDA toolkit: torch's CMake config cannot be used"
    if torch.version.cuda and (cpp_extension.CUDA_HOME is None or _sources.missing_cuda_headers(cpp_extension.CUDA_HOME))
    else None
)
needs_cmake = pytest.mark.skipif(CMAKE_SKIP is not None, reason=CMAKE_SKIP or "")

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

# Runs setup.py with setuptools.setup replaced by a recorder; FAKE_CUDA_HOME
# makes torch look like a CUDA build with that toolkit (to reach the CUDA branch on CPU).
CAPTURE_SETUP = textwrap.dedent(
    """
    import json, os, runpy, setuptools
    captured = {}
    setuptools.setup = lambda **kw: captured.update(kw)
    if os.environ.get("FAKE_CUDA_HOME"):
        import torch
        from torch.utils import cpp_extension
        torch.version.cuda = "13.0"
        cpp_extension.CUDA_HOME = os.environ["FAKE_CUDA_HOME"]
    runpy.run_path("setup.py", run_name="__main__")
    ext = captured["ext_modules"][0]
    print(json.dumps({"sources": ext.sources, "args": ext.extra_compile_args, "link": ext.extra_link_args,
                      "arch_list": os.environ.get("TORCH_CUDA_ARCH_LIST")}))
    """
)


def run_python(code, env=None, timeout=900, cwd=ROOT):
    environ = {k: v for k, v in os.environ.items() if k not in ("TORCH_CUDA_ARCH_LIST", "MAKE_INPLACE_CPU_ONLY")}
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=cwd, env={**environ, **(env or {})},
        capture_output=True, text=True, timeout=timeout,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return result


def relative(paths):
    return [os.path.relpath(p, ROOT) for p in paths]


def setup_py_extension(env=None):
    result = run_python(CAPTURE_SETUP, env)
    return json.loads(result.stdout.strip().splitlines()[-1]), result.stderr


def fake_cuda_home(tmp_path, headers=_sources.CUDA_HEADERS):
    (tmp_path / "include").mkdir(parents=True)
    for header in headers:
        (tmp_path / "include" / header).touch()
    return str(tmp_path)


# --- one config, read by every route ------------------------------------------


def test_setup_py_cpu_extension_is_the_config():
    ext, stderr = setup_py_extension({"MAKE_INPLACE_CPU_ONLY": "1"})
    assert ext["sources"] == relative(_sources.cpu_sources() + _sources.python_sources())
    assert ext["args"]["cxx"] == CONFIG["cxx_flags"] + _sources.openmp_flags()
    assert ext["link"] == _sources.openmp_flags()
    assert not any(flag.startswith("-std") for flag in ext["args"]["cxx"] + ext["args"]["nvcc"])
    assert "CPU kernels only: MAKE_INPLACE_CPU_ONLY=1" in stderr


def test_setup_py_cuda_extension_is_the_config(tmp_path):
    ext, stderr = setup_py_extension({"FAKE_CUDA_HOME": fake_cuda_home(tmp_path)})
    assert ext["sources"] == relative(_sources.cpu_sources() + _sources.python_sources() + _sources.cuda_sources())
    assert ext["arch_list"] == CONFIG["cuda_arch_list"] == "8.0+PTX;9.0a"
    defines = ["-D" + d for d in CONFIG["torch_library"]["cuda_defines"] + CONFIG["torch_library"]["sm90a_defines"]]
    assert ext["args"]["nvcc"] == CONFIG["nvcc_flags"] + defines
    assert ext["args"]["cxx"] == CONFIG["cxx_flags"] + _sources.openmp_flags() + defines
    assert "CPU and CUDA kernels for 8.0+PTX;9.0a" in stderr


def test_setup_py_falls_back_to_cpu_without_toolkit_headers(tmp_path):
    ext, stderr = setup_py_extension({"FAKE_CUDA_HOME": fake_cuda_home(tmp_path, headers=()), "CPATH": "", "CPLUS_INCLUDE_PATH": ""})
    assert ext["sources"] == relative(_sources.cpu_sources() + _sources.python_sources())
    assert "CPU kernels only" in stderr and "lacks cuda_runtime.h" in stderr


def test_setup_py_without_torch_stops_at_once_naming_no_build_isolation():
    code = "import runpy, sys; sys.modules['torch'] = None; runpy.run_path('setup.py', run_name='__main__')"
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert result.returncode != 0
    assert "--no-build-isolation" in result.stderr and "torch is not importable" in result.stderr


def test_build_isolation_would_not_fetch_torch():
    # A torch in [build-system].requires makes plain `pip install .` download the newest torch.
    tomllib = pytest.importorskip("tomllib")
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        pyproject = tomllib.load(f)
    assert not any(r.startswith("torch") for r in pyproject["build-system"]["requires"])
    assert "torch>=2.11.0" in pyproject["project"]["dependencies"]


def test_jit_route_compiles_the_config(monkeypatch, tmp_path):
    calls = []
    monkeypatch.setattr(cpp_extension, "load", lambda **kwargs: calls.append(kwargs))
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    monkeypatch.delenv("TORCH_CUDA_ARCH_LIST", raising=False)
    monkeypatch.setenv("MAKE_INPLACE_CPU_ONLY", "1")
    _loader._jit_build()
    (call,) = calls
    assert call["sources"] == _sources.cpu_sources() + _sources.python_sources()
    assert call["extra_cflags"] == CONFIG["cxx_flags"] + _sources.openmp_flags()
    assert call["extra_include_paths"] == [os.path.join(ROOT, d) for d in CONFIG["torch_library"]["include_dirs"]]


@pytest.mark.skipif(torch.cuda.is_available(), reason="with a GPU the JIT route builds the visible GPUs' archs")
def test_jit_route_arch_default_is_the_config(monkeypatch):
    monkeypatch.delenv("TORCH_CUDA_ARCH_LIST", raising=False)
    assert _loader._jit_arch_list() == CONFIG["cuda_arch_list"]


def cmake_codemodel(build):
    """Configures the top-level project (with the MindSpore bridge) and returns
    {target name: target reply} and the cache, from CMake's file API."""
    query = build / ".cmake" / "api" / "v1" / "query"
    query.mkdir(parents=True)
    (query / "codemodel-v2").touch()
    (query / "cache-v2").touch()
    env = {k: v for k, v in os.environ.items() if k != "TORCH_CUDA_ARCH_LIST"}
    subprocess.run(
        ["cmake", "-S", ROOT, "-B", str(build), f"-DCMAKE_PREFIX_PATH={torch.utils.cmake_prefix_path}",
         "-DMAKE_INPLACE_WITH_CUDA=OFF", "-DMAKE_INPLACE_MINDSPORE_BRIDGE=ON"],
        check=True, capture_output=True, timeout=300, env=env,
    )
    reply = build / ".cmake" / "api" / "v1" / "reply"
    targets = {}
    for path in glob.glob(str(reply / "target-*.json")):
        with open(path, encoding="utf-8") as f:
            target = json.load(f)
        targets[target["name"]] = target
    (cache_file,) = glob.glob(str(reply / "cache-v2-*.json"))
    with open(cache_file, encoding="utf-8") as f:
        cache = {entry["name"]: entry["value"] for entry in json.load(f)["entries"]}
    return targets, cache


def compile_flags(target, language="CXX"):
    (group,) = [g for g in target["compileGroups"] if g["language"] == language]
    fragments = " ".join(f["fragment"] for f in group["compileCommandFragments"]).split()
    return fragments, group["languageStandard"]["standard"]


@needs_cmake
def test_cmake_targets_are_the_config(tmp_path):
    targets, cache = cmake_codemodel(tmp_path / "build")
    ops = targets["make_inplace_ops"]
    assert [s["path"] for s in ops["sources"]] == relative(_sources.cpu_sources())
    flags, standard = compile_flags(ops)
    assert standard == TORCH_STD
    assert set(CONFIG["cxx_flags"] + _sources.openmp_flags()) <= set(flags)
    assert cache["TORCH_CUDA_ARCH_LIST"] == CONFIG["cuda_arch_list"]

    bridge = targets["make_inplace_ms_cpu"]
    assert [s["path"] for s in bridge["sources"]] == relative(_sources.cpu_sources("mindspore_bridge"))
    flags, standard = compile_flags(bridge)
    assert standard == TORCH_STD
    assert set(CONFIG["cxx_flags"] + CONFIG["mindspore_bridge"]["cxx_flags"]) <= set(flags)


def test_mindspore_bridge_build_is_the_config(monkeypatch, tmp_path):
    spec = importlib.util.spec_from_file_location("ms_build", os.path.join(ROOT, "make_inplace_mindspore", "_build.py"))
    ms_build = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(ms_build)  # imports neither MindSpore nor torch
    commands = []
    monkeypatch.setattr(ms_build.subprocess, "run", lambda cmd, check: commands.append(cmd))
    monkeypatch.delenv("TORCH_CUDA_ARCH_LIST", raising=False)
    ms_build.build_cpu(TORCH_INCLUDE, str(tmp_path))
    ms_build.build_cuda(TORCH_INCLUDE, str(tmp_path))
    cpu, cuda = commands
    assert [a for a in cpu if a.endswith(".cpp")] == _sources.cpu_sources("mindspore_bridge")
    assert [a for a in cuda if a.endswith((".cpp", ".cu"))] == _sources.cuda_sources("mindspore_bridge")
    bridge = CONFIG["mindspore_bridge"]
    assert set(CONFIG["cxx_flags"] + _sources.openmp_flags() + bridge["cxx_flags"] + bridge["link_flags"]) <= set(cpu)
    assert set(CONFIG["nvcc_flags"]) <= set(cuda)
    assert f"-std=c++{TORCH_STD}" in cpu and f"-std=c++{TORCH_STD}" in cuda
    assert ms_build.gencode_flags(CONFIG["cuda_arch_list"]) == [
        "-gencode=arch=compute_80,code=sm_80", "-gencode=arch=compute_80,code=compute_80",
        "-gencode=arch=compute_90a,code=sm_90a",
    ]
    assert set(ms_build.gencode_flags(CONFIG["cuda_arch_list"])) <= set(cuda)


# --- each route builds a working library (minutes) ------------------------------


@pytest.mark.build_routes
def test_setuptools_route_library_is_the_one_loaded():
    loaded = _loader.load()
    if os.environ.get(_loader.FORCE_JIT_ENV) != "1":
        assert os.path.dirname(loaded) == _sources.PACKAGE_DIR and os.path.basename(loaded).startswith("_C")
    assert "cpu" in make_inplace.build_backends()


@pytest.mark.build_routes
def test_jit_route_builds_and_announces_itself(tmp_path):
    env = {_loader.FORCE_JIT_ENV: "1", "TORCH_EXTENSIONS_DIR": str(tmp_path), "MAX_JOBS": "2"}
    if not torch.cuda.is_available():
        env["MAKE_INPLACE_CPU_ONLY"] = "1"  # no GPU to run CUDA kernels on: a CPU build is the one to check
    # The package's wrappers on the JIT library take its eager entry points too.
    entries = "print('ENTRIES', sorted(make_inplace._loader.eager_entries()))\n"
    result = run_python("import make_inplace\n" + CHECK_OP + entries, env)
    assert "JIT-building" in result.stderr
    assert "OK" in result.stdout
    assert "ENTRIES ['layer_norm_', 'outer_product', 'rms_norm_', 'softmax_', 'square_matmul_', 'trilinear_interpolation']" in result.stdout
    assert any(name.startswith("make_inplace_jit") for name in os.listdir(tmp_path))


@pytest.mark.build_routes
@needs_cmake
def test_cmake_route_loads_without_the_python_package(tmp_path):
    build = tmp_path / "build"
    generator = ["-G", "Ninja"] if shutil.which("ninja") else []
    with_cuda = "ON" if torch.cuda.is_available() else "OFF"
    subprocess.run(
        ["cmake", "-S", ROOT, "-B", str(build), f"-DCMAKE_PREFIX_PATH={torch.utils.cmake_prefix_path}",
         f"-DMAKE_INPLACE_WITH_CUDA={with_cuda}"] + generator,
        check=True, capture_output=True, timeout=300,
    )
    subprocess.run(["cmake", "--build", str(build), "-j", "2"], check=True, capture_output=True, timeout=1800)
    library = build / "libmake_inplace_ops.so"
    assert library.exists()
    code = f"import torch\ntorch.ops.load_library({str(library)!r})\n" + CHECK_OP + (
        "\nimport sys\nassert 'make_inplace' not in sys.modules"
    )
    run_python(code, cwd=str(tmp_path), timeout=300)
