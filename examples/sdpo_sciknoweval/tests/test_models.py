import torch

from examples.sdpo_sciknoweval.models import ModelSize, build_model, load_model, save_model
from examples.sdpo_sciknoweval.tokenizer import build_tokenizer

TINY = ModelSize(hidden_size=32, num_layers=1, intermediate_size=64, vocab_multiple=1024)


def test_build_is_seeded_and_save_load_round_trips(tmp_path):
    tok = build_tokenizer()
    a, b = build_model(TINY, tok, seed=3), build_model(TINY, tok, seed=3)
    ids = torch.tensor([tok.encode("Which organelle?", add_bos=True)])
    assert torch.equal(a(ids).logits, b(ids).logits)
    assert a.config.vocab_size == 1024 and a.config.eos_token_id == tok.eos_id
    save_model(a, tmp_path / "m")
    assert {"config.json", "model.safetensors"} <= {p.name for p in (tmp_path / "m").iterdir()}
    assert torch.equal(load_model(tmp_path / "m")(ids).logits, a(ids).logits)
