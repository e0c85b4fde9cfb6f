"""``distill-guard reference``: the teacher's reference file a launcher makes and ships."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("transformers")

from distill_guard.cli import main  # noqa: E402
from distill_guard.live.teacher_reference import TeacherReference  # noqa: E402
from distill_guard.testing.standins import tiny_random_qwen3  # noqa: E402


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    out = tmp_path_factory.mktemp("teacher")
    tiny_random_qwen3().save_pretrained(out)
    return out


def test_it_writes_the_reference_a_run_then_loads(checkpoint, tmp_path, capsys):
    out = tmp_path / "ref.json"
    code = main(["reference", str(checkpoint), "--out", str(out), "--set", "checks.canary.top_k=4"])
    assert code == 0
    said = capsys.readouterr().out
    assert f"teacher_reference={out}" in said and "top-4" in said
    ref = TeacherReference.load(out)
    assert len(ref.topk_logprobs[0]) == 4 and ref.temperature == 1.0
    assert ref.source == f"file {out} (checkpoint {checkpoint})"


def test_json_and_temperature(checkpoint, tmp_path, capsys):
    out = tmp_path / "ref.json"
    args = ["reference", str(checkpoint), "--out", str(out), "--teacher-temperature", "2", "--json"]
    assert main([*args, "--tolerance-mean", "0.3"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["temperature"] == 2.0 and summary["tokens"] == 64
    ref = TeacherReference.load(out)
    assert ref.tolerance("bfloat16") == (0.3, 3.0) and ref.tolerance("float32") == (0.3, 0.1)


@pytest.mark.parametrize(
    "extra, says",
    [
        (["--teacher-temperature", "0"], "--teacher-temperature must be a finite number > 0"),
        (["--set", "checks.canary.nope=1"], "bad guard setting"),
        (["--tolerance-max", "-1"], "--tolerance-max must be > 0"),
    ],
)
def test_bad_input_is_one_line_naming_it(checkpoint, tmp_path, capsys, extra, says):
    assert main(["reference", str(checkpoint), "--out", str(tmp_path / "r.json"), *extra]) == 2
    err = capsys.readouterr().err
    assert says in err and len(err.strip().splitlines()) == 1, err


def test_a_folder_without_a_checkpoint_is_named(tmp_path, capsys):
    assert main(["reference", str(tmp_path), "--out", str(tmp_path / "r.json")]) == 2
    assert "no config.json there" in capsys.readouterr().err
