"""The memory-budget benchmark's logic (the GPU numbers come from the device run)."""

from __future__ import annotations

import json
import os

import pytest
import torch

from make_inplace.budget import ROWS, BudgetConfig, _longest_fitting, run_memory_budget
from make_inplace._measure import MiB


def _cfg(refine_steps: int = 0) -> BudgetConfig:
    return BudgetConfig(
        device="cpu", d_model=16, nhead=2, dim_feedforward=32, batch=1, seq_lens=[8, 16],
        dtypes=["float32"], budgets_gib=[1.0], refine_steps=refine_steps,
    )


def test_cpu_run_writes_json_and_csv(tmp_path):
    lines = []
    result = run_memory_budget("cpu", config=_cfg(), out_dir=str(tmp_path), log=lines.append)
    assert set(result["rows"]) == set(ROWS)
    for row in ROWS:
        points = result["points"]["float32"][row]
        assert [p["seq_len"] for p in points] == [8, 16]
        assert all(p["status"] == "ok" and p["ms"] > 0 and p["peak_reserved_mib"] is None for p in points)
    assert result["fast_path_taken"]["float32"] is True
    assert not result["memory_measured"] and result["fits"] == {}
    with open(tmp_path / "memory_budget.json") as f:
        assert json.load(f)["config"]["d_model"] == 16
    with open(tmp_path / "memory_budget.csv") as f:
        assert len(f.read().strip().splitlines()) == 1 + 2 * len(ROWS)
    assert any("skipping the plot" in line for line in lines) or os.path.exists(tmp_path / "memory_budget.png")


def _point(seq_len: int, mib: float | None, status: str = "ok") -> dict:
    return {"seq_len": seq_len, "status": status, "peak_reserved_mib": mib, "peak_allocated_mib": mib, "ms": 1.0}


def test_longest_fitting_bisects_between_last_fit_and_first_failure():
    # A row whose memory grows linearly: 1 MiB per 64 tokens; budget 1 GiB fits 65536 tokens.
    probe = lambda s: _point(s, s / 64)  # noqa: E731
    points = [_point(s, s / 64) for s in (16384, 32768, 65536)] + [_point(131072, 131072 / 64)]
    fit = _longest_fitting(_cfg(refine_steps=10), points, 1.0, probe)
    assert fit["longest_seq_len"] == 65536 and fit["first_not_fitting"] == 65536 + 64
    assert not fit["at_least"]
    # Without refinement: the grid answer.
    fit = _longest_fitting(_cfg(refine_steps=0), points, 1.0, probe)
    assert fit["longest_seq_len"] == 65536 and fit["first_not_fitting"] == 131072


def test_longest_fitting_counts_oom_as_not_fitting_and_reports_open_ends():
    points = [_point(1024, 100.0), _point(2048, None, "oom")]
    probe = lambda s: _point(s, None, "oom")  # noqa: E731
    fit = _longest_fitting(_cfg(refine_steps=2), points, 4.0, probe)
    assert fit["longest_seq_len"] == 1024 and len(fit["refinement_points"]) == 2
    everything_fits = [_point(1024, 1.0), _point(2048, 2.0)]
    fit = _longest_fitting(_cfg(refine_steps=2), everything_fits, 4.0, probe)
    assert fit["longest_seq_len"] == 2048 and fit["at_least"]
    nothing_fits = [_point(1024, 8 * 1024.0)]
    fit = _longest_fitting(_cfg(refine_steps=0), nothing_fits, 4.0, probe)
    assert fit["longest_seq_len"] is None and fit["first_not_fitting"] == 1024


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_small_run_measures_memory_and_fits():
    cfg = BudgetConfig(
        device="cuda", d_model=256, nhead=4, dim_feedforward=1024, batch=2, seq_lens=[256, 1024, 2048],
        dtypes=["float16"], budgets_gib=[0.0625], refine_steps=2,
    )
    result = run_memory_budget("cuda", config=cfg, out_dir=None)
    pts = result["points"]["float16"]
    for row in ROWS:
        assert all(p["peak_reserved_mib"] is not None and p["peak_reserved_mib"] >= 0 for p in pts[row] if p["status"] == "ok")
    # Weights materialized: one L x S buffer where torch eager holds two (less
    # the one (N, L, d) buffer more we may hold at that moment).
    by_len = lambda row: {p["seq_len"]: p for p in pts[row]}  # noqa: E731
    ours, ref = by_len("inplace_weights"), by_len("torch_eager_weights")
    compared = 0
    for s in (1024, 2048):
        if ours[s]["status"] == ref[s]["status"] == "ok":
            scores_mib = 2 * 4 * s * s * 2 / MiB
            activation_mib = 2 * s * 256 * 2 / MiB
            assert ref[s]["peak_allocated_mib"] - ours[s]["peak_allocated_mib"] >= scores_mib - activation_mib
            compared += 1
    assert compared == 2
    fits = result["fits"]["float16"]
    assert fits["inplace_weights"][0]["longest_seq_len"] >= fits["torch_eager_weights"][0]["longest_seq_len"]
