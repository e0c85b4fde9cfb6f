"""GPU: the distillation loss from hidden states (forward + backward), side by side in one run.

The inputs a TRL or custom-loop user holds when the logits are never materialised: student and
teacher hidden states ``[rows, 2048]`` bf16 and their lm heads ``[151936, 2048]`` bf16 (logits of
std ≈ 3), generalized JSD β = 0.5, τ = 1, mean over rows; gradients w.r.t. the student's hidden
states and head. Compared:
- ``distill_loss_from_hidden`` (its default: the head's gradient accumulated in bf16; and in
  float32, ``float32_weight_grad=True``), with
  the teacher's hidden states, and with the teacher's top-64 (ids and logprobs made beforehand),
  by its Triton kernels and by PyTorch ops per chunk (``backend="torch"``);
- Liger-Kernel's ``LigerFusedLinearJSD`` (default, and ``accum_dtype=torch.float32``);
- Liger's ``LigerJSD`` from logits: both ``[rows, V]`` logits by a bf16 matmul, two float32
  ``log_softmax``, ``LigerJSD``, autograd back through them;
- plain PyTorch: the same logits, float32 ``log_softmax``, a ``logaddexp`` mixture, autograd;
- the matmuls alone, two ways: the four products of our chunking (two float32-out logits, the
  hidden-state gradient, the head's float32 accumulation) and the four whole bf16 products.
Time is the median of 5 after 2 warm-ups (CUDA events); peak extra memory is
``max_memory_allocated`` above what was allocated before, the returned gradients included.
Errors are against float64 on all rows (the head's gradient needs every row): |loss error| and
the relative L2 error of each gradient, beside the floor of rounding the exact gradient to bf16
once. The loss's non-matmul time is set against its bandwidth floor: the float32 logits read
once and the bf16 gradient rows written once, at the copy bandwidth measured in the same run.
``--chunks`` also times ours per chunk size. ``--error-seeds 0 1 2`` measures only the errors, over
those inputs, with the hidden states' gradient in one product over V and in slices of it;
``--ab-slices`` times those. Writes $OUT/gpu_linear_loss.json when $OUT is set.

Run: python3 benchmarks/gpu_linear_loss.py [--rows 4096 16384] [--chunks 64 128 256 512]
(Liger: pip install liger-kernel==0.8.5; its rows are skipped without it)
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os

import torch
from gpu_signals import measure  # the same timing and peak-memory yardstick as §2

import distill_guard.linear_loss as linear_loss
from distill_guard.linear_loss import default_chunk_rows, distill_loss_from_hidden
from distill_guard.losses import distill_loss

V, H, BETA, TOPK = 151_936, 2048, 0.5, 64
REF_CHUNK = 512


def inputs(rows: int, seed: int = 0) -> dict[str, torch.Tensor]:
    dev = torch.device("cuda")
    gen = torch.Generator(device=dev).manual_seed(seed)

    def randn(*shape, scale=1.0):
        return (torch.randn(*shape, device=dev, generator=gen) * scale).to(torch.bfloat16)

    return {
        "h": randn(rows, H),
        "w": randn(V, H, scale=3 / H**0.5),
        "ht": randn(rows, H),
        "wt": randn(V, H, scale=3 / H**0.5),
    }


def teacher_topk(x: dict, k: int = TOPK) -> tuple[torch.Tensor, torch.Tensor]:
    """The teacher's top-k logprobs and ids, as a server would return them (not timed)."""
    lps, ids = [], []
    for a in range(0, x["ht"].shape[0], REF_CHUNK):
        lp = torch.log_softmax(
            torch.mm(x["ht"][a : a + REF_CHUNK].float(), x["wt"].float().t()), -1
        )
        top = lp.topk(k, dim=-1)
        lps.append(top.values)
        ids.append(top.indices)
    return torch.cat(lps), torch.cat(ids)


def reference(x: dict, topk=None, rows_floor: bool = False) -> dict[str, torch.Tensor]:
    """Loss and both gradients in float64, chunk by chunk (exact up to float64 rounding); with
    ``rows_floor``, also the hidden states' gradient of exact row gradients rounded to bf16."""
    h, w = x["h"].double(), x["w"].double()
    wt = x["wt"].double()
    n = h.shape[0]
    grad_h = torch.empty_like(h)
    grad_w = torch.zeros_like(w)
    total = torch.zeros((), dtype=torch.float64, device=h.device)
    rows_rounded = torch.empty_like(h) if rows_floor else None
    for a in range(0, n, REF_CHUNK):
        b = min(a + REF_CHUNK, n)
        s = torch.mm(h[a:b], w.t()).requires_grad_()
        if topk is None:
            t = torch.mm(x["ht"][a:b].double(), wt.t())
        else:  # the top-k teacher: its logprobs at its ids, no mass elsewhere
            t = torch.full_like(s, float("-inf")).detach()
            t.scatter_(1, topk[1][a:b], topk[0][a:b].double())
        loss = distill_loss(s, t, beta=BETA, backend="torch").per_token.sum() / n
        (g,) = torch.autograd.grad(loss, s)
        if rows_rounded is not None:  # the row gradients rounded to bf16, the rest exact
            rows_rounded[a:b] = g.to(torch.bfloat16).double() @ w
        grad_h[a:b] = g @ w
        grad_w.addmm_(g.t(), h[a:b])
        total += loss.detach()
    out = {"loss": total, "grad_h": grad_h, "grad_w": grad_w}
    if rows_rounded is not None:
        out["grad_h_rows_rounded"] = rows_rounded.to(torch.bfloat16)
    return out


def rel(a: torch.Tensor, ref: torch.Tensor) -> float:
    return float((a.double() - ref).norm() / ref.norm())


def errors(loss, grads, ref) -> dict[str, float]:
    return {
        "loss_abs_err": abs(float(loss) - float(ref["loss"])),
        "grad_h_rel_err": rel(grads[0], ref["grad_h"]),
        "grad_w_rel_err": rel(grads[1], ref["grad_w"]),
    }


def matmuls_chunked(x: dict, chunk: int, group: int):
    """The four products as ours runs them, the loss's own work left out: both float32 logits
    per chunk, the hidden-state gradient and the head's float32 accumulation per group."""
    h, w, ht, wt = x["h"], x["w"], x["ht"], x["wt"]
    n = h.shape[0]
    g = torch.randn(group, V, device=h.device).to(torch.bfloat16)
    grad_h = torch.empty_like(h)
    grad_w = torch.zeros(w.shape, dtype=torch.float32, device=w.device)
    for a in range(0, n, chunk):
        b = min(a + chunk, n)
        torch.mm(h[a:b], w.t(), out_dtype=torch.float32)
        torch.mm(ht[a:b], wt.t(), out_dtype=torch.float32)
        if b % group == 0 or b == n:
            a0 = (b - 1) // group * group
            grad_h[a0:b] = torch.mm(g[: b - a0], w, out_dtype=torch.float32)
            torch.addmm(grad_w, g[: b - a0].t(), h[a0:b], out_dtype=torch.float32, out=grad_w)
    return grad_w.to(w.dtype)


def matmul_parts(x: dict, chunk: int, group: int) -> dict[str, float]:
    """Each product alone over all rows, as ours runs it (ms): where the matmul time goes."""
    h, w = x["h"], x["w"]
    n = h.shape[0]
    g = torch.randn(group, V, device=h.device).to(torch.bfloat16)
    acc32 = torch.zeros(w.shape, dtype=torch.float32, device=w.device)
    acc16 = torch.zeros_like(w)

    def per_chunk(fn):
        return lambda: [fn(a, min(a + chunk, n)) for a in range(0, n, chunk)]

    def per_group(fn):
        return lambda: [fn(a, min(a + group, n)) for a in range(0, n, group)]

    parts = {
        "logits_fp32_out": per_chunk(lambda a, b: torch.mm(h[a:b], w.t(), out_dtype=torch.float32)),
        "logits_bf16_out": per_chunk(lambda a, b: torch.mm(h[a:b], w.t())),
        "grad_h": per_group(lambda a, b: torch.mm(g[: b - a], w, out_dtype=torch.float32)),
        "grad_w_fp32_accum": per_group(
            lambda a, b: torch.addmm(
                acc32, g[: b - a].t(), h[a:b], out_dtype=torch.float32, out=acc32
            )
        ),
        "grad_w_bf16_accum": per_group(lambda a, b: acc16.addmm_(g[: b - a].t(), h[a:b])),
    }
    return {name: measure(fn)[0] for name, fn in parts.items()}


def matmuls_whole(x: dict):
    """The four whole bf16 products a path that materialises the logits runs."""
    h, w, ht, wt = x["h"], x["w"], x["ht"], x["wt"]
    s = torch.mm(h, w.t())
    torch.mm(ht, wt.t())
    torch.mm(s, w)
    return torch.mm(s.t(), h)


def plain_loss(s_logits, t_logits):
    ls = torch.log_softmax(s_logits.float(), -1)
    lt = torch.log_softmax(t_logits.float(), -1)
    lm = torch.logaddexp(ls + torch.log1p(torch.tensor(-BETA)), lt + torch.log(torch.tensor(BETA)))
    per_row = (1 - BETA) * (ls.exp() * (ls - lm)).sum(-1) + BETA * (lt.exp() * (lt - lm)).sum(-1)
    return per_row.mean()


def methods(x: dict, topk, liger: dict) -> dict:
    h = x["h"].detach().clone().requires_grad_()
    w = x["w"].detach().clone().requires_grad_()
    ht, wt = x["ht"], x["wt"]

    def grads(loss):
        return loss.detach(), torch.autograd.grad(loss, [h, w])

    out = {
        "ours": lambda: grads(distill_loss_from_hidden(h, w, ht, wt, beta=BETA).loss),
        "ours_fp32_weight_accum": lambda: grads(
            distill_loss_from_hidden(h, w, ht, wt, beta=BETA, float32_weight_grad=True).loss
        ),
        "ours_topk64": lambda: grads(
            distill_loss_from_hidden(h, w, teacher_topk=topk, beta=BETA).loss
        ),
        # the same top-64 loss in PyTorch ops per chunk (what the Triton kernels replace)
        "ours_topk64_torch_ops": lambda: grads(
            distill_loss_from_hidden(h, w, teacher_topk=topk, beta=BETA, backend="torch").loss
        ),
    }
    if liger:
        fused = liger["fused"](jsd_beta=BETA)
        fused32 = liger["fused"](jsd_beta=BETA, accum_dtype=torch.float32)
        jsd = liger["jsd"](beta=BETA)
        out["liger_fused_linear"] = lambda: grads(fused(h, w, ht, wt, None))
        out["liger_fused_linear_fp32_accum"] = lambda: grads(fused32(h, w, ht, wt, None))
        out["liger_from_logits"] = lambda: grads(
            jsd(
                torch.log_softmax((h @ w.t()).float(), -1),
                torch.log_softmax((ht @ wt.t()).float(), -1),
            )
        )
    out["plain_pytorch"] = lambda: grads(plain_loss(h @ w.t(), ht @ wt.t()))
    return out


def copy_bandwidth(rows: int) -> dict[str, float]:
    """A device-to-device copy of one ``[rows, V]`` float32 tensor: the bandwidth yardstick."""
    src = torch.empty(rows, V, device="cuda", dtype=torch.float32)
    dst = torch.empty_like(src)
    ms, _ = measure(lambda: dst.copy_(src))
    return {"ms": ms, "GBps": 2 * src.numel() * 4 / (ms / 1e3) / 1e9}


def run_rows(rows: int, liger: dict, chunks: list[int]) -> dict:
    x = inputs(rows)
    chunk = default_chunk_rows(rows)
    res: dict = {"rows": rows, "chunk_rows": chunk, "group_chunks": linear_loss._GROUP_CHUNKS}
    res["copy"] = copy_bandwidth(rows)
    copy_bw = res["copy"]["GBps"] * 1e9
    topk = teacher_topk(x)
    ref = reference(x)
    ref_topk = reference(x, topk)
    res["bf16_rounding_floor"] = {
        "grad_h_rel_err": rel(ref["grad_h"].to(torch.bfloat16), ref["grad_h"]),
        "grad_w_rel_err": rel(ref["grad_w"].to(torch.bfloat16), ref["grad_w"]),
    }
    for name, fn in methods(x, topk, liger).items():
        try:
            loss, g = fn()
            err = errors(loss, g, ref_topk if "topk" in name else ref)
            del loss, g
            torch.cuda.empty_cache()
            ms, peak = measure(fn)
            res[name] = {"ms": ms, "peak_extra_MB": peak, **err}
        except torch.OutOfMemoryError as exc:
            res[name] = {"error": f"OOM: {exc}"[:160]}
        torch.cuda.empty_cache()
        print(f"  {name}: {res[name]}", flush=True)
    group = chunk * linear_loss._GROUP_CHUNKS
    ms, peak = measure(lambda: matmuls_chunked(x, chunk, group))
    res["matmuls_chunked"] = {"ms": ms, "peak_extra_MB": peak}
    res["matmul_parts"] = matmul_parts(x, chunk, group)
    print(f"  matmul_parts {res['matmul_parts']}", flush=True)
    try:
        ms, peak = measure(lambda: matmuls_whole(x))
        res["matmuls_whole_bf16"] = {"ms": ms, "peak_extra_MB": peak}
    except torch.OutOfMemoryError as exc:
        res["matmuls_whole_bf16"] = {"error": f"OOM: {exc}"[:160]}
    torch.cuda.empty_cache()
    ours = res["ours"]
    # the loss's own work: both float32 logits read by three passes at best once, bf16 rows out;
    # set against the matmuls of the same setting (the head's gradient accumulated in float32)
    floor_ms = rows * V * (2 * 4 + 2) / copy_bw * 1e3
    loss_ms = res["ours_fp32_weight_accum"]["ms"] - res["matmuls_chunked"]["ms"]
    res["loss_part"] = {
        "ms": loss_ms,
        "floor_ms": floor_ms,
        "fraction_of_floor": floor_ms / loss_ms,
    }
    res["ours_fraction_of_matmuls"] = res["matmuls_chunked"]["ms"] / ours["ms"]
    # the top-K path runs three of the products: the student's logits, both gradients
    parts = res["matmul_parts"]
    topk_mm = parts["logits_fp32_out"] + parts["grad_h"] + parts["grad_w_bf16_accum"]
    if "ms" in res.get("ours_topk64", {}):
        res["topk"] = {
            "matmuls_ms": topk_mm,
            "fraction_of_matmuls": topk_mm / res["ours_topk64"]["ms"],
        }
        if "ms" in res.get("ours_topk64_torch_ops", {}):
            res["topk"]["speedup_vs_torch_ops"] = (
                res["ours_topk64_torch_ops"]["ms"] / res["ours_topk64"]["ms"]
            )
    for other in ("liger_fused_linear", "liger_fused_linear_fp32_accum", "liger_from_logits"):
        if "ms" in res.get(other, {}):
            res[f"speedup_vs_{other}"] = res[other]["ms"] / ours["ms"]
            res[f"memory_vs_{other}"] = ours["peak_extra_MB"] / res[other]["peak_extra_MB"]
    # like for like: both accumulating the head's gradient in float32
    ours32, liger32 = (
        res.get("ours_fp32_weight_accum", {}),
        res.get("liger_fused_linear_fp32_accum", {}),
    )
    if "ms" in ours32 and "ms" in liger32:
        res["fp32_speedup_vs_liger_fused_linear_fp32_accum"] = liger32["ms"] / ours32["ms"]
        res["fp32_memory_vs_liger_fused_linear_fp32_accum"] = (
            ours32["peak_extra_MB"] / liger32["peak_extra_MB"]
        )
    if chunks:
        h = x["h"].detach().clone().requires_grad_()
        w = x["w"].detach().clone().requires_grad_()
        res["chunk_sweep"] = {}
        default_group = linear_loss._GROUP_CHUNKS
        for c in chunks:
            for groups in (2, 4):
                for f32 in (True, False):

                    def run(c=c, f32=f32):
                        out = distill_loss_from_hidden(
                            h, w, x["ht"], x["wt"], chunk_rows=c, float32_weight_grad=f32
                        )
                        return torch.autograd.grad(out.loss, [h, w])

                    linear_loss._GROUP_CHUNKS = groups
                    ms, peak = measure(run)
                    linear_loss._GROUP_CHUNKS = default_group
                    key = f"chunk{c}_group{groups}{'' if f32 else '_bf16acc'}"
                    res["chunk_sweep"][key] = {"ms": ms, "peak_extra_MB": peak}
                    print(f"  {key}: {ms:.2f} ms {peak:.0f} MB", flush=True)
                    torch.cuda.empty_cache()
    return res


def _with_slice(cols, fn):
    """fn() with the hidden states' gradient contracted in slices of ``cols`` of V (None: one
    product over V)."""
    default = linear_loss.GRAD_H_SLICE_COLS
    linear_loss.GRAD_H_SLICE_COLS = cols
    try:
        return fn()
    finally:
        linear_loss.GRAD_H_SLICE_COLS = default


SLICES = (None, 16384, 32768)


def error_seeds(rows: int, seeds: list[int], liger: dict) -> dict:
    """The gradients' errors against float64 over several inputs (no timing). Ours and Liger's
    fused-linear share the rounding (float32 logits, bf16 row gradients, float32-accumulated
    matmuls); ``rows_rounded`` is the exact row gradients rounded to bf16 and the rest exact,
    rounded once: what that rounding costs. Ours is run with the hidden states' gradient in one
    product over V and in slices of it (``ours_slice<cols>``)."""
    res: dict = {"rows": rows, "seeds": {}}
    for seed in seeds:
        x = inputs(rows, seed)
        ref = reference(x, rows_floor=True)
        one = {
            "bf16_rounding_floor": rel(ref["grad_h"].to(torch.bfloat16), ref["grad_h"]),
            "rows_rounded": rel(ref.pop("grad_h_rows_rounded"), ref["grad_h"]),
        }
        fns = methods(x, None, liger)
        for cols in SLICES:
            loss, g = _with_slice(cols, fns["ours"])
            one[f"ours_slice{cols}"] = errors(loss, g, ref)
            del loss, g
        for name in ("liger_fused_linear", "liger_fused_linear_fp32_accum"):
            if name in fns:
                loss, g = fns[name]()
                one[name] = errors(loss, g, ref)
                del loss, g
        res["seeds"][seed] = one
        print(f"  seed {seed}: " + json.dumps(one), flush=True)
        del x, ref, fns
        torch.cuda.empty_cache()
    return res


def ab_slices(rows: int) -> dict:
    """Ours fwd + bwd per slicing of the hidden states' gradient and per tile rows of the
    sub-row statistics pass, same inputs, interleaved."""
    from distill_guard.kernels import split_rows

    x = inputs(rows)
    run = methods(x, None, {})["ours"]
    out: dict = {}
    default_tile = split_rows.SUB_ROW_TILE_ROWS
    for _ in range(2):
        for tile in (2, 4, 8):
            split_rows.SUB_ROW_TILE_ROWS = tile
            for cols in SLICES:
                ms, peak = _with_slice(cols, lambda: measure(run))
                key = f"tile{tile}_slice{cols}"
                out.setdefault(key, []).append({"ms": ms, "peak_extra_MB": peak})
                print(f"  ours rows {rows}, {key}: {ms:.2f} ms, {peak:.0f} MB", flush=True)
    split_rows.SUB_ROW_TILE_ROWS = default_tile
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, nargs="+", default=[4096, 16384])
    ap.add_argument("--chunks", type=int, nargs="*", default=[])
    ap.add_argument("--error-seeds", type=int, nargs="*", default=[])
    ap.add_argument("--ab-slices", action="store_true")
    args = ap.parse_args()
    liger: dict = {}
    try:
        from liger_kernel.transformers.fused_linear_jsd import LigerFusedLinearJSD
        from liger_kernel.transformers.jsd import LigerJSD

        liger = {"fused": LigerFusedLinearJSD, "jsd": LigerJSD}
        liger_version = importlib.metadata.version("liger-kernel")
    except ImportError:
        liger_version = None
    import triton

    res: dict = {
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "triton": triton.__version__,
        "liger_kernel": liger_version,
        "vocab": V,
        "hidden": H,
        "beta": BETA,
        "runs": [],
    }
    print(f"# {res['device']}  torch {res['torch']}  triton {res['triton']}  liger {liger_version}")
    if args.error_seeds or args.ab_slices:
        for rows in args.rows:
            print(f"## rows {rows}", flush=True)
            if args.error_seeds:
                res.setdefault("error_seeds", []).append(error_seeds(rows, args.error_seeds, liger))
            if args.ab_slices:
                res.setdefault("ab_slices", []).append(ab_slices(rows))
        args.rows = []
    for rows in args.rows:
        print(f"## rows {rows}", flush=True)
        r = run_rows(rows, liger, args.chunks)
        res["runs"].append(r)
        for k, v in r.items():
            if not isinstance(v, dict) and k not in ("rows",):
                print(f"  {k:44s} {v:.4g}" if isinstance(v, float) else f"  {k} {v}")
        print(f"  loss_part {r['loss_part']}  copy {r['copy']}")
        print(f"  bf16_rounding_floor {r['bf16_rounding_floor']}")
        print(f"  matmuls {r['matmuls_chunked']} whole {r['matmuls_whole_bf16']}", flush=True)
        torch.cuda.empty_cache()
    if os.environ.get("OUT"):
        with open(os.path.join(os.environ["OUT"], "gpu_linear_loss.json"), "w") as fh:
            json.dump(res, fh, indent=1)


if __name__ == "__main__":
    main()
