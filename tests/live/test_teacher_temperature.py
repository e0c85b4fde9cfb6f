"""Teacher temperature: SGLang scores input logprobs at T = 1 whatever ``sampling_params`` says;
the reference server does the same, and preflight reports a run whose teacher T ≠ 1 is ignored."""

from __future__ import annotations

import json
import math
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch

from distill_guard.findings import Code, Severity
from distill_guard.live.canary import Canary
from distill_guard.live.preflight import (
    TEMPERATURE_IGNORED_ATOL,
    measure_temperature,
    preflight_server_args,
    preflight_teacher,
)
from distill_guard.teachers import ScoreResult, SGLangEngineTeacher, SGLangHTTPTeacher, TorchTeacher
from distill_guard.teachers._sglang_wire import build_score_item, score_request
from distill_guard.testing.servers import reference_teacher
from distill_guard.testing.tiny import build_tiny_qwen3

IGNORED = Code.CONFIG_TEACHER_TEMPERATURE_IGNORED  # "config.teacher_temperature_ignored"
SEQ = [3, 17, 250, 9, 41, 7, 300, 12, 5, 88, 101, 64]


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_qwen3(tmp_path_factory.mktemp("temperature_tiny"), vocab_size=512)


@pytest.fixture(scope="module")
def served(tiny_dir: Path) -> Iterator[tuple[str, TorchTeacher]]:
    """A healthy, deterministic teacher on the reference server: its only finding can be ours."""
    with reference_teacher(
        tiny_dir, enable_cpu_backup=True, enable_deterministic_inference=True
    ) as pair:
        yield pair


def ours(findings) -> list:
    return [f for f in findings if f.code == IGNORED]


def generate(url: str, **sampling: Any) -> httpx.Response:
    body = {
        "input_ids": SEQ,
        "sampling_params": {"max_new_tokens": 0, **sampling},
        "return_logprob": True,
        "logprob_start_len": 0,
        "top_logprobs_num": 8,
    }
    return httpx.post(f"{url}/generate", json=body, timeout=30)


# ---------------------------------------------------------------------------------- the server


def test_reference_server_scores_input_logprobs_at_t1_whatever_the_temperature(served) -> None:
    url, teacher = served
    answers = {}
    for t in (None, 0, 0.5, 1, 2):
        r = generate(url, **({} if t is None else {"temperature": t}))
        assert r.status_code == 200, r.text
        meta = r.json()["meta_info"]
        answers[t] = (meta["input_token_logprobs"], meta["input_top_logprobs"])
    assert answers[0.5] == answers[1] and answers[2] == answers[1]  # bit for bit
    assert answers[None] == answers[1] and answers[0] == answers[1]

    # ... and they are the model's own T = 1 distribution, which T = 0.5 or 2 would move a lot
    with torch.no_grad():
        logits = teacher.model(torch.tensor([SEQ])).logits[0, :-1].double()
    target = torch.tensor(SEQ[1:])[:, None]
    served_lp = torch.tensor([e[0] for e in answers[1][0][1:]], dtype=torch.float64)
    at_1 = torch.log_softmax(logits, -1).gather(1, target)[:, 0]
    assert torch.allclose(served_lp, at_1, atol=1e-5)
    for t in (0.5, 2.0):
        tempered = torch.log_softmax(logits / t, -1).gather(1, target)[:, 0]
        assert (served_lp - tempered).abs().max() > 0.05

    # the client sends the temperature and gets the same answer at every one
    with SGLangHTTPTeacher(url) as client:
        at = {t: client.score([SEQ], top_k=8, temperature=t) for t in (0.5, 1.0, 2.0)}
    for t in (0.5, 2.0):
        assert torch.equal(at[t].token_logprobs[0], at[1.0].token_logprobs[0])
        assert torch.equal(at[t].topk_logprobs[0], at[1.0].topk_logprobs[0])
        assert torch.equal(at[t].topk_ids[0], at[1.0].topk_ids[0])


def test_reference_server_refuses_the_temperatures_sglang_refuses(served) -> None:
    url, _ = served
    negative = generate(url, temperature=-1)
    assert negative.status_code == 400
    assert negative.json() == {
        "error": {"message": "temperature must be a non-negative finite number, got -1.0."}
    }
    wrong_type = generate(url, temperature="hot")
    assert wrong_type.status_code == 400
    assert wrong_type.json() == {"error": 'invalid type: string "hot", expected f64'}
    assert generate(url, temperature=None).status_code == 200  # null is SGLang's default, 1.0


# ---------------------------------------------------------------------------------- the clients


def test_clients_send_the_temperature_and_keep_their_default() -> None:
    assert score_request([[1, 2]], 0, 0)["sampling_params"]["temperature"] == 0
    assert score_request([[1, 2]], 0, 0, 0.5)["sampling_params"]["temperature"] == 0.5

    sent: list[dict] = []

    def handler(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        sent.append(body["sampling_params"])
        seq = body["input_ids"][0]
        item = build_score_item(seq, torch.zeros(len(seq) - 1), None, None, 0)
        return httpx.Response(200, json=[item])

    with SGLangHTTPTeacher("http://t", transport=httpx.MockTransport(handler)) as client:
        client.score([[1, 2, 3]])
        client.score([[1, 2, 3]], temperature=0.7)
        with pytest.raises(ValueError, match="non-negative finite"):
            client.score([[1, 2, 3]], temperature=-0.5)
    assert [p["temperature"] for p in sent] == [0, 0.7]
    assert all(p["max_new_tokens"] == 0 for p in sent)

    class Engine:
        def __init__(self) -> None:
            self.sampling: list[dict] = []

        def generate(self, *, input_ids, sampling_params, **kw: Any) -> list[dict]:
            self.sampling.append(sampling_params)
            return [build_score_item(s, torch.zeros(len(s) - 1), None, None, 0) for s in input_ids]

    engine = Engine()
    t = SGLangEngineTeacher(engine)
    t.score([[1, 2, 3]])
    t.score([[1, 2, 3]], temperature=2.0)
    assert [p["temperature"] for p in engine.sampling] == [0, 2.0]


# ---------------------------------------------------------------------------------- preflight


def test_preflight_measures_an_ignored_teacher_temperature_over_http(served) -> None:
    url, _ = served
    with SGLangHTTPTeacher(url) as client:
        findings = preflight_teacher(client, teacher_temperature=0.7)
    assert [f.code for f in findings] == [IGNORED]
    f = findings[0]
    assert f.severity is Severity.WARN and f.step is None
    v = f.values
    assert v["max_abs_delta"] == 0.0 and v["repeat_noise"] == 0.0
    assert v["bound"] == TEMPERATURE_IGNORED_ATOL and v["evidence"] == "canary"
    assert v["teacher_temperature"] == 0.7 and v["scored_at"] == 1.0
    assert v["sglang_version"] == "0.5.23" and (v["canary_tokens"], v["top_k"]) == (63, 16)
    assert "teacher temperature is 0.7" in f.message and "max |Δ| = 0 nats" in f.message
    assert "bound 1e-06" in f.message and "SGLang 0.5.23" in f.message
    assert "Divide the teacher's logits by 0.7" in f.message
    assert "set the teacher temperature to 1 in the config" in f.message
    json.dumps(f.to_dict())  # the event log can carry it


@pytest.mark.parametrize("temperature", [1.0, 1, None])
def test_a_teacher_temperature_of_one_or_none_has_no_finding(served, temperature) -> None:
    url, _ = served
    with SGLangHTTPTeacher(url) as client:
        assert preflight_teacher(client, teacher_temperature=temperature) == []
    launch = "python -m sglang.launch_server --model-path M --enable-deterministic-inference"
    from distill_guard.live.preflight import parse_launch_command

    args = parse_launch_command(launch)
    assert preflight_server_args(args, teacher_temperature=temperature) == []


@pytest.mark.parametrize("bad", [0, 0.0, -0.5, math.nan, math.inf, "warm", True])
def test_a_bad_teacher_temperature_is_a_clear_error(bad) -> None:
    teacher = FakeSGLang()
    with pytest.raises(ValueError, match="teacher_temperature must be a finite number > 0"):
        preflight_teacher(teacher, teacher_temperature=bad)
    assert teacher.calls == 0  # refused before the teacher was asked anything
    with pytest.raises(ValueError, match="teacher_temperature must be a finite number > 0"):
        preflight_server_args({"version": "0.5.23"}, teacher_temperature=bad)
    if bad == 0:
        with pytest.raises(ValueError, match="greedy"):
            preflight_server_args({}, teacher_temperature=bad)


def test_cli_preflight_with_teacher_temperature(served, run_cli) -> None:
    url, _ = served
    code, out, err = run_cli("preflight", "--url", url, "--teacher-temperature", "0.7", "--json")
    assert code == 0, err  # a warning: the configuration is healthy otherwise
    (f,) = json.loads(out)["findings"]
    assert f["code"] == IGNORED and f["severity"] == "warn"
    assert f["values"]["max_abs_delta"] == 0.0 and f["values"]["teacher_temperature"] == 0.7

    code, out, _ = run_cli("preflight", "--url", url, "--teacher-temperature", "1")
    assert code == 0 and IGNORED not in out

    launch = "python -m sglang.launch_server --model-path M --enable-deterministic-inference"
    code, out, _ = run_cli("preflight", "--args", launch, "--teacher-temperature", "2", "--json")
    (f,) = json.loads(out)["findings"]
    assert f["code"] == IGNORED and f["values"]["evidence"] == "launch command"
    assert f["values"]["max_abs_delta"] is None and "Not measured" in f["message"]
    assert "--teacher-temperature 2" in f["message"]

    for bad in ("0", "-1", "nan"):
        code, out, err = run_cli("preflight", "--args", launch, f"--teacher-temperature={bad}")
        assert code == 2 and out == ""
        assert "error: --teacher-temperature must be a finite number > 0" in err


def test_relax_launch_with_a_teacher_temperature_is_judged_from_the_command() -> None:
    from distill_guard.live.preflight import parse_launch_command

    relax = (
        "python train.py --use-opd --opd-type sglang --teacher-hf-checkpoint /t --colocate "
        "--teacher-sglang-enable-weights-cpu-backup"
    )
    (f,) = ours(preflight_server_args(parse_launch_command(relax), teacher_temperature=0.6))
    assert "Relax launch command" in f.message and f.values["sglang_version"] is None


# ---------------------------------------------------------------------------------- measurement


class FakeSGLang:
    """Scores a fixed random teacher; ``applies`` temperature to its logprobs or not, adds
    ``jitter`` per call (a nondeterministic server), or is ``flat`` (a uniform teacher)."""

    V = 64

    def __init__(self, *, applies: bool = False, jitter: float = 0.0, flat: bool = False,
                 version: str | None = "0.5.23") -> None:  # fmt: skip
        self.applies, self.jitter, self.flat, self.version = applies, jitter, flat, version
        self.calls = 0
        self.asleep = False

    def _score(
        self, sequences: Sequence[Sequence[int]], top_k: int, temperature: float | None
    ) -> ScoreResult:
        self.calls += 1
        seq = list(sequences[0])
        g = torch.Generator().manual_seed(7)
        logits = 3 * torch.randn(len(seq) - 1, self.V, generator=g, dtype=torch.float64)
        if self.flat:
            logits = torch.zeros_like(logits)
        t = temperature if self.applies and temperature else 1.0
        lp = torch.log_softmax(logits / t, -1) + self.jitter * self.calls
        tok = lp.gather(1, torch.tensor(seq[1:])[:, None])[:, 0]
        top = lp.topk(top_k, dim=-1)
        return ScoreResult([tok.float()], [top.values.float()], [top.indices])

    def score(self, sequences, *, top_k=0, logprob_start_len=0, temperature=None) -> ScoreResult:
        return self._score(sequences, top_k, temperature)

    def server_info(self) -> dict[str, Any]:
        info: dict[str, Any] = {"enable_deterministic_inference": True}
        if self.version is not None:
            info["version"] = self.version
        return info

    @property
    def vocab_size(self) -> int:
        return self.V


class FakeSGLangNoTemperatureArg(FakeSGLang):
    """A client whose ``score`` cannot send a temperature (the plain Teacher protocol)."""

    def score(self, sequences, *, top_k=0, logprob_start_len=0) -> ScoreResult:  # type: ignore[override]
        return self._score(sequences, top_k, None)


def test_a_teacher_that_applies_the_temperature_has_no_finding() -> None:
    teacher = FakeSGLang(applies=True)  # says 0.5.23, but the measurement is the evidence
    measured = measure_temperature(teacher, 0.7, Canary(top_k=8))
    assert measured is not None and not measured["ignored"]
    assert measured["max_abs_delta"] > 0.1 and measured["repeat_noise"] == 0.0
    assert ours(preflight_teacher(teacher, teacher_temperature=0.7)) == []
    assert ours(preflight_teacher(FakeSGLang(), teacher_temperature=0.7))  # the control


def test_the_bound_is_the_noise_of_a_repeat_when_that_is_larger() -> None:
    teacher = FakeSGLang(jitter=1e-4)  # ignores T; every call moves every logprob by 1e-4
    (f,) = ours(preflight_teacher(teacher, teacher_temperature=1.5))
    assert f.values["max_abs_delta"] == pytest.approx(1e-4, rel=0.05)
    assert f.values["bound"] == f.values["repeat_noise"] == pytest.approx(2e-4, rel=0.05)
    assert "the noise of a repeat at T = 1" in f.message
    assert teacher.calls == 3


def test_without_a_measurement_an_sglang_version_decides() -> None:
    no_arg, flat = FakeSGLangNoTemperatureArg(version="0.5.9"), FakeSGLang(flat=True)
    for teacher in (no_arg, flat):
        assert measure_temperature(teacher, 0.7) is None  # cannot send T / a flat canary
        (f,) = ours(preflight_teacher(teacher, teacher_temperature=0.7))
        assert f.severity is Severity.WARN and f.values["evidence"] == "version"
        assert f.values["max_abs_delta"] is None and "Not measured" in f.message
        assert f"this teacher is SGLang {teacher.version}" in f.message
    assert no_arg.calls == 0 and flat.calls == 2  # a flat canary: one call each, no more
    assert (
        "client sends no temperature"
        in ours(preflight_teacher(no_arg, teacher_temperature=2))[0].message
    )
    assert "the canary is flat" in f.message
    # neither SGLang nor measurable: not judged
    unknown = FakeSGLangNoTemperatureArg(version=None)
    assert ours(preflight_teacher(unknown, teacher_temperature=0.7)) == []


def test_an_in_process_torch_teacher_is_not_judged(tiny_dir) -> None:
    teacher = TorchTeacher.from_pretrained(tiny_dir, enable_cpu_backup=True)
    assert ours(preflight_teacher(teacher, teacher_temperature=0.7)) == []
