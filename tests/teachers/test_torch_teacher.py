"""TorchTeacher: scoring alignment and SGLang's memory-saver semantics, emulated on CPU."""

from __future__ import annotations

import math

import pytest
import torch
from safetensors.torch import save_file

from distill_guard.teachers import TeacherError, TeacherStateError, TorchTeacher
from distill_guard.testing.tiny import QWEN3_VOCAB

SEQS = [list(range(3, 40)), [7, 1, 9, 200, 11, 5, 5, 5, 5], list(range(100, 137))]


def reference_logprobs(teacher: TorchTeacher, seq: list[int], start: int) -> torch.Tensor:
    with torch.no_grad():
        logits = teacher.model(input_ids=torch.tensor([seq])).logits[0].float()
    lp = torch.log_softmax(logits, -1)
    return lp[start:-1].gather(1, torch.tensor(seq[start + 1 :])[:, None])[:, 0]


@pytest.mark.parametrize("start", [0, 5])
def test_scores_are_aligned_to_the_next_token(tiny_dir, start) -> None:
    t = TorchTeacher.from_pretrained(tiny_dir)
    res = t.score(SEQS, top_k=4, logprob_start_len=start)
    assert len(res) == 3
    for seq, lp, top, ids in zip(SEQS, res.token_logprobs, res.topk_logprobs, res.topk_ids):
        n = len(seq) - start - 1
        assert lp.shape == (n,) and top.shape == (n, 4) and ids.shape == (n, 4)
        torch.testing.assert_close(lp, reference_logprobs(t, seq, start), rtol=0, atol=1e-5)
        assert torch.all(top[:, :-1] >= top[:, 1:])  # sorted
        assert torch.all(top[:, 0] >= lp - 1e-6)  # top-1 bounds the actual token
    single = t.score([SEQS[1]], top_k=4, logprob_start_len=start)
    torch.testing.assert_close(single.token_logprobs[0], res.token_logprobs[1])


def test_wake_without_backup_gives_zeros_hence_exactly_uniform(tiny_dir) -> None:
    t = TorchTeacher.from_pretrained(tiny_dir)
    t.release()
    t.resume()
    assert all(float(p.abs().max()) == 0.0 for p in t.model.parameters())
    res = t.score([SEQS[0]], top_k=8)
    target = -math.log(512)
    assert float((res.token_logprobs[0] - target).abs().max()) < 1e-5
    assert float((res.topk_logprobs[0] - target).abs().max()) < 1e-5


def test_wake_without_backup_can_give_garbage_instead(tiny_dir) -> None:
    t = TorchTeacher.from_pretrained(tiny_dir, fault="garbage")
    before = t.score([SEQS[0]], top_k=8)
    t.release()
    t.resume()
    after = t.score([SEQS[0]], top_k=8)
    assert float((after.token_logprobs[0] - before.token_logprobs[0]).abs().max()) > 1.0
    spread = after.topk_logprobs[0][:, 0] - after.topk_logprobs[0][:, -1]
    assert float(spread.min()) > 1e-3  # garbage is not uniform


@pytest.mark.parametrize("kw", [{"enable_cpu_backup": True}, {"enable_memory_saver": False}])
def test_backup_or_no_memory_saver_keeps_the_weights_bit_exact(tiny_dir, kw) -> None:
    t = TorchTeacher.from_pretrained(tiny_dir, **kw)
    before = t.score(SEQS, top_k=4)
    for _ in range(3):
        t.release(["weights"])
        t.resume(["weights"])
    after = t.score(SEQS, top_k=4)
    for a, b in zip(before.token_logprobs, after.token_logprobs):
        assert torch.equal(a, b)


def test_weight_cache_mode_forces_the_backup_off_as_in_sglang(tiny_dir) -> None:
    t = TorchTeacher.from_pretrained(tiny_dir, enable_cpu_backup=True, weight_cache_mode="ipc")
    t.release()
    t.resume()
    assert all(float(p.abs().max()) == 0.0 for p in t.model.parameters())


def test_kv_cache_release_leaves_the_weights_alone(tiny_dir) -> None:
    t = TorchTeacher.from_pretrained(tiny_dir)
    before = t.score([SEQS[0]])
    t.release(["kv_cache"])
    t.resume(["kv_cache"])
    assert torch.equal(before.token_logprobs[0], t.score([SEQS[0]]).token_logprobs[0])


def test_reload_restores_exactly_because_buffers_are_snapshotted(tiny_dir) -> None:
    t = TorchTeacher.from_pretrained(tiny_dir)
    before = t.score(SEQS, top_k=4)
    t.release()
    t.resume()
    t.reload_weights()
    after = t.score(SEQS, top_k=4)
    for a, b in zip(before.topk_logprobs, after.topk_logprobs):
        assert torch.equal(a, b)


def test_without_the_buffer_snapshot_a_reload_is_not_enough(tiny_dir) -> None:
    t = TorchTeacher.from_pretrained(tiny_dir, snapshot_buffers=False)
    before = t.score([SEQS[0]])
    t.release()
    t.resume()
    t.reload_weights()  # parameters back, RoPE inv_freq still zero: positions are lost
    after = t.score([SEQS[0]], top_k=4)
    # small on a 2-layer toy (5.6 nats on a 4 B shape), but not zero and not uniform
    assert float((after.token_logprobs[0] - before.token_logprobs[0]).abs().max()) > 1e-3
    assert float((after.topk_logprobs[0][:, 0] - after.topk_logprobs[0][:, -1]).min()) > 1e-3


def test_reload_is_refused_while_asleep_and_checked_before_copying(tiny_dir, tmp_path) -> None:
    t = TorchTeacher.from_pretrained(tiny_dir)
    t.release(["weights"])
    with pytest.raises(TeacherStateError, match="resume the teacher first"):
        t.reload_weights()
    t.resume(["weights"])
    t.reload_weights()
    before = t.score([SEQS[0]])
    save_file({"model.embed_tokens.weight": torch.zeros(3, 3)}, str(tmp_path / "model.safetensors"))
    with pytest.raises(TeacherError, match="does not fit the model"):
        t.reload_weights(str(tmp_path))
    with pytest.raises(TeacherError, match="no \\*.safetensors"):
        t.reload_weights(str(tmp_path / "missing"))
    assert torch.equal(before.token_logprobs[0], t.score([SEQS[0]]).token_logprobs[0])


def test_out_of_vocabulary_ids_are_an_error(tiny_dir) -> None:
    t = TorchTeacher.from_pretrained(tiny_dir)
    with pytest.raises(TeacherError, match="outside the vocabulary"):
        t.score([[1, 2, 512]])


def test_qwen3_vocabulary_gives_the_real_uniform_value(qwen_vocab_dir) -> None:
    t = TorchTeacher.from_pretrained(qwen_vocab_dir)
    assert t.vocab_size == QWEN3_VOCAB
    healthy = t.score([list(range(0, 151936, 4001))], top_k=16)
    assert float(healthy.topk_logprobs[0][:, 0].mean()) > -8.0  # peaked, far from uniform
    t.release()
    t.resume()
    res = t.score([list(range(0, 151936, 4001))], top_k=16)
    assert float((res.topk_logprobs[0] - (-11.931215)).abs().max()) < 1e-4


def test_every_teacher_satisfies_the_protocol(tiny_dir) -> None:
    from distill_guard.teachers import SGLangEngineTeacher, SGLangHTTPTeacher, Teacher

    assert isinstance(TorchTeacher.from_pretrained(tiny_dir), Teacher)
    assert isinstance(SGLangEngineTeacher(object(), vocab_size=8), Teacher)
    assert isinstance(SGLangHTTPTeacher("http://127.0.0.1:1", vocab_size=8), Teacher)


def test_server_info_uses_sglang_names(tiny_dir) -> None:
    info = TorchTeacher.from_pretrained(tiny_dir, enable_cpu_backup=True).server_info()
    assert info["model_path"] == str(tiny_dir)
    assert info["enable_memory_saver"] is True and info["enable_weights_cpu_backup"] is True
    assert info["enable_deterministic_inference"] is False and info["weight_cache_mode"] == "off"
    assert "not SGLang" in info["version"]


def test_reading_the_checkpoint_keeps_nothing_per_call(tmp_path) -> None:
    """A teacher repaired at every wake reloads its checkpoint thousands of times: reading it
    must retain nothing (safetensors' load_file keeps about 0.7 KiB per call; found by the
    chaos soak)."""
    import gc
    import tracemalloc

    from safetensors.torch import save_file

    from distill_guard.teachers.torch_teacher import _load_safetensors_dir

    save_file({f"w{i}": torch.randn(8, 8) for i in range(13)}, str(tmp_path / "m.safetensors"))
    for _ in range(200):
        _load_safetensors_dir(tmp_path)
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    for _ in range(1000):
        _load_safetensors_dir(tmp_path)
    gc.collect()
    retained = (tracemalloc.get_traced_memory()[0] - before) / 1000
    tracemalloc.stop()
    assert retained < 50, f"{retained:.0f} bytes retained per reload"
