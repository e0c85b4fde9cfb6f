"""The team kernel against float64, through Triton's interpreter on CPU (a launch per pass) or
compiled on CUDA (one cooperative launch, barriers between the passes, fewer teams than rows so
that teams take turns and reuse their partials' two slots): every mode, masked rows, a −inf entry,
a constant row, a temperature, a last slice shorter than the others."""

from __future__ import annotations

import textwrap

import pytest

from tests._triton import run_triton_script

pytest.importorskip("triton")

SCRIPT = textwrap.dedent(
    """
    import torch
    from distill_guard.kernels.team_loss import team_loss
    from distill_guard.losses import _torch_backward, _torch_forward
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    torch.manual_seed(0)
    for mode, beta in ((0, 0.3), (1, 0.0), (2, 1.0)):
        for masked in (False, True):
            n, v = 7, 1000  # slices of 256 columns in blocks of 128: a team of 4, the last short
            s = torch.randn(n, v) * 3
            t = torch.randn(n, v) * 2
            s[0, :50] = -float("inf")
            t[1] = 0.0
            valid = torch.ones(n, dtype=torch.bool)
            if masked:
                valid[[2, 6]] = False
            w = valid.double() * 0.37
            g = torch.full((n, v), float("nan"), device=dev)
            stats = team_loss(s.to(dev), t.to(dev), valid.to(dev) if masked else None, 0.8,
                              beta, mode, w.float().to(dev), g, slice_cols=256, sub=128,
                              num_warps=4, teams=3)
            ref = _torch_forward(s.double(), t.double(), valid, beta, 0.8, mode, 4)
            g_ref = torch.empty(n, v, dtype=torch.float64)
            _torch_backward(s.double(), t.double(), ref, w, beta, 0.8, mode, 4, g_ref)
            a, b = stats.cpu()[:, valid].double(), ref[:, valid]
            err = torch.where(a == b, 0.0, (a - b).abs()).max()  # an infinite KL is equal
            assert err < 1e-4, (mode, masked, a, b)
            assert (g.cpu().double() - g_ref).abs().max() < 1e-5 * g_ref.abs().max(), (mode, masked)
            assert bool((g.cpu()[~valid] == 0).all())
    print("ok")
    """
)


def test_team_kernel_matches_float64_in_every_mode():
    run_triton_script(SCRIPT, timeout=240)
