"""Strategies and checks shared by the property tests (tests/test_*_properties.py).

Values come from a torch generator seeded by a drawn integer, so hypothesis
shrinks shapes, dtypes and layouts while the values stay reproducible.
"""

from __future__ import annotations

import torch
from hypothesis import strategies as st

from conftest import DEVICES  # noqa: F401  (re-exported for the property tests)

DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16]
# 0 and 1, small primes and powers of two with their neighbours.
SMALL = [1, 0, 2, 3, 5, 7, 8, 13]
MEDIUM = [16, 31, 32, 33, 64, 127, 128, 257]
# Wide rows: past a warp's registers and past shared memory (staged and
# two-pass row kernels on CUDA).
WIDE = [1000, 1025, 4097, 65537]


def sizes(*, zero: bool = True, wide: bool = False) -> st.SearchStrategy[int]:
    pool = SMALL + MEDIUM + (WIDE if wide else [])
    return st.sampled_from([s for s in pool if zero or s > 0])


def capped(shape, cap: int = 1 << 18) -> list[int]:
    """shape with its largest dims halved until it has at most cap elements
    (so the CPU run stays fast; 0-sized shapes pass unchanged)."""
    shape = list(shape)
    while shape and 0 not in shape and _numel(shape) > cap:
        i = max(range(len(shape)), key=lambda k: shape[k])
        shape[i] = max(1, shape[i] // 2)
    return shape


def _numel(shape) -> int:
    n = 1
    for s in shape:
        n *= s
    return n


dtypes = st.sampled_from(DTYPES)
seeds = st.integers(0, 2**31 - 1)


def randn(shape, dtype, device, gen: torch.Generator, scale: float = 1.0, shift: float = 0.0) -> torch.Tensor:
    values = torch.randn(tuple(shape), generator=gen, dtype=torch.float64) * scale + shift
    return values.to(dtype).to(device)


# How a read-only input is laid out in memory; the values never change.
LAYOUTS = ["contiguous", "transposed", "strided", "offset"]


def with_layout(t: torch.Tensor, layout: str) -> torch.Tensor:
    """t's values in the given layout: transposed strides, every other element
    of a wider buffer, or a contiguous view at a storage offset."""
    if layout == "transposed" and t.dim() >= 2:
        return t.transpose(-1, -2).contiguous().transpose(-1, -2)
    if layout == "strided" and t.dim() >= 1:
        wide = torch.full((*t.shape[:-1], 2 * t.shape[-1]), float("nan"), dtype=t.dtype, device=t.device)
        wide[..., ::2] = t
        return wide[..., ::2]
    if layout == "offset":
        buf = torch.full((t.numel() + 3,), float("nan"), dtype=t.dtype, device=t.device)
        view = buf[3:].view(t.shape)
        view.copy_(t)
        return view
    return t.clone()


class Guarded:
    """A written tensor placed inside a larger buffer, to prove that the op
    writes nothing outside it (``intact()``)."""

    PAD = 17

    def __init__(self, values: torch.Tensor) -> None:
        n = values.numel()
        self.buffer = torch.randn(n + 2 * self.PAD, dtype=torch.float64).to(values.dtype).to(values.device)
        self.tensor = self.buffer[self.PAD : self.PAD + n].view(values.shape)
        self.tensor.copy_(values)
        self._margins = [self.buffer[: self.PAD].clone(), self.buffer[self.PAD + n :].clone()]

    def intact(self) -> bool:
        n = self.tensor.numel()
        now = [self.buffer[: self.PAD], self.buffer[self.PAD + n :]]
        return all(same_bytes(a, b) for a, b in zip(now, self._margins))


def _bytes(t: torch.Tensor) -> torch.Tensor:
    dense = torch.empty(t.numel(), dtype=t.dtype, device=t.device).copy_(t.detach().reshape(-1))
    return dense.view(torch.uint8)


def same_bytes(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bitwise equality (NaN patterns included), whatever the strides."""
    return a.shape == b.shape and torch.equal(_bytes(a), _bytes(b))


def max_error(result: torch.Tensor, truth: torch.Tensor) -> float:
    if result.numel() == 0:
        return 0.0
    return (result.detach().double().cpu() - truth.detach().double().cpu()).abs().max().item()


def _relative_error(result: torch.Tensor, truth: torch.Tensor) -> float:
    """||result - truth|| / (||truth|| + sqrt(numel)): relative for large values,
    absolute (per element, RMS) for small ones, as scale = max(1, |truth|) elsewhere."""
    if result.numel() == 0:
        return 0.0
    r, t = result.detach().double().cpu(), truth.detach().double().cpu()
    return (r - t).norm().item() / (t.norm().item() + t.numel() ** 0.5)


def one_ulp_away(t: torch.Tensor, seed: int) -> torch.Tensor:
    """t with every element moved one unit in the last place of its dtype, up or
    down at random (seeded): a neighbouring problem, always distinct from t
    (multiplying by 1 +- the unit roundoff often rounds back to t itself)."""
    up = torch.randint(0, 2, tuple(t.shape), generator=torch.Generator().manual_seed(seed), dtype=torch.bool)
    inf = torch.tensor(float("inf"), dtype=t.dtype)
    return torch.nextafter(t.detach().cpu(), torch.where(up, inf, -inf)).to(t.device)


def no_worse_than_torch(ours, theirs, truth: torch.Tensor, tol: float, what: str) -> None:
    """Ours no less accurate than torch in the same dtype: within tol, or within
    twice torch's own error, whichever is larger.

    ``ours``: our results on R problems, the case itself and R - 1 neighbours
    (inputs and parameters each moved one ulp, see ``one_ulp_away``); ``theirs``:
    for each of torch's algorithms (e.g. its default and its math attention
    backend), its results on the same R problems. Every result is measured
    against the float64 truth of the case itself. Errors are norms over the
    tensor (two equally valid rounding orders differ element by element far
    more than in norm), and each side's error is the RMS over the R problems;
    the worst of torch's algorithms sets the bound.

    Why R problems and not one: on the tiny tensors of the property tests (a
    gradient of a few elements, some of them exactly 0 in exact arithmetic,
    such as the key bias's of attention), one result's error is one draw of
    rounding noise, further amplified by whatever ill-conditioned step follows
    (a layer norm over 2 features, whose rstd blows up when they nearly tie):
    which of two rounding orders lands closer to the truth is luck. Measured
    on the CPU over the modules' property-test distributions in float16
    (tests/test_modules_properties.py), torch's own error on the input
    moved by one rounding exceeds twice its error on the input itself in about
    one case in ten, so "ours <= 2 x torch's error at the one point" failed
    torch against itself (11 of 5850 comparisons) and failed ours where it is
    no worse: in a float16 encoder layer over 2 features, ours's in_proj_bias
    gradient is off by 0.0075 where torch's is off by 0.0031, but on the case
    and 3 neighbours with input and parameters moved ours's errors are 0.0075,
    0.0051, 0.0053, 0.0028 and torch's 0.0031, 0.0010, 0.0108, 0.0144 (RMS
    0.0054 against 0.0091): each problem redraws the roundings of the attention
    output, which the 2-feature layer norm after it amplifies, and which side
    lands closer is luck. Moving the input alone is not enough: the first
    2-feature layer norm maps such neighbours to the same values (a bfloat16
    case stayed about 3 to 7 times torch's on all of them, and equal to or below
    torch's once the parameters moved too). Judged on the same R = 4 problems
    (input and parameters moved), ours stayed within 0.70 of the bound in every
    comparison (encoder and attention, float16 and bfloat16, 950 random
    examples), typically at 0.5 (errors equal to torch's).
    """
    if isinstance(ours, torch.Tensor):
        ours = [ours]
    theirs = [[t] if isinstance(t, torch.Tensor) else list(t) for t in theirs]

    def rms(results) -> tuple[float, list[float]]:
        errors = [_relative_error(r, truth) for r in results]
        return (sum(e * e for e in errors) / len(errors)) ** 0.5, errors

    err, per_problem = rms(ours)
    torch_errors = [rms(runs) for runs in theirs]
    bound = max(tol, 2 * max(e for e, _ in torch_errors))
    fmt = lambda errors: "[" + ", ".join(f"{e:.3g}" for e in errors) + "]"  # noqa: E731
    assert err <= bound, (
        f"{what}: relative error {err:.3g} > bound {bound:.3g} (RMS over {len(ours)} problems; ours "
        f"{fmt(per_problem)}, torch's " + "; ".join(fmt(e) for _, e in torch_errors) + ")"
    )
