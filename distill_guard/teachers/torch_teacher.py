"""An in-process Hugging Face causal LM as a teacher, with SGLang's sleep/wake memory semantics.

Release and resume behave as in SGLang with ``--enable-memory-saver``: the ``weights`` tag's
parameters and buffers live in one memory region; SGLang snapshots the named buffers before a
release and copies them back after the resume; parameters survive only with the weights CPU
backup. On CUDA with ``torch_memory_saver`` installed the region is a real one; elsewhere an
emulation with the same observable behaviour refills the region in place on resume (zeros by
default, or garbage), like fresh physical pages mapped at the same virtual address.
"""

from __future__ import annotations

import atexit
import functools
import logging
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Literal

import torch

from distill_guard._version import __version__
from distill_guard.errors import GuardValueError
from distill_guard.extras import needed
from distill_guard.teachers.base import ScoreResult, TeacherError, TeacherStateError, TrackedTeacher

log = logging.getLogger("distill_guard")

Fault = Literal["zeros", "garbage"]
WEIGHTS = "weights"


class _EmulatedRegion:
    """CPU stand-in for a torch_memory_saver region: pause keeps nothing unless backed up."""

    def __init__(self, tensors: list[torch.Tensor], *, cpu_backup: bool, fault: Fault, seed: int):
        self._tensors = tensors
        self._cpu_backup = cpu_backup
        self._fault = fault
        self._gen = torch.Generator().manual_seed(seed)
        self._backup: list[torch.Tensor] | None = None

    def pause(self) -> None:
        if self._cpu_backup:
            self._backup = [t.detach().to("cpu", copy=True) for t in self._tensors]

    def resume(self) -> None:
        with torch.no_grad():
            for i, t in enumerate(self._tensors):
                if self._backup is not None:
                    t.copy_(self._backup[i])
                elif self._fault == "zeros" or not t.is_floating_point():
                    t.zero_()
                else:
                    noise = torch.randn(t.shape, generator=self._gen, dtype=torch.float32)
                    t.copy_(noise.to(t.dtype))
        self._backup = None


class _TMSRegion:
    """A real torch_memory_saver region (CUDA): allocations made in ``allocate()`` are paused by tag."""

    def __init__(self, tag: str, *, cpu_backup: bool, hook_mode: str | None):
        with needed("a real torch_memory_saver region", "gpu"):
            from torch_memory_saver import torch_memory_saver as tms

        if hook_mode is not None and getattr(tms, "_impl", None) is None:
            tms.hook_mode = hook_mode  # only settable before the first region
        self._tms = tms
        _free_outside_regions_at_exit(tms)
        self._tag = tag
        self._cpu_backup = cpu_backup

    @contextmanager
    def allocate(self) -> Iterator[None]:
        with self._tms.region(tag=self._tag, enable_cpu_backup=self._cpu_backup):
            yield

    def pause(self) -> None:
        self._tms.pause(self._tag)

    def resume(self) -> None:
        self._tms.resume(self._tag)


@functools.cache
def _free_outside_regions_at_exit(tms) -> None:
    """Let the interpreter's teardown free region memory without killing the process.

    torch_memory_saver 0.0.10 ``exit(1)``s when its free hook runs outside a region ("only
    support interesting region", ``csrc/entrypoint.cpp``), and at shutdown torch frees the
    region's blocks outside any region: a run whose every step passed exits 1 (docs/teachers.md,
    "Exiting after torch_memory_saver"). At exit, once no more work can run, the flag the hook
    checks is set for the rest of the process; installed once (cached), at the first region."""

    def set_flag() -> None:
        impl = getattr(tms, "_impl", None)
        setter = getattr(getattr(getattr(impl, "_binary_wrapper", None), "cdll", None),
                         "tms_set_interesting_region", None)  # fmt: skip
        if setter is None:
            log.warning(
                "distill_guard: this torch_memory_saver has no tms_set_interesting_region; the "
                "process may exit 1 at shutdown after a region was used"
            )
            return
        setter(True)

    atexit.register(set_flag)


@functools.cache
def _takes_logits_to_keep(model_type: type) -> bool:
    import inspect

    try:
        return "logits_to_keep" in inspect.signature(model_type.forward).parameters
    except (TypeError, ValueError):
        return False


def _use_tms(device: torch.device, enable_memory_saver: bool) -> bool:
    if not enable_memory_saver or device.type != "cuda":
        return False
    try:
        import torch_memory_saver  # noqa: F401
    except ImportError:
        return False
    return True


class TorchTeacher(TrackedTeacher):
    """A Hugging Face causal LM scored in-process; sleeps and wakes like an SGLang teacher.

    Use it for offline runs, tests, and behind the reference server. ``score`` returns the same
    :class:`ScoreResult` as the SGLang teachers. Thread-safe: one lock serializes every call.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        *,
        model_path: str | Path | None = None,
        device: str | torch.device | None = None,
        enable_memory_saver: bool = True,
        enable_cpu_backup: bool = False,
        fault: Fault = "zeros",
        fault_seed: int = 0,
        snapshot_buffers: bool = True,
        enable_deterministic_inference: bool = False,
        weight_cache_mode: str = "off",
        tms_hook_mode: str | None = "torch",
    ) -> None:
        """
        Args:
            model: a causal LM whose forward returns ``.logits`` (e.g. ``Qwen3ForCausalLM``).
            model_path: checkpoint directory, the default source of ``reload_weights``.
            device: where to run (default: the model's device).
            enable_memory_saver: release drops the weights (SGLang ``--enable-memory-saver``).
            enable_cpu_backup: weights survive release (``--enable-weights-cpu-backup``).
            fault: what a no-backup resume leaves in the parameters on the CPU emulation:
                ``"zeros"`` (what colocated teachers saw) or ``"garbage"`` (seeded noise).
            fault_seed: seed of the garbage.
            snapshot_buffers: restore buffers (RoPE ``inv_freq``) after resume, as SGLang does;
                False gives raw torch_memory_saver behaviour (buffers lost too).
            enable_deterministic_inference: reported in ``server_info`` (canary tolerance).
            weight_cache_mode: reported; anything but ``"off"`` forces the backup off, as in SGLang.
            tms_hook_mode: torch_memory_saver hook mode on CUDA (``"torch"`` needs no LD_PRELOAD).
        """
        super().__init__()
        if fault not in ("zeros", "garbage"):
            raise GuardValueError(f"fault must be 'zeros' or 'garbage', got {fault!r}")
        self.model = model.eval().requires_grad_(False)
        self.model_path = str(model_path) if model_path is not None else None
        self.enable_memory_saver = enable_memory_saver
        self.enable_cpu_backup = enable_cpu_backup
        self.weight_cache_mode = weight_cache_mode
        self.enable_deterministic_inference = enable_deterministic_inference
        self.snapshot_buffers = snapshot_buffers
        self.fault = fault
        self._lock = threading.RLock()
        self._buffer_snapshot: dict[str, torch.Tensor] | None = None
        first = next(iter(model.parameters()))
        self.device = torch.device(device) if device is not None else first.device
        backup = enable_cpu_backup and weight_cache_mode == "off"
        self._region: _EmulatedRegion | _TMSRegion | None = None
        if _use_tms(self.device, enable_memory_saver):
            region = _TMSRegion(WEIGHTS, cpu_backup=backup, hook_mode=tms_hook_mode)
            with region.allocate():
                self.model.to(self.device)
            self._region = region
        else:
            self.model.to(self.device)
            if enable_memory_saver:
                tensors = [p.data for p in self.model.parameters()]
                tensors += [b for _, b in self.model.named_buffers()]
                self._region = _EmulatedRegion(
                    tensors, cpu_backup=backup, fault=fault, seed=fault_seed
                )

    @classmethod
    def from_pretrained(
        cls, model_dir: str | Path, *, dtype: torch.dtype | None = None, **kwargs: Any
    ) -> TorchTeacher:
        """Load a checkpoint directory with ``AutoModelForCausalLM`` (on CPU, then moved)."""
        with needed("TorchTeacher.from_pretrained", "hf"):
            from transformers import AutoModelForCausalLM

        model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=dtype or "auto")
        return cls(model, model_path=model_dir, **kwargs)

    @property
    def vocab_size(self) -> int | None:
        config = getattr(self.model, "config", None)
        v = getattr(config, "vocab_size", None)
        if v is None and config is not None and hasattr(config, "get_text_config"):
            v = getattr(config.get_text_config(), "vocab_size", None)
        return int(v) if v is not None else None

    @property
    def uses_torch_memory_saver(self) -> bool:
        return isinstance(self._region, _TMSRegion)

    # -- scoring ---------------------------------------------------------------------------

    def _score(self, sequences: list[list[int]], top_k: int, logprob_start_len: int) -> ScoreResult:
        with self._lock, torch.inference_mode():
            v = self.vocab_size
            by_len: dict[int, list[int]] = {}
            for i, s in enumerate(sequences):
                by_len.setdefault(len(s), []).append(i)
            tok: list[torch.Tensor | None] = [None] * len(sequences)
            tvals: list[torch.Tensor | None] = [None] * len(sequences)
            tids: list[torch.Tensor | None] = [None] * len(sequences)
            for idx in by_len.values():
                ids = torch.tensor([sequences[i] for i in idx], device=self.device)
                if v is not None and int(ids.max()) >= v:
                    raise TeacherError(
                        f"token id {int(ids.max())} is outside the vocabulary (V={v})"
                    )
                logits = self._logits_from(ids, logprob_start_len)
                logits = logits[:, :-1, : v or logits.shape[-1]].float()
                logp = torch.log_softmax(logits, dim=-1)
                targets = ids[:, logprob_start_len + 1 :]
                token = logp.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
                if top_k > 0:
                    vals, ids_k = logp.topk(min(top_k, logp.shape[-1]), dim=-1)
                for row, i in enumerate(idx):
                    tok[i] = token[row].cpu()
                    if top_k > 0:
                        tvals[i] = vals[row].cpu()
                        tids[i] = ids_k[row].cpu()
            return ScoreResult(
                [t for t in tok if t is not None],
                [t for t in tvals if t is not None] if top_k > 0 else None,
                [t for t in tids if t is not None] if top_k > 0 else None,
            )

    def _logits_from(self, ids: torch.Tensor, start: int) -> torch.Tensor:
        """The logits at positions ``start ..`` of ``ids`` ``[B, L]``, the same logits either
        way. A model that takes ``logits_to_keep`` (transformers' causal LMs) runs its output
        layer on those positions only, not on the whole prompt before them."""
        if start > 0 and _takes_logits_to_keep(type(self.model)):
            kept = self.model(input_ids=ids, use_cache=False, logits_to_keep=ids.shape[1] - start)
            return kept.logits
        return self.model(input_ids=ids, use_cache=False).logits[:, start:]

    def _score_token_ids(
        self, sequences: list[list[int]], token_ids: list[list[int]], logprob_start_len: int
    ) -> ScoreResult:
        with self._lock, torch.inference_mode():
            v = self.vocab_size
            token, asked = [], []
            for seq, want in zip(sequences, token_ids):
                ids = torch.tensor([seq], device=self.device)
                if v is not None and int(ids.max()) >= v:
                    raise TeacherError(
                        f"token id {int(ids.max())} is outside the vocabulary (V={v})"
                    )
                logits = self.model(input_ids=ids, use_cache=False).logits
                logp = torch.log_softmax(
                    logits[0, logprob_start_len:-1, : v or logits.shape[-1]].float(), dim=-1
                )
                targets = ids[0, logprob_start_len + 1 :]
                token.append(logp.gather(-1, targets.unsqueeze(-1)).squeeze(-1).cpu())
                asked.append(logp[:, torch.tensor(want, device=logp.device)].cpu())
            return ScoreResult(token, token_ids_logprobs=asked)

    # -- sleep and wake --------------------------------------------------------------------

    def _release(self, tags: tuple[str, ...]) -> None:
        with self._lock:
            if WEIGHTS not in tags or self._region is None:
                return  # kv_cache / cuda_graph: an HF forward without cache holds none
            if self.snapshot_buffers:
                self._buffer_snapshot = {
                    n: b.detach().clone() for n, b in self.model.named_buffers()
                }
            self._sync()
            self._region.pause()

    def _resume(self, tags: tuple[str, ...]) -> None:
        with self._lock:
            if WEIGHTS not in tags or self._region is None:
                return
            self._region.resume()
            if self._buffer_snapshot is not None:
                with torch.no_grad():
                    buffers = dict(self.model.named_buffers())
                    for n, saved in self._buffer_snapshot.items():
                        buffers[n].copy_(saved)
                self._buffer_snapshot = None
            self._sync()

    def _sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    # -- weights ---------------------------------------------------------------------------

    def reload_weights(self, model_path: str | None = None) -> None:
        """Copy a safetensors checkpoint into the existing parameters, in place (like SGLang).

        Every tensor is checked (names, shapes) before the first copy, so a bad checkpoint leaves
        the weights as they were. Buffers are not in checkpoints and are left alone.
        """
        path = model_path or self.model_path
        if path is None:
            raise TeacherError("reload_weights: no model_path given and the teacher has none")
        if WEIGHTS in self.sleep_state.released:
            raise TeacherStateError(
                "refusing to reload weights while they are released: resume the teacher first"
            )
        with self._lock:
            state = _load_safetensors_dir(Path(path))
            params = dict(self.model.named_parameters(remove_duplicate=False))
            covered = {id(params[n]) for n in state if n in params}
            # a tied alias (lm_head.weight = embed_tokens.weight) is covered by either name
            missing = sorted(n for n, p in self.model.named_parameters() if id(p) not in covered)
            unknown = sorted(set(state) - set(params))
            bad = [
                f"{n}: {tuple(state[n].shape)} vs {tuple(params[n].shape)}"
                for n in state
                if n in params and state[n].shape != params[n].shape
            ]
            if missing or unknown or bad:
                raise TeacherError(
                    f"checkpoint {path} does not fit the model: missing {missing[:5]}, "
                    f"unexpected {unknown[:5]}, shape mismatches {bad[:5]}"
                )
            with torch.no_grad():
                for n, t in state.items():
                    params[n].copy_(t)
            self._sync()

    def flush_cache(self) -> None:
        """Nothing to flush: the forward runs without a KV cache."""

    def server_info(self) -> dict[str, Any]:
        """This teacher's settings under SGLang's server-argument names (flat, as ``/server_info``)."""
        dtype = next(iter(self.model.parameters())).dtype
        return {
            "model_path": self.model_path,
            "enable_memory_saver": self.enable_memory_saver,
            "enable_weights_cpu_backup": self.enable_cpu_backup,
            "enable_draft_weights_cpu_backup": False,
            "enable_deterministic_inference": self.enable_deterministic_inference,
            "weight_cache_mode": self.weight_cache_mode,
            "dtype": str(dtype).removeprefix("torch."),
            "tp_size": 1,
            "device": str(self.device),
            "vocab_size": self.vocab_size,
            "torch_memory_saver": self.uses_torch_memory_saver,
            "version": f"distill_guard-torch-teacher {__version__} (not SGLang)",
        }


def _load_safetensors_dir(path: Path) -> dict[str, torch.Tensor]:
    """Every tensor of the checkpoint at ``path``. Read as bytes and parsed: ``load_file`` keeps
    about 0.7 KiB per call (safetensors 0.8.0), which a teacher repaired at every wake adds up."""
    with needed("loading a safetensors checkpoint into a TorchTeacher", "hf"):
        from safetensors.torch import load

    files = [path] if path.is_file() else sorted(path.glob("*.safetensors"))
    if not files:
        raise TeacherError(f"no *.safetensors checkpoint at {path}")
    state: dict[str, torch.Tensor] = {}
    for f in files:
        state.update(load(f.read_bytes()))
    return state
