"""docs/img/replay_example.png: referenced by the README with a caption that tells what the plot
shows, and the story of scripts/replay_example.py (which draws it) is the caption's."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from distill_guard.findings import Code
from distill_guard.history import load_history
from distill_guard.replay import replay
from distill_guard.testing.histories import QWEN3_VOCAB, write_jsonl

ROOT = Path(__file__).resolve().parents[2]


def _script():
    spec = importlib.util.spec_from_file_location(
        "replay_example", ROOT / "scripts" / "replay_example.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_readme_shows_the_replay_example_with_its_caption():
    """Issue 28: the image was referenced by no doc, and its story (a healthy teacher, rising
    accuracy, yet a reload and a halt) confused."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert (
        "](docs/img/replay_example.png)" in readme
        and (ROOT / "docs/img/replay_example.png").is_file()
    )
    caption = readme.split("](docs/img/replay_example.png)", 1)[1].split("\n\n")[1]
    for said in ("step 40", "halts at step", "42", "scripts/replay_example.py", "−ln V"):
        assert said in caption


def test_the_drawn_run_tells_the_captions_story(tmp_path):
    script = _script()
    path = write_jsonl(script.teacher_dies_at_a_wake(), tmp_path / "run.jsonl")
    result = replay(load_history(path), "default", [f"run.vocab_size={QWEN3_VOCAB}"])
    assert result.first_action == (40, "rewake") and result.halt_step == 42
    assert result.first[Code.TEACHER_UNIFORM] == 40 and result.first[Code.LOSS_JSD_CEILING] == 40
    assert min(result.first.values()) == 40  # nothing before the teacher died
    rows = load_history(path).steps
    accuracy = [v["eval_accuracy"] for s, v in rows if "eval_accuracy" in v]
    assert accuracy[8] > accuracy[0] and accuracy[-1] < 0.05  # rises, then falls after step 40
