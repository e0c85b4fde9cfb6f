"""The loss from hidden states against float64 references: values, both gradients, the signals,
a top-K teacher, masks, bad input; the sub-row merge the Triton path relies on.

The PyTorch path runs here; the Triton path runs in a fresh process through Triton's interpreter
(compiled on a CUDA machine: tests/gpu/test_linear_loss.py).
"""

from __future__ import annotations

import math
import textwrap

import pytest
import torch

from distill_guard import StepGuard, distill_loss_from_hidden
from distill_guard.errors import GuardTypeError, GuardValueError
from distill_guard.linear_loss import _merge_sub_rows, _splits, default_chunk_rows
from distill_guard.losses import _MODES, _torch_forward, distill_loss
from distill_guard.observations import LossKind
from tests._triton import run_triton_script

N, H, H_T, V, K = 37, 16, 19, 96, 8


def _inputs(dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    return {
        "h": (torch.randn(N, H, generator=g)).to(dtype),
        "w": (torch.randn(V, H, generator=g) * 0.6).to(dtype),
        "ht": (torch.randn(N, H_T, generator=g)).to(dtype),
        "wt": (torch.randn(V, H_T, generator=g) * 0.6).to(dtype),
        "mask": torch.rand(N, generator=g) > 0.2,
    }


def _leaves(x):
    return x["h"].clone().requires_grad_(), x["w"].clone().requires_grad_()


def _reference(h, w, teacher_logits, **kw):
    """distill_loss on float64 logits (itself tested against autograd's gradcheck), and its
    gradients w.r.t. the hidden states and the head."""
    h64, w64 = h.detach().double().requires_grad_(), w.detach().double().requires_grad_()
    out = distill_loss(h64 @ w64.t(), teacher_logits.double(), **kw)
    out.loss.backward()
    return out, h64.grad, w64.grad


def _rel(a, b):
    return float((a.double() - b).norm() / b.norm())


@pytest.mark.parametrize("beta", [0.0, 0.3, 0.5, 1.0])
@pytest.mark.parametrize("tau", [1.0, 1.7])
def test_full_teacher_matches_float64(beta, tau):
    x = _inputs()
    h, w = _leaves(x)
    out = distill_loss_from_hidden(
        h, w, x["ht"], x["wt"], beta=beta, temperature=tau, mask=x["mask"], chunk_rows=7
    )
    out.loss.backward()
    ref, gh, gw = _reference(
        h, w, x["ht"].double() @ x["wt"].double().t(), beta=beta, temperature=tau, mask=x["mask"]
    )
    assert abs(float(out.loss) - float(ref.loss)) < 1e-6
    assert _rel(h.grad, gh) < 3e-6 and _rel(w.grad, gw) < 3e-6
    keep = x["mask"]
    for name in ("per_token", "student_entropy", "teacher_entropy", "teacher_top1_logprob"):
        got, want = getattr(out, name), getattr(ref, name)
        assert float((got[keep].double() - want[keep]).abs().max()) < 1e-5, name
    for name in ("student_entropy", "teacher_top1_logprob", "student_lse", "teacher_lse"):
        assert bool(getattr(out, name)[~keep].isnan().all()), name
    assert bool((out.per_token[~keep] == 0).all()) and not out.per_token.requires_grad
    assert (out.kind, out.vocab_size, out.ceiling) == (ref.kind, V, ref.ceiling)


def test_bf16_gradients_are_the_rounding_of_the_exact_ones():
    """Float32 logits and float32 accumulation: the bf16 gradients are as close to float64 as
    rounding the exact ones to bf16 (a path through bf16 logits is ~10× further off)."""
    x = _inputs(torch.bfloat16)
    h, w = _leaves(x)
    out = distill_loss_from_hidden(h, w, x["ht"], x["wt"], beta=0.5, chunk_rows=5)
    out.loss.backward()
    _, gh, gw = _reference(h, w, x["ht"].double() @ x["wt"].double().t(), beta=0.5)
    assert h.grad.dtype == w.grad.dtype == torch.bfloat16
    for got, exact in ((h.grad, gh), (w.grad, gw)):
        assert _rel(got, exact) <= 1.5 * _rel(exact.to(torch.bfloat16), exact)


def _topk(seed=3, scale=2.0):
    g = torch.Generator().manual_seed(seed)
    lp = torch.log_softmax(torch.randn(N, V, generator=g) * scale, -1)
    top, ids = lp.topk(K, -1)
    perm = torch.randperm(K, generator=g)  # a server's order need not be sorted
    return top[:, perm], ids[:, perm]


def _dense(lp, ids):
    """The top-K teacher as float64 logits: its logprobs at its ids, −inf elsewhere."""
    t = torch.full((N, V), -math.inf, dtype=torch.float64)
    return t.scatter_(1, ids, lp.double())


@pytest.mark.parametrize("beta", [0.0, 0.2, 0.5])
@pytest.mark.parametrize("tau", [1.0, 1.7])
def test_topk_teacher_matches_float64_on_its_renormalised_k(beta, tau):
    x = _inputs()
    lp, ids = _topk()
    h, w = _leaves(x)
    out = distill_loss_from_hidden(
        h, w, teacher_topk=(lp, ids), beta=beta, temperature=tau, mask=x["mask"], chunk_rows=6
    )
    out.loss.backward()
    ref, gh, gw = _reference(h, w, _dense(lp, ids), beta=beta, temperature=tau, mask=x["mask"])
    assert abs(float(out.loss) - float(ref.loss)) < 2e-6
    assert _rel(h.grad, gh) < 3e-6 and _rel(w.grad, gw) < 3e-6
    keep = x["mask"]
    assert float((out.per_token[keep] - ref.per_token[keep]).abs().max()) < 2e-6
    # the guard's top-1 is the logprob as given, −ln V for a uniform teacher
    assert torch.equal(out.teacher_top1_logprob[keep], lp.amax(-1)[keep])
    assert float((out.teacher_entropy[keep] - ref.teacher_entropy[keep]).abs().max()) < 1e-5
    assert bool(out.teacher_lse.isnan().all())


def test_topk_uniform_teacher_reads_minus_ln_v():
    x = _inputs()
    ids = torch.stack([torch.randperm(V)[:K] for _ in range(N)])
    lp = torch.full((N, K), -math.log(V))
    out = distill_loss_from_hidden(x["h"], x["w"], teacher_topk=(lp, ids))
    assert torch.allclose(out.teacher_top1_logprob, torch.tensor(-math.log(V)))
    assert torch.allclose(out.teacher_entropy, torch.tensor(math.log(K)))


def test_upstream_gradient_scale_and_temperature_squared():
    x = _inputs()
    h, w = _leaves(x)
    out = distill_loss_from_hidden(h, w, x["ht"], x["wt"], temperature=2.0)
    (2.5 * out.loss).backward()
    h2, w2 = _leaves(x)
    scaled = distill_loss_from_hidden(
        h2, w2, x["ht"], x["wt"], temperature=2.0, scale_by_temperature_squared=True
    )
    scaled.loss.backward()
    assert scaled.scale == 4.0 and torch.allclose(scaled.loss, 4.0 * out.loss)
    assert torch.allclose(h2.grad, h.grad * 4.0 / 2.5, rtol=1e-5)
    assert torch.allclose(w2.grad, w.grad * 4.0 / 2.5, rtol=1e-5)


def test_frozen_head_and_no_grad_compute_the_same_loss():
    x = _inputs()
    full = distill_loss_from_hidden(x["h"], x["w"], x["ht"], x["wt"], labels=None)
    h = x["h"].clone().requires_grad_()
    frozen = distill_loss_from_hidden(h, x["w"], x["ht"], x["wt"])  # the head takes no gradient
    frozen.loss.backward()
    with torch.no_grad():
        eval_out = distill_loss_from_hidden(x["h"], x["w"], x["ht"], x["wt"])
    assert float(full.loss) == float(frozen.loss) == float(eval_out.loss)
    assert h.grad is not None and not full.loss.requires_grad


def test_labels_ignore_index_and_no_valid_position():
    x = _inputs()
    labels = torch.arange(N)
    labels[::3] = -100
    h, w = _leaves(x)
    out = distill_loss_from_hidden(h, w, x["ht"], x["wt"], labels=labels)
    ref, _, _ = _reference(h, w, x["ht"].double() @ x["wt"].double().t(), labels=labels)
    assert abs(float(out.loss) - float(ref.loss)) < 1e-6
    assert out.valid.tolist() == (labels != -100).tolist()
    h, w = _leaves(x)
    none = distill_loss_from_hidden(h, w, x["ht"], x["wt"], mask=torch.zeros(N))
    none.loss.backward()
    assert float(none.loss) == 0.0 and bool((h.grad == 0).all()) and bool((w.grad == 0).all())


def test_leading_shape_and_sample_index():
    x = _inputs()
    h = x["h"][:36].reshape(4, 9, H)
    ht = x["ht"][:36].reshape(4, 9, H_T)
    out = distill_loss_from_hidden(h, x["w"], ht, x["wt"], mask=torch.ones(4, 9))
    assert out.per_token.shape == out.valid.shape == (4, 9)
    assert out.sample_index[:, 0].tolist() == [0, 1, 2, 3]


def test_the_guard_reads_it_and_catches_a_zeroed_teacher_head():
    x = _inputs()
    dead = distill_loss_from_hidden(x["h"], x["w"], x["ht"], torch.zeros(V, H_T))
    sg = StepGuard("default", ["alerts.use_wandb=false"])
    sg.observe_distill_loss(dead)
    assert sg.guard.run.vocab_size == V
    assert sg.before_update(0) is False  # the update is refused
    assert "teacher.uniform" in sg.guard.summary.first


def test_reverse_kl_of_a_topk_teacher_is_refused():
    x = _inputs()
    with pytest.raises(GuardValueError, match="reverse KL"):
        distill_loss_from_hidden(x["h"], x["w"], teacher_topk=_topk(), beta=1.0)


@pytest.mark.parametrize(
    ("change", "error", "match"),
    [
        (lambda x: {"wt": x["wt"][:50]}, GuardValueError, "vocabularies differ"),
        (lambda x: {"ht": x["ht"][:10]}, GuardValueError, "leading shape"),
        (lambda x: {"w": x["w"][:, :5]}, GuardValueError, "must end in the head's H"),
        (lambda x: {"w": x["w"].double()}, GuardTypeError, "bf16, fp16 or fp32"),
        (lambda x: {"w": x["w"].bfloat16()}, GuardTypeError, "cast one to the other"),
        (lambda x: {"w": x["w"][0]}, GuardValueError, r"\[V, H\]"),
        (lambda x: {"wt": None}, GuardValueError, "go together"),
    ],
)
def test_bad_input_names_what_is_wrong(change, error, match):
    x = {**_inputs(), **{}}
    x.update(change(x))
    with pytest.raises(error, match=match):
        distill_loss_from_hidden(x["h"], x["w"], x["ht"], x["wt"])


def test_bad_teacher_arguments():
    x = _inputs()
    lp, ids = _topk()
    with pytest.raises(GuardValueError, match="not both, not neither"):
        distill_loss_from_hidden(x["h"], x["w"])
    with pytest.raises(GuardValueError, match="not both"):
        distill_loss_from_hidden(x["h"], x["w"], x["ht"], x["wt"], teacher_topk=(lp, ids))
    with pytest.raises(GuardValueError, match=r"outside \[0, V = 96\)"):
        distill_loss_from_hidden(x["h"], x["w"], teacher_topk=(lp, ids + V))
    with pytest.raises(GuardValueError, match="leading shape"):
        distill_loss_from_hidden(x["h"], x["w"], teacher_topk=(lp[:5], ids[:5]))
    with pytest.raises(GuardTypeError, match="ids integer"):
        distill_loss_from_hidden(x["h"], x["w"], teacher_topk=(lp, ids.float()))
    with pytest.raises(GuardTypeError, match="a pair"):
        distill_loss_from_hidden(x["h"], x["w"], teacher_topk=lp)
    with pytest.raises(GuardValueError, match="chunk_rows"):
        distill_loss_from_hidden(x["h"], x["w"], x["ht"], x["wt"], chunk_rows=0)
    with pytest.raises(GuardValueError, match="temperature"):
        distill_loss_from_hidden(x["h"], x["w"], x["ht"], x["wt"], temperature=0.0)


def test_chunks_grow_with_the_rows_and_splits_fill_the_gpu_with_whole_divisors():
    assert default_chunk_rows(4096) == 128 and default_chunk_rows(16384) == 512
    assert default_chunk_rows(8192) == 256 and default_chunk_rows(10**6) == 512
    assert default_chunk_rows(37) == 37  # never more than the rows
    assert _splits(256, 151936) == 8  # 2048 programs, sub-rows of 18992 columns
    assert _splits(512, 151936) == 4 and _splits(128, 151936) == 16
    assert _splits(64, 151936) == 32
    assert _splits(4096, 151936) == 1
    assert _splits(64, 32001) == 1  # no divisor: whole rows


@pytest.mark.parametrize("mode", [LossKind.JSD, LossKind.FORWARD_KL, LossKind.REVERSE_KL])
@pytest.mark.parametrize("splits", [2, 4, 8])
def test_sub_row_merge_is_exact(mode, splits):
    """The Triton path's merge: the statistics of rows from those of their sub-rows (each a
    distribution of its own) equal the statistics of the whole rows."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(6, 64, generator=g, dtype=torch.float64) * 3
    y = torch.randn(6, 64, generator=g, dtype=torch.float64) * 2
    x[1, 41:47] = y[2, 1:7] = -math.inf  # no mass there, on each side: an infinite KL
    x[4, 10], y[5, 60] = 30.0, 25.0  # one sub-row holds nearly all the mass
    beta = {LossKind.JSD: 0.5, LossKind.FORWARD_KL: 0.0, LossKind.REVERSE_KL: 1.0}[mode]
    valid = torch.ones(6, dtype=torch.bool)
    whole = _torch_forward(x, y, valid, beta, 1 / 1.3, _MODES[mode], 6)
    sub = _torch_forward(
        x.view(6 * splits, -1), y.view(6 * splits, -1), valid.repeat_interleave(splits),
        beta, 1 / 1.3, _MODES[mode], 64,
    )  # fmt: skip
    merged = _merge_sub_rows(sub.view(7, 6, splits), _MODES[mode])
    # the JSD's loss rows come from its own pass; the forward KL's gradient needs no aux row
    rows = {LossKind.JSD: 5, LossKind.FORWARD_KL: 6, LossKind.REVERSE_KL: 7}[mode]
    torch.testing.assert_close(merged[:rows], whole[:rows], rtol=1e-12, atol=1e-12)


TRITON_SCRIPT = textwrap.dedent(
    """
    import math, torch
    import distill_guard.linear_loss as ll
    from distill_guard.losses import distill_loss
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    ll._MIN_SPLIT_COLS = 16  # V = 96 in sub-rows of 24 (on CUDA also at V = 16384 below)
    g = torch.Generator().manual_seed(0)
    n, h, v = 29, 16, 96
    for beta, dtype, chunk in ((0.0, torch.float32, 8), (0.5, torch.bfloat16, 5),
                               (1.0, torch.float32, 29), (0.3, torch.float16, 16)):
        hs = torch.randn(n, h, generator=g).to(dtype).to(dev).requires_grad_()
        w = (torch.randn(v, h, generator=g) * 0.6).to(dtype).to(dev).requires_grad_()
        ht = torch.randn(n, h + 3, generator=g).to(dtype).to(dev)
        wt = (torch.randn(v, h + 3, generator=g) * 0.6).to(dtype).to(dev)
        mask = (torch.rand(n, generator=g) > 0.2).to(dev)
        # the head's gradient accumulated in float32 (always on CPU): both at the rounding floor
        out = ll.distill_loss_from_hidden(hs, w, ht, wt, beta=beta, temperature=1.3, mask=mask,
                                          chunk_rows=chunk, backend="triton",
                                          float32_weight_grad=True)
        out.loss.backward()
        h64 = hs.detach().double().cpu().requires_grad_()
        w64 = w.detach().double().cpu().requires_grad_()
        ref = distill_loss(h64 @ w64.t(), ht.double().cpu() @ wt.double().cpu().t(), beta=beta,
                           temperature=1.3, mask=mask.cpu())
        ref.loss.backward()
        assert abs(float(out.loss) - float(ref.loss)) < 2e-6, (beta, dtype)
        for got, exact in ((hs.grad, h64.grad), (w.grad, w64.grad)):
            err = float((got.double().cpu() - exact).norm() / exact.norm())
            floor = float((exact.to(dtype).double() - exact).norm() / exact.norm())
            assert err <= max(1.5 * floor, 3e-6), (beta, dtype, err, floor)
        keep = mask.cpu()
        for name in ("student_entropy", "teacher_entropy", "teacher_top1_logprob", "per_token"):
            d = (getattr(out, name).cpu()[keep].double() - getattr(ref, name)[keep]).abs().max()
            assert float(d) < 1e-5, (name, beta, dtype)
    print("ok")
    """
)


@pytest.mark.slow  # ~40 s of CPU in Triton's interpreter; tests/gpu/test_linear_loss.py compiles it
def test_triton_path_matches_float64_references():
    pytest.importorskip("triton")
    run_triton_script(TRITON_SCRIPT, timeout=400)


def test_a_second_backward_is_refused_not_wrong():
    x = _inputs()
    h, w = _leaves(x)
    out = distill_loss_from_hidden(h, w, x["ht"], x["wt"])
    out.loss.backward(retain_graph=True)
    with pytest.raises(GuardValueError, match="second backward"):
        out.loss.backward()


TOPK_TRITON_SCRIPT = textwrap.dedent(
    """
    import math, torch
    import distill_guard.linear_loss as ll
    from distill_guard.losses import distill_loss
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    ll._MIN_SPLIT_COLS = 16  # V = 96 in sub-rows of 24
    g = torch.Generator().manual_seed(0)
    n, h, v, k = 29, 16, 96, 7
    for beta, dtype, chunk, tau in ((0.0, torch.float32, 8, 1.3), (0.5, torch.bfloat16, 5, 0.8),
                                    (0.3, torch.float32, 29, 1.0)):
        hs = torch.randn(n, h, generator=g).to(dtype).to(dev).requires_grad_()
        w = (torch.randn(v, h, generator=g) * 0.6).to(dtype).to(dev).requires_grad_()
        top, ids = torch.log_softmax(torch.randn(n, v, generator=g) * 2, -1).topk(k, -1)
        perm = torch.randperm(k, generator=g)  # a server's order need not be sorted
        top, ids = top[:, perm].to(dev), ids[:, perm].to(dev)
        mask = (torch.rand(n, generator=g) > 0.2).to(dev)
        out = ll.distill_loss_from_hidden(hs, w, teacher_topk=(top, ids), beta=beta,
                                          temperature=tau, mask=mask, chunk_rows=chunk,
                                          backend="triton", float32_weight_grad=True)
        out.loss.backward()
        h64 = hs.detach().double().cpu().requires_grad_()
        w64 = w.detach().double().cpu().requires_grad_()
        dense = torch.full((n, v), -math.inf, dtype=torch.float64)
        dense.scatter_(1, ids.cpu(), top.double().cpu())  # the K entries, no mass elsewhere
        ref = distill_loss(h64 @ w64.t(), dense, beta=beta, temperature=tau, mask=mask.cpu())
        ref.loss.backward()
        assert abs(float(out.loss) - float(ref.loss)) < 2e-6, (beta, dtype)
        # on CUDA the gradient rows are in the head's dtype: bf16 rows add their own rounding
        # (on the CPU they are float32, and only the result is rounded)
        bound = 2.0 if dev == "cuda" and dtype != torch.float32 else 1.5
        for got, exact in ((hs.grad, h64.grad), (w.grad, w64.grad)):
            err = float((got.double().cpu() - exact).norm() / exact.norm())
            floor = float((exact.to(dtype).double() - exact).norm() / exact.norm())
            assert err <= max(bound * floor, 3e-6), (beta, dtype, err, floor)
        keep = mask.cpu()
        for name in ("student_entropy", "teacher_entropy", "per_token"):
            d = (getattr(out, name).cpu()[keep].double() - getattr(ref, name)[keep]).abs().max()
            assert float(d) < 1e-5, (name, beta, dtype)
    print("ok")
    """
)


@pytest.mark.slow  # ~6 s of CPU in Triton's interpreter; on a CUDA machine it runs compiled
def test_triton_topk_path_matches_float64_references():
    """The top-K teacher's Triton kernels (statistics and gradient rows over sub-rows), a
    few seconds in Triton's interpreter."""
    pytest.importorskip("triton")
    run_triton_script(TOPK_TRITON_SCRIPT, timeout=240)
