"""Stand-ins for the docs' examples, the demos and the tests: tiny random-init models, token data
and a word-level tokenizer, built offline on CPU in about a second.

None of them is a trained model. The "teacher" is a 2-layer Qwen3 with random weights, peaked
like a trained teacher (:func:`tiny_random_qwen3`) so that the guard's checks can tell it from a
dead one; the "student" is a noisy copy of it, as after SFT. They are here so that a snippet of
the docs runs as it is copied; put your own teacher, student and loader in their place.

- :func:`stand_ins`: the README loop's teacher (zeroed mid-run), student and loader in one call;
  :func:`save_tiny_models`: a teacher and a student on disk, with a tokenizer, for
  ``from_pretrained``;
- :func:`tiny_random_qwen3`, :func:`student_of`, :func:`zero_weights`;
- :class:`DyingTeacher` and :func:`kill_after`: a teacher whose weights are zeroed before a given
  batch, what a colocated wake without the weights' CPU backup leaves;
- :func:`token_rows`, :func:`token_batches`: random token ids, as rows and as a loader's batches;
- :func:`tiny_tokenizer`, :func:`chat_rows`, :func:`chat_prompts`: a chat tokenizer over the
  tiny vocabulary and conversations of random words for it.

``transformers`` (``pip install 'distill_guard[hf]'``) builds the models and the tokenizer;
:mod:`distill_guard.testing.lightning_standins` has a LightningModule over them.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any, NamedTuple

import torch

from distill_guard.extras import needed

VOCAB = 128
"""The stand-ins' vocabulary: ids ``[0, 128)``."""


def tiny_random_qwen3(seed: int = 0, vocab: int = VOCAB, embed_std: float = 0.3) -> torch.nn.Module:
    """A 2-layer Qwen3 with random weights, built from a config (no download), seeded, peaked like a
    trained teacher (:func:`distill_guard.testing.tiny.tiny_qwen3`); it knows nothing."""
    from distill_guard.testing.tiny import tiny_qwen3

    return tiny_qwen3(vocab_size=vocab, seed=seed, embed_std=embed_std, max_positions=128)


def student_of(teacher: torch.nn.Module, noise: float = 0.02, seed: int = 1) -> torch.nn.Module:
    """A student that starts near the teacher, as after SFT: a healthy JSD is far below ln 2."""
    student = copy.deepcopy(teacher)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in student.parameters():
            p.add_(torch.randn(p.shape, generator=g) * noise)
    return student.train()


def at_temperature(model: torch.nn.Module, temperature: float = 2.0) -> None:
    """A teacher whose distribution is at ``temperature``: its final norm's weight divided by it,
    so every logit is (the lm_head is linear in the norm's output; Qwen3's ``model.norm``)."""
    with torch.no_grad():
        model.model.norm.weight.div_(temperature)  # type: ignore[union-attr]


def become_student(model: torch.nn.Module) -> None:
    """A teacher that is a copy of the student: its weights replaced by :func:`student_of`'s
    (the student of the healthy teacher starts exactly there)."""
    student = student_of(model)
    with torch.no_grad():
        for p, q in zip(model.parameters(), student.parameters()):
            p.copy_(q)


def zero_weights(model: torch.nn.Module) -> None:
    """What a colocated wake without weights backup leaves: every weight zero, a uniform output."""
    with torch.no_grad():
        for p in model.parameters():
            p.zero_()


class _BatchCounter:
    """Counts the forwards of ``batch``-row batches and zeroes ``model`` before the
    ``healthy + 1``-th (a guard's one-row canary does not count)."""

    def __init__(self, model: torch.nn.Module, healthy: int, batch: int) -> None:
        self.model, self.healthy, self.batch, self.calls = model, healthy, batch, 0

    def see(self, input_ids: torch.Tensor | None) -> None:
        self.calls += input_ids is not None and input_ids.shape[0] == self.batch
        if self.calls == self.healthy + 1:
            zero_weights(self.model)


class DyingTeacher(torch.nn.Module):
    """A stand-in teacher: ``inner``, whose weights are zeroed before its ``healthy + 1``-th
    forward of a ``batch``-row batch (the guard's one-row canary does not count). Called with the
    model's keyword arguments; ``config`` is the inner model's."""

    def __init__(self, inner: torch.nn.Module, healthy: int = 3, batch: int = 4) -> None:
        super().__init__()
        self.inner = inner
        self.config = getattr(inner, "config", None)
        self._counter = _BatchCounter(inner, healthy, batch)

    @property
    def calls(self) -> int:
        """The ``batch``-row forwards so far."""
        return self._counter.calls

    def forward(self, **kw: Any) -> Any:
        self._counter.see(kw.get("input_ids"))
        return self.inner(**kw)


def kill_after(teacher: torch.nn.Module, healthy_steps: int, batch: int = 4) -> None:
    """Zero a Hugging Face causal LM (``teacher``) before its backbone's ``healthy_steps + 1``-th
    forward of a ``batch``-row batch. A hook on ``teacher.model``, because TRL's trainers run the
    backbone (GKD through the model, DistillationTrainer through its hidden states)."""
    counter = _BatchCounter(teacher, healthy_steps, batch)

    def pre(_mod: Any, args: Any, kwargs: dict[str, Any]) -> None:
        counter.see(kwargs.get("input_ids", args[0] if args else None))

    teacher.model.register_forward_pre_hook(pre, with_kwargs=True)


def token_rows(n: int = 64, length: int = 12, vocab: int = VOCAB, seed: int = 0) -> list[dict]:
    """``n`` rows of ``length`` random token ids, unpadded (``input_ids``, ``attention_mask``)."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, vocab, (n, length), generator=g)
    return [{"input_ids": r.tolist(), "attention_mask": [1] * length} for r in ids]


def token_batches(steps: int, size: int = 4) -> list[dict[str, torch.Tensor]]:
    """``steps`` batches of ``size`` :func:`token_rows`, as a loader yields them."""
    rows = token_rows(size * steps)
    return [
        {k: torch.tensor([r[k] for r in rows[i : i + size]]) for k in rows[0]}
        for i in range(0, size * steps, size)
    ]


class StandIns(NamedTuple):
    teacher: torch.nn.Module
    student: torch.nn.Module
    loader: list[dict[str, torch.Tensor]]


def stand_ins(teacher_dies_after: int | None = 3, batches: int = 8, seed: int = 0) -> StandIns:
    """A loop's teacher, student and loader: :func:`tiny_random_qwen3` as the teacher (a
    :class:`DyingTeacher` zeroed before its batch ``teacher_dies_after``, counting from 0; never
    with None), :func:`student_of` it, and ``batches`` :func:`token_batches` of 4."""
    teacher = tiny_random_qwen3(seed=seed)
    student = student_of(teacher)
    if teacher_dies_after is not None:
        teacher = DyingTeacher(teacher, healthy=teacher_dies_after)
    return StandIns(teacher, student, token_batches(batches))


CHAT_SPECIALS = ("<pad>", "<|im_start|>", "<|im_end|>", "user", "assistant")
"""The tiny chat tokenizer's first ids; every other id is a word ``w<i>``."""


def tiny_tokenizer(vocab: int = VOCAB):
    """A word-level fast tokenizer over exactly ``vocab`` ids with a ChatML-like template, built
    offline (no download): ``<pad>`` pads, ``<|im_end|>`` ends a turn and is the EOS, as in Qwen."""
    with needed("tiny_tokenizer", "hf"):
        from tokenizers import Tokenizer, models, pre_tokenizers
        from transformers import PreTrainedTokenizerFast

    words = [*CHAT_SPECIALS, *(f"w{i}" for i in range(vocab - len(CHAT_SPECIALS)))]
    backend = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<pad>"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok = PreTrainedTokenizerFast(
        tokenizer_object=backend, pad_token="<pad>", eos_token="<|im_end|>", model_max_length=128
    )
    tok.chat_template = (
        "{% for m in messages %}<|im_start|> {{ m['role'] }} {{ m['content'] }} <|im_end|> "
        "{% endfor %}{% if add_generation_prompt %}<|im_start|> assistant {% endif %}"
    )
    return tok


def chat_rows(
    n: int = 64, prompt_len: int = 6, completion_len: int = 6, vocab: int = VOCAB, seed: int = 0
) -> list[dict]:
    """Conversations of random words for the tiny tokenizer: a user turn, an assistant turn.

    The assistant turn is ``completion_len`` words and ``<|im_end|>``: ``completion_len + 1``
    completion tokens."""
    g = torch.Generator().manual_seed(seed)
    lo = len(CHAT_SPECIALS)
    ids = torch.randint(lo, vocab, (n, prompt_len + completion_len), generator=g)

    def text(row: torch.Tensor) -> str:
        return " ".join(f"w{int(i) - lo}" for i in row)

    return [
        {
            "messages": [
                {"role": "user", "content": text(r[:prompt_len])},
                {"role": "assistant", "content": text(r[prompt_len:])},
            ]
        }
        for r in ids
    ]


def chat_prompts(n: int = 64, **kw: Any) -> list[dict]:
    """The user turns of :func:`chat_rows`, as a prompt-only dataset's rows (``{"prompt": [...]}``:
    TRL's conversational prompts)."""
    return [{"prompt": r["messages"][:1]} for r in chat_rows(n, **kw)]


def save_tiny_models(teacher_dir: str | Path, student_dir: str | Path, seed: int = 0) -> None:
    """:func:`tiny_random_qwen3` to ``teacher_dir`` and :func:`student_of` it to ``student_dir``,
    each with :func:`tiny_tokenizer` (``from_pretrained`` loads them; TRL finds the tokenizer by
    the model's name). Same seed, same bytes."""
    teacher = tiny_random_qwen3(seed=seed)
    for model, out in ((teacher, teacher_dir), (student_of(teacher), student_dir)):
        model.save_pretrained(out)
        tiny_tokenizer().save_pretrained(out)
