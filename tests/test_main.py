"""The main job (python -m make_inplace) on CPU: every row carries a memory figure,
and the CPU measure shows the memory an in-place op saves."""

from __future__ import annotations

import json

import torch

import make_inplace
from make_inplace.__main__ import main
from make_inplace._measure import MiB, cpu_peak_extra

CPU = torch.device("cpu")


def test_cpu_peak_extra_sees_what_softmax_saves():
    x = torch.randn(1024, 1024)  # 4 MiB of float32
    ours = cpu_peak_extra(lambda: make_inplace.softmax_(x))
    reference = cpu_peak_extra(lambda: torch.softmax(x, -1))
    assert ours < 64 << 10
    assert reference >= 4 * MiB


def test_cpu_peak_extra_counts_transients_not_only_what_is_kept():
    x = torch.randn(256, 256)
    # x * 2 is freed before the sum returns: the peak still holds it.
    assert cpu_peak_extra(lambda: (x * 2).sum()) >= x.nbytes


def test_main_job_cpu_rows_carry_memory(tmp_path, capsys):
    path = tmp_path / "rows.json"
    assert main(["--device", "cpu", "--ops", "softmax,layer_norm", "--json", str(path)]) == 0
    header = capsys.readouterr().out.splitlines()[0]
    assert f"{torch.get_num_threads()} threads" in header
    with open(path) as f:
        rows = json.load(f)["rows"]
    assert {r["op"] for r in rows} == {"softmax_", "layer_norm_"}
    for r in rows:
        assert r["ours_bytes"] is not None and r["torch_bytes"] is not None
        # Both overwrite their input; torch allocates an output of the input's size.
        assert r["ours_bytes"] < r["torch_bytes"]
        assert r["torch_bytes"] >= 1 * MiB
