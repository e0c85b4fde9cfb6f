"""The Triton kernels against float64 references: compiled on a CUDA machine, else on CPU
through Triton's interpreter (chosen when a kernel is defined, hence a fresh process)."""

from __future__ import annotations

import textwrap

import pytest

from tests._triton import run_triton_script

pytest.importorskip("triton")

SCRIPT = textwrap.dedent(
    """
    import math, torch
    from distill_guard.triton_kernels import (
        MODE_FORWARD_KL, MODE_JSD, MODE_REVERSE_KL, STAT_H_S, STAT_H_T, STAT_LOSS, STAT_LSE_S,
        STAT_LSE_T, STAT_TOP1_T, triton_entropy, triton_jsd, triton_loss_stats,
    )
    torch.manual_seed(0)
    dev = "cuda" if torch.cuda.is_available() else "cpu"

    from tests._reference import binary_entropy64, entropy64, jsd64

    def ref_entropy(x):
        return torch.from_numpy(entropy64(x)).to(x.device)

    def ref_jsd(a, b, beta):
        return torch.from_numpy(jsd64(a, b, beta)).to(a.device)

    # V not a multiple of the tile (2 x 128: three whole tiles and a partial one), -inf
    # (masked) entries, a constant row, a peak in the partial tile (each lane's rescaling), bf16
    x = torch.randn(6, 1000, device=dev) * 4
    x[0, :37] = -float("inf")
    x[1] = 0.0
    x[2, 990] = 40.0
    x[3, ::2] = -float("inf")  # half of every lane's columns
    small = {"tile_rows": 2, "tile_cols": 128}
    h = triton_entropy(x, **small)
    assert (h - ref_entropy(x)).abs().max() < 1e-4, (h, ref_entropy(x))
    assert abs(float(h[1]) - math.log(1000)) < 1e-4
    xb = x.bfloat16()
    assert (triton_entropy(xb, **small) - ref_entropy(xb.float())).abs().max() < 1e-3
    assert triton_entropy(x.reshape(2, 3, 1000), **small).shape == (2, 3)
    assert (triton_entropy(x) - ref_entropy(x)).abs().max() < 1e-4  # the default: one tile
    x_nan = x.clone(); x_nan[4, 500] = math.nan
    assert bool(triton_entropy(x_nan, **small)[4].isnan()) and not bool(triton_entropy(x_nan)[5].isnan())

    # the loss's statistics pass, per column lane over tiles, against float64
    s, t = torch.randn(5, 1000, device=dev) * 3, torch.randn(5, 1000, device=dev) * 2
    s[0, :300] = t[0, :300] = -float("inf")
    s[2, 999] = t[3, 10] = 30.0
    valid = torch.tensor([True, True, False, True, True], device=dev)
    for mode, inv_temp in ((MODE_JSD, 1.0), (MODE_FORWARD_KL, 0.7), (MODE_REVERSE_KL, 1.3)):
        st = triton_loss_stats(s, t, valid, inv_temp, mode, **small)[:, valid].cpu().double()
        x64, y64 = (s[valid] * inv_temp).cpu().double(), (t[valid] * inv_temp).cpu().double()
        ls, lt = torch.log_softmax(x64, -1), torch.log_softmax(y64, -1)
        ps, pt = ls.exp(), lt.exp()
        assert (st[STAT_LSE_S] - torch.logsumexp(x64, -1)).abs().max() < 1e-5
        assert (st[STAT_LSE_T] - torch.logsumexp(y64, -1)).abs().max() < 1e-5
        assert (st[STAT_H_S] - -(ps * ls.clamp_min(-1e4)).sum(-1)).abs().max() < 1e-4
        assert (st[STAT_H_T] - -(pt * lt.clamp_min(-1e4)).sum(-1)).abs().max() < 1e-4
        assert (st[STAT_TOP1_T] - lt.amax(-1)).abs().max() < 1e-5
        fwd = torch.where(pt == 0, 0.0, pt * (lt - ls)).sum(-1)
        rev = torch.where(ps == 0, 0.0, ps * (ls - lt)).sum(-1)
        want = {MODE_JSD: torch.zeros(4), MODE_FORWARD_KL: fwd, MODE_REVERSE_KL: rev}[mode]
        assert (st[STAT_LOSS] - want).abs().max() < 1e-4, (mode, st[STAT_LOSS], want)
    s_nan = s.clone(); s_nan[1, 700] = math.nan
    assert bool(triton_loss_stats(s_nan, t, None, 1.0, MODE_JSD, **small)[STAT_LSE_S, 1].isnan())

    a, b = torch.randn(5, 777, device=dev) * 5, torch.randn(5, 777, device=dev)
    b[0, :20] = -float("inf")
    b[1] = 0.0
    for beta in (0.1, 0.5, 0.9):
        d = triton_jsd(a, b, beta, block=128)
        r = ref_jsd(a, b, beta)
        assert (d - r).abs().max() < 1e-5, (beta, d, r)
        ceiling = binary_entropy64(beta)
        assert bool((d >= -1e-6).all()) and bool((d <= ceiling + 1e-6).all())
    assert triton_jsd(a, a, 0.5, block=128).abs().max() < 1e-6

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
    grid = np.concatenate([e + ulp * np.arange(-40, 41, dtype=np.float32) for e in edges + [near]])
    n = 70_000  # more rows than 128 programs of 512 take in one pass
    top1 = torch.from_numpy(np.resize(grid, n).astype(np.float32))
    top1[::17] = -1.0  # above −ln 6: flat there is not a uniform row
    rows = top1[:, None] - torch.rand(n, 6) * 3
    rows[:, 0] = top1
    rows[::7, 1:] = top1[::7, None]  # flat rows, above and below −ln 6
    rows[::11, 1:] = top1[::11, None] - 2**-10  # rows whose spread is atol
    rows[::13, 1:] = -float("inf")
    rows, top1 = rows.to(dev), top1.to(dev)
    for values, x in ((top1, rows), (top1, None)):
        for v_size in (vocab, None):
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
        x = torch.randn(3000, k) * 4 - 10
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
    for bound in (5.0, 0.1, 5.2):  # float32 rounds 5.2 down, 0.1 up
        b32 = np.float32(bound)
        around = b32 + np.spacing(b32) * np.arange(-30, 31, dtype=np.float32)
        gap = torch.from_numpy(np.resize(around, 70_000).astype(np.float32))
        tok = -torch.rand(70_000) * 8
        top1 = tok + gap
        gap = top1 - tok  # the float32 gaps both paths read
        check = TokenPairingCheck(max_median_gap=bound)
        for t1 in (top1, torch.where(torch.arange(70_000) == 4321, float("nan"), top1)):
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


def test_kernels_match_float64_references():
    run_triton_script(SCRIPT, timeout=240)
