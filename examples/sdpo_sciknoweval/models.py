"""Small Qwen3-architecture causal LMs built from scratch, saved as HF model directories.

The miniature's teacher and student share the real recipe's architecture (Qwen3) at a size that
trains in seconds on a CPU; a directory with ``config.json`` + ``model.safetensors`` is what an
SGLang-style teacher would load.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import Qwen3Config, Qwen3ForCausalLM

from examples.sdpo_sciknoweval.tokenizer import WordTokenizer


@dataclass(frozen=True)
class ModelSize:
    """Shape of a miniature Qwen3 model."""

    hidden_size: int = 64
    num_layers: int = 2
    num_heads: int = 4
    num_kv_heads: int = 2
    intermediate_size: int = 256
    max_positions: int = 128
    vocab_multiple: int = 4096


def padded_vocab_size(tokenizer: WordTokenizer, multiple: int) -> int:
    """The model's output vocabulary: the tokenizer's, rounded up to ``multiple``.

    Qwen3 pads its 151,665 tokens to 151,936 logits. Padding here matters for the failure being
    reproduced: a uniform teacher sits at -ln V of the model's V, and the JSD of a peaked student
    against it is ln 2 - O(K/V), so V must be large next to K=16 for the loss to reach ln 2.
    """
    return -(-tokenizer.vocab_size // multiple) * multiple


def build_model(size: ModelSize, tokenizer: WordTokenizer, seed: int) -> Qwen3ForCausalLM:
    """A freshly initialised Qwen3ForCausalLM; the same seed gives the same weights.

    The config carries the tokenizer's BOS/EOS/PAD ids: samplers read EOS and PAD from it.
    """
    config = Qwen3Config(
        vocab_size=padded_vocab_size(tokenizer, size.vocab_multiple),
        hidden_size=size.hidden_size,
        intermediate_size=size.intermediate_size,
        num_hidden_layers=size.num_layers,
        num_attention_heads=size.num_heads,
        num_key_value_heads=size.num_kv_heads,
        head_dim=size.hidden_size // size.num_heads,
        max_position_embeddings=size.max_positions,
        tie_word_embeddings=False,
        bos_token_id=tokenizer.bos_id,
        eos_token_id=tokenizer.eos_id,
        pad_token_id=tokenizer.pad_id,
    )
    torch.manual_seed(seed)
    return Qwen3ForCausalLM(config).float().eval()


def save_model(model: Qwen3ForCausalLM, path: str | Path) -> None:
    """Write ``config.json`` and ``model.safetensors`` into ``path``."""
    model.save_pretrained(path, safe_serialization=True)


def load_model(path: str | Path) -> Qwen3ForCausalLM:
    """Load a directory written by ``save_model`` (local files only), in float32, eval mode."""
    return Qwen3ForCausalLM.from_pretrained(path, local_files_only=True, dtype=torch.float32).eval()
