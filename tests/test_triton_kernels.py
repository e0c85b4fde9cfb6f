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
    from distill_guard.triton_kernels import triton_entropy, triton_jsd
    torch.manual_seed(0)
    dev = "cuda" if torch.cuda.is_available() else "cpu"

    from tests._reference import binary_entropy64, entropy64, jsd64

    def ref_entropy(x):
        return torch.from_numpy(entropy64(x)).to(x.device)

    def ref_jsd(a, b, beta):
        return torch.from_numpy(jsd64(a, b, beta)).to(a.device)

    # V not a multiple of the block, a row of -inf (masked) entries, a constant row, bf16
    x = torch.randn(6, 1000, device=dev) * 4
    x[0, :37] = -float("inf")
    x[1] = 0.0
    h = triton_entropy(x, block=256)
    assert (h - ref_entropy(x)).abs().max() < 1e-4, (h, ref_entropy(x))
    assert abs(float(h[1]) - math.log(1000)) < 1e-4
    xb = x.bfloat16()
    assert (triton_entropy(xb, block=128) - ref_entropy(xb.float())).abs().max() < 1e-3
    assert triton_entropy(x.reshape(2, 3, 1000), block=256).shape == (2, 3)

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
