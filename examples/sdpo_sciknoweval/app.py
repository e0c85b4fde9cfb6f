"""``make demo``: SDPO on a SciKnowEval-style biology set, three arms, one command.

A small Qwen3-architecture student samples answers; a trained teacher scores them (top-16 JSD,
β = 0.5, with a tail bin, at the student's top-16 as the recipe does); the teacher is put to
sleep and woken every step through the ``Teacher`` protocol. Writes ``summary.json``,
``timeline.png``, one event file and one wandb run (offline by default) per arm under
``out_dir`` and prints the verdict. Configs: ``conf/sdpo_sciknoweval.yaml``.

``fault=<name>`` (:mod:`examples.sdpo_sciknoweval.faults`) swaps the weight loss for another
reproducible failure: every teacher keeps its weights, ``healthy`` runs without the fault,
``unguarded`` and ``guarded`` with it.

Run: ``python -m examples.sdpo_sciknoweval.app [fault=off_by_one] [arm.steps=30]
[teacher=reference_server] ...``
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import hydra
import torch
import transformers
from omegaconf import DictConfig, OmegaConf

from distill_guard import DistillGuard
from distill_guard.extras import require
from distill_guard.summary import VERDICT_SKIP, VERDICT_TRAIN
from distill_guard.teachers import SGLangHTTPTeacher, Teacher, TorchTeacher
from examples.sdpo_sciknoweval.arms import ARMS, ArmSpec, make_guard, run_guarded_arm
from examples.sdpo_sciknoweval.data import DataConfig, build_dataset
from examples.sdpo_sciknoweval.faults import (
    BETA_AT_END,
    FaultyScorer,
    check_fault,
    garbage_replica,
)
from examples.sdpo_sciknoweval.models import load_model
from examples.sdpo_sciknoweval.pretrain import PretrainConfig, pretrain
from examples.sdpo_sciknoweval.run_arm import ArmConfig
from examples.sdpo_sciknoweval.summary import arm_summary, format_table
from examples.sdpo_sciknoweval.timeline import Bounds, plot_timeline
from examples.sdpo_sciknoweval.tokenizer import build_tokenizer

log = logging.getLogger("sdpo_demo")


@contextlib.contextmanager
def open_teacher(cfg: DictConfig, teacher_dir: Path, backup: bool) -> Iterator[Teacher]:
    """The arm's teacher, as configured: in process, behind the reference server, or a URL."""
    kind = cfg.teacher.kind
    if kind == "torch":
        yield TorchTeacher.from_pretrained(
            teacher_dir, enable_cpu_backup=backup, fault=cfg.teacher.fault
        )
    elif kind == "reference_server":
        from distill_guard.testing.servers import reference_teacher

        with reference_teacher(teacher_dir, enable_cpu_backup=backup, fault=cfg.teacher.fault) as (
            url,
            _,
        ):
            yield SGLangHTTPTeacher(url, timeout_s=cfg.teacher.timeout_s)
    elif kind == "sglang_http":
        # A real server keeps the backup setting it was launched with; the arm's is not applied.
        yield SGLangHTTPTeacher(cfg.teacher.url, timeout_s=cfg.teacher.timeout_s)
    else:
        raise ValueError(
            f"teacher.kind must be torch, reference_server or sglang_http, got {kind!r}"
        )


def served_backup(teacher: Teacher, configured: bool) -> bool:
    """The weights CPU backup the teacher really runs with: an HTTP server's own
    ``enable_weights_cpu_backup`` (``/get_server_info``; absent before SGLang 0.5.3, which has
    none), the arm's setting in process."""
    if not isinstance(teacher, SGLangHTTPTeacher):
        return configured
    served = bool(teacher.server_info().get("enable_weights_cpu_backup", False))
    if served != configured:
        log.info(
            "teacher at %s reports enable_weights_cpu_backup=%s (the arm asked for %s): the "
            "summary gives the server's",
            teacher.url,
            served,
            configured,
        )
    return served


WANDB_KEYS = {
    "loss": "train/loss",
    "student_entropy": "train/entropy",
    "eos_prob": "train/eos_prob",
    "truncated_ratio": "train/truncated_ratio",
    "teacher_logprob": "train/teacher_logprob",
    "reward": "train/reward",
    "trained": "train/update_applied",
    "seconds": "train/seconds",
    "eval_accuracy": "eval/accuracy",
}
"""The step record's numbers under the names a dashboard groups them by."""


def wandb_row(record: dict, guard: DistillGuard) -> dict[str, float]:
    """One wandb row: the record's numbers namespaced (:data:`WANDB_KEYS`) and the guard's
    ``guard/*`` metrics of the step (``GUARD_METRICS``, the names every integration logs)."""
    row = {WANDB_KEYS[k]: float(v) for k, v in record.items() if k in WANDB_KEYS}
    verdict = VERDICT_TRAIN if record.get("trained", True) else VERDICT_SKIP
    return row | guard.summary.metrics(repairs=guard.repairs, verdict=verdict)


def open_wandb(cfg: DictConfig, arm: str, out: Path) -> Any:
    if cfg.wandb.mode == "disabled":
        return None
    import wandb

    return wandb.init(
        project=cfg.wandb.project,
        name=arm,
        group=cfg.wandb.group,
        mode=cfg.wandb.mode,
        dir=str(out),
        config=OmegaConf.to_container(cfg, resolve=True),
        reinit="finish_previous",
    )


def _preset_chosen(arm: str) -> str | None:
    """The guard preset Hydra composed for ``arm``, when run as the Hydra app."""
    from hydra.core.hydra_config import HydraConfig

    if not HydraConfig.initialized():
        return None
    return HydraConfig.get().runtime.choices.get(f"guard@guards.{arm}")


def run_one_arm(cfg: DictConfig, name: str, ctx: dict[str, Any]) -> tuple[dict, Any]:
    """One arm end to end: its teacher, guard and wandb run; its summary and trace."""
    spec = ArmSpec.named(name, ctx["fault"])
    preset = _preset_chosen(name)
    if preset is not None and preset != spec.preset:  # guard@guards.<arm>=... on the command line
        spec = dataclasses.replace(spec, preset=preset)
    out, arm_cfg = ctx["out"], ctx["arm_cfg"]
    guard_cfg = cfg.guards[name]
    if spec.fault == "beta_end":  # the run is configured with it: the loss and the guard's spec
        arm_cfg = dataclasses.replace(arm_cfg, beta=BETA_AT_END)
        guard_cfg = OmegaConf.merge(guard_cfg, {"run": {"beta": BETA_AT_END}})
    start = time.perf_counter()
    log.info(
        "arm %s: teacher backup %s, guard %s, fault %s, %d steps",
        name,
        spec.backup,
        spec.preset,
        spec.fault,
        arm_cfg.steps,
    )
    wandb_run = open_wandb(cfg, name, out)

    guard: DistillGuard | None = None

    def on_record(record: dict) -> None:
        if wandb_run is not None and guard is not None:
            wandb_run.log(wandb_row(record, guard), step=record["step"])
        if record["step"] % cfg.progress_every == 0 and "loss" in record:
            log.info(
                "  %s step %3d  loss %.4f  entropy %.3f  guard %s  repairs %d",
                name,
                record["step"],
                record["loss"],
                record["student_entropy"],
                record.get("guard_action", "-"),
                record["repairs"],
            )

    with open_teacher(cfg, ctx["teacher_dir"], spec.backup) as teacher:
        spec = dataclasses.replace(spec, backup=served_backup(teacher, spec.backup))
        guard = make_guard(guard_cfg, teacher, out / f"events_{name}.jsonl", wandb_run)
        replica = garbage_replica(ctx["teacher_dir"], cfg.seed) if spec.fault == "partial" else None
        scorer = FaultyScorer(
            spec.fault,
            teacher,
            vocab_size=ctx["tokenizer"].vocab_size,
            replica=replica,
            seed=cfg.seed,
        )
        trace = run_guarded_arm(
            spec,
            teacher,
            load_model(ctx["student_dir"]),
            ctx["tokenizer"],
            ctx["train"],
            ctx["eval_items"],
            arm_cfg,
            guard,
            on_record,
            out / f"halt_{name}",
            ctx["reference"],
            scorer,
        )
        summary = arm_summary(spec, trace, guard.halted)
    summary["seconds"] = round(time.perf_counter() - start, 1)
    if wandb_run is not None:
        wandb_run.summary.update(
            {f"demo/{k}": v for k, v in summary.items() if isinstance(v, (int, float))}
        )
        wandb_run.finish()
    return summary, trace


def pretrain_config(cfg: DictConfig) -> PretrainConfig:
    """The warm-up ``run`` trains (or finds cached under ``out_dir/pretrain``) for ``cfg``."""
    defaults = PretrainConfig(data=DataConfig(**cfg.data.synthetic))
    return dataclasses.replace(
        defaults,
        teacher=dataclasses.replace(defaults.teacher, steps=cfg.pretrain.teacher_steps),
        student=dataclasses.replace(defaults.student, steps=cfg.pretrain.student_steps),
    )


def run(cfg: DictConfig) -> dict[str, Any]:
    fault = check_fault(cfg.fault)
    if cfg.wandb.mode != "disabled":  # before the first arm trains, not after it
        require(f"the demo's wandb runs (wandb.mode={cfg.wandb.mode}; wandb.mode=disabled runs "
                "without them)", "wandb", "wandb")  # fmt: skip
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one INFO line per teacher request
    transformers.utils.logging.disable_progress_bar()
    torch.manual_seed(cfg.seed)
    torch.set_num_threads(cfg.threads)
    out = Path(cfg.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    data_cfg = DataConfig(**cfg.data.synthetic)
    start = time.perf_counter()
    log.info("pretraining teacher and student (cached in %s)", out / "pretrain")
    teacher_dir, student_dir = pretrain(out / "pretrain", pretrain_config(cfg), threads=cfg.threads)
    log.info("pretraining done in %.0f s", time.perf_counter() - start)
    train, eval_items = build_dataset(data_cfg)
    ctx = {
        "fault": fault,
        "out": out,
        "teacher_dir": teacher_dir,
        "student_dir": student_dir,
        "tokenizer": build_tokenizer(),
        # the healthy teacher, never slept: what the poisoned-update count compares against
        "reference": TorchTeacher.from_pretrained(teacher_dir, enable_memory_saver=False),
        "train": train,
        "eval_items": eval_items,
        "arm_cfg": ArmConfig(**OmegaConf.to_container(cfg.arm), seed=cfg.seed, threads=cfg.threads),
    }
    summaries, traces = {}, {}
    for name in cfg.arms:
        summaries[name], traces[name] = run_one_arm(cfg, name, ctx)
    result = {"fault": fault, "arms": summaries, "seconds": round(time.perf_counter() - start, 1)}
    (out / "summary.json").write_text(json.dumps(result, indent=1))
    bounds = Bounds(beta=ctx["arm_cfg"].beta, vocab_size=ctx["reference"].vocab_size)
    plot_timeline(traces, summaries, bounds, out / "timeline.png", fault)
    print(format_table(summaries, fault))
    print(f"\nwritten: {', '.join(map(str, written_files(cfg)))} ({result['seconds']:.0f} s)")
    return result


def written_files(cfg: DictConfig) -> list[Path]:
    """What ``run`` writes under ``out_dir``, as its last line names it: the summary, the plot,
    each arm's event file and, unless disabled, the folder of the wandb runs."""
    out = Path(cfg.out_dir)
    files = [out / "summary.json", out / "timeline.png"]
    files += [out / f"events_{name}.jsonl" for name in cfg.arms]
    if cfg.wandb.mode != "disabled":
        files.append(out / "wandb")
    return files


@hydra.main(config_path="../../conf", config_name="sdpo_sciknoweval", version_base="1.3")
def main(cfg: DictConfig) -> None:
    unknown = sorted(set(cfg.arms) - set(ARMS))
    if unknown:
        raise ValueError(f"unknown arm(s) {unknown}; arms are {', '.join(ARMS)}")
    check_fault(cfg.fault)
    run(cfg)


if __name__ == "__main__":
    main()
