"""The CPU kernels split their rows over torch's thread pool and honour
torch.set_num_threads: results do not depend on the thread count, one thread
means no other thread of the process works, and more threads do share the work.

Which threads worked is read from each thread's CPU time in
/proc/self/task/<tid>/stat (Linux), so the checks do not depend on how busy
the machine is.
"""

from __future__ import annotations

import os
import sys
import threading
import time

import pytest
import torch

import make_inplace as mi

LINUX = sys.platform.startswith("linux") and os.path.isdir("/proc/self/task")


def _cases():
    """(name, make inputs, op) triples at sizes the kernels split over threads."""

    def softmax(dtype, **kw):
        shape = (64, 128, 64) if kw.get("dim") == 1 else (4, 4, 128, 128)

        def make():
            return (torch.randn(shape, dtype=dtype),)

        return make, lambda x: mi.softmax_(x, kw.get("dim", -1), scale=kw.get("scale"), causal=kw.get("causal", False))

    def layer_norm(dtype):
        def make():
            return torch.randn(512, 1024, dtype=dtype), torch.randn(1024, dtype=dtype), torch.randn(1024, dtype=dtype)

        return make, lambda x, w, b: mi.layer_norm_(x, 1024, w, b)

    def rms_norm(dtype):
        def make():
            return torch.randn(512, 1024, dtype=dtype), torch.randn(1024, dtype=dtype)

        return make, lambda x, w: mi.rms_norm_(x, 1024, w)

    def square_matmul(dtype, transpose):
        def make():
            return torch.randn(512, 256, dtype=dtype), torch.randn(256, 256, dtype=dtype) / 16, torch.randn(256, dtype=dtype)

        return make, lambda x, w, b: mi.square_matmul_(x, w, b, transpose=transpose, workspace_bytes=0)

    def outer(dtype):
        def make():
            a, b = torch.randn(16, 256, dtype=dtype), torch.randn(16, 256, dtype=dtype)
            g = torch.randn(16, 256, 256, dtype=dtype)
            return a, b, g, torch.empty(16, 256, 256, dtype=dtype), torch.empty_like(a), torch.empty_like(b)

        def op(a, b, g, out, ga, gb):
            mi.outer_product(a, b, out=out)
            mi.outer_product_backward(g, a, b, grad_a=ga, grad_b=gb)
            return out, ga, gb

        return make, op

    def trilinear(dtype):
        def make():
            feats, points = torch.randn(4096, 8, 32, dtype=dtype), (torch.rand(4096, 3) * 2 - 1).to(dtype)
            g = torch.randn(4096, 32, dtype=dtype)
            return feats, points, g, torch.empty(4096, 32, dtype=dtype), torch.empty_like(feats), torch.empty(4096, 3, dtype=dtype)

        def op(feats, points, g, out, gf, gp):
            mi.trilinear_interpolation(feats, points, out=out)
            mi.trilinear_interpolation_backward(g, points, feats, grad_feats=gf, grad_points=gp)
            return out, gf, gp

        return make, op

    cases = []
    for dtype in (torch.float32, torch.bfloat16, torch.float64):
        name = str(dtype).removeprefix("torch.")
        cases += [
            (f"softmax_ {name}", *softmax(dtype)),
            (f"softmax_ causal {name}", *softmax(dtype, scale=0.125, causal=True)),
            (f"softmax_ dim=1 {name}", *softmax(dtype, dim=1)),
            (f"layer_norm_ {name}", *layer_norm(dtype)),
            (f"rms_norm_ {name}", *rms_norm(dtype)),
            (f"square_matmul_ {name}", *square_matmul(dtype, False)),
            (f"square_matmul_ transpose {name}", *square_matmul(dtype, True)),
            (f"outer_product {name}", *outer(dtype)),
            (f"trilinear_interpolation {name}", *trilinear(dtype)),
        ]
    return cases


CASES = _cases()


class _Threads:
    """torch.set_num_threads(n) for the block, restored after."""

    def __init__(self, n: int):
        self.n = n

    def __enter__(self):
        self.saved = torch.get_num_threads()
        torch.set_num_threads(self.n)

    def __exit__(self, *exc):
        torch.set_num_threads(self.saved)


@pytest.mark.parametrize("name,make,op", CASES, ids=[c[0] for c in CASES])
def test_results_do_not_depend_on_threads(name, make, op):
    torch.manual_seed(0)
    inputs = make()
    runs = []
    for threads in (1, 2, 3):
        with _Threads(threads):
            args = [t.clone() for t in inputs]
            out = op(*args)
            runs.append([t.clone() for t in (out if isinstance(out, tuple) else (out,))])
    for other in runs[1:]:
        for a, b in zip(runs[0], other):
            assert torch.equal(a, b), name


def _cpu_ticks() -> dict[int, int]:
    """utime + stime of every thread of this process, in clock ticks."""
    ticks = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:  # the thread ended
            continue
        ticks[int(tid)] = int(fields[11]) + int(fields[12])
    return ticks


def _busy_threads(work, seconds: float = 0.6, most_wall: float = 60.0) -> dict[int, int]:
    """Runs work() repeatedly until this thread has spent about `seconds` of
    CPU time (on a busy machine the wall time stretches, not the count; at
    most `most_wall` seconds of it); returns the CPU ticks each thread of the
    process spent meanwhile."""
    work()  # start-up (thread pool, first-call costs) outside the count
    before = _cpu_ticks()
    cpu0, wall0 = time.thread_time(), time.monotonic()
    while time.thread_time() - cpu0 < seconds and time.monotonic() - wall0 < most_wall:
        work()
    after = _cpu_ticks()
    return {tid: after[tid] - before.get(tid, 0) for tid in after}


def _big_softmax():
    x = torch.randn(2048, 2048)
    return lambda: mi.softmax_(x, -1)


@pytest.mark.skipif(not LINUX, reason="reads per-thread CPU time from /proc")
def test_one_thread_means_one_thread():
    work = _big_softmax()
    with _Threads(1):
        spent = _busy_threads(work)
    me = threading.get_native_id()
    others = sum(t for tid, t in spent.items() if tid != me)
    assert spent[me] > 20, spent  # the measurement ran (ticks are 10 ms)
    assert others <= max(2, spent[me] // 20), f"other threads worked with torch.set_num_threads(1): {spent}"


@pytest.mark.skipif(not LINUX, reason="reads per-thread CPU time from /proc")
@pytest.mark.skipif((os.cpu_count() or 1) < 2, reason="needs two CPUs")
def test_two_threads_share_the_work():
    work = _big_softmax()
    with _Threads(2):
        spent = _busy_threads(work)
    workers = sorted((t for t in spent.values() if t > 0), reverse=True)
    assert len(workers) >= 2 and workers[1] >= workers[0] // 4, f"the work stayed on one thread: {spent}"


@pytest.mark.skipif(not LINUX, reason="reads per-thread CPU time from /proc")
def test_one_thread_holds_in_other_python_threads():
    """torch.set_num_threads applies to threads started later too (torch's
    thread pool applies it to each thread on its first parallel region)."""
    work = _big_softmax()
    result = {}

    def body():
        result["spent"] = _busy_threads(work)
        result["me"] = threading.get_native_id()

    with _Threads(1):
        t = threading.Thread(target=body)
        t.start()
        t.join()
    spent, me = result["spent"], result["me"]
    others = sum(v for tid, v in spent.items() if tid != me)
    assert spent[me] > 20, spent
    assert others <= max(2, spent[me] // 20), f"other threads worked with torch.set_num_threads(1): {spent}"
