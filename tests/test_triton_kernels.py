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

    print("ok")
    """
)


def test_kernels_match_float64_references():
    run_triton_script(SCRIPT, timeout=240)
