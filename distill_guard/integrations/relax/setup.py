"""Setting the guard up in Relax's rollout process, and refusing to run half-wired.

Relax passes its hooks no configuration, so the settings come from the environment (listed in
``RELAX_PROPAGATE_ENV_VARS`` so they reach Relax's Ray actors) or from :func:`configure`:

==================================  ==============================================================
``DISTILL_GUARD_PRESET``            ``default`` | ``monitor_only`` | ``strict``
``DISTILL_GUARD_OVERRIDES``         Hydra overrides of the guard node, space separated
``DISTILL_GUARD_EVENTS``            the JSONL event file (without Ray, on a file system every
                                    rank sees: the verdict board is ``<stem>.verdicts/`` beside it)
``DISTILL_GUARD_RUN_ID``            the run's name on the verdict channel (default: the Ray
                                    session and job; without Ray, unnamed)
``DISTILL_GUARD_VERDICT_CHANNEL``   ``auto`` (a Ray actor under Ray, else the file board),
                                    ``ray`` or ``file``
``DISTILL_GUARD_GATES``             the gates the launcher wired (``filter,train_step,feedback``);
                                    one that Relax did not load is an error at the first hook
``DISTILL_GUARD_ON_DEAD_TEACHER``   ``halt`` (default): stop at the first dead wake, checkpoint
                                    on every rank; ``repair``: reload, verify and re-score
``DISTILL_GUARD_TEACHER_URL``       the teacher to check (else ``--opd-teacher-url`` or the first
                                    of ``--opd-teacher-urls``); ``none``: no canary, no repair
``DISTILL_GUARD_MAX_SKIPPED_STEPS`` consecutive skipped updates after which the run halts (3)
``DISTILL_GUARD_INNER_FILTER``      your own dynamic sampling filter, run after the guard's
==================================  ==============================================================
"""

from __future__ import annotations

import dataclasses
import logging
import os
import time
from collections.abc import Sequence
from typing import Any

from distill_guard.config import GuardSpec, build_guard
from distill_guard.guard import DistillGuard
from distill_guard.integrations.plain import refuse_unexpected
from distill_guard.integrations.relax.errors import GuardSetupError
from distill_guard.integrations.relax.feedback import FEEDBACK_BASES
from distill_guard.integrations.relax.file_board import HOST
from distill_guard.integrations.relax.gate import RelaxGate
from distill_guard.integrations.relax.verdicts import Announcement, new_attempt, verdict_channel
from distill_guard.observations import LossKind, RunSpec

log = logging.getLogger("distill_guard")

HOOKS = "distill_guard.integrations.relax"
GATE_FLAGS = {
    "filter": ("dynamic_sampling_filter_path", f"{HOOKS}.dynamic_sampling_filter"),
    "train_step": (
        "custom_megatron_before_train_step_hook_path",
        f"{HOOKS}.before_train_step_hook",
    ),
    "log": ("custom_rollout_log_function_path", f"{HOOKS}.rollout_log_function"),
    "convert": (
        "custom_convert_samples_to_train_data_path",
        f"{HOOKS}.convert_samples_to_train_data",
    ),
    "post_process": ("custom_reward_post_process_path", f"{HOOKS}.reward_post_process"),
    "feedback": ("opd_feedback_class", None),
}
"""Gate → (Relax's argument, the value that wires it; None: any of our feedback classes)."""
ON_DEAD = {"halt": "HALT", "repair": "REWAKE"}


def wired_gates(args: Any) -> dict[str, bool]:
    """Which of the guard's gates Relax actually loaded, read from its parsed arguments."""
    wired = {}
    for gate, (attr, value) in GATE_FLAGS.items():
        got = getattr(args, attr, None)
        if value is None:
            wired[gate] = isinstance(got, str) and got.rpartition(".")[2] in FEEDBACK_BASES
        else:
            wired[gate] = got == value
    return wired


def check_gates(args: Any, expected: Sequence[str]) -> list[str]:
    """One line per expected gate that is not wired, naming the flag and why."""
    wired = wired_gates(args)
    problems = []
    for gate in expected:
        if gate not in GATE_FLAGS:
            problems.append(
                f"unknown gate {gate!r} in DISTILL_GUARD_GATES (known: {', '.join(GATE_FLAGS)})"
            )
        elif not wired[gate]:
            attr, value = GATE_FLAGS[gate]
            flag = "--" + attr.replace("_", "-")
            if args is not None and not hasattr(args, attr):
                why = "this Relax has no such argument (its parser ignores unknown flags)"
            else:
                why = f"it is {getattr(args, attr, None)!r}"
            want = value or f"{HOOKS}.GuardedGoldenAnswerSDPOFeedback"
            problems.append(f"gate {gate!r} is not loaded: {flag} should be {want}, but {why}")
    return problems


def configure(
    guard: GuardSpec = None,
    *,
    overrides: Sequence[str] = (),
    args: Any = None,
    teacher: Any = None,
    canary: Any = None,
    gates: Sequence[str] | None = None,
    on_dead_teacher: str | None = None,
    max_skipped_steps: int | None = None,
    **unexpected: Any,
) -> RelaxGate:
    """Set up the gate (else the first hook call does it from the environment).

    ``args`` is Relax's argparse namespace: ``--opd-kl-type`` / ``--opd-jsd-alpha`` fill the
    run's loss and β, ``--opd-token-selection`` / ``--opd-log-prob-top-k`` the re-scoring, the
    teacher URL the teacher. ``gates`` are the gates the launcher wired; a missing one raises
    :class:`GuardSetupError`. ``on_dead_teacher`` is ``halt`` or ``repair``.
    """
    refuse_unexpected("configure", unexpected)
    on_dead = on_dead_teacher or os.environ.get("DISTILL_GUARD_ON_DEAD_TEACHER", "halt")
    if on_dead not in ON_DEAD:
        raise GuardSetupError(
            f"DISTILL_GUARD_ON_DEAD_TEACHER must be halt or repair, got {on_dead!r}"
        )
    max_skipped = _max_skipped(max_skipped_steps)
    overrides = list(overrides)
    if not isinstance(guard, DistillGuard):
        overrides.append(f"policy.critical_action={ON_DEAD[on_dead]}")
    g = build_guard(guard, overrides)
    g.run = _run_from_args(g.run, args)
    teacher = teacher if teacher is not None else _teacher_from(args)
    if teacher is not None:
        g.attach_teacher(teacher, canary)
    expected = tuple(gates) if gates is not None else _env_gates()
    problems = check_gates(args, expected)
    if problems:
        g.events.write("setup_refused", problems=problems)
        g.close()
        raise GuardSetupError(
            "distill_guard refuses to run unguarded: " + "; ".join(problems) + ". Fix the launcher "
            "(examples/relax/) or drop the gate from DISTILL_GUARD_GATES."
        )
    active = (
        sorted(gate for gate, on in wired_gates(args).items() if on)
        if args is not None
        else sorted(expected)
    )
    unprotected = blind_spots(args, active, on_dead, teacher)
    if unprotected:
        g.events.write("setup_refused", problems=unprotected)
        g.close()
        raise GuardSetupError("distill_guard refuses this run: " + "; ".join(unprotected) + ".")
    try:
        board = verdict_channel(g.events.path)
        announcement = Announcement(
            run=getattr(board, "run", ""),
            attempt=new_attempt(),
            gates=active,
            on_dead_teacher=on_dead,
            teacher=teacher is not None,
            time=time.time(),
            host=HOST,
            pid=os.getpid(),
        )
        if board is not None:
            board.announce(announcement)
    except GuardSetupError as exc:
        g.events.write("setup_refused", problems=[str(exc)])
        g.close()
        raise
    g.events.write(
        "setup", **announcement.to_dict(), channel=board.where if board is not None else None
    )
    log.info(
        "distill_guard: Relax gates active: %s; dead teacher: %s",
        ", ".join(active) or "none",
        on_dead,
    )
    return RelaxGate(
        guard=g,
        board=board,
        token_selection=str(getattr(args, "opd_token_selection", None) or "student_sampled"),
        top_k=int(getattr(args, "opd_log_prob_top_k", 0) or 0),
        gates=tuple(active),
        max_skipped_steps=max_skipped,
    )


def _max_skipped(given: int | None) -> int:
    raw = given if given is not None else os.environ.get("DISTILL_GUARD_MAX_SKIPPED_STEPS", "3")
    try:
        value = int(raw)
    except (TypeError, ValueError):
        value = 0
    if value < 1 or isinstance(raw, bool):
        raise GuardSetupError(
            f"DISTILL_GUARD_MAX_SKIPPED_STEPS must be a whole number >= 1, got {raw!r}"
        )
    return value


CONVERT_FLAG = "--custom-convert-samples-to-train-data-path " + GATE_FLAGS["convert"][1]


def blind_spots(args: Any, active: Sequence[str], on_dead: str, teacher: Any) -> list[str]:
    """Ways teacher values could reach the trainer that the wired gates cannot see or repair,
    one line each, read from Relax's arguments (``docs/relax.md`` §3.3)."""
    if args is None:
        return []
    problems = []
    if deferred_scoring(args) and "convert" not in active:
        problems.append(
            "deferred OPD is on (a managed teacher shares the rollout GPUs, or "
            "--opd-teacher-defer): the teacher scores each batch after the dynamic sampling "
            "filter ran, so the filter never sees its values. Wire the conversion gate: "
            + CONVERT_FLAG
        )
    selection = str(getattr(args, "opd_token_selection", None) or "student_sampled")
    if on_dead == "repair" and selection == "union":
        problems.append(
            "repair mode cannot re-score --opd-token-selection union: the sample keeps the merged "
            "ids, not the student's half, so a repaired teacher cannot rebuild the union. Use "
            "DISTILL_GUARD_ON_DEAD_TEACHER=halt, or student_topk"
        )
    if (
        on_dead == "repair"
        and selection == "student_topk"
        and teacher is not None
        and not callable(getattr(teacher, "score_token_ids", None))
    ):
        problems.append(
            f"repair mode re-scores the student's top-K ids with the teacher's score_token_ids "
            f"(SGLang's token_ids_logprob), which {type(teacher).__name__} does not have. Use "
            "DISTILL_GUARD_ON_DEAD_TEACHER=halt"
        )
    return problems


def deferred_scoring(args: Any) -> bool:
    """Whether Relax scores the teacher after the dynamic sampling filter: the explicit
    ``--opd-teacher-defer`` of one line, or, on the current line, Relax's own
    ``deferred_opd_active(args)`` (a managed teacher sharing the rollout GPU bundles)."""
    if getattr(args, "opd_teacher_defer", False):
        return True
    try:
        from relax.engine.rollout.deferred_opd import deferred_opd_active
    except ImportError:  # no Relax here, or a line without deferred OPD
        return False
    return bool(deferred_opd_active(args))


def _env_gates() -> tuple[str, ...]:
    raw = os.environ.get("DISTILL_GUARD_GATES", "")
    return tuple(g.strip() for g in raw.split(",") if g.strip())


def _run_from_args(run: RunSpec, args: Any) -> RunSpec:
    if args is None:
        return run
    changes: dict[str, Any] = {}
    kl = getattr(args, "opd_kl_type", None)
    if kl in {k.value for k in LossKind}:
        changes["loss"] = LossKind(kl)
    alpha = getattr(args, "opd_jsd_alpha", None)
    if alpha is not None:
        changes["beta"] = float(alpha)
    return dataclasses.replace(run, **changes) if changes else run


def _teacher_from(args: Any) -> Any:
    url = os.environ.get("DISTILL_GUARD_TEACHER_URL")
    if url is None and args is not None:
        urls = getattr(args, "opd_teacher_urls", None)
        url = getattr(args, "opd_teacher_url", None) or (urls[0] if urls else None)
    if not url or url.lower() == "none":
        return None
    from distill_guard.teachers import SGLangHTTPTeacher

    timeout = float(getattr(args, "opd_teacher_timeout_s", 30.0) or 30.0)
    # student_topk and union ask the teacher for the student's ids (token_ids_logprob): on SGLang
    # 0.5.10-0.5.15 the guard's own requests must then carry ids too (a mixed batch kills)
    selection = str(getattr(args, "opd_token_selection", None) or "student_sampled")
    return SGLangHTTPTeacher(
        url, timeout_s=timeout, traffic_token_ids=selection in ("student_topk", "union")
    )
