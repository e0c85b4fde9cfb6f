"""Build and save a tiny seeded Qwen3-architecture model for tests, demos and the reference server."""

from __future__ import annotations

from pathlib import Path

import torch

from distill_guard.extras import needed

QWEN3_VOCAB = 151936
"""Qwen3's vocabulary: a tiny model with this V gives the real uniform value, −11.931215."""


def tiny_qwen3(
    *,
    vocab_size: int = 512,
    hidden_size: int = 32,
    num_layers: int = 2,
    num_heads: int = 2,
    num_kv_heads: int = 1,
    head_dim: int = 16,
    intermediate_size: int = 64,
    seed: int = 0,
    embed_std: float = 0.4,
    max_positions: int = 4096,
) -> torch.nn.Module:
    """A random tiny Qwen3, seeded without touching the global RNG stream.

    Embeddings are drawn with ``embed_std`` (default 0.4, not HF's 0.02) so the random model is
    peaked like a trained teacher (top-1 logprob around −0.2 at V = 512, −2 at V = 151936): with
    HF's init a tiny model is itself nearly uniform and a canary could not tell it from a dead one.
    """
    with needed("build_tiny_qwen3", "hf"):
        from transformers import Qwen3Config, Qwen3ForCausalLM

    config = Qwen3Config(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        intermediate_size=intermediate_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_kv_heads,
        head_dim=head_dim,
        max_position_embeddings=max_positions,
        tie_word_embeddings=True,
    )
    gen_state = torch.random.get_rng_state()
    try:
        torch.manual_seed(seed)
        model = Qwen3ForCausalLM(config)
        with torch.no_grad():
            model.get_input_embeddings().weight.normal_(0.0, embed_std)
    finally:
        torch.random.set_rng_state(gen_state)
    return model


def build_tiny_qwen3(
    out_dir: str | Path, *, dtype: torch.dtype = torch.float32, **kwargs: object
) -> Path:
    """Write ``config.json`` and ``model.safetensors`` of :func:`tiny_qwen3` to ``out_dir``.

    Same arguments and seed give the same bytes.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tiny_qwen3(**kwargs).to(dtype).save_pretrained(out)  # type: ignore[arg-type]
    return out
