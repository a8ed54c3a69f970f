"""benchmarks/summarize.py: a pytest-benchmark run -> summary.csv, summary.md and summary.png (no GPU needed)."""

from __future__ import annotations

import csv
import json
import pathlib
import sys

import pytest

BENCHMARKS = pathlib.Path(__file__).resolve().parent.parent / "benchmarks"
sys.path.append(str(BENCHMARKS))  # summarize.py and summary_plot.py are scripts there, not a package

import summarize  # noqa: E402
import summary_plot  # noqa: E402

DEVICE = "NVIDIA Test GPU"
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def _bench(group: str, impl: str, ms: float, **extra) -> dict:
    info = {"impl": impl, "median_ms": ms, "device": DEVICE, "torch": "2.13.0", "peak_extra_reserved_mib": 0.0, **extra}
    return {"group": group, "extra_info": info}


def _run(tmp_path: pathlib.Path) -> pathlib.Path:
    """A small run: a memory-bound op, a compute-bound op with its workspace_bytes=0 variant, and a layer."""
    benchmarks = []
    for dtype in ("bfloat16", "float32"):
        group = f"softmax {dtype} (1024, 512)"
        benchmarks += [_bench(group, "make_inplace", 0.010, gb_per_s=2700.0, share_of_copy_bandwidth=0.9),
                       _bench(group, "torch eager", 0.012, gb_per_s=2250.0), _bench(group, "torch.compile", 0.011)]
        group = f"square_matmul {dtype} (4096, 1024)"
        benchmarks += [_bench(group, "make_inplace", 0.050, tflops=350.0), _bench(group, "make_inplace ws=0", 0.060, tflops=290.0),
                       _bench(group, "torch.matmul", 0.045, tflops=390.0)]
    group = "layers InplaceLinear float16 (8, 1024, 1024) h=16"
    benchmarks += [_bench(group, "make_inplace", 0.30), _bench(group, "torch eager", 0.31)]
    path = tmp_path / "bench.json"
    path.write_text(json.dumps({"datetime": "2026-11-25T00:00:00", "benchmarks": benchmarks}))
    return path


def _rows(folder: pathlib.Path) -> list[dict]:
    with open(folder / "summary.csv", newline="") as f:
        return list(csv.DictReader(f))


def _check_png(path: pathlib.Path) -> None:
    data = path.read_bytes()
    assert data.startswith(PNG_SIGNATURE) and len(data) < 300 * 1024


def test_out_writes_tables_and_plot(tmp_path, capsys):
    out = tmp_path / "gpu"
    assert summarize.main([f"{_run(tmp_path)}@abc1234", "--out", str(out)]) == 0
    assert "summary.png" in capsys.readouterr().out
    rows = _rows(out)
    assert {r["op"] for r in rows} == {"softmax_", "square_matmul_", "square_matmul_ (workspace_bytes=0)", "InplaceLinear"}
    assert len(rows) == 2 + 4 + 1
    _check_png(out / "summary.png")
    # Variants share their op's panel; the memory-bound rows carry a ceiling share.
    panels = summary_plot.panels(rows)
    assert list(panels) == ["square_matmul_", "softmax_", "InplaceLinear"] and len(panels["square_matmul_"]) == 4
    assert {r["ceiling_share"] for r in panels["softmax_"]} == {"0.90"}
    assert summary_plot.case_label(panels["square_matmul_"][1]) == "(4096, 1024) bf16 ws=0"


def test_plot_redraws_from_summary_csv(tmp_path, monkeypatch):
    out = tmp_path / "gpu"
    summarize.main([f"{_run(tmp_path)}@abc1234", "--out", str(out)])
    (out / "summary.png").unlink()
    assert summarize.main(["--plot", str(out)]) == 0
    _check_png(out / "summary.png")
    # The rows come from summary.csv, the GPU in the title from summary.md's sources.
    drawn = {}
    monkeypatch.setattr(summarize, "plot", lambda rows, path, title: drawn.update(rows=rows, path=path, title=title))
    summarize.main(["--plot", str(out)])
    assert drawn["rows"] == _rows(out) and drawn["path"] == str(out / "summary.png")
    assert DEVICE in drawn["title"] and "2.13.0" in drawn["title"]
    with pytest.raises(SystemExit):
        summarize.main(["--plot", str(out), "--out", str(tmp_path / "other")])


def test_tables_without_matplotlib(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # `import matplotlib` raises ImportError
    out = tmp_path / "gpu"
    assert summarize.main([f"{_run(tmp_path)}@abc1234", "--out", str(out)]) == 0
    assert len(_rows(out)) == 7 and (out / "summary.md").exists() and not (out / "summary.png").exists()
    printed = capsys.readouterr().out
    assert "matplotlib is not installed" in printed and "and summary.png" not in printed


def test_rerun_of_one_file_replaces_its_source(tmp_path):
    # Two per-op files at one commit, then one of them again at another: the
    # summary keeps the other file's source and only the re-run's for its op.
    def per_op(name: str, group: str, peer: str) -> pathlib.Path:
        path = tmp_path / name
        benches = [_bench(group, "make_inplace", 0.010), _bench(group, peer, 0.012)]
        path.write_text(json.dumps({"datetime": "2026-11-25T00:00:00", "benchmarks": benches}))
        return path

    softmax = per_op("bench_softmax.json", "softmax bfloat16 (1024, 512)", "torch eager")
    matmul = per_op("bench_square_matmul.json", "square_matmul bfloat16 (4096, 1024)", "torch.matmul")
    out = tmp_path / "gpu"
    summarize.main([f"{softmax}@aaaaaaa", f"{matmul}@aaaaaaa", "--out", str(out)])
    summarize.main([str(out / "summary.csv"), f"{softmax}@bbbbbbb", "--out", str(out)])
    assert {(r["op"], r["commit"]) for r in _rows(out)} == {("softmax_", "bbbbbbb"), ("square_matmul_", "aaaaaaa")}
    _, sources = summarize.load([str(out / "summary.csv")])
    assert {(s["file"], s["commit"]) for s in sources} == {
        ("bench_square_matmul.json", "aaaaaaa"), ("bench_softmax.json", "bbbbbbb")}
