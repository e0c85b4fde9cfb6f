"""The team kernel compiled on CUDA: the path distill_loss takes, its barrier (each program arrives
twice per row of the JSD), against the three-pass kernels and float64 at V = 151936."""

from __future__ import annotations

import pytest
import torch

from distill_guard import losses
from distill_guard.kernels import team_loss as tm
from distill_guard.losses import distill_loss
from tests.test_losses import reference_divergence

NEEDS_TORCH_MEMORY_SAVER = False
V = 151_936


def _rows(n, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    s = (torch.randn(n, V, device="cuda", generator=g) * 3).bfloat16()
    t = (torch.randn(n, V, device="cuda", generator=g) * 3).bfloat16()
    return s, t


@pytest.mark.parametrize("beta", [0.0, 0.5, 1.0])
def test_distill_loss_takes_the_team_kernel_and_matches_the_three_passes(beta):
    s, t = _rows(37)
    mask = torch.ones(37, device="cuda", dtype=torch.bool)
    mask[[3, 20]] = False
    losses._TEAM_REFUSED.clear()
    x = s.clone().requires_grad_()
    out = distill_loss(x, t, beta=beta, temperature=1.5, mask=mask)
    (grad,) = torch.autograd.grad(out.loss, x)
    assert not losses._TEAM_REFUSED, "the team kernel did not launch"
    losses.TEAM_KERNEL = False
    try:
        y = s.clone().requires_grad_()
        ref = distill_loss(y, t, beta=beta, temperature=1.5, mask=mask)
        (g_ref,) = torch.autograd.grad(ref.loss, y)
    finally:
        losses.TEAM_KERNEL = True
    assert abs(float(out.loss) - float(ref.loss)) < 1e-5
    for name in ("student_entropy", "teacher_entropy", "teacher_top1_logprob", "student_lse"):
        a, b = getattr(out, name)[mask], getattr(ref, name)[mask]
        assert float((a - b).abs().max()) < 1e-4, name
    eps = torch.finfo(torch.bfloat16).eps
    assert float((grad.float() - g_ref.float()).abs().max()) <= eps * float(g_ref.abs().max())
    assert bool((grad[~mask] == 0).all())
    r_in = s[:8].double().requires_grad_()
    f64 = reference_divergence(r_in, t[:8].double(), beta, 1.5)
    assert float((out.per_token[:8].double() - f64).abs()[mask[:8]].max()) < 1e-5


def test_each_program_arrives_twice_per_row_and_every_row_is_written():
    s, t = _rows(1000, seed=1)
    n = s.shape[0]
    w = torch.full((n,), 1.0 / n, device="cuda")
    g = torch.full_like(s, float("nan"))
    _, sync = tm._team_launch(
        s, t, None, 1.0, 0.5, 0, w, g,
        slice_cols=tm.TEAM_SLICE, sub=tm.TEAM_SUB, num_warps=tm.TEAM_NUM_WARPS,
        l2_share=tm.TEAM_L2_SHARE, teams=7,
    )  # fmt: skip
    team_size = -(-V // tm.TEAM_SLICE)
    turns = [len(range(k, n, 7)) for k in range(7)]
    assert sync.tolist() == [2 * team_size * k for k in turns]  # two barriers per row (JSD)
    assert not bool(g.isnan().any())


def test_a_team_too_large_for_the_device_raises_for_the_three_passes_to_run():
    s, t = _rows(4)
    wide = torch.cat([s] * 200, dim=1)[:, :25_000_000]  # V = 25 M: a team of ~3000 programs
    with pytest.raises(RuntimeError, match="more than the device holds"):
        tm.team_loss(wide, wide, None, 1.0, 0.5, 0, None, None)
