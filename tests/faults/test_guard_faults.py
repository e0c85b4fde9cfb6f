"""Faults that used to escape into the training loop or mislead the guard (issue 13, first part):
each fails on the code before its fix."""

from __future__ import annotations

import math

import torch

from distill_guard.checks import TeacherCollapseCheck
from distill_guard.events import read_events
from distill_guard.findings import Code, Finding, Severity
from distill_guard.guard import DistillGuard
from distill_guard.live.canary import Canary
from distill_guard.observations import RunSpec, TeacherScores
from distill_guard.policy import Action
from distill_guard.teachers import TeacherError, TorchTeacher
from distill_guard.testing.tiny import build_tiny_qwen3


def test_a_teacher_failing_during_the_guards_own_repair_is_a_halt_not_an_exception(tmp_path):
    teacher = TorchTeacher.from_pretrained(build_tiny_qwen3(tmp_path / "m", vocab_size=64))

    def failing_reload(t):
        raise TeacherError("reload: the server went away")

    events = tmp_path / "events.jsonl"
    guard = DistillGuard(
        teacher=teacher, canary=Canary(length=8), reloader=failing_reload, events=events,
        repair_attempts=2, repair_backoff_s=0,
    )  # fmt: skip
    guard.sleep(0)
    decision = guard.wake(0)  # lost weights, and the repair's reload fails: must not raise
    assert decision.action is Action.HALT and guard.halted
    kinds = [e["kind"] for e in read_events(events)]
    assert kinds.count("repair.error") == 2 and "halt" in kinds
    assert all(e["during"] == "reload" for e in read_events(events) if e["kind"] == "repair.error")


def test_a_finding_carrying_a_tensor_is_recorded(tmp_path):
    finding = Finding(Code.TEACHER_UNIFORM, Severity.WARN, "m", 0, {"rows": torch.ones(2, 3)})
    assert finding.to_dict()["values"]["rows"] == [[1.0] * 3] * 2
    guard = DistillGuard(events=tmp_path / "e.jsonl")
    guard.record_findings("teacher_scores", [finding])
    assert read_events(tmp_path / "e.jsonl")[-1]["values"]["rows"] == [[1.0] * 3] * 2


def test_a_fault_inside_the_decision_becomes_a_safe_decision(tmp_path):
    guard = DistillGuard(events=tmp_path / "e.jsonl")

    def broken(*args, **kwargs):
        raise RuntimeError("policy bug")

    guard.policy.decide = broken
    d = guard.on_teacher_scores(0, token_logprobs=torch.full((8,), -1.0))
    assert d.action is Action.SKIP_BATCH and d.reasons[0].code == Code.GUARD_INTERNAL_ERROR
    assert guard.on_step_metrics(0, {"loss": 0.1}).action is Action.ALERT


def test_top_k_rows_of_only_minus_inf_are_a_dead_teacher_not_masked_entries():
    """fp16 log_softmax of a zero-weight teacher gives rows of −inf: no probability anywhere."""
    check = TeacherCollapseCheck()
    dead = torch.full((8, 4), -math.inf)
    found = check.on_teacher_scores(TeacherScores(0, topk_logprobs=dead), RunSpec(vocab_size=512))
    assert [f.code for f in found] == [Code.TEACHER_NONFINITE]
    masked_entries = torch.tensor([[-0.1, -3.0, -math.inf, -math.inf]] * 8)  # union padding
    assert check.on_teacher_scores(TeacherScores(0, topk_logprobs=masked_entries), RunSpec()) == []


def test_a_failed_fingerprint_leaves_no_stale_reference_for_a_moving_teacher(tmp_path):
    """An EMA teacher moves between steps; when the fingerprint before sleep fails, the wake must
    not be judged against the reference of an earlier step (it used to reload the disk
    checkpoint three times and halt a healthy run)."""
    teacher = TorchTeacher.from_pretrained(
        build_tiny_qwen3(tmp_path / "m", vocab_size=64), enable_cpu_backup=True
    )
    guard = DistillGuard(teacher=teacher, canary=Canary(length=8), repair_backoff_s=0)
    assert guard.sleep(0).action is Action.CONTINUE and guard.wake(0).action is Action.CONTINUE
    with torch.no_grad():  # the EMA update of this step
        for p in teacher.model.parameters():
            p.mul_(0.5)
    real_score = teacher._score
    teacher._score = lambda *a: (_ for _ in ()).throw(TeacherError("scoring timed out"))
    slept = guard.sleep(1)  # the fingerprint fails: recorded, the reference is dropped
    assert Code.TEACHER_UNREACHABLE in {f.code for f in slept.reasons}
    teacher._score = real_score
    woke = guard.wake(1)
    assert woke.action is Action.CONTINUE and guard.repairs == 0 and not guard.halted


def test_a_torn_last_event_line_does_not_lose_the_good_events(tmp_path):
    path = tmp_path / "events.jsonl"
    path.write_text('{"kind": "finding", "step": 1}\n{"kind": "halt", "step": 2}\n{"kind": "de')
    assert [e["kind"] for e in read_events(path)] == ["finding", "halt"]
    path.write_text('{"kind": "finding"}\nnot json\n{"kind": "halt"}\n')
    import pytest

    with pytest.raises(ValueError, match="events.jsonl:2"):
        read_events(path)


def test_a_resume_that_fails_says_the_teacher_was_left_asleep_not_weight_loss(tmp_path):
    teacher = TorchTeacher.from_pretrained(build_tiny_qwen3(tmp_path / "m", vocab_size=64))
    guard = DistillGuard(teacher=teacher, canary=Canary(length=8), repair_attempts=1)
    guard.sleep(0)
    teacher._resume = lambda tags: (_ for _ in ()).throw(TeacherError("HTTP 500"))
    d = guard.wake(0)
    (finding,) = [f for f in d.reasons if f.code == Code.TEACHER_UNREACHABLE]
    assert "left asleep" in finding.message and "--enable-weights-cpu-backup" not in finding.message
    assert Code.TEACHER_UNIFORM not in {f.code for f in d.reasons}


# ---------------------------------------------------------------------------------- the network


def drip_server(body: bytes, gap_s: float):
    """A server on 127.0.0.1 that answers 200 and then drips its body one byte per ``gap_s``:
    every socket read succeeds, the answer never ends in time. Serves one connection."""
    import socket
    import threading

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(1)

    def serve() -> None:
        conn, _ = sock.accept()
        conn.recv(65536)
        head = f"HTTP/1.1 200 OK\r\nContent-Length: {len(body)}\r\n\r\n".encode()
        conn.sendall(head)
        try:
            for b in body:  # bounded: the body's length
                conn.sendall(bytes([b]))
                import time as _t

                _t.sleep(gap_s)
        except OSError:
            pass
        finally:
            conn.close()
            sock.close()

    threading.Thread(target=serve, daemon=True).start()
    return f"http://127.0.0.1:{sock.getsockname()[1]}"


def test_a_server_that_drips_its_answer_is_cut_at_the_total_deadline():
    import time

    import pytest

    from distill_guard.teachers import SGLangHTTPTeacher, TeacherUnreachable

    url = drip_server(b'{"version": "0.5.23", "model_path": "/m"}' * 4, gap_s=0.05)
    t = SGLangHTTPTeacher(url, timeout_s=1.0, max_retries=0)
    t0 = time.monotonic()
    with pytest.raises(TeacherUnreachable, match="within 1 s"):
        t.server_info()
    assert time.monotonic() - t0 < 2.0  # the whole call, not each byte's read


def test_a_key_with_a_trailing_newline_works_and_never_reaches_a_message(tiny_dir, monkeypatch):
    from distill_guard.teachers import SGLangHTTPTeacher, TeacherHTTPError, TorchTeacher
    from distill_guard.testing.reference_server import ReferenceServer, serve_in_thread

    server = ReferenceServer(TorchTeacher.from_pretrained(tiny_dir), api_key="s3cret-key")
    with serve_in_thread(server) as url:
        monkeypatch.setenv("KEY_FILE_CONTENT", "s3cret-key\n")  # as read from a mounted file
        t = SGLangHTTPTeacher(url, api_key_env="KEY_FILE_CONTENT")
        assert t.score([[1, 2, 3]]).token_logprobs[0].numel() == 2
        monkeypatch.setenv("WRONG", "not-the-key\n")
        wrong = SGLangHTTPTeacher(url, api_key_env="WRONG", max_retries=0)
        import pytest

        with pytest.raises(TeacherHTTPError) as err:
            wrong.score([[1, 2, 3]])
        assert "not-the-key" not in str(err.value) and "s3cret" not in str(err.value)


# ---------------------------------------------------------------------------------- user input


def test_bad_histories_and_cli_values_are_exit_2_with_the_file_named(tmp_path, run_cli):
    binary = tmp_path / "h.jsonl"
    binary.write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00\xff\xfe")
    code, _, err = run_cli("replay", binary)
    assert code == 2 and "h.jsonl" in err and ("UTF-8" in err or "binary" in err)
    nested = tmp_path / "n.jsonl"
    nested.write_text("[" * 100000 + "]" * 100000 + "\n")
    code, _, err = run_cli("replay", nested)
    assert code == 2 and "n.jsonl:1" in err
    bom = tmp_path / "b.csv"
    bom.write_text("\ufeff_step,train/loss\n0,0.02\n1,0.02\n", encoding="utf-8")
    code, out, _ = run_cli("replay", bom, "--json")
    assert code == 0 and '"halt_step": null' in out
    good = tmp_path / "g.jsonl"
    good.write_text('{"train/loss": 0.02}\n')
    code, _, err = run_cli("replay", good, "--plot", tmp_path / "missing" / "p.png")
    assert code == 2 and "does not exist" in err
    for bad in (["--top-k", "-1"], ["--canary-length", "1"], ["--timeout", "0"]):
        code, _, err = run_cli("probe", "--url", "http://127.0.0.1:9", *bad)
        assert code == 2 and bad[0] in err


def test_an_interrupted_probe_puts_the_teacher_back(tiny_dir, monkeypatch):
    """Ctrl-C (or SIGTERM) right after a wake that lost the weights: the probe reloads and
    verifies the teacher before the interruption propagates."""
    import pytest

    from distill_guard.live import probe as probe_module
    from distill_guard.teachers import SGLangHTTPTeacher
    from distill_guard.testing.servers import reference_teacher

    with reference_teacher(tiny_dir, enable_cpu_backup=False) as (url, served):
        t = SGLangHTTPTeacher(url)
        canary = Canary(length=8)
        real_verify = canary.verify
        calls = []

        def interrupted(teacher, step=None):
            calls.append(step)
            if len(calls) == 1:  # the first cycle's canary, right after the weight-losing wake
                raise KeyboardInterrupt
            return real_verify(teacher, step=step)

        monkeypatch.setattr(canary, "verify", interrupted)
        with pytest.raises(KeyboardInterrupt):
            probe_module.run_probe(t, cycles=2, canary=canary, preflight=False)
        assert not t.asleep and not served.asleep
        assert real_verify(t) == []  # reloaded and verified: as the probe found it


def test_a_key_typed_on_the_command_line_is_never_echoed(run_cli):
    code, out, err = run_cli("probe", "--url", "http://127.0.0.1:9", "--api-key", "s3cret-key")
    assert code == 2 and "s3cret-key" not in err + out
    assert "--api-key-env" in err
