"""GPU: the fused distillation loss (forward + backward) against Liger-Kernel and plain PyTorch.

Side by side in one run on the same bf16 logits ``[rows, 151936]`` (default 4096 and 16384 rows),
generalized JSD β = 0.5, τ = 1, mean over rows, gradient w.r.t. the student's logits:
- ``distill_loss`` (Triton kernels; the gradient in a new bf16 tensor, and ``inplace_backward``);
- Liger-Kernel's ``LigerJSD`` from logits, as a TRL or custom-loop user would call it: two
  float32 ``log_softmax`` then ``LigerJSD`` (its gradient flows back through the log_softmax);
  and ``LigerJSD`` alone on precomputed float32 log-probs (its kernel, not a user's path);
- plain PyTorch: ``log_softmax`` of float32 copies, ``logaddexp`` mixture, autograd.
Each is timed with CUDA events (median of 5 after 2 warm-ups); peak extra memory is
``max_memory_allocated`` above what was allocated before the call, the returned gradient
included. Errors are max |·| of the loss and the gradient against float64 on the first 32 rows.
The exp unit's floor is the time of the loss's 8 hardware exp2/log2 per element pair alone
(2 for the statistics, 3 for the JSD, 3 for the gradient), values made in registers.
The forward JSD signal (``signals.jsd_from_logits``) is timed given the loss's log-normalisers
(one read of each input) and without (two), against a device-to-device copy of one input
(read + write bytes / time) measured in the same run. ``--sweep`` also times the three kernels
per tile or block size × warps. Writes $OUT/gpu_loss.json when $OUT is set.

Run: python3 benchmarks/gpu_loss.py [--rows 4096 16384] [--sweep]   (Liger: pip install
liger-kernel==0.8.5; its rows are skipped without it)
"""

from __future__ import annotations

import argparse
import functools
import importlib.metadata
import json
import math
import os

import torch
from gpu_signals import TILE_SWEEP, measure  # the same yardstick as §2, the same tiles swept

from distill_guard.losses import distill_loss
from distill_guard.signals import jsd_from_logits

V = 151_936
BETA = 0.5
REF_ROWS = 32


def plain_jsd_loss(
    s: torch.Tensor, t: torch.Tensor, beta: float = BETA, dtype: torch.dtype = torch.float32
) -> torch.Tensor:
    ls = torch.log_softmax(s.to(dtype), dim=-1)
    lt = torch.log_softmax(t.to(dtype), dim=-1)
    lm = torch.logaddexp(ls + math.log1p(-beta), lt + math.log(beta))
    per_row = (1 - beta) * (ls.exp() * (ls - lm)).sum(-1) + beta * (lt.exp() * (lt - lm)).sum(-1)
    return per_row.mean()


def liger_from_logits(jsd, s: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    return jsd(torch.log_softmax(s.float(), dim=-1), torch.log_softmax(t.float(), dim=-1))


def errors(loss_and_grad, s: torch.Tensor, t: torch.Tensor) -> dict[str, float]:
    """Max |error| of the loss and the gradient on ``s``, ``t`` against float64."""
    x = s.detach().clone().requires_grad_()
    loss, grad = loss_and_grad(x, t)
    r = s.detach().double().requires_grad_()
    ref = plain_jsd_loss(r, t, dtype=torch.float64)
    (g_ref,) = torch.autograd.grad(ref, r)
    return {
        "loss_abs_err": abs(float(loss) - float(ref.detach())),
        "grad_abs_err": float((grad.double() - g_ref).abs().max()),
        "grad_max": float(g_ref.abs().max()),
    }


@functools.cache
def _mufu_kernel():
    """The exp unit's floor kernel, compiled once for every row count measured."""
    import triton
    import triton.language as tl

    from distill_guard.kernels.fused_loss import _log2

    @triton.jit
    def mufu(out_ptr, n_iter, BLOCK: tl.constexpr):
        x = tl.program_id(0) * 1e-6 - tl.arange(0, BLOCK) * 1e-4
        acc = tl.zeros([BLOCK], tl.float32)
        for _ in range(n_iter):
            a = tl.exp2(x)
            b = tl.exp2(x * 0.5)
            c = _log2(a + b, True)
            d = tl.exp2(x * 0.25)
            e = tl.exp2(x * 0.125)
            f = _log2(d + e, True)
            h = tl.exp2(x - 1.0)
            k = _log2(h + 1.0, True)
            acc += (c + f) + k
            x = x - 1e-3
        tl.store(out_ptr + tl.program_id(0), tl.sum(acc, axis=0))

    return mufu


def _mufu_floor_ms(pairs: int) -> float:
    """The time of 8 hardware exp2/log2 per element pair over ``pairs`` pairs and nothing else
    (values made in registers, one float stored per program): the exp unit's floor for any
    kernel that evaluates the loss's 2 + 3 + 3 of them per pair (statistics, JSD, gradient)."""
    mufu = _mufu_kernel()
    block = 1024
    programs = 16 * torch.cuda.get_device_properties(0).multi_processor_count
    n_iter = max(1, pairs // (block * programs))
    out = torch.empty(programs, device="cuda")
    ms, _ = measure(lambda: mufu[(programs,)](out, n_iter, BLOCK=block, num_warps=4), 3, 1)
    return ms * pairs / (n_iter * block * programs)


def run_rows(rows: int, liger) -> dict:
    dev = torch.device("cuda")
    gen = torch.Generator(device=dev).manual_seed(0)
    s = (torch.randn(rows, V, device=dev, generator=gen) * 3).to(torch.bfloat16)
    t = (torch.randn(rows, V, device=dev, generator=gen) * 3).to(torch.bfloat16)
    nbytes = s.numel() * s.element_size()
    res: dict = {"rows": rows, "bytes_per_tensor": nbytes}

    dst = torch.empty_like(s)
    copy_ms, _ = measure(lambda: dst.copy_(s))
    copy_bw = 2 * nbytes / (copy_ms / 1e3)
    res["copy"] = {"ms": copy_ms, "GBps": copy_bw / 1e9}
    # the loss's memory floor: read both inputs once, write one gradient (an elementwise kernel
    # that does just that, and the bytes at the copy's bandwidth)
    floor_ms, _ = measure(lambda: torch.sub(s, t, out=dst))
    res["floor"] = {"ms": floor_ms, "copy_bw_ms": 3 * nbytes / copy_bw * 1e3}
    # the exp unit's floor: the loss's 8 exp2/log2 per element pair and nothing else
    res["exp_unit_floor"] = {"ms": _mufu_floor_ms(s.numel())}
    dst = None  # free one tensor before the other measurements

    sg = s.detach().clone().requires_grad_()
    s_inplace = s.detach().clone().requires_grad_()  # overwritten by its gradient each time

    def fused(x):
        return torch.autograd.grad(distill_loss(x, t, beta=BETA).loss, x)[0]

    def fused_inplace():
        out = distill_loss(s_inplace, t, beta=BETA, inplace_backward=True)
        return torch.autograd.grad(out.loss, s_inplace)[0]

    def plain(x):
        return torch.autograd.grad(plain_jsd_loss(x, t), x)[0]

    methods = {
        "fused": lambda: fused(sg),
        "fused_inplace": fused_inplace,
        "plain_pytorch": lambda: plain(sg),
    }
    ref_s, ref_t = s[:REF_ROWS], t[:REF_ROWS]

    def fused_lg(x, tt):
        out = distill_loss(x, tt, beta=BETA)
        return out.loss.detach(), torch.autograd.grad(out.loss, x)[0]

    def plain_lg(x, tt):
        loss = plain_jsd_loss(x, tt)
        return loss.detach(), torch.autograd.grad(loss, x)[0]

    errs = {
        "fused": errors(fused_lg, ref_s, ref_t),
        "plain_pytorch": errors(plain_lg, ref_s, ref_t),
    }
    if liger is not None:
        jsd = liger(beta=BETA)

        def liger_lg(x, tt):
            loss = liger_from_logits(jsd, x, tt)
            return loss.detach(), torch.autograd.grad(loss, x)[0]

        methods["liger_from_logits"] = lambda: torch.autograd.grad(
            liger_from_logits(jsd, sg, t), sg
        )[0]
        errs["liger_from_logits"] = errors(liger_lg, ref_s, ref_t)
    for name, fn in methods.items():
        try:
            ms, peak = measure(fn)
            res[name] = {"ms": ms, "peak_extra_MB": peak, **errs.get(name, {})}
        except torch.OutOfMemoryError as exc:
            res[name] = {"error": f"OOM: {exc}"[:200]}
        torch.cuda.empty_cache()
    if liger is not None:  # Liger's kernel alone, on log-probs made beforehand (not timed)
        jsd = liger(beta=BETA)
        lq = torch.log_softmax(s.float(), dim=-1).requires_grad_()
        lp = torch.log_softmax(t.float(), dim=-1)
        ms, peak = measure(lambda: torch.autograd.grad(jsd(lq, lp), lq)[0])
        res["liger_on_logprobs"] = {"ms": ms, "peak_extra_MB": peak}
        del lq, lp
        torch.cuda.empty_cache()

    # the forward JSD signal, and the loss's forward alone
    out = distill_loss(s, t, beta=BETA)
    lse_s, lse_t = out.student_lse.clone(), out.teacher_lse.clone()
    del out
    signal = {
        "jsd_given_lse": lambda: jsd_from_logits(s, t, BETA, student_lse=lse_s, teacher_lse=lse_t),
        "jsd_two_pass": lambda: jsd_from_logits(s, t, BETA),
        "fused_forward": lambda: distill_loss(s, t, beta=BETA),
    }
    for name, fn in signal.items():
        ms, peak = measure(fn)
        bw = 2 * nbytes / (ms / 1e3)  # each input counted once
        res[name] = {
            "ms": ms,
            "GBps": bw / 1e9,
            "fraction_of_copy_bw": bw / copy_bw,
            "peak_extra_MB": peak,
        }
    ref_j = plain_jsd_loss(ref_s, ref_t, dtype=torch.float64)  # mean over the rows
    given = jsd_from_logits(
        ref_s, ref_t, BETA, student_lse=lse_s[:REF_ROWS], teacher_lse=lse_t[:REF_ROWS]
    )
    res["jsd_given_lse"]["mean_abs_err"] = abs(float(given.double().mean()) - float(ref_j))
    for name in ("fused", "fused_inplace"):
        if "ms" in res[name]:
            res[f"{name}_fraction_of_floor"] = res["floor"]["ms"] / res[name]["ms"]
            res[f"{name}_fraction_of_copy_floor"] = res["floor"]["copy_bw_ms"] / res[name]["ms"]
            res[f"{name}_fraction_of_exp_unit_floor"] = (
                res["exp_unit_floor"]["ms"] / res[name]["ms"]
            )
    liger_res = res.get("liger_from_logits", {})
    if "ms" in liger_res:
        for name in ("fused", "fused_inplace"):
            res[f"{name}_speedup_vs_liger_from_logits"] = liger_res["ms"] / res[name]["ms"]
            res[f"{name}_memory_vs_liger_from_logits"] = (
                res[name]["peak_extra_MB"] / liger_res["peak_extra_MB"]
            )
    return res


def sweep(rows: int) -> dict:
    from distill_guard import triton_kernels as tk

    dev = torch.device("cuda")
    gen = torch.Generator(device=dev).manual_seed(0)
    s = (torch.randn(rows, V, device=dev, generator=gen) * 3).to(torch.bfloat16)
    t = (torch.randn(rows, V, device=dev, generator=gen) * 3).to(torch.bfloat16)
    nbytes = s.numel() * s.element_size()
    stats = tk.triton_loss_stats(s, t, None, 1.0, tk.MODE_JSD)
    weight = torch.full((rows,), 1.0 / rows, device=dev)
    grad = torch.empty_like(s)
    out = {}
    for r, c, w in TILE_SWEEP:
        kw = {"tile_rows": r, "tile_cols": c, "num_warps": w}
        a, _ = measure(lambda kw=kw: tk.triton_loss_stats(s, t, None, 1.0, 0, **kw), 3, 1)
        key = f"stats_tile{r}x{c}x{w}"
        out[key] = {"stats_GBps": 2 * nbytes / (a / 1e3) / 1e9}
        print(f"sweep {key:22s} stats_GBps {out[key]['stats_GBps']:6.0f}")
    for block, warps, stages in [
        (b, w, st) for b in (1024, 2048, 4096) for w in (4, 8) for st in (1, 2, 3, 4)
    ]:
        kw = {"block": block, "num_warps": warps, "stages": stages}
        b, _ = measure(
            lambda kw=kw: tk.triton_jsd_given_lse(
                s, t, stats[tk.STAT_LSE_S], stats[tk.STAT_LSE_T], BETA, **kw
            ),
            3,
            1,
        )
        c, _ = measure(
            lambda kw=kw: tk.triton_loss_grad(s, t, stats, weight, BETA, 1.0, 0, grad, **kw),
            3,
            1,
        )
        key = f"{block}x{warps}s{stages}"
        out[key] = {
            "jsd_given_lse_GBps": 2 * nbytes / (b / 1e3) / 1e9,
            "grad_GBps": 3 * nbytes / (c / 1e3) / 1e9,  # two reads, one write
        }
        print(f"sweep {key:12s} " + "  ".join(f"{k} {v:6.0f}" for k, v in out[key].items()))
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, nargs="+", default=[4096, 16384])
    ap.add_argument("--sweep", action="store_true")
    args = ap.parse_args()
    try:
        from liger_kernel.transformers.jsd import LigerJSD

        liger_version = importlib.metadata.version("liger-kernel")
    except ImportError:
        LigerJSD, liger_version = None, None
    import triton

    res: dict = {
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "triton": triton.__version__,
        "liger_kernel": liger_version,
        "vocab": V,
        "beta": BETA,
        "runs": [],
    }
    print(f"# {res['device']}  torch {res['torch']}  triton {res['triton']}  liger {liger_version}")
    for rows in args.rows:
        r = run_rows(rows, LigerJSD)
        res["runs"].append(r)
        print(
            f"## [{rows}, {V}] bf16, {r['bytes_per_tensor'] / 1e9:.2f} GB per tensor; "
            f"d2d copy {r['copy']['ms']:.2f} ms = {r['copy']['GBps']:.0f} GB/s"
        )
        for k, v in r.items():
            if not isinstance(v, dict) or k == "copy":
                if k.endswith(
                    ("_vs_liger_from_logits", "_of_floor", "_of_copy_floor", "_of_exp_unit_floor")
                ):
                    print(f"{k:44s} {v:.4g}")
                continue
            if k == "exp_unit_floor":
                print(f"{'exp-unit floor (8 exp2/log2 a pair)':30s} {v['ms']:8.2f} ms")
                continue
            if k == "floor":
                print(
                    f"{'floor (sub: 2 reads, 1 write)':30s} {v['ms']:8.2f} ms; at copy bw "
                    f"{v['copy_bw_ms']:.2f} ms"
                )
                continue
            if "error" in v:
                print(f"{k:22s} {v['error']}")
                continue
            line = f"{k:22s} {v['ms']:8.2f} ms  peak extra {v['peak_extra_MB']:10.1f} MB"
            if "fraction_of_copy_bw" in v:
                line += f"  {v['GBps']:6.0f} GB/s = {v['fraction_of_copy_bw']:6.1%} of copy"
            if "loss_abs_err" in v:
                line += (
                    f"  |loss err| {v['loss_abs_err']:.2e}  |grad err| {v['grad_abs_err']:.2e}"
                    f" (max |grad| {v['grad_max']:.2e})"
                )
            print(line)
        torch.cuda.empty_cache()
    if args.sweep:
        res["sweep"] = sweep(max(args.rows))
    if os.environ.get("OUT"):
        with open(os.path.join(os.environ["OUT"], "gpu_loss.json"), "w") as fh:
            json.dump(res, fh, indent=1)


if __name__ == "__main__":
    main()
