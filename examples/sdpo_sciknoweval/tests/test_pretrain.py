import json
from dataclasses import replace

from examples.sdpo_sciknoweval.models import ModelSize
from examples.sdpo_sciknoweval.pretrain import PretrainConfig, SFTConfig, pretrain

TINY = ModelSize(hidden_size=32, num_layers=1, intermediate_size=64, vocab_multiple=1024)


def test_pretrain_caches_by_config_hash(tmp_path):
    cfg = PretrainConfig(
        teacher=SFTConfig(TINY, seed=1, steps=2, lr=1e-3, batch_size=4, warmup_steps=1),
        student=SFTConfig(TINY, seed=2, steps=2, lr=1e-3, batch_size=4, warmup_steps=1),
    )
    teacher_dir, student_dir = pretrain(tmp_path, cfg, threads=1)
    record = json.loads((tmp_path / "pretrain.json").read_text())
    assert {"accuracy", "answer_entropy", "seconds"} <= record["teacher"].keys()
    assert (teacher_dir / "model.safetensors").exists() and (student_dir / "config.json").exists()
    stamp = (teacher_dir / "model.safetensors").stat().st_mtime_ns
    assert pretrain(tmp_path, cfg, threads=1) == (teacher_dir, student_dir)
    assert (teacher_dir / "model.safetensors").stat().st_mtime_ns == stamp
    changed = replace(cfg, student=replace(cfg.student, steps=3))
    pretrain(tmp_path, changed, threads=1)
    assert json.loads((tmp_path / "pretrain.json").read_text())["hash"] != record["hash"]
