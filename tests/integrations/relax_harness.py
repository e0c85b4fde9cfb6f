"""Relax's colocated OPD step, in Relax's own order, with real parts: the guard's Relax hooks are
judged by what the trainer consumed.

Every stage names the Relax function it follows (``docs/relax.md`` §3.2; redai-studio/Relax
@02bf712a and redai-infra/Relax @6bc26c5 agree on this order):

1. ``update_weights()``: trainer rank 0 resumes the teacher, ``TeacherManager.onload`` →
   ``POST /resume_memory_occupation`` with every tag (relax/backends/megatron/actor.py,
   ``MegatronTrainRayActor.update_weights``). The teacher was offloaded right after launch
   (relax/utils/opd/opd_utils.py, ``create_managed_opd_teacher_manager``).
2. generate: each sample gets a response (relax/engine/rollout/sglang_rollout.py,
   ``generate_and_rm``; here seeded ids, the guard never looks at how they were made).
3. teacher scoring: ``OpdManager._teacher_prefill`` posts each sample to the teacher's
   ``/generate`` (relax/engine/rollout/on_policy_distillation.py): plain OPD scores
   ``tokens`` from ``len(tokens) - response_length - 1`` into ``teacher_log_probs``; the SDPO line
   scores ``teacher_tokens`` (its own prompt + the response) with top-K into ``opd_topk_*``.
4. per-sample hooks: ``OpdManager._assemble_transfer`` calls the feedback class's
   ``check_transfer_channels(sample, channels, top_k)`` (SDPO line, top-K modes).
5. ``call_dynamic_filter(dynamic_filter, args, group)`` per finished group
   (sglang_rollout.py, ``generate_rollout_async``).
6. ``transfer_batch_to_data_system``: ``convert_samples_to_train_data`` (``remove_sample`` zeroes
   the ``loss_mask``; SDPO's ``produce_extra_transfer`` adds ``opd_sample_mask``), then
   ``async_put(partition_id=f"train_{rollout_id}")``: here a file, a copy the trainer reads
   (relax/utils/utils.py).
7. the rollout log hook (relax/distributed/ray/rollout.py, ``_log_rollout_data``).
8. ``train(rollout_id)``: rank 0 offloads the teacher, ``/flush_cache`` then
   ``/release_memory_occupation``; a barrier (actor.py, ``MegatronTrainRayActor.train``).
9. ``train_one_step`` on every trainer rank: ``zero_grad``, the before-train-step hook, forward
   and backward on the queued copy, gradients all-reduced, ``update_successful, grad_norm,
   num_zeros = optimizer.step()``, ``opt_param_scheduler.step()`` (relax/backends/megatron/model.py).

The trainer ranks are real gloo processes; the teacher is the SGLang-protocol reference server (a
tiny Qwen3 with the memory saver on, its CPU backup on or off) over loopback HTTP, with Relax's
own handle doing the sleep and wake and the guard's handle its checks. What the trainer consumed is
measured against ground truth: the values of the same teacher that never slept.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import time
from argparse import Namespace
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from distill_guard.integrations.relax.setup import GATE_FLAGS, HOOKS
from distill_guard.teachers import SGLangHTTPTeacher, TorchTeacher
from distill_guard.teachers.per_row_ids import score_ids_per_row
from distill_guard.testing.reference_server import ReferenceServer, serve_in_thread
from distill_guard.testing.servers import free_port
from examples.multigpu_colocate.run import LauncherStreams, RankStreams

VOCAB, PROMPT, RESPONSE, TEACHER_PROMPT = 128, 6, 10, 9
GROUPS, PER_GROUP, TOP_K, RANKS, STEPS = 3, 2, 4, 2, 2
TOLERANCE = 1e-3
"""A queued teacher value further than this from the never-slept teacher's is poisoned."""


@dataclasses.dataclass
class Sample:
    """The fields of Relax's ``Sample`` that OPD uses (relax/utils/types.py)."""

    tokens: list[int]
    response_length: int
    index: int
    loss_mask: list[int] | None = None
    remove_sample: bool = False
    teacher_log_probs: list[float] | None = None
    teacher_tokens: list[int] | None = None
    teacher_prompt_length: int | None = None
    opd_topk_teacher_log_probs: list[list[float]] | None = None
    opd_topk_token_ids: list[list[int]] | None = None
    opd_sample_mask: bool | None = None
    reward: Any = None


def default_gates(line: str) -> tuple[str, ...]:
    """The gates the launcher wires on each line (slime and miles: the post-process gate)."""
    return {
        "studio": ("filter", "convert", "train_step", "log"),
        "sdpo": ("filter", "convert", "train_step", "log", "feedback"),
        "slime": ("post_process", "train_step", "log"),
    }[line]


WIRING = {
    **GATE_FLAGS,
    "feedback": ("opd_feedback_class", f"{HOOKS}.GuardedGoldenAnswerSDPOFeedback"),
}
"""Gate → (the Relax argument, the guard's hook path)."""


def relax_args(
    line: str, gates: tuple[str, ...], teacher_url: str, *, deferred: bool = False
) -> Namespace:
    """The parsed arguments the hooks see, with the guard's hooks for ``gates``. The SDPO line
    scores the student's top-K (``student_topk``: the only selection its feedback accepts);
    ``deferred`` is the line whose teacher scores after the filter (``--opd-teacher-defer``)."""
    args: dict[str, Any] = {
        "opd_teacher_url": teacher_url + "/generate",
        "opd_kl_type": "jsd" if line == "sdpo" else "reverse_kl",
        "opd_jsd_alpha": 0.5,
        "opd_token_selection": "student_topk" if line == "sdpo" else "student_sampled",
        "opd_log_prob_top_k": TOP_K if line == "sdpo" else 0,
        "opd_teacher_defer": deferred,
        "harness_line": line,
        "start_rollout_id": 0,
        **{name: None for name, _ in WIRING.values() if name != "opd_feedback_class"},
    }
    if line == "sdpo":
        args["opd_feedback_class"] = "relax.utils.opd.sdpo.feedback.GoldenAnswerSDPOFeedback"
    for gate in gates:
        name, value = WIRING[gate]
        args[name] = value
    return Namespace(**args)


def relax_convert(args: Any, samples: list[Sample]) -> dict[str, Any]:
    """Relax's own conversion (``DISTILL_GUARD_INNER_CONVERT``), after the conversion gate."""
    return convert(samples, args.harness_line)


def fill_teacher_values(args: Any, samples: list[Sample]) -> list[float]:
    """slime's OPD ``post_process_rewards`` (``--custom-reward-post-process-path``): the
    teacher's logprobs, fetched by the reward function, move onto the sample at conversion."""
    for s in samples:
        s.teacher_log_probs = s.reward["teacher_log_probs"]
    return [0.0] * len(samples)


# ---------------------------------------------------------------------------------- rollout side


def score(teacher: SGLangHTTPTeacher, s: Sample, line: str) -> dict[str, Any]:
    """Stage 3, ``OpdManager._teacher_prefill``: the sample's teacher channels."""
    r = s.response_length
    if line in ("studio", "slime"):
        start = max(len(s.tokens) - r - 1, 0)
        res = teacher.score([s.tokens], logprob_start_len=start)
        return {"teacher_log_probs": res.token_logprobs[0][-r:].tolist()}
    # student_topk: the teacher's logprobs of the student's own top-K ids at each row
    # (SGLang's token_ids_logprob, row by row)
    start = max(len(s.teacher_tokens) - r - 1, 0)
    ids = torch.tensor(s.opd_topk_token_ids)
    values = score_ids_per_row(teacher, s.teacher_tokens, start, ids)
    return {"opd_topk_teacher_log_probs": values.tolist()}


def make_samples(step: int, line: str) -> list[list[Sample]]:
    """Stage 2: seeded prompts and responses; on the SDPO line the teacher scores its own
    prompt (``teacher_tokens``, built by ``OpsdWorker.build_teacher_inputs``) + the response."""
    g = torch.Generator().manual_seed(1000 + step)
    groups = []
    for gi in range(GROUPS):
        prompt = torch.randint(1, VOCAB, (PROMPT,), generator=g).tolist()
        group = []
        for j in range(PER_GROUP):
            response = torch.randint(1, VOCAB, (RESPONSE,), generator=g).tolist()
            teacher_prompt = torch.randint(1, VOCAB, (TEACHER_PROMPT,), generator=g).tolist()
            group.append(
                Sample(
                    prompt + response,
                    RESPONSE,
                    index=gi * PER_GROUP + j,
                    loss_mask=[1] * RESPONSE,
                    teacher_tokens=teacher_prompt + response if line == "sdpo" else None,
                    teacher_prompt_length=TEACHER_PROMPT if line == "sdpo" else None,
                    # the student's rollout top-K (``student_self_topk``), K distinct ids a row
                    opd_topk_token_ids=[
                        torch.randperm(VOCAB, generator=g)[:TOP_K].tolist() for _ in range(RESPONSE)
                    ]
                    if line == "sdpo"
                    else None,
                )
            )
        groups.append(group)
    return groups


def convert(samples: list[Sample], line: str) -> dict[str, Any]:
    """Stage 6, ``convert_samples_to_train_data``: what is queued for the trainer (a copy)."""
    data: dict[str, Any] = {"tokens": [], "loss_masks": [], "index": []}
    for s in samples:
        if s.remove_sample:
            s.loss_mask = [0] * s.response_length
        data["tokens"].append(list(s.tokens))
        data["loss_masks"].append(list(s.loss_mask))
        data["index"].append(s.index)
    if line in ("studio", "slime"):
        data["teacher_log_probs"] = [list(s.teacher_log_probs or []) for s in samples]
    else:
        data["opd_topk_teacher_log_probs"] = [s.opd_topk_teacher_log_probs for s in samples]
        data["opd_topk_token_ids"] = [s.opd_topk_token_ids for s in samples]
        data["opd_sample_mask"] = [bool(s.opd_sample_mask is not False) for s in samples]
    return json.loads(json.dumps(data))


def poisoned(data: dict[str, Any], truth: dict[str, Any], line: str) -> list[bool]:
    """Per queued sample: do its teacher values differ from the never-slept teacher's?"""
    key = "opd_topk_teacher_log_probs" if line == "sdpo" else "teacher_log_probs"
    out = []
    for got, want in zip(data[key], truth[key]):
        g, w = torch.tensor(got, dtype=torch.float64), torch.tensor(want, dtype=torch.float64)
        out.append(g.shape != w.shape or not bool(((g - w).abs() <= TOLERANCE).all()))
    return out


def rollout_side(
    line: str,
    gates: tuple[str, ...],
    out: Path,
    url: str,
    truth_url: str,
    steps: int,
    deferred: bool = False,
) -> None:
    """The rollout process: stages 2–7 for each step, after the trainer's ``update_weights``.
    slime and miles order the log hook before the conversion and fill the teacher's values in
    the reward post-process (``slime/ray/rollout.py``, ``RolloutManager.generate``). With
    ``deferred`` (Relax's ``DeferredOpdSession``) the filter runs first and the teacher scores
    the committed batch at its flush, just before the conversion."""
    from distill_guard.integrations import relax

    args = relax_args(line, gates, url, deferred=deferred)
    opd_teacher = SGLangHTTPTeacher(url, timeout_s=30)  # OpdManager's session
    truth_teacher = SGLangHTTPTeacher(truth_url, timeout_s=30)
    feedback = relax.GuardedGoldenAnswerSDPOFeedback() if "feedback" in gates else None
    for step in range(steps):
        if not wait_for(out / f"updated_{step - 1}", out / "trainer_done"):
            return
        groups = make_samples(step, line)
        flat = [s for g in groups for s in g]

        def teacher_scoring(flat: list[Sample] = flat) -> None:  # stages 3 and 4
            for s in flat:
                channels = score(opd_teacher, s, line)
                if feedback is not None:
                    feedback.check_transfer_channels(s, channels, TOP_K)
                if line == "slime":  # slime's OPD reward function: the raw answer, on the reward
                    s.reward = channels
                    continue
                for name, value in channels.items():
                    setattr(s, name, value)

        if not deferred:
            teacher_scoring()
        if "filter" in gates:
            for group in groups:
                relax.dynamic_sampling_filter(args, group)
        if deferred:  # DeferredOpdSession.flush: score the committed batch, then publish it
            teacher_scoring()
        truth = _truth_values(truth_teacher, flat, line)
        metrics: dict[str, float] = {}
        if line == "slime" and "log" in gates:  # slime: the log hook, then the conversion
            relax.rollout_log_function(step, args, flat, metrics, 1.0)
        if line == "slime":
            if "post_process" in gates:
                relax.reward_post_process(args, flat)
            else:
                fill_teacher_values(args, flat)
        if "convert" in gates:  # --custom-convert-samples-to-train-data-path
            data = relax.convert_samples_to_train_data(args, flat)
        else:
            data = convert(flat, line)
        data["poisoned"] = poisoned(data, truth, line)  # ground truth, read by the harness only
        # whole or not at all: the trainer ranks read it as soon as the name exists
        (out / f"train_{step}.json.tmp").write_text(json.dumps(data))
        os.replace(out / f"train_{step}.json.tmp", out / f"train_{step}.json")
        if line != "slime" and "log" in gates:  # Relax: the log hook after the put
            relax.rollout_log_function(step, args, flat, metrics, 1.0)
        if metrics:
            (out / f"metrics_{step}.json").write_text(json.dumps(metrics))
    opd_teacher.close()
    truth_teacher.close()


def _truth_values(teacher: SGLangHTTPTeacher, samples: list[Sample], line: str) -> dict[str, Any]:
    key = "opd_topk_teacher_log_probs" if line == "sdpo" else "teacher_log_probs"
    return {key: [score(teacher, s, line)[key] for s in samples]}


def wait_for(path: Path, abort: Path, timeout_s: float = 120.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while not path.exists():
        if abort.exists() or time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


# ---------------------------------------------------------------------------------- trainer side


class MegatronLikeOptimizer:
    """Megatron's optimizer surface as ``train_one_step`` uses it: ``zero_grad()`` and
    ``step() -> (update_successful, grad_norm, num_zeros_in_grad)``."""

    def __init__(self, params: list[torch.nn.Parameter]) -> None:
        self.params = params
        self.inner = torch.optim.AdamW(params, lr=1e-2)

    def zero_grad(self) -> None:
        self.inner.zero_grad(set_to_none=False)

    def step(self) -> tuple[bool, float, int]:
        norm = float(torch.nn.utils.clip_grad_norm_(self.params, 1.0))
        self.inner.step()
        return True, norm, 0


class Scheduler:
    def __init__(self) -> None:
        self.steps = 0

    def step(self, increment: int = 1) -> None:
        self.steps += increment


def save_checkpoint(args: Any, rollout_id: int, model: Any, optimizer: Any, scheduler: Any) -> None:
    """The run's checkpoint function (``DISTILL_GUARD_SAVE_FUNCTION``), a collective in Relax."""
    rank = dist.get_rank()
    path = Path(os.environ["HARNESS_OUT"]) / "ckpt" / f"rank{rank}_rollout{rollout_id}.pt"
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save({"model": model[0].state_dict(), "rollout_id": rollout_id}, path)


def trainer_rank(
    rank: int,
    line: str,
    gates: tuple[str, ...],
    out: Path,
    url: str,
    port: int,
    steps: int,
    env: dict[str, str],
    streams: RankStreams,
) -> None:
    """One trainer rank: stages 8, 9 and 1 for every step, as Relax's actor runs them. ``env`` is
    the driver's environment when it launched the ranks (``RELAX_PROPAGATE_ENV_VARS``) and
    ``streams`` its stdout and stderr: a child forked from a fork server would otherwise hold the
    server's."""
    streams.attach()
    os.environ.clear()
    os.environ.update(env)
    os.environ["HARNESS_OUT"] = str(out)
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=RANKS
    )
    from distill_guard.integrations import relax

    args = relax_args(line, gates, url)
    manager = SGLangHTTPTeacher(url, timeout_s=30) if rank == 0 else None  # TeacherManager
    torch.manual_seed(0)
    student = torch.nn.Embedding(VOCAB, VOCAB)  # next-token logits from the previous token
    optimizer = MegatronLikeOptimizer(list(student.parameters()))
    scheduler = Scheduler()
    record: dict[str, Any] = {"rank": rank, "steps": []}
    try:
        if rank == 0:  # initial update_weights(): the first resume (stage 1)
            manager.mark_released(None)
            manager.resume()
            (out / "updated_-1").touch()
        for step in range(steps):
            if not wait_for(out / f"train_{step}.json", out / "rollout_done"):
                break
            if rank == 0:  # stage 8: train() offloads the teacher
                manager.flush_cache()
                manager.release()
            dist.barrier()
            data = json.loads((out / f"train_{step}.json").read_text())
            mine = list(range(rank, len(data["tokens"]), RANKS))
            before = student.weight.detach().clone()
            optimizer.zero_grad()  # stage 9, train_one_step
            if "train_step" in gates:
                relax.before_train_step_hook(args, step, 0, [student], optimizer, scheduler)
            loss = distill_loss(student, data, mine, line)
            loss.backward()
            for p in student.parameters():
                dist.all_reduce(p.grad)
                p.grad /= RANKS
            update_successful, _, _ = optimizer.step()
            assert update_successful  # bf16 path of train_one_step
            scheduler.step()
            updated = not torch.equal(before, student.weight.detach())
            used = [
                i
                for i in mine
                if any(data["loss_masks"][i])
                and data.get("opd_sample_mask", [True] * len(data["tokens"]))[i]
            ]
            record["steps"].append(
                {
                    "step": step,
                    "updated": updated,
                    "consumed_poisoned": sum(data["poisoned"][i] for i in used),
                    "consumed": len(used),
                }
            )
            if rank == 0:  # stage 1: update_weights() resumes the teacher
                manager.resume()
                (out / f"updated_{step}").touch()
    except relax.GuardHalt as halt:
        record["halted"] = str(halt)
    finally:
        record["params_sha"] = float(student.weight.detach().double().sum())
        (out / f"rank{rank}.json").write_text(json.dumps(record))
        (out / "trainer_done").touch()
        dist.destroy_process_group()


def distill_loss(
    student: torch.nn.Module, data: dict[str, Any], rows: list[int], line: str
) -> torch.Tensor:
    """A loss whose gradient depends on the queued teacher values (masked as Relax's
    ``get_batch`` masks: ``loss_masks`` times SDPO's ``opd_sample_mask``)."""
    total = student.weight.sum() * 0.0
    for i in rows:
        tokens = torch.tensor(data["tokens"][i])
        mask = torch.tensor(data["loss_masks"][i], dtype=torch.float32)
        if "opd_sample_mask" in data:
            mask = mask * float(data["opd_sample_mask"][i])
        logp = torch.log_softmax(student(tokens[-RESPONSE - 1 : -1]), dim=-1)
        if line != "sdpo":
            t = torch.tensor(data["teacher_log_probs"][i])
            s = logp.gather(-1, tokens[-RESPONSE:, None]).squeeze(-1)
            per = (s - t) ** 2
        else:
            t = torch.tensor(data["opd_topk_teacher_log_probs"][i])
            ids = torch.tensor(data["opd_topk_token_ids"][i])
            per = ((logp.gather(-1, ids) - t) ** 2).mean(-1)
        total = total + (per * mask).sum()
    return total / max(len(rows), 1)


# ---------------------------------------------------------------------------------- one run


def run(
    tmp: Path,
    teacher_dir: Path,
    *,
    line: str,
    backup: bool,
    guarded: bool = True,
    on_dead: str = "halt",
    steps: int = STEPS,
    gates: tuple[str, ...] | None = None,
    env: dict[str, str] | None = None,
    context: Any = None,
    deferred: bool = False,
) -> dict[str, Any]:
    """One run of ``steps`` rollouts with ``gates`` wired (the line's own when None, none when
    not ``guarded``); what each trainer rank consumed, and the events. The trainer ranks are new
    processes of the multiprocessing ``context`` (spawn when None; the tests pass a fork server
    that imported torch and the package once, which saves each rank that import)."""
    gates = (default_gates(line) if gates is None else gates) if guarded else ()
    name = "-".join(
        [line, *gates, on_dead, "backup" if backup else "nobackup", *(["deferred"] * deferred)]
    )
    out = tmp / name
    out.mkdir(parents=True)
    events = out / "events.jsonl"
    settings = {
        "DISTILL_GUARD_EVENTS": str(events),
        "DISTILL_GUARD_OVERRIDES": f"run.vocab_size={VOCAB} alerts.use_wandb=false repair.backoff_s=0",
        "DISTILL_GUARD_GATES": ",".join(gates),
        "DISTILL_GUARD_INNER_REWARD_POST_PROCESS": "tests.integrations.relax_harness:fill_teacher_values",
        "DISTILL_GUARD_INNER_CONVERT": "tests.integrations.relax_harness:relax_convert",
        "DISTILL_GUARD_ON_DEAD_TEACHER": on_dead,
        "DISTILL_GUARD_SAVE_FUNCTION": "tests.integrations.relax_harness:save_checkpoint",
        "DISTILL_GUARD_VERDICT_WAIT_S": "60",
        "DISTILL_GUARD_VOCAB_SIZE": str(VOCAB),
        **(env or {}),
    }
    saved = {k: os.environ.get(k) for k in settings}
    os.environ.update(settings)
    from distill_guard.integrations import relax

    relax.reset()
    colocated = TorchTeacher.from_pretrained(teacher_dir, enable_cpu_backup=backup)
    never_slept = TorchTeacher.from_pretrained(teacher_dir, enable_memory_saver=False)
    try:
        with (
            serve_in_thread(ReferenceServer(colocated)) as url,
            serve_in_thread(ReferenceServer(never_slept)) as truth_url,
        ):
            launch = SGLangHTTPTeacher(url)
            launch.release()  # create_managed_opd_teacher_manager: offloaded right after launch
            launch.close()
            ctx = context if context is not None else mp.get_context("spawn")
            port = free_port()
            launch_env = dict(os.environ)
            ranks = [
                ctx.Process(
                    target=trainer_rank,
                    args=(r, line, gates, out, url, port, steps, launch_env, LauncherStreams()),
                )
                for r in range(RANKS)
            ]
            for p in ranks:
                p.start()
            try:
                rollout_side(line, gates, out, url, truth_url, steps, deferred)
            finally:
                (out / "rollout_done").touch()
                for p in ranks:
                    p.join(timeout=120)
                    if p.is_alive():
                        p.kill()
    finally:
        relax.reset()
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    ranks_out = [json.loads((out / f"rank{r}.json").read_text()) for r in range(RANKS)]
    return {
        "out": out,
        "ranks": ranks_out,
        "events": _events(out),
        "metrics": [json.loads(p.read_text()) for p in sorted(out.glob("metrics_*.json"))],
        "queued": [
            json.loads((out / f"train_{s}.json").read_text())
            for s in range(steps)
            if (out / f"train_{s}.json").exists()
        ],
    }


def _events(out: Path) -> list[dict[str, Any]]:
    rows = []
    for p in sorted(out.glob("events*.jsonl")):
        rows += [json.loads(line) for line in p.read_text().splitlines() if line.strip()]
    return rows


def totals(result: dict[str, Any]) -> dict[str, int]:
    """Samples with dead teacher values that reached a trainer step, and updates taken on them."""
    steps = [s for r in result["ranks"] for s in r["steps"]]
    return {
        "poisoned_consumed": sum(s["consumed_poisoned"] for s in steps),
        "poisoned_updates": sum(1 for s in steps if s["updated"] and s["consumed_poisoned"]),
        "updates": sum(1 for s in steps if s["updated"]),
        "queued_poisoned": sum(sum(q["poisoned"]) for q in result["queued"]),
    }


UNIFORM = -math.log(VOCAB)
