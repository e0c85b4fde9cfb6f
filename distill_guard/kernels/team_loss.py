"""The distillation loss of :mod:`distill_guard.losses` in one read of each input: a *team* of
programs holds a row pair in registers, each program a slice of the vocabulary, and the team
reduces the row's statistics through global memory between the passes.

Why: the loss's gradient needs KL(student‖mixture), known only after a full pass over the row,
and a 151936-wide bf16 row pair (608 KB) does not fit one SM. The three-pass kernels of
:mod:`~distill_guard.kernels.fused_loss` read both rows three times; here each program loads its
slice once, the team exchanges per-row partial sums (a few floats per program) at a barrier, and
the gradient is written from the registers: both inputs read once and the gradient written once,
the loss's memory floor.

The barrier needs every program of a team resident at once, so the grid is launched cooperatively
(``launch_cooperative_grid``: CUDA refuses a grid that cannot be co-resident instead of letting it
deadlock) and sized from the compiled kernel's occupancy. On Triton's interpreter, which runs
programs one after another, the same kernel runs as one launch per phase (``PHASE`` 1, 2, 3).
"""

from __future__ import annotations

import functools

import torch

from distill_guard.kernels.fused_loss import STATS_ROWS, _fast_log, _log2, _valid_arg
from distill_guard.kernels.shared import _as_rows, tl, triton

TEAM_BLOCK, TEAM_ROWS, TEAM_NUM_WARPS = 4096, 2, 8
"""Each program's slice of the vocabulary, rows per team turn and warps (benchmarks/gpu_loss.py
--sweep-team on an H200: benchmarks/RESULTS.md)."""
_PARTIALS = 7
"""Per-row partial sums a program hands its team: see the ``_P_*`` indices."""
_P_MAX_S, _P_SUM_S, _P_W_S, _P_MAX_T, _P_SUM_T, _P_W_T, _P_CROSS = range(_PARTIALS)
_LN2 = 0.6931471805599453
_LOG2E = 1.4426950408889634


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
def _fold(part_ptr, stat, team_size, GP: tl.constexpr, ROWS: tl.constexpr):
    """``[GP, ROWS]`` partials ``stat`` of every program of the team (read past L1: other
    programs wrote them)."""
    g = tl.arange(0, GP)
    r = tl.arange(0, ROWS)
    ptrs = part_ptr + (stat * GP + g[:, None]) * ROWS + r[None, :]
    return tl.load(ptrs, mask=(g < team_size)[:, None], other=0.0, cache_modifier=".cg")


@triton.jit
def _fold_max_sum(part_ptr, i_max, i_sum, team_size, GP: tl.constexpr, ROWS: tl.constexpr):
    """The row's max and Σ 2^(u − max) from each program's (max, sum), and each program's
    rescale factor 2^(max_g − max)."""
    m = tl.where(tl.arange(0, GP)[:, None] < team_size, _fold(part_ptr, i_max, team_size, GP, ROWS),
                 float("-inf"))  # fmt: skip
    big = tl.max(m, axis=0)
    safe = tl.where(big == float("-inf"), 0.0, big)
    a = tl.exp2(m - safe[None, :])
    return big, tl.sum(_fold(part_ptr, i_sum, team_size, GP, ROWS) * a, axis=0), a


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
    MODE: tl.constexpr,
    HAS_VALID: tl.constexpr,
    WRITE_GRAD: tl.constexpr,
    FAST_LOG: tl.constexpr,
    PHASE: tl.constexpr,
    BLOCK: tl.constexpr,
    ROWS: tl.constexpr,
    GP: tl.constexpr,
):
    # PHASE 0: the whole loss with barriers; 1, 2, 3: one phase per launch (the interpreter)
    LAST: tl.constexpr = 3 if MODE == 0 else 2
    pid = tl.program_id(0)
    team = pid // team_size
    j = pid % team_size
    cols = j * BLOCK + tl.arange(0, BLOCK)
    cmask = cols < n_cols
    c = inv_temp * 1.4426950408889634  # log2 units: u = x·c, log₂ p = u − lse₂
    sync = sync_ptr + team
    n_groups = tl.cdiv(n_rows, ROWS)
    turn = 0
    for group in range(team, n_groups, n_teams):
        # the team's partials, reused turn after turn behind the barriers; one slot per row
        # group when the phases are separate launches
        slot = team if PHASE == 0 else group
        part_team = part_ptr + slot * (2 * _PARTIALS * GP * ROWS)
        part_a = part_team + j * ROWS  # this program's column of the team's partials
        part_b = part_team + _PARTIALS * GP * ROWS
        rows = group * ROWS + tl.arange(0, ROWS)
        rmask = rows < n_rows
        if HAS_VALID:
            rmask = rmask & (tl.load(valid_ptr + rows, mask=rmask, other=0) != 0)
        rows64 = rows.to(tl.int64)
        mask = rmask[:, None] & cmask[None, :]
        u = tl.load(s_ptr + rows64[:, None] * stride_s + cols[None, :], mask=mask,
                    other=float("-inf")).to(tl.float32) * c  # fmt: skip
        v = tl.load(t_ptr + rows64[:, None] * stride_t + cols[None, :], mask=mask,
                    other=float("-inf")).to(tl.float32) * c  # fmt: skip
        # phase A: each program's max, Σ 2^(u − max), Σ 2^(u − max)·u of both rows (and a
        # KL end's cross term), folded by the team into the log-normalisers
        ms = tl.max(u, axis=1)
        mt = tl.max(v, axis=1)
        es = tl.exp2(u - tl.where(ms == float("-inf"), 0.0, ms)[:, None])
        et = tl.exp2(v - tl.where(mt == float("-inf"), 0.0, mt)[:, None])
        r = tl.arange(0, ROWS)
        if PHASE <= 1:
            tl.store(part_a + _P_MAX_S * GP * ROWS + r, ms)
            tl.store(part_a + _P_SUM_S * GP * ROWS + r, tl.sum(es, axis=1))
            tl.store(part_a + _P_W_S * GP * ROWS + r, tl.sum(tl.where(es == 0, 0.0, es * u), 1))
            tl.store(part_a + _P_MAX_T * GP * ROWS + r, mt)
            tl.store(part_a + _P_SUM_T * GP * ROWS + r, tl.sum(et, axis=1))
            tl.store(part_a + _P_W_T * GP * ROWS + r, tl.sum(tl.where(et == 0, 0.0, et * v), 1))
            if MODE == 1:  # Σ p_t·u (forward KL(t‖s)), unnormalised like the teacher's sum
                tl.store(part_a + _P_CROSS * GP * ROWS + r,
                         tl.sum(tl.where(et == 0, 0.0, et * u), 1))  # fmt: skip
            if MODE == 2:  # Σ p_s·v (reverse KL(s‖t))
                tl.store(part_a + _P_CROSS * GP * ROWS + r,
                         tl.sum(tl.where(es == 0, 0.0, es * v), 1))  # fmt: skip
        if PHASE == 0:
            turn += 1
            _team_barrier(sync, turn * team_size)
        if PHASE != 1:
            big_s, sum_s, a_s = _fold_max_sum(part_team, _P_MAX_S, _P_SUM_S, team_size, GP, ROWS)
            big_t, sum_t, a_t = _fold_max_sum(part_team, _P_MAX_T, _P_SUM_T, team_size, GP, ROWS)
            w_s = tl.sum(_fold(part_team, _P_W_S, team_size, GP, ROWS) * a_s, axis=0) / sum_s
            w_t = tl.sum(_fold(part_team, _P_W_T, team_size, GP, ROWS) * a_t, axis=0) / sum_t
            lse_s = big_s + tl.log2(sum_s)  # log2 units
            lse_t = big_t + tl.log2(sum_t)
            ls = u - lse_s[:, None]
            lt = v - lse_t[:, None]
            ps = tl.exp2(ls)
            loss = tl.zeros([ROWS], tl.float32)
            aux = tl.zeros([ROWS], tl.float32)
            lm = ls
            if MODE == 1:  # KL(t‖s) = Σ p_t·(lt − ls) = E_t[v] − E_t[u] − lse_t + lse_s
                cross = tl.sum(_fold(part_team, _P_CROSS, team_size, GP, ROWS) * a_t, 0) / sum_t
                loss = (w_t - cross - lse_t + lse_s) * _LN2
            if MODE == 2:  # KL(s‖t) = E_s[u] − E_s[v] − lse_s + lse_t
                cross = tl.sum(_fold(part_team, _P_CROSS, team_size, GP, ROWS) * a_s, 0) / sum_s
                loss = (w_s - cross - lse_s + lse_t) * _LN2
                aux = loss
            if MODE == 0:  # phase B: each program's share of KL(s‖m) and KL(t‖m)
                pt = tl.exp2(lt)
                lm = _log2((1.0 - beta) * ps + beta * pt, FAST_LOG)
                kl_s = tl.sum(tl.where(ps == 0, 0.0, ps * (ls - lm)), axis=1)
                kl_t = tl.sum(tl.where(pt == 0, 0.0, pt * (lt - lm)), axis=1)
                if PHASE <= 2:
                    tl.store(part_b + (0 * GP + j) * ROWS + r, kl_s)
                    tl.store(part_b + (1 * GP + j) * ROWS + r, kl_t)
                if PHASE == 0:
                    turn += 1
                    _team_barrier(sync, turn * team_size)
                if PHASE != 2:
                    aux = tl.sum(_fold(part_b, 0, team_size, GP, ROWS), axis=0) * _LN2
                    kl_t_row = tl.sum(_fold(part_b, 1, team_size, GP, ROWS), axis=0) * _LN2
                    loss = (1.0 - beta) * aux + beta * kl_t_row
            if PHASE == 0 or PHASE == LAST:
                if j == 0:
                    out = stats_ptr + rows
                    tl.store(out + 0 * n_rows, lse_s * _LN2, mask=rmask)
                    tl.store(out + 1 * n_rows, lse_t * _LN2, mask=rmask)
                    tl.store(out + 2 * n_rows, (lse_s - w_s) * _LN2, mask=rmask)
                    tl.store(out + 3 * n_rows, (lse_t - w_t) * _LN2, mask=rmask)
                    tl.store(out + 4 * n_rows, (big_t - lse_t) * _LN2, mask=rmask)
                    tl.store(out + 5 * n_rows, loss, mask=rmask)
                    tl.store(out + 6 * n_rows, aux, mask=rmask)
                if WRITE_GRAD:
                    w = tl.load(w_ptr + rows, mask=rows < n_rows, other=0.0)
                    if MODE == 0:  # ∂JSD/∂x = (1−β)·p_s·(ls − lm − KL(s‖m)); (1−β)/τ is in w
                        g = tl.where(ps == 0, 0.0, ps * ((ls - lm) * _LN2 - aux[:, None]))
                    elif MODE == 1:  # ∂KL(t‖s)/∂x = p_s − p_t
                        g = ps - tl.exp2(lt)
                    else:  # ∂KL(s‖t)/∂x = p_s·(ls − lt − KL(s‖t))
                        g = tl.where(ps == 0, 0.0, ps * ((ls - lt) * _LN2 - aux[:, None]))
                    g = tl.where((w != 0)[:, None], w[:, None] * g, 0.0)  # masked rows: 0
                    tl.store(g_ptr + rows64[:, None] * stride_g + cols[None, :],
                             g.to(g_ptr.dtype.element_ty),
                             mask=(rows < n_rows)[:, None] & cmask[None, :])  # fmt: skip


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
    block: int = TEAM_BLOCK,
    rows_per_turn: int = TEAM_ROWS,
    num_warps: int = TEAM_NUM_WARPS,
    teams: int | None = None,
) -> torch.Tensor:
    """``[7, N]`` float32 statistics (the layout of ``triton_loss_stats``, the loss and aux
    filled) in one read of each ``[N, V]`` input; with ``grad_weight`` (``[N]`` float32), also
    ``grad_weight[r]`` times ∂loss_r/∂(logits·inv_temp) into ``grad_out`` (for the JSD without
    its factor 1−β, which the caller puts in the weight). Rows where ``valid`` is False are not
    read. Raises RuntimeError where CUDA cannot launch the cooperative grid (the caller falls
    back to the three-pass kernels)."""
    return _team_launch(
        student_rows, teacher_rows, valid, inv_temp, beta, mode, grad_weight, grad_out,
        block=block, rows_per_turn=rows_per_turn, num_warps=num_warps, teams=teams,
    )[0]  # fmt: skip


def _team_launch(
    student_rows, teacher_rows, valid, inv_temp, beta, mode, grad_weight, grad_out, *,
    block, rows_per_turn, num_warps, teams,
) -> tuple[torch.Tensor, torch.Tensor | None]:  # fmt: skip
    """:func:`team_loss`, and each team's barrier count (what the barrier's test reads)."""
    s, t = _as_rows(student_rows), _as_rows(teacher_rows)
    n, n_cols = s.shape
    stats = torch.empty(STATS_ROWS, n, dtype=torch.float32, device=s.device)
    if not n:
        return stats, None
    team_size = triton.cdiv(n_cols, block)
    gp = triton.next_power_of_2(team_size)
    v, has_valid = _valid_arg(valid, stats)
    write_grad = grad_weight is not None
    g = grad_out if write_grad else s  # a placeholder pointer, never written
    w = grad_weight.float().contiguous() if write_grad else stats
    n_groups = triton.cdiv(n, rows_per_turn)
    compiled = s.is_cuda
    args = dict(
        s_ptr=s, t_ptr=t, g_ptr=g, valid_ptr=v, w_ptr=w, stats_ptr=stats,
        n_rows=n, n_cols=n_cols, stride_s=s.stride(0), stride_t=t.stride(0),
        stride_g=g.stride(0), inv_temp=inv_temp, beta=beta, team_size=team_size,
        MODE=mode, HAS_VALID=has_valid, WRITE_GRAD=write_grad, FAST_LOG=_fast_log(s),
        BLOCK=block, ROWS=rows_per_turn, GP=gp, num_warps=num_warps,
    )  # fmt: skip
    if not compiled:  # the interpreter runs programs in turn: a launch per phase
        teams = n_groups if teams is None else max(1, min(teams, n_groups))
        part = torch.empty(n_groups, 2, _PARTIALS, gp, rows_per_turn, device=s.device)
        for phase in range(1, 4 if mode == 0 else 3):
            _team_loss_kernel[(teams * team_size,)](
                part_ptr=part, sync_ptr=part, n_teams=teams, PHASE=phase, **args
            )
        return stats, None
    part = torch.empty(1, 2, _PARTIALS, gp, rows_per_turn, device=s.device)
    sync = torch.zeros(1, dtype=torch.int32, device=s.device)
    if teams is None:
        teams = _cooperative_teams(s.device, team_size, dict(args, part_ptr=part, sync_ptr=sync))
    if teams < 1:
        raise RuntimeError(
            f"a team of {team_size} programs (V = {n_cols}, block {block}) is more than the "
            "device holds at once"
        )
    teams = min(teams, n_groups)
    part = torch.empty(teams, 2, _PARTIALS, gp, rows_per_turn, device=s.device)
    sync = torch.zeros(teams, dtype=torch.int32, device=s.device)
    _team_loss_kernel[(teams * team_size,)](
        part_ptr=part, sync_ptr=sync, n_teams=teams, PHASE=0, launch_cooperative_grid=True,
        **args,
    )  # fmt: skip
    return stats, sync


_TEAMS: dict[tuple, int] = {}
"""Teams per device and compiled variant, found once (compiling the kernel to read its
occupancy)."""


def _cooperative_teams(device: torch.device, team_size: int, args: dict) -> int:
    """The most teams whose programs are all resident at once on ``device``."""
    index = device.index if device.index is not None else torch.cuda.current_device()
    key = (index, team_size, args["s_ptr"].dtype, args["g_ptr"].dtype) + tuple(
        args[k] for k in ("MODE", "HAS_VALID", "WRITE_GRAD", "FAST_LOG", "BLOCK", "ROWS", "GP",
                          "num_warps")
    )  # fmt: skip
    if key not in _TEAMS:
        kernel = _team_loss_kernel.warmup(
            n_teams=1, PHASE=0, launch_cooperative_grid=True, grid=(1,), **args
        )
        kernel._init_handles()
        per_sm = _programs_per_sm(
            index, int(kernel.n_regs), int(kernel.metadata.shared), args["num_warps"]
        )
        sms = torch.cuda.get_device_properties(index).multi_processor_count
        _TEAMS[key] = (per_sm * sms) // team_size
    return _TEAMS[key]
