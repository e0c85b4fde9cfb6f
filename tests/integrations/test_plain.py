"""The plain-loop adapter."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from distill_guard.integrations.plain import StepGuard
from distill_guard.observations import Metric
from distill_guard.signals import teacher_logprobs_from_logits
from tests.docs.snippets import snippet

from ._tiny import (
    VOCAB,
    UpdateLedger,
    events,
    jsd,
    kill,
    student_of,
    tiny_qwen3,
    token_batches,
    token_rows,
)

ROOT = Path(__file__).resolve().parents[2]


def test_readme_snippet_is_under_15_lines_and_matches_the_docs():
    """The loop itself runs as written in tests/docs (setup ``plain-loop``)."""
    assert len(snippet("plain-loop").strip().splitlines()) < 15
    assert snippet("plain-loop") == snippet("plain-loop", "docs/integrations.md")


def test_topk_from_logits_is_chunked_and_exact():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(3, 7, 50, generator=g) * 4
    mask = torch.rand(3, 7, generator=g) > 0.3
    labels = torch.randint(0, 50, (3, 7), generator=g)
    labels[0, 0] = -100
    reduced = teacher_logprobs_from_logits(logits, top_k=5, mask=mask, labels=labels, chunk_rows=2)
    topk, tok = reduced.topk, reduced.token
    keep = mask.reshape(-1) & (labels.reshape(-1) != -100)
    lp = torch.log_softmax(logits.reshape(-1, 50), -1)[keep]
    assert torch.allclose(topk, lp.topk(5, -1).values, atol=1e-5)
    assert torch.allclose(tok, lp.gather(-1, labels.reshape(-1)[keep, None]).squeeze(-1), atol=1e-5)
    assert topk.dtype == torch.float32 and topk.shape == (int(keep.sum()), 5)
    assert torch.equal(reduced.topk_ids, lp.topk(5, -1).indices)
    assert torch.equal(reduced.token_ids, labels.reshape(-1)[keep])
    assert torch.equal(reduced.sample_index, torch.arange(21).div(7, rounding_mode="floor")[keep])


def test_a_loss_taken_on_teacher_logits_shifted_by_one_is_caught_before_the_update():
    """The in-process form of AReaL PR #1729: the user's loss pairs row t of the teacher with
    token t+1. Handing the guard the logits and labels the loss uses shows the shift."""
    teacher = tiny_qwen3(vocab=VOCAB)
    g = torch.Generator().manual_seed(3)
    ids = torch.randint(0, VOCAB, (8, 24), generator=g)
    with torch.no_grad():
        logits = teacher(input_ids=ids).logits
    # on-policy tokens: what the teacher itself would sample, so a matched pairing agrees
    sampled = torch.distributions.Categorical(logits=logits[:, :-1]).sample()
    sg = StepGuard("default", ["alerts.use_wandb=false"])
    sg.observe_teacher_logits(logits[:, :-1], labels=sampled)  # row t predicts token t
    assert sg.before_update(0) is True
    sg.observe_teacher_logits(logits[:, 1:], labels=sampled)  # off by one
    assert sg.before_update(1) is False
    assert sg.guard.summary.first == {"teacher.position_shift": 1}


def test_vocab_learnt_from_logits_and_uniform_caught():
    sg = StepGuard("default", ["alerts.use_wandb=false"])
    assert sg.guard.run.vocab_size is None
    sg.observe_teacher_logits(torch.zeros(2, 4, 64))
    assert sg.guard.run.vocab_size == 64
    assert sg.before_update(0) is False
    # no live teacher to reload: the update is skipped, and the decision says just that
    assert (sg.last_decision.action.value, sg.last_decision.intended.value) == (
        "skip_batch",
        "rewake",
    )


def test_raw_loss_is_judged_before_and_not_again_after():
    sg = StepGuard("default", ["alerts.use_wandb=false"])
    seen = []
    sg.guard.on_finding = seen.append
    sg.observe_loss(torch.tensor(float("nan")))
    sg.observe_loss(torch.tensor(0.1))
    assert sg.before_update(0) is False
    assert [f.code for f in seen] == ["metric.nonfinite"]
    sg.after_update(0, {Metric.LOSS: float("nan"), Metric.STUDENT_ENTROPY: 0.4})
    assert len(seen) == 1  # the loss was not judged twice
    sg.observe_loss(0.02)
    assert sg.before_update(1) is True


def test_watch_observes_only_while_collecting():
    teacher = tiny_qwen3()
    sg = StepGuard("default", ["alerts.use_wandb=false"], top_k=4)
    sg.watch(teacher)
    x = torch.tensor([token_rows(1)[0]["input_ids"]])
    sg.collecting = False
    teacher(input_ids=x)
    assert sg._buffer.topk.parts == []
    sg.collecting = True
    teacher(input_ids=x, attention_mask=torch.ones_like(x))
    assert sg._buffer.topk.parts[0].shape == (x.shape[1], 4)
    sg.unwatch()
    teacher(input_ids=x)
    assert len(sg._buffer.topk.parts) == 1
    with pytest.raises(ValueError, match="top-k width"):
        sg.observe_teacher_logprobs(topk_logprobs=torch.zeros(3, 8))


def test_watch_judges_only_outputs_as_wide_as_the_vocabulary(caplog):
    """A forward that returns hidden states (TRL's DistillationTrainer runs its teacher's
    backbone through the teacher's own forward) is not taken for logits: one INFO line, nothing
    observed, however many forwards."""
    caplog.set_level("DEBUG", logger="distill_guard")
    teacher = tiny_qwen3()
    sg = StepGuard("default", ["alerts.use_wandb=false"], top_k=4)
    sg.watch(teacher, canary=False)
    x = torch.tensor([token_rows(1)[0]["input_ids"]])
    backbone = teacher.base_model.forward
    teacher.forward = lambda **kw: backbone(**kw).last_hidden_state  # [1, T, H], H != V
    for _ in range(3):
        teacher(input_ids=x)
    assert sg._buffer.topk.parts == []
    told = [r.getMessage() for r in caplog.records if "not judged" in r.getMessage()]
    hidden = teacher.config.hidden_size
    assert len(told) == 1 and f"width {hidden}" in told[0] and str(VOCAB) in told[0], told
    del teacher.forward  # the real forward: logits over the vocabulary are observed again
    teacher(input_ids=x)
    assert sg._buffer.topk.parts[0].shape == (x.shape[1], 4)


def test_hidden_states_are_judged_through_the_teachers_head():
    """``observe_teacher_hidden_states`` sees what the full forward's logits say, a few samples
    at a time (here one sample per chunk)."""
    teacher = tiny_qwen3()
    x = torch.tensor([r["input_ids"] for r in token_rows(3)])
    mask = torch.ones_like(x)
    mask[1, 5:] = 0
    full = StepGuard("default", ["alerts.use_wandb=false"], top_k=4)
    projected = StepGuard("default", ["alerts.use_wandb=false"], top_k=4, chunk_rows=x.shape[1])
    with torch.no_grad():
        full.observe_teacher_logits(teacher(input_ids=x).logits, mask=mask, labels=x)
        hidden = teacher.base_model(input_ids=x).last_hidden_state
    projected.observe_teacher_hidden_states(
        hidden, teacher.get_output_embeddings(), mask=mask, labels=x
    )
    assert len(projected._buffer.topk.parts) == 3  # one chunk per sample
    for name in ("topk", "token", "topk_ids", "samples"):
        a = torch.cat(getattr(full._buffer, name).parts)
        b = torch.cat(getattr(projected._buffer, name).parts)
        assert a.shape == b.shape and torch.allclose(a.float(), b.float(), atol=1e-5), name
    assert int(torch.cat(projected._buffer.samples.parts).max()) == 2


def test_healthy_loop_is_untouched():
    teacher = tiny_qwen3()
    student = student_of(teacher)
    ledger = UpdateLedger(student, teacher)
    opt = torch.optim.AdamW(student.parameters(), lr=1e-3)
    sg = StepGuard("default", ["alerts.use_wandb=false"])
    rows = token_rows(16)
    for step in range(4):
        ledger.begin(step)
        ids = torch.tensor([r["input_ids"] for r in rows[step * 4 : step * 4 + 4]])
        with torch.no_grad():
            t = teacher(input_ids=ids).logits
        sg.observe_teacher_logits(t)
        loss = jsd(student(input_ids=ids).logits, t, torch.ones(ids.shape))
        loss.backward()
        assert sg.before_update(step)
        opt.step()
        opt.zero_grad()
        ledger.end(skipped=False)
        assert sg.after_update(step, {"loss": loss.item()}).action.value == "continue"
    assert ledger.changed == dict.fromkeys(range(4), True) and sg.guard.summary.count == {}
    assert sg.guard.run.vocab_size == VOCAB


def ema_run(rate: float, steps: int = 8):
    """Self-distillation with an EMA teacher: teacher ← (1 − rate)·teacher + rate·student."""
    teacher = tiny_qwen3()
    student = student_of(teacher, noise=0.1)
    optimizer = torch.optim.AdamW(student.parameters(), lr=1e-3)
    sg = StepGuard("default", ["alerts.use_wandb=false"], teacher=teacher)
    rows = token_rows(4 * steps)
    losses = []
    for step in range(steps):
        batch = {k: torch.tensor([r[k] for r in rows[4 * step : 4 * step + 4]]) for k in rows[0]}
        with torch.no_grad():
            t_logits = teacher(**batch).logits
        sg.observe_teacher_logits(t_logits, mask=batch["attention_mask"])
        loss = jsd(student(**batch).logits, t_logits, batch["attention_mask"])
        loss.backward()
        losses.append(loss.item())
        sg.optimizer_step(optimizer, step)
        with torch.no_grad():
            for pt, ps in zip(teacher.parameters(), student.parameters()):
                pt.mul_(1 - rate).add_(ps, alpha=rate)
        if sg.halted:
            break
    return sg, losses


def test_an_ema_teacher_updated_the_wrong_way_is_caught_at_its_first_move():
    """trl PR #4935: the rate inverted, the teacher keeps 5 % of itself per step and becomes a
    copy of the student; the loss 'converges' to 0 at once (0.19 → 0.004 → 0 here). The canary
    sees the teacher move 1.4 nats in one step against a 0.1 tolerance."""
    sg, losses = ema_run(rate=0.95)
    assert losses[1] < 0.05 * losses[0]  # the damage: the teacher is now the student
    assert sg.guard.summary.first == {"teacher.fingerprint_mismatch": 1}
    assert sg.skipped_updates == 3 and sg.halted  # no update on the copy, then halt
    finding_message = sg.guard.halt.message
    assert "3 consecutive steps" in finding_message


def test_an_ema_teacher_at_its_configured_rate_stays_clean():
    sg, losses = ema_run(rate=0.05)
    assert sg.guard.summary.count == {} and sg.skipped_updates == 0
    assert min(losses) > 0.05


# ---------------------------------------------------------------------- the fused loss


def fused_run(tmp_path, monkeypatch, poison=None, at=6, steps=12):
    """The fused-loss loop of docs/losses.md (``distill_loss`` as the loss, its output handed to
    ``observe_distill_loss``), with the logits reducer made to fail: the guard reads nothing of
    the logits but what the loss returned."""
    from distill_guard.integrations import step_guard
    from distill_guard.losses import distill_loss

    def second_pass(*args, **kwargs):
        raise AssertionError("the guard read the teacher's logits a second time")

    monkeypatch.setattr(step_guard, "teacher_logprobs_from_logits", second_pass)
    teacher = tiny_qwen3()
    student = student_of(teacher)
    batches = token_batches(steps)
    ledger = UpdateLedger(student, teacher, at=at if poison else None, poison=poison)
    seen = []
    with StepGuard("default", [f"events_path={tmp_path / 'guard.jsonl'}"], teacher=teacher) as sg:
        judge = sg.guard.on_step_metrics
        sg.guard.on_step_metrics = lambda step, m, **kw: (
            seen.append(dict(m)) or judge(step, m, **kw)
        )
        optimizer = torch.optim.AdamW(student.parameters(), lr=1e-3)
        for step, batch in enumerate(batches):
            ledger.begin(step)
            with torch.no_grad():
                t_logits = teacher(**batch).logits
            out = distill_loss(student(**batch).logits, t_logits, mask=batch["attention_mask"])
            sg.observe_distill_loss(out)
            out.loss.backward()
            applied = sg.optimizer_step(optimizer, step)
            ledger.end(not applied)
            sg.after_update(step, {})
            if sg.halted:
                break
    return sg, ledger, seen


def test_fused_loss_zeroed_teacher_mid_run_trains_nothing(tmp_path, monkeypatch):
    sg, ledger, _ = fused_run(tmp_path, monkeypatch, poison=kill)
    assert ledger.poisoned == []
    assert all(ledger.changed[s] for s in range(6))
    assert sg.halted and sg.guard.halt.step == 8  # skip, skip, halt
    assert sg.guard.summary.first["teacher.uniform"] == 6
    assert min(sg.guard.summary.first.values()) == 6


def test_fused_loss_healthy_run_is_silent_and_reports_the_students_entropy(tmp_path, monkeypatch):
    sg, ledger, seen = fused_run(tmp_path, monkeypatch)
    assert sg.guard.summary.count == {} and not sg.halted
    assert all(ledger.changed.values()) and len(ledger.changed) == 12
    assert sg.guard.run.vocab_size == VOCAB
    before = [m for m in seen if Metric.STUDENT_ENTROPY not in m]
    after = [m for m in seen if Metric.STUDENT_ENTROPY in m]
    assert len(before) == len(after) == 12  # the raw loss before each update, entropy after
    assert all(0.0 < m[Metric.LOSS] < 0.3 * math.log(2) for m in before)
    assert all(0.0 < m[Metric.STUDENT_ENTROPY] < math.log(VOCAB) for m in after)


def test_observe_distill_loss_hands_top1_samples_loss_and_entropy():
    from distill_guard.losses import distill_loss

    g = torch.Generator().manual_seed(0)
    student, teacher = torch.randn(3, 5, 40, generator=g), torch.randn(3, 5, 40, generator=g) * 3
    mask = torch.ones(3, 5)
    mask[1, 3:] = 0
    out = distill_loss(student, teacher, beta=0.3, mask=mask)
    sg = StepGuard("default", ["alerts.use_wandb=false"])
    sg.observe_distill_loss(out)
    (top1,), (samples,) = sg._buffer.topk.parts, sg._buffer.samples.parts
    lp = torch.log_softmax(teacher, -1).amax(-1)[mask.bool()]
    assert top1.shape == (13, 1) and torch.allclose(top1[:, 0], lp, atol=1e-5)
    assert samples.tolist() == [0] * 5 + [1] * 3 + [2] * 5
    assert (sg.guard.run.vocab_size, sg.guard.run.beta) == (40, 0.3)
    assert sg.before_update(0) is True
    h = -(torch.softmax(student, -1) * torch.log_softmax(student, -1)).sum(-1)[mask.bool()]
    seen = []
    judge = sg.guard.on_step_metrics
    sg.guard.on_step_metrics = lambda step, m, **kw: seen.append(dict(m)) or judge(step, m, **kw)
    sg.after_update(0, {})
    assert seen[-1][Metric.STUDENT_ENTROPY] == pytest.approx(float(h.mean()), rel=1e-5)
    sg.observe_distill_loss(out)
    sg.before_update(1)
    sg.after_update(1, {Metric.STUDENT_ENTROPY: 0.5})  # the caller's own value wins
    assert seen[-1][Metric.STUDENT_ENTROPY] == 0.5
    sg.after_update(2, {})  # nothing observed for this step: nothing added
    assert Metric.STUDENT_ENTROPY not in seen[-1]
    with pytest.raises(TypeError, match="DistillLoss"):
        sg.observe_distill_loss(out.loss)


@pytest.mark.parametrize("teacher_kind", ["uniform", "near_uniform", "peaked"])
def test_top1_alone_tells_a_uniform_teacher_from_a_peaked_one(teacher_kind):
    """k = 1 is enough for the collapse check: a top-1 at −ln V is a uniform row, a median top-1
    at or below −½ ln V a near-uniform teacher; a peaked teacher is silent."""
    from distill_guard.losses import distill_loss

    g = torch.Generator().manual_seed(0)
    scale = {"uniform": 0.0, "near_uniform": 0.05, "peaked": 6.0}[teacher_kind]
    teacher = torch.randn(4, 8, 512, generator=g) * scale
    out = distill_loss(torch.randn(4, 8, 512, generator=g), teacher)
    sg = StepGuard("default", ["alerts.use_wandb=false"])
    sg.observe_distill_loss(out)
    applied = sg.before_update(0)
    codes = set(sg.guard.summary.count)
    expected = {
        "uniform": {"teacher.uniform"},
        "near_uniform": {"teacher.near_uniform"},
        "peaked": set(),
    }[teacher_kind]
    assert codes == expected and applied is (teacher_kind == "peaked")


def test_fused_signals_after_a_logits_reduction_are_not_mixed_in(caplog):
    """A watch hook that already reduced the step's teacher logits to top-16: the fused top-1
    is not appended (the widths would not stack), said once at INFO; the loss still counts."""
    from distill_guard.losses import distill_loss

    caplog.set_level("INFO", logger="distill_guard")
    logits = torch.randn(2, 6, 64)
    sg = StepGuard("default", ["alerts.use_wandb=false"])
    for _ in range(2):
        sg.observe_teacher_logits(logits)
        sg.observe_distill_loss(distill_loss(logits + 0.1, logits))
    assert [t.shape[-1] for t in sg._buffer.topk.parts] == [16, 16] and len(sg._buffer.losses) == 2
    told = [r for r in caplog.records if "read the logits once" in r.getMessage()]
    assert len(told) == 1 and told[0].levelname == "INFO"


def recorded(sg: StepGuard) -> list[dict[str, float]]:
    """The metrics each ``on_step_metrics`` call hands the guard."""
    calls: list[dict[str, float]] = []
    on_step_metrics = sg.guard.on_step_metrics

    def record(step, metrics, **kwargs):
        calls.append(dict(metrics))
        return on_step_metrics(step, metrics, **kwargs)

    sg.guard.on_step_metrics = record
    return calls


def test_after_update_reads_any_conventions_names_and_role_keys_win():
    """Issue 23: TRL's ``entropy`` handed to after_update was silently ignored."""
    sg = StepGuard("default", ["alerts.use_wandb=false"])
    calls = recorded(sg)
    sg.after_update(0, {"loss": 0.02, "entropy": 0.41, "completions/clipped_ratio": 0.05})
    assert calls[-1] == {
        Metric.LOSS: 0.02,
        Metric.STUDENT_ENTROPY: 0.41,
        Metric.TRUNCATED_RATIO: 0.05,
    }
    sg.after_update(1, {"loss": 0.02, "student_entropy": 0.4, "train/entropy_loss": 9.0})
    assert calls[-1] == {Metric.LOSS: 0.02, Metric.STUDENT_ENTROPY: 0.4}  # the role key wins
    sg.after_update(2, {"train/loss": 0.02, "eval/accuracy": 0.5})
    assert calls[-1] == {Metric.LOSS: 0.02, Metric.EVAL_ACCURACY: 0.5}


def test_after_logs_reads_older_trls_truncation_name():
    from distill_guard.metric_names import HF_METRIC_NAMES

    sg = StepGuard("default", ["alerts.use_wandb=false"], metric_names=HF_METRIC_NAMES)
    calls = recorded(sg)
    sg.after_logs(0, {"loss": 0.02, "completions/truncated_fraction": 0.1, "epoch": 0.1})
    assert calls[-1] == {Metric.LOSS: 0.02, Metric.TRUNCATED_RATIO: 0.1}


def test_a_lookalike_of_a_role_not_read_is_told_once_at_info(caplog):
    caplog.set_level("DEBUG", logger="distill_guard")
    sg = StepGuard("default", ["alerts.use_wandb=false"])
    seen = []
    sg.guard.on_finding = seen.append
    calls = recorded(sg)
    for step in range(3):
        sg.after_update(
            step, {"loss": 0.02, "train/pg_loss": 0.01, "actor/entropy_mean": 0.41, "lr": 1e-5}
        )
    assert calls[-1]["loss"] == 0.02 and Metric.STUDENT_ENTROPY not in calls[-1]
    told = [r for r in caplog.records if "looks like" in r.getMessage()]
    assert [r.levelname for r in told] == ["INFO"]  # once, at INFO; pg_loss is not news
    assert told[0].name == "distill_guard"
    assert "'actor/entropy_mean' looks like student_entropy" in told[0].getMessage()
    assert not [r for r in caplog.records if r.levelno >= 30] and seen == []
    # a role already read: its look-alikes are not news
    caplog.clear()
    sg.after_update(3, {"loss": 0.02, "entropy": 0.4})
    sg.after_update(4, {"loss": 0.02, "entropy": 0.4, "my/other_entropy": 0.3})
    assert not [r for r in caplog.records if "looks like" in r.getMessage()]


@pytest.mark.parametrize("lr", [3e-2, 1e-1])
def test_a_learning_rate_far_too_high_is_a_loss_rise_blamed_on_the_student(tmp_path, lr):
    """A healthy teacher (its canary checked every step) and a real torch student at 30× and
    100× the healthy learning rate: the JSD multiplies from the student's step-0 value while
    staying below its ceiling; ``loss.rise`` says so within a few steps and blames the student."""
    teacher = tiny_qwen3()
    student = student_of(teacher)
    opt = torch.optim.AdamW(student.parameters(), lr=lr)
    sg = StepGuard(
        "default",
        [f"events_path={tmp_path / 'e.jsonl'}", "alerts.use_wandb=false"],
        teacher=teacher,
    )
    with sg:
        for step, batch in enumerate(token_batches(12)):
            with torch.no_grad():
                t_logits = teacher(**batch).logits
            sg.observe_teacher_logits(t_logits, mask=batch["attention_mask"])
            loss = jsd(student(**batch).logits, t_logits, batch["attention_mask"])
            loss.backward()
            sg.optimizer_step(opt, step)
            sg.after_update(step, {"loss": loss.item()})
    summary = sg.guard.summary
    assert set(summary.count) == {"loss.rise"} and summary.first["loss.rise"] <= 6, summary.count
    rise = next(e for e in events(tmp_path / "e.jsonl") if e.get("code") == "loss.rise")
    assert (
        "the student is leaving its teacher" in rise["message"]
        and rise["values"]["teacher_healthy"]
    )
