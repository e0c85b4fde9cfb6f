"""The teacher's reference from outside the run: made from the checkpoint, shipped as a file,
installed in every canary, kept across a resume, and the truth a repair is verified against."""

from __future__ import annotations

import json

import pytest
import torch

pytest.importorskip("transformers")

from distill_guard import StepGuard  # noqa: E402
from distill_guard.checks.canary import CanaryCheck  # noqa: E402
from distill_guard.config import build_guard  # noqa: E402
from distill_guard.events import read_events  # noqa: E402
from distill_guard.findings import Code  # noqa: E402
from distill_guard.live.teacher_reference import (  # noqa: E402
    TeacherReference,
    TeacherReferenceError,
    reference_from_checkpoint,
    resolve_reference,
)
from distill_guard.teachers import TorchTeacher  # noqa: E402
from distill_guard.testing.standins import (  # noqa: E402
    VOCAB,
    at_temperature,
    become_student,
    tiny_random_qwen3,
    zero_weights,
)

from ..integrations._tiny import garble  # noqa: E402

POISONS = {"garbage": garble, "temperature 2": at_temperature, "student copy": become_student}


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    out = tmp_path_factory.mktemp("teacher")
    tiny_random_qwen3().save_pretrained(out)
    return out


def quiet(tmp_path, *more):
    return [f"events_path={tmp_path / 'ev.jsonl'}", "alerts.use_wandb=false", *more]


def test_a_reference_from_the_checkpoint_is_the_never_slept_teacher(checkpoint, tmp_path):
    ref = reference_from_checkpoint(checkpoint, CanaryCheck(vocab_size=VOCAB))
    assert len(ref.tokens) == 64 and len(ref.token_logprobs) == 63
    assert ref.temperature == 1.0 and ref.source == f"checkpoint {checkpoint}"
    back = TeacherReference.load(ref.save(tmp_path / "ref.json"))
    assert back.token_logprobs == ref.token_logprobs and back.tokens == ref.tokens
    assert back.source == f"file {tmp_path / 'ref.json'} (checkpoint {checkpoint})"
    hot = reference_from_checkpoint(checkpoint, CanaryCheck(vocab_size=VOCAB), temperature=2.0)
    assert max(abs(a - b) for a, b in zip(hot.token_logprobs, ref.token_logprobs)) > 1.0


@pytest.mark.parametrize(
    "content, says",
    [
        ("not json", "not a reference file"),
        (json.dumps([1, 2]), "expected a JSON object"),
        (json.dumps({"tokens": [1, 2]}), "missing token_logprobs, temperature, source"),
        (
            json.dumps(
                {"tokens": [1, 2, 3], "token_logprobs": [-1.0], "temperature": 1, "source": "x"}
            ),
            "3 tokens need 2 token logprobs, it has 1",
        ),
        (json.dumps({"format": 9}), "format 9"),
    ],
)
def test_a_bad_reference_file_names_what_is_wrong(tmp_path, content, says):
    p = tmp_path / "ref.json"
    p.write_text(content)
    with pytest.raises(TeacherReferenceError, match=str(p)) as e:
        TeacherReference.load(p)
    assert says in str(e.value)


def test_a_reference_at_another_temperature_is_refused(checkpoint, tmp_path):
    ref = reference_from_checkpoint(checkpoint, CanaryCheck(vocab_size=VOCAB), temperature=2.0)
    path = ref.save(tmp_path / "ref.json")
    with pytest.raises(TeacherReferenceError, match="temperature 2, the run declares"):
        resolve_reference(path, CanaryCheck(), temperature=1.0)
    with pytest.raises(TeacherReferenceError, match="no model_path"):
        resolve_reference("auto", CanaryCheck(), own_checkpoint=None)


def run_plain(tmp_path, teacher, overrides, steps=3, guard_state=None):
    """The README's loop with the module canary; which steps' updates were applied."""
    from ..integrations._tiny import jsd, student_of, token_batches

    student = student_of(tiny_random_qwen3())
    opt = torch.optim.AdamW(student.parameters(), lr=1e-3)
    sg = StepGuard("default", quiet(tmp_path, *overrides), teacher=teacher)
    if guard_state is not None:
        sg.guard.load_state_dict(guard_state, keep_halt=False)
    applied = []
    with sg:
        for step, batch in enumerate(token_batches(steps)):
            with torch.no_grad():
                t_logits = teacher(**batch).logits
            sg.observe_teacher_logits(t_logits, mask=batch["attention_mask"])
            jsd(student(**batch).logits, t_logits, batch["attention_mask"]).backward()
            applied.append(sg.optimizer_step(opt, step))
            sg.after_update(step, {})
    return sg.guard, applied


@pytest.mark.parametrize("poison", list(POISONS))
def test_a_module_teacher_wrong_from_step_0_is_caught_before_the_first_update(
    checkpoint, tmp_path, poison
):
    teacher = tiny_random_qwen3()
    POISONS[poison](teacher)
    guard, applied = run_plain(tmp_path, teacher, [f"teacher_reference={checkpoint}"])
    assert applied == [False, False, False] and guard.halt is not None and guard.halt.step == 2
    first = guard.summary.first.get(Code.TEACHER_REFERENCE_MISMATCH)
    assert first == 0, guard.summary.count


def test_without_a_reference_the_first_fingerprint_is_trusted(tmp_path):
    """What the reference is for: the same garbage teacher trains on every step without one."""
    teacher = tiny_random_qwen3()
    garble(teacher)
    guard, applied = run_plain(tmp_path, teacher, [])
    assert applied == [True, True, True] and guard.summary.count == {}


def test_auto_takes_the_modules_own_checkpoint(checkpoint, tmp_path):
    from transformers import AutoModelForCausalLM

    teacher = AutoModelForCausalLM.from_pretrained(str(checkpoint))
    guard, applied = run_plain(tmp_path, teacher, ["teacher_reference=auto"])
    assert applied == [True, True, True] and guard.summary.count == {}
    assert guard.reference is not None and guard.reference.source == f"checkpoint {checkpoint}"
    (attached,) = [e for e in read_events(tmp_path / "ev.jsonl") if e["kind"] == "attached"]
    assert attached["teacher_reference"] == f"checkpoint {checkpoint}"  # said how it was watched


def test_a_reference_that_cannot_be_had_is_a_warning_and_the_canary_goes_on(tmp_path):
    teacher = tiny_random_qwen3()
    guard, applied = run_plain(tmp_path, teacher, ["teacher_reference=auto"])
    assert applied == [True, True, True]
    assert guard.summary.count == {Code.TEACHER_REFERENCE_UNAVAILABLE: 1}
    zero_weights(teacher)  # the canary still judges against its fingerprint
    assert guard.module_canary.check(3)[0].code == Code.TEACHER_UNIFORM


def test_the_reference_survives_a_resume_and_reaches_a_canary_made_after_the_load(
    checkpoint, tmp_path
):
    guard, _ = run_plain(tmp_path / "a", tiny_random_qwen3(), [f"teacher_reference={checkpoint}"])
    state = guard.state_dict()
    assert state["teacher_reference"]["source"] == f"checkpoint {checkpoint}"
    fresh = build_guard("default", quiet(tmp_path))  # no teacher_reference configured
    fresh.load_state_dict(state)
    teacher = tiny_random_qwen3()
    garble(teacher)
    canary = fresh.watch_module_teacher(teacher)  # after the load, as the HF mixin does
    assert [f.code for f in canary.check(0)] == [Code.TEACHER_FINGERPRINT_MISMATCH]
    canary.canary.forget()  # the reference alone still tells
    assert [f.code for f in canary.check(0)] == [Code.TEACHER_REFERENCE_MISMATCH]


def test_a_repair_is_verified_against_the_reference_not_the_first_wake(checkpoint, tmp_path):
    """A colocated teacher garbage from its first wake: its first fingerprint would be the
    garbage's. With the checkpoint's reference the wake is caught, the reload from model_path
    verifies against the reference, and the repaired teacher is the checkpoint again."""
    teacher = TorchTeacher.from_pretrained(checkpoint, enable_cpu_backup=True)
    teacher.release()
    guard = build_guard(
        "default", quiet(tmp_path, "teacher_reference=auto", "repair.backoff_s=0"), teacher=teacher
    )
    resume = teacher.resume

    def garbage_wake(tags=None):
        resume(tags)
        garble(teacher.model)

    teacher.resume = garbage_wake
    d = guard.wake(0)
    assert d.repaired and guard.repairs == 1, d
    codes = [f.code for f in d.reasons]
    assert Code.TEACHER_REFERENCE_MISMATCH in codes, codes
    assert guard.canary.verify(teacher) == []  # the checkpoint again
    teacher.resume = resume
    guard.sleep(0)
    assert guard.wake(1).action.value == "continue"
