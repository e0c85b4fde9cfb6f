"""The distillation loss of :mod:`distill_guard.losses` with its gradient in one launch that reads
each input from memory once: a *team* of programs shares a row, each streaming its slice of the
vocabulary three times, and the grid holds few enough rows that the second and third reads come
from the L2 cache.

Why: the loss's gradient needs the row's log-normalisers and then KL(student‖mixture), each known
only after a full pass over the row, and a 151936-wide bf16 row pair (608 KB) fits neither one
SM's registers nor its shared memory. The three-pass kernels of
:mod:`~distill_guard.kernels.fused_loss` read both ``[N, V]`` inputs from memory three times.
Here a team of programs takes one row at a time, each program a slice; between the passes the
team exchanges per-row partial sums (a few floats per program) through global memory at a
barrier. The grid is sized so that its rows in flight (one per team) take a fraction of the L2
cache: what memory sees is one read of each input and one write of the gradient, the loss's
memory floor; the passes' re-reads are served by L2.

A row's barrier needs every program of its team resident at once, so the grid is launched
cooperatively (``launch_cooperative_grid``: CUDA refuses a grid that cannot be co-resident instead
of letting it deadlock) and sized from the compiled kernel's occupancy. On Triton's interpreter,
which runs programs one after another, the same kernel runs as one launch per pass (``PHASE``
1, 2, 3).
"""

from __future__ import annotations

import functools

import torch

from distill_guard.kernels.fused_loss import STATS_ROWS, _fast_log, _log2, _valid_arg
from distill_guard.kernels.shared import _as_rows, tl, triton

TEAM_SLICE, TEAM_SUB, TEAM_NUM_WARPS, TEAM_L2_SHARE = 8192, 2048, 4, 0.5
"""Each program's slice of the vocabulary, the block it streams the slice in, warps, and the
share of the L2 cache the rows in flight may fill (benchmarks/gpu_loss.py --sweep-team on an
H200: benchmarks/RESULTS.md)."""
# (constexpr: the only globals a Triton kernel may read)
_NP = tl.constexpr(9)
"""Floats a program hands its team per row: the first pass's seven (``_P_*``), the second's two."""
_P_MAX_S, _P_SUM_S, _P_W_S, _P_MAX_T, _P_SUM_T, _P_W_T, _P_CROSS, _P_KL_S, _P_KL_T = (
    tl.constexpr(i) for i in range(9)
)
_LN2 = tl.constexpr(0.6931471805599453)


@triton.jit
def _team_barrier(sync_ptr, target):
    """Wait until ``target`` arrivals are counted at ``sync_ptr`` (this program's included):
    the program's earlier stores are visible to every program that passes the same barrier."""
    tl.debug_barrier()  # every thread's stores precede the release below
    tl.atomic_add(sync_ptr, 1, sem="release", scope="gpu")
    arrived = tl.atomic_add(sync_ptr, 0, sem="acquire", scope="gpu")
    while arrived < target:
        arrived = tl.atomic_add(sync_ptr, 0, sem="acquire", scope="gpu")
    tl.debug_barrier()


@triton.jit
def _team_partials(part_ptr, stat, team_size, GP: tl.constexpr):
    """Partial ``stat`` of every program of the team, ``[GP]`` (0 past the team; read past L1:
    other programs wrote them)."""
    g = tl.arange(0, GP)
    return tl.load(part_ptr + stat * GP + g, mask=g < team_size, other=0.0, cache_modifier=".cg")


@triton.jit
def _team_max_sum(part_ptr, i_max, i_sum, team_size, GP: tl.constexpr):
    """The row's max and Σ 2^(u − max) from each program's (max, sum), and each program's
    rescale factor 2^(max_g − max)."""
    g = tl.arange(0, GP)
    m = tl.load(part_ptr + i_max * GP + g, mask=g < team_size, other=float("-inf"),
                cache_modifier=".cg")  # fmt: skip
    big = tl.max(m, axis=0)
    a = tl.exp2(m - tl.where(big == float("-inf"), 0.0, big))
    return big, tl.sum(_team_partials(part_ptr, i_sum, team_size, GP) * a, axis=0), a


@triton.jit
def _fold_block(m, total, x):
    """Fold a block of log₂-unit values into a running (max ``m``, Σ 2^(x − m)): the rescale
    of the old sum, and the block's 2^(x − m_new)."""
    m_new = tl.maximum(m, tl.max(x, axis=0))
    safe = tl.where(m_new == float("-inf"), 0.0, m_new)
    alpha = tl.exp2(m - safe)
    e = tl.exp2(x - safe)
    return m_new, total * alpha + tl.sum(e, axis=0), alpha, e


@triton.jit
def _team_loss_kernel(
    s_ptr,
    t_ptr,
    g_ptr,
    valid_ptr,
    w_ptr,
    stats_ptr,
    part_ptr,
    sync_ptr,
    n_rows,
    n_cols,
    stride_s,
    stride_t,
    stride_g,
    inv_temp,
    beta,
    team_size,
    n_teams,
    slice_cols,
    MODE: tl.constexpr,
    HAS_VALID: tl.constexpr,
    WRITE_GRAD: tl.constexpr,
    FAST_LOG: tl.constexpr,
    PHASE: tl.constexpr,
    SUB: tl.constexpr,
    GP: tl.constexpr,
):
    # PHASE 0: the whole loss with barriers; 1, 2, 3: one pass per launch (the interpreter)
    LAST: tl.constexpr = 3 if MODE == 0 else 2
    pid = tl.program_id(0)
    team = pid // team_size
    j = pid % team_size
    lo = j * slice_cols
    hi = tl.minimum(lo + slice_cols, n_cols)
    c = inv_temp * 1.4426950408889634  # log2 units: u = x·c, log₂ p = u − lse₂
    sync = sync_ptr + team
    turn = 0  # barriers passed: the team's arrivals so far are turn · team_size
    done = 0  # rows this team has taken: their parity picks the partials' slot
    for row in range(team, n_rows, n_teams):
        row64 = tl.cast(row, tl.int64)
        s_base = s_ptr + row64 * stride_s
        t_base = t_ptr + row64 * stride_t
        g_base = g_ptr + row64 * stride_g
        take = True
        if HAS_VALID:
            take = tl.load(valid_ptr + row) != 0  # the whole team skips a masked row alike
        if take:
            # two slots per team, by the row's parity: a program that runs ahead into the next
            # row writes the other slot while its team may still read this one
            slot = row
            if PHASE == 0:
                slot = team * 2 + done % 2
            part = part_ptr + tl.cast(slot, tl.int64) * (_NP * GP)
            if PHASE <= 1:
                # pass 1 (from memory): the slice's max, Σ 2^(u − max) and Σ 2^(u − max)·u of
                # both rows (and a KL end's cross term)
                ms, ss, ws = float("-inf"), 0.0, 0.0
                mt, st, wt = float("-inf"), 0.0, 0.0
                wc = 0.0
                for start in range(lo, hi, SUB):
                    cols = start + tl.arange(0, SUB)
                    mask = cols < hi
                    u = tl.load(s_base + cols, mask=mask, other=float("-inf")).to(tl.float32) * c
                    v = tl.load(t_base + cols, mask=mask, other=float("-inf")).to(tl.float32) * c
                    ms, ss, a_s, es = _fold_block(ms, ss, u)
                    mt, st, a_t, et = _fold_block(mt, st, v)
                    ws = ws * a_s + tl.sum(tl.where(es == 0, 0.0, es * u), axis=0)
                    wt = wt * a_t + tl.sum(tl.where(et == 0, 0.0, et * v), axis=0)
                    if MODE == 1:  # Σ p_t·u (forward KL(t‖s)), unnormalised like st
                        wc = wc * a_t + tl.sum(tl.where(et == 0, 0.0, et * u), axis=0)
                    if MODE == 2:  # Σ p_s·v (reverse KL(s‖t))
                        wc = wc * a_s + tl.sum(tl.where(es == 0, 0.0, es * v), axis=0)
                tl.store(part + _P_MAX_S * GP + j, ms)
                tl.store(part + _P_SUM_S * GP + j, ss)
                tl.store(part + _P_W_S * GP + j, ws)
                tl.store(part + _P_MAX_T * GP + j, mt)
                tl.store(part + _P_SUM_T * GP + j, st)
                tl.store(part + _P_W_T * GP + j, wt)
                tl.store(part + _P_CROSS * GP + j, wc)
            if PHASE == 0:
                turn += 1
                _team_barrier(sync, turn * team_size)
            if PHASE != 1:
                big_s, sum_s, f_s = _team_max_sum(part, _P_MAX_S, _P_SUM_S, team_size, GP)
                big_t, sum_t, f_t = _team_max_sum(part, _P_MAX_T, _P_SUM_T, team_size, GP)
                w_s = tl.sum(_team_partials(part, _P_W_S, team_size, GP) * f_s, axis=0) / sum_s
                w_t = tl.sum(_team_partials(part, _P_W_T, team_size, GP) * f_t, axis=0) / sum_t
                lse_s = big_s + tl.log2(sum_s)  # log2 units
                lse_t = big_t + tl.log2(sum_t)
                loss = 0.0
                aux = 0.0
                if MODE == 1:  # KL(t‖s) = E_t[v] − E_t[u] − lse_t + lse_s
                    cross = tl.sum(_team_partials(part, _P_CROSS, team_size, GP) * f_t, 0) / sum_t
                    loss = (w_t - cross - lse_t + lse_s) * _LN2
                if MODE == 2:  # KL(s‖t) = E_s[u] − E_s[v] − lse_s + lse_t
                    cross = tl.sum(_team_partials(part, _P_CROSS, team_size, GP) * f_s, 0) / sum_s
                    loss = (w_s - cross - lse_s + lse_t) * _LN2
                    aux = loss
                if MODE == 0:
                    if PHASE <= 2:
                        # pass 2 (from L2): the slice's share of KL(s‖m) and KL(t‖m)
                        acc_s = tl.zeros([SUB], tl.float32)
                        acc_t = tl.zeros([SUB], tl.float32)
                        for start in range(lo, hi, SUB):
                            cols = start + tl.arange(0, SUB)
                            mask = cols < hi
                            u = tl.load(s_base + cols, mask=mask, other=float("-inf"))
                            v = tl.load(t_base + cols, mask=mask, other=float("-inf"))
                            ls = u.to(tl.float32) * c - lse_s
                            lt = v.to(tl.float32) * c - lse_t
                            ps = tl.exp2(ls)
                            pt = tl.exp2(lt)
                            lm = _log2((1.0 - beta) * ps + beta * pt, FAST_LOG)
                            acc_s += tl.where(ps == 0, 0.0, ps * (ls - lm))
                            acc_t += tl.where(pt == 0, 0.0, pt * (lt - lm))
                        tl.store(part + _P_KL_S * GP + j, tl.sum(acc_s, axis=0))
                        tl.store(part + _P_KL_T * GP + j, tl.sum(acc_t, axis=0))
                    if PHASE == 0:
                        turn += 1
                        _team_barrier(sync, turn * team_size)
                    if PHASE != 2:
                        aux = tl.sum(_team_partials(part, _P_KL_S, team_size, GP), 0) * _LN2
                        kl_t = tl.sum(_team_partials(part, _P_KL_T, team_size, GP), 0) * _LN2
                        loss = (1.0 - beta) * aux + beta * kl_t
                if PHASE == 0 or PHASE == LAST:
                    if j == 0:
                        out = stats_ptr + row
                        tl.store(out + 0 * n_rows, lse_s * _LN2)
                        tl.store(out + 1 * n_rows, lse_t * _LN2)
                        tl.store(out + 2 * n_rows, (lse_s - w_s) * _LN2)
                        tl.store(out + 3 * n_rows, (lse_t - w_t) * _LN2)
                        tl.store(out + 4 * n_rows, (big_t - lse_t) * _LN2)
                        tl.store(out + 5 * n_rows, loss)
                        tl.store(out + 6 * n_rows, aux)
                    if WRITE_GRAD:
                        # pass 3 (from L2, the last read: evicted first): the gradient, bit for
                        # bit that of the gradient kernel, which reads the stored statistics
                        w = tl.load(w_ptr + row)
                        lse_s = (lse_s * _LN2) * 1.4426950408889634
                        lse_t = (lse_t * _LN2) * 1.4426950408889634
                        for start in range(lo, hi, SUB):
                            cols = start + tl.arange(0, SUB)
                            mask = cols < hi
                            u = tl.load(s_base + cols, mask=mask, other=float("-inf"),
                                        eviction_policy="evict_first")  # fmt: skip
                            v = tl.load(t_base + cols, mask=mask, other=float("-inf"),
                                        eviction_policy="evict_first")  # fmt: skip
                            ls = u.to(tl.float32) * c - lse_s
                            lt = v.to(tl.float32) * c - lse_t
                            ps = tl.exp2(ls)
                            if MODE == 0:  # ∂JSD/∂x = (1−β)·p_s·(ls − lm − KL(s‖m)); (1−β)/τ in w
                                lm = _log2((1.0 - beta) * ps + beta * tl.exp2(lt), FAST_LOG)
                                g = tl.where(ps == 0, 0.0, ps * ((ls - lm) * _LN2 - aux))
                            elif MODE == 1:  # ∂KL(t‖s)/∂x = p_s − p_t
                                g = ps - tl.exp2(lt)
                            else:  # ∂KL(s‖t)/∂x = p_s·(ls − lt − KL(s‖t))
                                g = tl.where(ps == 0, 0.0, ps * ((ls - lt) * _LN2 - aux))
                            tl.store(g_base + cols, (w * g).to(g_ptr.dtype.element_ty), mask=mask,
                                     eviction_policy="evict_first")  # fmt: skip
            done += 1
        else:
            if WRITE_GRAD and (PHASE == 0 or PHASE == LAST):  # a masked row's gradient is 0
                for start in range(lo, hi, SUB):
                    cols = start + tl.arange(0, SUB)
                    tl.store(g_base + cols, tl.zeros([SUB], g_ptr.dtype.element_ty),
                             mask=cols < hi)  # fmt: skip


@triton.jit
def _scale_unless_one_kernel(g_ptr, scale_ptr, n, BLOCK: tl.constexpr):
    """``g *= scale`` where the device scalar ``scale`` is not 1 (a plain ``backward()``): the
    decision is taken on the device, so the backward needs no host read and moves no bytes."""
    scale = tl.load(scale_ptr)
    if scale != 1.0:
        offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
        mask = offs < n
        g = tl.load(g_ptr + offs, mask=mask).to(tl.float32)
        tl.store(g_ptr + offs, (g * scale).to(g_ptr.dtype.element_ty), mask=mask)


def triton_scale_unless_one(g: torch.Tensor, scale: torch.Tensor, block: int = 4096) -> None:
    """Multiply the contiguous ``g`` in place by the one-element ``scale`` unless it is 1."""
    n = g.numel()
    if n:
        s = scale.reshape(1).float()
        _scale_unless_one_kernel[(triton.cdiv(n, block),)](g, s, n, BLOCK=block, num_warps=4)


@functools.lru_cache(maxsize=64)
def _programs_per_sm(device: int, n_regs: int, shared: int, num_warps: int) -> int:
    """How many programs of a compiled kernel an SM holds at once (registers, threads, shared
    memory): what a cooperative grid may ask for."""
    props = torch.cuda.get_device_properties(device)
    threads = 32 * num_warps
    regs_per_warp = -(-max(n_regs, 1) * 32 // 256) * 256  # allocated per warp in units of 256
    by_regs = props.regs_per_multiprocessor // (regs_per_warp * num_warps)
    by_threads = props.max_threads_per_multi_processor // threads
    smem = getattr(props, "shared_memory_per_multiprocessor", 0)
    by_smem = smem // (shared + 1024) if smem else by_threads  # 1 KB per block is the system's
    return max(0, min(by_regs, by_threads, by_smem, 32))


def team_loss(
    student_rows: torch.Tensor,
    teacher_rows: torch.Tensor,
    valid: torch.Tensor | None,
    inv_temp: float,
    beta: float,
    mode: int,
    grad_weight: torch.Tensor | None,
    grad_out: torch.Tensor | None,
    *,
    slice_cols: int = TEAM_SLICE,
    sub: int = TEAM_SUB,
    num_warps: int = TEAM_NUM_WARPS,
    l2_share: float = TEAM_L2_SHARE,
    teams: int | None = None,
) -> torch.Tensor:
    """``[7, N]`` float32 statistics (the layout of ``triton_loss_stats``, the loss and aux
    filled) reading each ``[N, V]`` input from memory once; with ``grad_weight`` (``[N]``
    float32), also ``grad_weight[r]`` times ∂loss_r/∂(logits·inv_temp) into ``grad_out`` (for the
    JSD without its factor 1−β, which the caller puts in the weight). Rows where ``valid`` is
    False are not read (their gradient is 0). Raises RuntimeError where CUDA cannot launch the
    cooperative grid (the caller falls back to the three-pass kernels)."""
    return _team_launch(
        student_rows, teacher_rows, valid, inv_temp, beta, mode, grad_weight, grad_out,
        slice_cols=slice_cols, sub=sub, num_warps=num_warps, l2_share=l2_share, teams=teams,
    )[0]  # fmt: skip


def _team_launch(
    student_rows, teacher_rows, valid, inv_temp, beta, mode, grad_weight, grad_out, *,
    slice_cols, sub, num_warps, l2_share, teams,
) -> tuple[torch.Tensor, torch.Tensor | None]:  # fmt: skip
    """:func:`team_loss`, and each team's barrier count (what the barrier's test reads)."""
    s, t = _as_rows(student_rows), _as_rows(teacher_rows)
    n, n_cols = s.shape
    stats = torch.empty(STATS_ROWS, n, dtype=torch.float32, device=s.device)
    if not n:
        return stats, None
    slice_cols = triton.cdiv(min(slice_cols, n_cols), sub) * sub  # whole blocks
    team_size = triton.cdiv(n_cols, slice_cols)
    gp = triton.next_power_of_2(team_size)
    v, has_valid = _valid_arg(valid, stats)
    write_grad = grad_weight is not None
    g = grad_out if write_grad else s  # a placeholder pointer, never written
    w = grad_weight.float().contiguous() if write_grad else stats
    args = dict(
        s_ptr=s, t_ptr=t, g_ptr=g, valid_ptr=v, w_ptr=w, stats_ptr=stats,
        n_rows=n, n_cols=n_cols, stride_s=s.stride(0), stride_t=t.stride(0),
        stride_g=g.stride(0), inv_temp=inv_temp, beta=beta, team_size=team_size,
        slice_cols=slice_cols, MODE=mode, HAS_VALID=has_valid, WRITE_GRAD=write_grad,
        FAST_LOG=_fast_log(s), SUB=sub, GP=gp, num_warps=num_warps,
    )  # fmt: skip
    if not s.is_cuda:  # the interpreter runs programs in turn: a launch per pass, a slot per row
        part = torch.empty(n, _NP.value, gp, device=s.device)
        for phase in range(1, 4 if mode == 0 else 3):
            _team_loss_kernel[(n * team_size,)](
                part_ptr=part, sync_ptr=part, n_teams=n, PHASE=phase, **args
            )
        return stats, None
    if teams is None:
        placeholder = torch.empty(1, device=s.device)
        resident = _cooperative_teams(s.device, team_size, dict(args, part_ptr=placeholder,
                                                                 sync_ptr=placeholder))  # fmt: skip
        l2 = torch.cuda.get_device_properties(s.device).L2_cache_size
        row_bytes = n_cols * (s.element_size() + t.element_size())
        teams = min(resident, max(1, int(l2_share * l2 // row_bytes)))
        if resident < 1:
            raise RuntimeError(
                f"a team of {team_size} programs (V = {n_cols}, slice {slice_cols}) is more than "
                "the device holds at once"
            )
    teams = min(teams, n)
    part = torch.empty(teams * 2, _NP.value, gp, device=s.device)
    sync = torch.zeros(teams, dtype=torch.int32, device=s.device)
    _team_loss_kernel[(teams * team_size,)](
        part_ptr=part, sync_ptr=sync, n_teams=teams, PHASE=0, launch_cooperative_grid=True,
        **args,
    )  # fmt: skip
    return stats, sync


_RESIDENT: dict[tuple, int] = {}
"""Teams resident at once per device and compiled variant, found once (compiling the kernel to
read its occupancy)."""


def _cooperative_teams(device: torch.device, team_size: int, args: dict) -> int:
    """The most teams whose programs are all resident at once on ``device``."""
    index = device.index if device.index is not None else torch.cuda.current_device()
    key = (index, team_size, args["s_ptr"].dtype, args["g_ptr"].dtype) + tuple(
        args[k] for k in ("MODE", "HAS_VALID", "WRITE_GRAD", "FAST_LOG", "SUB", "GP", "num_warps")
    )
    if key not in _RESIDENT:
        kernel = _team_loss_kernel.warmup(
            n_teams=1, PHASE=0, launch_cooperative_grid=True, grid=(1,), **args
        )
        kernel._init_handles()
        per_sm = _programs_per_sm(
            index, int(kernel.n_regs), int(kernel.metadata.shared), args["num_warps"]
        )
        sms = torch.cuda.get_device_properties(index).multi_processor_count
        _RESIDENT[key] = (per_sm * sms) // team_size
    return _RESIDENT[key]
