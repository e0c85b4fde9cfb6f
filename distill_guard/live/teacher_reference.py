"""The teacher's reference from outside the run: the canary as the teacher's checkpoint scores it.

The seed failure starts at the first wake, so a fingerprint of the live teacher is the failure's
as soon as the teacher woke wrong (garbage, another checkpoint, another temperature, a copy of the
student). This reference is taken where no wake can reach: the checkpoint on disk, loaded in a
process that never slept (the guard's own, or the launcher's, which ships it as a JSON file:
``distill-guard reference``), scored at the run's declared teacher temperature. The canary holds
every wake, every in-process step and every repair against it (``docs/invariants.md`` §3.1).

Where it comes from (``GuardConfig.teacher_reference``):

- a ``.json`` file made by ``distill-guard reference`` (for teachers too large to load twice);
- a checkpoint directory (``config.json`` and weights), loaded here with ``transformers``;
- ``auto``: the teacher's own checkpoint, the server's ``model_path`` or a module's
  ``name_or_path``.
"""

from __future__ import annotations

import json
import logging
import math
import os
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from distill_guard.checks.canary import CanaryCheck, CanaryMeasurement
from distill_guard.errors import GuardValueError
from distill_guard.extras import needed
from distill_guard.findings import Code, Finding, Severity
from distill_guard.teachers.base import Teacher, TeacherError

log = logging.getLogger("distill_guard")

REFERENCE_FORMAT = 1
"""Version of the JSON file's layout."""
AUTO = "auto"
"""``teacher_reference: auto``: the teacher's own checkpoint (``model_path``, ``name_or_path``)."""
TOLERANCE_BY_DTYPE: dict[str, tuple[float, float]] = {
    "float32": (0.02, 0.1),
    "float16": (0.1, 0.5),
    "bfloat16": (0.5, 3.0),
}
"""(mean, max) |Δ logprob| in nats between a healthy serving forward in that dtype and the fp32
reference forward, about 5× what was measured (``benchmarks/RESULTS.md``, teacher reference:
bf16 0.09 / 0.39, fp16 0.013 / 0.063, fp32 0.0000 / 0.0001 on a 4.4 B Qwen3 on an H200) and far
below a wrong teacher (garbage, temperature 2, another checkpoint, a student: 2.9 nats mean or
more). An unknown dtype (SGLang's ``auto``) gets the widest."""
WIDEST = "bfloat16"


def tolerance_for(dtype: str | None) -> tuple[float, float]:
    """The (mean, max) kernel tolerance of a teacher serving in ``dtype`` (``torch.bfloat16``,
    ``bfloat16``, ``bf16``, ``auto``, None ...)."""
    name = str(dtype or "").removeprefix("torch.").lower()
    name = {"bf16": "bfloat16", "fp16": "float16", "half": "float16", "fp32": "float32"}.get(
        name, name
    )
    name = {"float": "float32"}.get(name, name)
    return TOLERANCE_BY_DTYPE.get(name, TOLERANCE_BY_DTYPE[WIDEST])


class TeacherReferenceError(GuardValueError):
    """A teacher reference that cannot be made or used; the message names the source and why."""


@dataclass
class TeacherReference:
    """The canary's expected logprobs, from the teacher's checkpoint, at the run's temperature."""

    tokens: list[int]
    """The canary sequence (the canary adopts it)."""
    token_logprobs: list[float]
    """``len(tokens) - 1`` logprobs of ``tokens[1:]``."""
    temperature: float
    """The temperature the logprobs are at (the run's ``teacher_temperature``)."""
    source: str
    """Where it was taken: ``checkpoint <path>`` or ``file <path> (checkpoint <path>)``."""
    topk_logprobs: list[list[float]] | None = None
    topk_ids: list[list[int]] | None = None
    vocab_size: int | None = None
    dtype: str = "float32"
    """The dtype of the reference forward."""
    tolerance_mean: float | None = None
    """Largest mean |Δ logprob| (nats) against it that is still kernel noise; None: by the
    serving dtype (:data:`TOLERANCE_BY_DTYPE`)."""
    tolerance_max: float | None = None
    """Largest single |Δ logprob| (nats) that is still kernel noise; None: by the dtype."""
    seconds: float = 0.0
    """Wall time of making it (the load and the forward)."""
    extra: dict[str, Any] = field(default_factory=dict)

    def tolerance(self, serving_dtype: str | None) -> tuple[float, float]:
        """(mean, max) for a teacher serving in ``serving_dtype``; the file's own if it set them."""
        mean, most = tolerance_for(serving_dtype)
        return (
            self.tolerance_mean if self.tolerance_mean is not None else mean,
            self.tolerance_max if self.tolerance_max is not None else most,
        )

    def measurement(self) -> CanaryMeasurement:
        """The reference as a canary measurement (what :class:`CanaryCheck` compares)."""
        return CanaryMeasurement(
            list(self.tokens),
            list(self.token_logprobs),
            self.topk_logprobs,
            self.topk_ids,
            step=None,
        )

    def to_dict(self) -> dict[str, Any]:
        return {"format": REFERENCE_FORMAT, **asdict(self)}

    @classmethod
    def from_dict(
        cls, data: dict[str, Any], *, where: str = "teacher reference"
    ) -> TeacherReference:
        """Validate and build; a :class:`TeacherReferenceError` names what is wrong and where."""
        if not isinstance(data, dict):
            raise TeacherReferenceError(
                f"{where}: expected a JSON object, got {type(data).__name__}"
            )
        fmt = data.get("format", REFERENCE_FORMAT)
        if fmt != REFERENCE_FORMAT:
            raise TeacherReferenceError(
                f"{where}: format {fmt!r}, this distill_guard reads format {REFERENCE_FORMAT}; "
                "remake it with distill-guard reference"
            )
        missing = [
            k for k in ("tokens", "token_logprobs", "temperature", "source") if k not in data
        ]
        if missing:
            raise TeacherReferenceError(f"{where}: missing {', '.join(missing)}")
        known = {k: v for k, v in data.items() if k in cls.__dataclass_fields__}
        ref = cls(**known)
        if len(ref.tokens) < 2 or len(ref.token_logprobs) != len(ref.tokens) - 1:
            raise TeacherReferenceError(
                f"{where}: {len(ref.tokens)} tokens need {max(len(ref.tokens) - 1, 0)} "
                f"token logprobs, it has {len(ref.token_logprobs)}"
            )
        if not all(math.isfinite(x) for x in ref.token_logprobs):
            raise TeacherReferenceError(f"{where}: its token logprobs are not all finite")
        if not (math.isfinite(ref.temperature) and ref.temperature > 0):
            raise TeacherReferenceError(
                f"{where}: temperature must be > 0, got {ref.temperature!r}"
            )
        return ref

    def save(self, path: str | os.PathLike[str]) -> Path:
        p = Path(path)
        p.write_text(json.dumps(self.to_dict()) + "\n", encoding="utf-8")
        return p

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> TeacherReference:
        p = Path(path)
        try:
            data = json.loads(p.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise TeacherReferenceError(f"teacher reference {p}: file not found") from None
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise TeacherReferenceError(
                f"teacher reference {p}: not a reference file ({exc})"
            ) from None
        ref = cls.from_dict(data, where=f"teacher reference {p}")
        if not ref.source.startswith("file "):
            ref.source = f"file {p} ({ref.source})"
        return ref


def score_canary(
    module: torch.nn.Module, tokens: list[int], top_k: int, *, temperature: float = 1.0
) -> CanaryMeasurement:
    """The canary scored by a module's own forward at ``temperature`` (gradients off, eval mode
    for the call, the module's mode restored): :meth:`Canary.measure` on a
    :class:`~distill_guard.live.module_canary.ModuleScorer`."""
    from distill_guard.live.canary import Canary
    from distill_guard.live.module_canary import ModuleScorer

    canary = Canary(CanaryCheck(tokens=list(tokens), top_k=top_k))
    return canary.measure(ModuleScorer(module, temperature=temperature))  # type: ignore[arg-type]


def reference_from_module(
    module: torch.nn.Module,
    canary: CanaryCheck,
    *,
    temperature: float = 1.0,
    source: str,
    vocab_size: int | None = None,
) -> TeacherReference:
    """The reference of a module loaded from the checkpoint (never woken, never trained)."""
    config = getattr(module, "config", None)
    v = vocab_size or canary.vocab_size or getattr(config, "vocab_size", None)
    tokens = canary.draw_tokens(int(v) if v else None)
    first = next(iter(module.parameters()), None)
    m = score_canary(module, tokens, canary.top_k, temperature=temperature)
    return TeacherReference(
        tokens=m.tokens,
        token_logprobs=m.token_logprobs,
        topk_logprobs=m.topk_logprobs,
        topk_ids=m.topk_ids,
        temperature=float(temperature),
        source=source,
        vocab_size=int(v) if v else None,
        dtype=str(first.dtype).removeprefix("torch.") if first is not None else "float32",
        seconds=m.seconds,
    )


def reference_from_checkpoint(
    model_path: str | os.PathLike[str],
    canary: CanaryCheck,
    *,
    temperature: float = 1.0,
    dtype: torch.dtype = torch.float32,
    device: str = "cpu",
) -> TeacherReference:
    """Load the checkpoint at ``model_path`` (``transformers``), score the canary once, free it.

    The load is a second copy of the teacher: in fp32 on CPU by default (the most exact
    forward there is). For a teacher too large for that, the launcher runs
    ``distill-guard reference`` where it fits and ships the file."""
    p = Path(model_path)
    if not (p / "config.json").is_file():
        raise TeacherReferenceError(
            f"teacher reference from checkpoint {p}: no config.json there (give the directory "
            "the teacher was launched from, or a reference file from distill-guard reference)"
        )
    with needed("a teacher reference from its checkpoint", "hf"):
        from transformers import AutoModelForCausalLM
    t0 = time.perf_counter()
    try:
        model = AutoModelForCausalLM.from_pretrained(str(p), dtype=dtype).to(device)
    except (OSError, ValueError, RuntimeError) as exc:
        raise TeacherReferenceError(
            f"teacher reference from checkpoint {p}: the load failed: {exc}"
        ) from exc
    try:
        ref = reference_from_module(
            model, canary, temperature=temperature, source=f"checkpoint {p}"
        )
    finally:
        del model
    ref.seconds = time.perf_counter() - t0
    return ref


def resolve_reference(
    spec: str | os.PathLike[str],
    canary: CanaryCheck,
    *,
    temperature: float = 1.0,
    own_checkpoint: str | None = None,
) -> TeacherReference:
    """The reference ``spec`` names: a reference file, a checkpoint directory, or ``auto`` (the
    teacher's ``own_checkpoint``). Raises :class:`TeacherReferenceError` saying why it cannot be had."""
    text = str(spec)
    if text == AUTO:
        if not own_checkpoint:
            raise TeacherReferenceError(
                "teacher_reference=auto: the teacher does not say where its checkpoint is (no "
                "model_path in its server info, no name_or_path on the module); give the "
                "checkpoint directory or a reference file"
            )
        path = Path(own_checkpoint)
        if not path.is_dir():
            raise TeacherReferenceError(
                f"teacher_reference=auto: the teacher's checkpoint {own_checkpoint!r} is not a "
                "directory here (a hub name, or a path on another machine); make a reference "
                "file with distill-guard reference where it is, and give that"
            )
        return reference_from_checkpoint(path, canary, temperature=temperature)
    path = Path(text)
    if path.is_dir():
        return reference_from_checkpoint(path, canary, temperature=temperature)
    ref = TeacherReference.load(path)
    if not math.isclose(ref.temperature, temperature, rel_tol=1e-6):
        raise TeacherReferenceError(
            f"teacher reference {path} was taken at temperature {ref.temperature:g}, the run "
            f"declares teacher_temperature={temperature:g}; remake it at {temperature:g}"
        )
    return ref


def make_reference(
    spec: str | os.PathLike[str],
    canary: CanaryCheck,
    *,
    temperature: float,
    own_checkpoint: Callable[[], str | None],
) -> tuple[TeacherReference | None, Finding | None]:
    """(the reference, None), or (None, ``teacher.reference_unavailable``) saying why it could
    not be had: never an exception (the guard must not crash a run through its own fault)."""
    try:
        ref = resolve_reference(
            spec,
            canary,
            temperature=temperature,
            own_checkpoint=own_checkpoint() if str(spec) == AUTO else None,
        )
    except TeacherReferenceError as exc:
        return None, reference_unavailable(spec, str(exc))
    except Exception as exc:  # noqa: BLE001 - fail safe: a finding, not a crash
        log.exception("distill_guard: making the teacher reference raised")
        return None, reference_unavailable(spec, f"{type(exc).__name__}: {exc}")
    log.info(
        "distill_guard: teacher reference from %s (temperature %g, %.2f s)",
        ref.source,
        ref.temperature,
        ref.seconds,
    )
    return ref, None


def reference_unavailable(spec: Any, why: str) -> Finding:
    """``teacher.reference_unavailable``: asked for, not had; the canary goes on without it."""
    return Finding(
        Code.TEACHER_REFERENCE_UNAVAILABLE,
        Severity.WARN,
        f"The teacher's reference from outside the run (teacher_reference={spec}) could not be "
        f"had: {why}. Without it the canary trusts the teacher's first fingerprint, so a teacher "
        "wrong from its first wake (garbage, another checkpoint or temperature) is not caught. "
        "Fix the path, or make a reference file with distill-guard reference and give that.",
        None,
        {"teacher_reference": str(spec), "error": why},
    )


def server_checkpoint(teacher: Teacher) -> str | None:
    """The checkpoint a server says it loaded (``/server_info`` ``model_path``)."""
    try:
        path = teacher.server_info().get("model_path")
    except TeacherError:
        return None
    return str(path) if path else None


def module_checkpoint(module: torch.nn.Module) -> str | None:
    """The checkpoint a ``transformers`` module was loaded from (``name_or_path``)."""
    path = getattr(module, "name_or_path", None) or getattr(
        getattr(module, "config", None), "_name_or_path", None
    )
    return str(path) if path else None
