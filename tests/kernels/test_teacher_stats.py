"""The teacher checks' Triton kernels (:mod:`distill_guard.kernels.teacher_stats`) against the
PyTorch path they replace, exactly, at ulps around every bound: compiled on a CUDA machine, else
through Triton's interpreter (a fresh process)."""

from __future__ import annotations

import textwrap

import pytest

from tests._triton import run_triton_script

pytest.importorskip("triton")

SCRIPT = textwrap.dedent(
    """
    import math, torch
    torch.manual_seed(0)
    dev = "cuda" if torch.cuda.is_available() else "cpu"

    # the teacher-collapse check's fused statistics: the PyTorch path's counts at their
    # boundaries (|v − (−ln V)| = atol, the near-uniform bound, flat rows above −ln k) and maxima
    import numpy as np
    from distill_guard.checks import TeacherCollapseCheck
    from distill_guard.checks.base import to_host
    from distill_guard.checks.teacher_collapse import _View
    from distill_guard.kernels.teacher_stats import combine_parts, triton_view_parts
    from distill_guard.observations import RunSpec
    from distill_guard.signals import uniform_logprob
    check, vocab = TeacherCollapseCheck(atol=2**-10), 151936  # a tolerance the grid can hit
    target = np.float32(uniform_logprob(vocab))
    ulp = np.float32(np.spacing(target))
    edges = [target + np.float32(s * check.atol) for s in (-1, 1)]
    near = np.float32(check._near_bound(RunSpec(vocab_size=vocab)))
    steps = np.arange(-40, 41, dtype=np.float32)  # each edge's own ulps (−ln V's are twice near's)
    grid = np.concatenate([e + ulp * steps for e in edges] + [near + np.spacing(near) * steps])
    n = 70_000  # more rows than 128 programs of 512 take in one pass
    top1 = torch.from_numpy(np.resize(grid, n).astype(np.float32))
    top1[::17] = -1.0  # above −ln 6: flat there is not a uniform row
    rows = top1[:, None] - torch.rand(n, 6) * 3
    rows[:, 0] = top1
    rows[::7, 1:] = top1[::7, None]  # flat rows, above and below −ln 6
    rows[::11, 1:] = top1[::11, None] - 2**-10  # rows whose spread is atol
    rows[::13, 1:] = -float("inf")
    rows, top1 = rows.to(dev), top1.to(dev)
    # all rows once (several passes of the programs), the other cases on the first 5000
    few = slice(0, 5000)
    for values, x, v_size in (
        (top1, rows, vocab), (top1[few], rows[few], None),
        (top1[few], None, vocab), (top1[few], None, None),
    ):
        run = RunSpec(vocab_size=v_size)
        view = _View(x if x is not None else values, x is not None, values)
        want = to_host(check._parts(view, run))
        got = combine_parts(triton_view_parts(
            values, x, target=float(target) if v_size else math.nan, atol=check.atol,
            low_bound=check._near_bound(run) if v_size and x is not None else -math.inf,
            flat_below=-math.log(6) if x is not None else -math.inf,
        ).cpu().numpy())
        for name, w in want.items():
            if name in ("sum", "sum_sq"):
                assert abs(got[name] - w) <= 1e-12 * abs(w), (name, got[name], w)
            elif name == "mass":
                assert abs(got[name] - w) <= 1e-6 * w, (name, got[name], w)
            else:
                assert got[name] == w, (name, v_size, x is None, got[name], w)

    # the rows' top-1 as amax(dim=1): NaN, +inf and all −inf rows, widths up to MAX_FUSED_K
    from distill_guard.kernels.teacher_stats import MAX_FUSED_K, triton_gap_parts, triton_row_max
    for k in (1, 6, 16, 17, 64, MAX_FUSED_K):
        x = torch.randn(3000 if k <= 16 else 600, k) * 4 - 10  # several blocks of rows each
        x[2::9] = -float("inf")
        x[::5, k // 2] = float("nan")
        x[1::7, k - 1] = float("inf")
        x[3::11, 0] = float("nan")
        x[3::11, -1] = float("inf")
        x = x.to(dev)
        want = x.amax(dim=1)
        for rows in (x, x[::2], x.t().contiguous().t()):  # strided rows, strided columns
            got, ref = triton_row_max(rows).cpu(), rows.amax(dim=1).cpu()
            assert torch.equal(got.isnan(), ref.isnan()), k
            assert torch.equal(got[~ref.isnan()], ref[~ref.isnan()]), k
    assert torch.isnan(want[::5]).all()

    # the pairing check's gaps: ≥ bound as compared in float64, at ulps around a bound that
    # float32 does not hold, and a non-finite gap reaching the sum
    from distill_guard.checks import TokenPairingCheck
    from distill_guard.checks.pairing import _Gaps
    for bound, n in ((5.0, 70_000), (0.1, 5_000), (5.2, 5_000)):  # 5.2 rounds down, 0.1 up
        b32 = np.float32(bound)
        around = b32 + np.spacing(b32) * np.arange(-30, 31, dtype=np.float32)
        gap = torch.from_numpy(np.resize(around, n).astype(np.float32))
        tok = -torch.rand(n) * 8
        top1 = tok + gap
        gap = top1 - tok  # the float32 gaps both paths read
        check = TokenPairingCheck(max_median_gap=bound)
        for t1 in (top1, torch.where(torch.arange(n) == 4321, float("nan"), top1)):
            gaps = _Gaps(tok.to(dev), t1.to(dev))
            want = to_host({"gap_sum": gaps.gap.sum(dtype=torch.float64),
                            "far": gaps.far(bound).sum(dtype=torch.float64)})
            got = triton_gap_parts(t1.to(dev), tok.to(dev), bound).tolist()
            assert got[1] == want["far"], (bound, got, want)
            assert math.isfinite(got[0]) == math.isfinite(want["gap_sum"]), (got, want)
            if math.isfinite(want["gap_sum"]):
                assert abs(got[0] - want["gap_sum"]) <= 1e-12 * abs(want["gap_sum"]) + 1e-9
    print("ok")
    """
)


def test_teacher_stats_kernels_match_the_pytorch_path():
    run_triton_script(SCRIPT, timeout=240)
