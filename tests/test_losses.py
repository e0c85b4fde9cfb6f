"""The fused distillation loss against float64 references: values, gradients, signals, masks.

The PyTorch path runs here; the Triton kernels run in a fresh process through Triton's
interpreter (compiled, on a CUDA machine), as in tests/test_triton_kernels.py.
"""

from __future__ import annotations

import math
import textwrap

import pytest
import torch

from distill_guard.losses import DistillLoss, distill_loss, loss_kind
from distill_guard.observations import LossKind, Metric
from distill_guard.signals import jsd_from_logits
from tests._reference import entropy, jsd
from tests._triton import run_triton_script

BETAS = (0.0, 0.3, 1.0)  # forward KL, the JSD, reverse KL


def reference_divergence(s: torch.Tensor, t: torch.Tensor, beta: float, tau: float) -> torch.Tensor:
    """Per row, at temperature τ, by the convention of distill_guard.losses. A -inf logit is
    taken as -1e4 (its probability is exactly 0 in float64): autograd through -inf is NaN."""
    x, y = s.clamp_min(-1e4) / tau, t.clamp_min(-1e4) / tau
    ls, lt = torch.log_softmax(x, -1), torch.log_softmax(y, -1)
    if beta == 0.0:  # KL(teacher ‖ student)
        return torch.where(lt.exp() > 0, lt.exp() * (lt - ls), 0.0).sum(-1)
    if beta == 1.0:  # KL(student ‖ teacher)
        return torch.where(ls.exp() > 0, ls.exp() * (ls - lt), 0.0).sum(-1)
    return jsd(x, y, beta)


def _inputs(shape=(2, 3, 40), seed=0):
    g = torch.Generator().manual_seed(seed)
    s = torch.randn(*shape, generator=g, dtype=torch.float64) * 3
    t = torch.randn(*shape, generator=g, dtype=torch.float64) * 2
    s[0, 0, :5] = t[0, 0, :5] = -math.inf  # masked-out vocabulary entries on both sides
    return s, t


@pytest.mark.parametrize("beta", BETAS)
def test_gradcheck_float64_with_mask_temperature_and_chunks(beta):
    s, t = _inputs(shape=(2, 3, 16))
    mask = torch.tensor([[1, 1, 0], [1, 0, 1]])
    s = s.requires_grad_()

    def loss(z):
        return distill_loss(z, t, beta=beta, temperature=1.7, mask=mask, chunk_rows=2).loss

    assert torch.autograd.gradcheck(loss, (s,))
    expected = reference_divergence(s, t, beta, 1.7)[mask.bool()].mean()
    out = distill_loss(s, t, beta=beta, temperature=1.7, mask=mask, chunk_rows=2)
    torch.testing.assert_close(out.loss, expected, rtol=1e-12, atol=1e-12)
    (g,) = torch.autograd.grad(out.loss, s)
    (g_ref,) = torch.autograd.grad(expected, s)
    torch.testing.assert_close(g, g_ref, rtol=1e-10, atol=1e-15)
    assert bool((g[0, 0, :5] == 0).all())


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_low_precision_inputs_match_float64_of_the_same_values(dtype):
    s64, t64 = _inputs(seed=1)
    s, t = s64.to(dtype).requires_grad_(), t64.to(dtype)
    out = distill_loss(s, t, beta=0.5, temperature=2.0)
    (g,) = torch.autograd.grad(out.loss, s)
    assert out.per_token.dtype == torch.float32 and g.dtype == dtype
    ref_in = s.detach().double().requires_grad_()
    ref = reference_divergence(ref_in, t.double(), 0.5, 2.0).mean()
    (g_ref,) = torch.autograd.grad(ref, ref_in)
    assert abs(float(out.loss.detach()) - float(ref.detach())) < 1e-6
    eps = torch.finfo(dtype).eps
    assert float((g.double() - g_ref).abs().max()) <= eps * float(g_ref.abs().max()) + 1e-9


def test_signals_are_those_of_each_model_and_masked_positions_are_nan():
    s, t = _inputs()
    labels = torch.tensor([[5, -100, 7], [1, 2, -100]])
    out = distill_loss(s.float(), t.float(), beta=0.5, labels=labels)
    keep = labels != -100
    assert torch.equal(out.valid, keep)
    torch.testing.assert_close(
        out.student_entropy[keep].double(), entropy(s)[keep], atol=1e-5, rtol=1e-5
    )
    torch.testing.assert_close(
        out.teacher_entropy[keep].double(), entropy(t)[keep], atol=1e-5, rtol=1e-5
    )
    top1 = torch.log_softmax(t, -1).amax(-1)
    torch.testing.assert_close(
        out.teacher_top1_logprob[keep].double(), top1[keep], atol=1e-5, rtol=1e-5
    )
    torch.testing.assert_close(
        out.student_lse[keep].double(), torch.logsumexp(s, -1)[keep], atol=1e-5, rtol=1e-5
    )
    for x in (out.student_entropy, out.teacher_entropy, out.teacher_top1_logprob):
        assert bool(x[~keep].isnan().all())
    assert bool((out.per_token[~keep] == 0).all())
    m = out.metrics()
    assert m["valid_tokens"] == 4
    assert m[Metric.LOSS] == pytest.approx(float(jsd(s, t, 0.5)[keep].mean()), abs=1e-6)
    assert m[Metric.STUDENT_ENTROPY] == pytest.approx(float(entropy(s)[keep].mean()), abs=1e-5)
    assert m["teacher_top1_logprob"] == pytest.approx(float(top1[keep].mean()), abs=1e-5)


def test_uniform_teacher_is_read_off_the_loss_signals():
    v = 1000
    s = torch.zeros(4, v)
    s[:, 0] = 30.0  # a peaked student
    out = distill_loss(s, torch.zeros(4, v), beta=0.5)
    torch.testing.assert_close(out.teacher_top1_logprob, torch.full((4,), -math.log(v)))
    torch.testing.assert_close(out.teacher_entropy, torch.full((4,), math.log(v)))
    assert out.ceiling == pytest.approx(math.log(2))
    # near the ceiling H(β) = ln 2, below it by O(1/V): the failed run's step-0 loss
    assert math.log(2) - 1e-2 < float(out.loss) < math.log(2)  # 0.689 at V = 1000
    assert out.vocab_size == v


def test_sample_index_is_the_leading_dim_and_none_for_rows():
    s = torch.randn(3, 2, 4, 10)
    out = distill_loss(s, s.flip(-1))
    assert out.sample_index.shape == (3, 2, 4)
    assert out.sample_index[:, 1, 3].tolist() == [0, 1, 2]
    assert bool((out.sample_index == torch.arange(3)[:, None, None]).all())
    assert distill_loss(s[0, 0], s[0, 0].flip(-1)).sample_index is None


def test_temperature_squared_scale_and_kinds():
    s, t = _inputs()
    plain = distill_loss(s, t, beta=0.5, temperature=2.0)
    scaled = distill_loss(s, t, beta=0.5, temperature=2.0, scale_by_temperature_squared=True)
    torch.testing.assert_close(scaled.loss, 4.0 * plain.loss)
    assert scaled.scale == 4.0 and plain.scale == 1.0
    assert scaled.metrics()[Metric.LOSS] == pytest.approx(plain.metrics()[Metric.LOSS])
    assert [loss_kind(b) for b in BETAS] == [
        LossKind.FORWARD_KL,
        LossKind.JSD,
        LossKind.REVERSE_KL,
    ]
    assert distill_loss(s, t, beta=0.0).ceiling is None


def test_only_the_student_gets_a_gradient():
    s, t = _inputs()
    s, t = s.requires_grad_(), t.clone().requires_grad_()
    distill_loss(s, t).loss.backward()
    assert s.grad is not None and t.grad is None


def test_no_valid_position_gives_zero_loss_and_gradient():
    s, t = _inputs()
    s = s.requires_grad_()
    out = distill_loss(s, t, mask=torch.zeros(2, 3))
    out.loss.backward()
    assert float(out.loss.detach()) == 0.0 and bool((s.grad == 0).all())
    assert math.isnan(out.metrics()[Metric.STUDENT_ENTROPY])


def test_nan_teacher_logit_makes_the_loss_nan():
    s, t = _inputs()
    t[1, 1, 3] = math.nan
    out = distill_loss(s.float(), t.float())
    assert math.isnan(float(out.loss)) and math.isnan(float(out.teacher_entropy[1, 1]))


def test_inplace_backward_reuses_the_student_storage():
    _, t = _inputs()
    h = torch.randn(2, 3, 8, dtype=torch.float64)
    w = torch.randn(8, 40, dtype=torch.float64, requires_grad=True)  # a head
    expected = torch.autograd.grad(distill_loss(h @ w, t).loss, w)[0]
    logits = h @ w
    out = distill_loss(logits, t, inplace_backward=True)
    (g,) = torch.autograd.grad(out.loss, w, retain_graph=True)
    torch.testing.assert_close(g, expected)  # the head's backward got the right gradient
    assert not torch.equal(logits.detach(), (h @ w).detach())  # it lives where the logits were
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        torch.autograd.grad(out.loss, w)  # the logits it would recompute from are gone


def test_bad_input_is_refused_with_what_was_wrong():
    s, t = _inputs()
    with pytest.raises(ValueError, match="beta must lie in"):
        distill_loss(s, t, beta=1.5)
    with pytest.raises(ValueError, match="temperature"):
        distill_loss(s, t, temperature=0.0)
    with pytest.raises(ValueError, match="same shape"):
        distill_loss(s, t[..., :10])
    with pytest.raises(ValueError, match="mask has shape"):
        distill_loss(s, t, mask=torch.ones(2, 4))
    with pytest.raises(TypeError, match="student logits must be"):
        distill_loss(s.long(), t)
    with pytest.raises(ValueError, match="backend"):
        distill_loss(s, t, backend="cuda")


def test_jsd_signal_given_the_loss_log_normalisers():
    s, t = _inputs()
    out = distill_loss(s.float(), t.float(), beta=0.3)
    given = jsd_from_logits(
        s.float(), t.float(), 0.3, student_lse=out.student_lse, teacher_lse=out.teacher_lse
    )
    torch.testing.assert_close(given, jsd_from_logits(s.float(), t.float(), 0.3))
    torch.testing.assert_close(given, out.per_token)
    with pytest.raises(ValueError, match="both"):
        jsd_from_logits(s, t, student_lse=out.student_lse)
    with pytest.raises(ValueError, match="student_lse has shape"):
        jsd_from_logits(s, t, student_lse=out.student_lse[0], teacher_lse=out.teacher_lse[0])


def test_result_is_a_frozen_dataclass():
    s, t = _inputs()
    out = distill_loss(s, t)
    assert isinstance(out, DistillLoss)
    with pytest.raises(AttributeError):
        out.beta = 0.1  # type: ignore[misc]


TRITON_SCRIPT = textwrap.dedent(
    """
    import math, torch
    from distill_guard.losses import distill_loss
    from distill_guard.signals import jsd_from_logits
    from tests.test_losses import reference_divergence
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    g = torch.Generator().manual_seed(0)
    # V = 4500: two blocks of the statistics kernel, three of the others
    s64 = torch.randn(5, 4500, generator=g, dtype=torch.float64) * 3
    t64 = torch.randn(5, 4500, generator=g, dtype=torch.float64) * 2
    s64[0, :20] = t64[0, :20] = -math.inf
    t64[1, :9] = -math.inf  # the JSD is finite where only one side is zero
    s64[3, 4400] = t64[4, 2100] = 25.0  # a peak beyond the first block: the rescaling
    mask = torch.tensor([1, 1, 0, 1, 1], device=dev)
    keep = mask.bool().cpu()
    for beta, dtype in ((0.0, torch.bfloat16), (0.3, torch.float32), (0.3, torch.float16),
                        (1.0, torch.bfloat16)):
        t_in = t64.clone()
        if beta != 0.3:
            t_in[1, :9] = 0.0
        s = s64.to(dtype).to(dev).requires_grad_()
        t = t_in.to(dtype).to(dev)
        out = distill_loss(s, t, beta=beta, temperature=1.3, mask=mask, backend="triton")
        (grad,) = torch.autograd.grad(out.loss, s)
        assert grad.dtype == dtype
        r_in = s.detach().double().cpu().requires_grad_()
        ref = reference_divergence(r_in, t.double().cpu(), beta, 1.3)[keep].mean()
        (g_ref,) = torch.autograd.grad(ref, r_in)
        assert abs(float(out.loss) - float(ref)) < 2e-6, (beta, dtype, out.loss, ref)
        eps = torch.finfo(dtype).eps
        err = float((grad.double().cpu() - g_ref).abs().max())
        # fp32: log p carries ~1e-6 absolute error (the ulp of lse ~ 20), near-cancelling terms
        assert err <= max(eps, 1e-4) * float(g_ref.abs().max()), (beta, dtype, err)
        lt = torch.log_softmax(t.double().cpu() / 1.3, -1)
        top1 = out.teacher_top1_logprob.cpu().double()
        assert (top1[keep] - lt.amax(-1)[keep]).abs().max() < 1e-5
        h_t = -(lt.exp() * lt.clamp_min(-1e4)).sum(-1)
        assert (out.teacher_entropy.cpu()[keep] - h_t[keep]).abs().max() < 1e-4
        assert bool(top1[~keep].isnan().all())
        # the gradient written over the student's own logits is the same
        s2 = s.detach().clone().requires_grad_()
        o2 = distill_loss(s2 * 1.0, t, beta=beta, temperature=1.3, mask=mask,
                          backend="triton", inplace_backward=True)
        (g2,) = torch.autograd.grad(o2.loss, s2)
        assert torch.equal(g2, grad), (beta, dtype)
        tol = max(eps, 1e-4) * float(g_ref.abs().max())
        # a loss scaled after the call, per-token weights in the graph, a second backward
        s4 = s.detach().clone().requires_grad_()
        o4 = distill_loss(s4, t, beta=beta, temperature=1.3, mask=mask, backend="triton")
        (g4,) = torch.autograd.grad(2.5 * o4.loss, s4)
        assert (g4.double() - 2.5 * grad.double()).abs().max() <= 3 * tol, (beta, dtype)
        rows_w = torch.arange(5, device=dev, dtype=torch.float32)
        o5 = distill_loss(s4, t, beta=beta, temperature=1.3, mask=mask, backend="triton")
        (g5,) = torch.autograd.grad((o5.per_token * rows_w).sum() + o5.loss, s4)
        r5 = s.detach().double().cpu().requires_grad_()
        per = reference_divergence(r5, t.double().cpu(), beta, 1.3)
        ref5 = (per * rows_w.double().cpu() * keep).sum() + per[keep].mean()
        (g5_ref,) = torch.autograd.grad(ref5, r5)
        # (weights up to 4 put row 3's near-cancelling peak, 3e-4 off in fp32, at the max)
        assert float((g5.double().cpu() - g5_ref).abs().max()) <= max(eps, 1e-3) * float(
            g5_ref.abs().max()), (beta, dtype)
        # (retain_graph): each backward recomputes from the rows and the saved statistics
        o6 = distill_loss(s4, t, beta=beta, temperature=1.3, mask=mask, backend="triton")
        (g6a,) = torch.autograd.grad(o6.loss, s4, retain_graph=True)
        (g6b,) = torch.autograd.grad(3.0 * o6.loss, s4)
        assert (g6b.double() - 3.0 * g6a.double()).abs().max() <= 3 * tol, (beta, dtype)
    s, t = s64.float().to(dev), t64.float().to(dev)
    out = distill_loss(s, t, beta=0.3, backend="triton")
    given = jsd_from_logits(s, t, 0.3, student_lse=out.student_lse, teacher_lse=out.teacher_lse,
                            backend="triton")
    assert (given - out.per_token).abs().max() < 1e-6
    assert (given.cpu().double() - reference_divergence(s64, t64, 0.3, 1.0)).abs().max() < 2e-6
    t_nan = t.clone(); t_nan[2, 5] = math.nan
    assert math.isnan(float(distill_loss(s, t_nan, backend="triton").loss))
    assert math.isnan(float(jsd_from_logits(s, t_nan, 0.3, backend="triton")[2]))  # two-pass
    none = distill_loss(s.requires_grad_(), t, mask=torch.zeros(5, device=dev), backend="triton")
    none.loss.backward()
    assert float(none.loss) == 0.0 and bool((s.grad == 0).all())
    print("ok")
    """
)


@pytest.mark.slow  # ~7 s of CPU in Triton's interpreter; tests/gpu/test_losses.py runs it compiled
def test_triton_path_matches_float64_references():
    pytest.importorskip("triton")
    run_triton_script(TRITON_SCRIPT, timeout=240)
