"""A teacher that is an in-process ``sglang.Engine`` (sglang imported only when one is built here)."""

from __future__ import annotations

from typing import Any

from distill_guard.extras import needed
from distill_guard.teachers._sglang_wire import (
    SGLangScoring,
    sampling_params,
)
from distill_guard.teachers.base import (
    TeacherError,
    read_vocab_size,
)
from distill_guard.teachers.capabilities import Capabilities, capabilities_for


def _check_result(result: Any, what: str) -> None:
    """Engine methods answer ``None``, ``(success, message[, ...])``, a dict or an object with
    ``success``; turn every "failed" form into a :class:`TeacherError`."""
    if result is None:
        return
    if isinstance(result, tuple) and result and isinstance(result[0], bool):
        if not result[0]:
            msg = result[1] if len(result) > 1 else ""
            raise TeacherError(f"{what} failed: {msg}")
        return
    if isinstance(result, dict) and result.get("success") is False:
        raise TeacherError(f"{what} failed: {result.get('message', '')}")
    if getattr(result, "success", True) is False:
        raise TeacherError(f"{what} failed: {getattr(result, 'message', '')}")


class SGLangEngineTeacher(SGLangScoring):
    """Wraps an ``sglang.Engine`` (or anything with its method signatures and return shapes).

    Same semantics as :class:`~distill_guard.teachers.SGLangHTTPTeacher`: prefill-only scoring
    with ``max_new_tokens=0``, tagged release and resume tracked by the guard, in-place reload with
    ``update_weights_from_disk``. Exceptions raised by the engine become :class:`TeacherError`.

    In process a call that kills the scheduler kills the trainer, so nothing is sent that could:
    no scoring, reload or flush while the tracked state is asleep or unknown, no resume of a tag
    not known released. The Engine has no pause (``docs/sglang-contract.md`` §7.2): the guard's
    own release is made where the trainer calls ``sleep``, which must be when none of its
    ``generate`` calls is in flight.
    """

    def __init__(
        self, engine: Any, *, vocab_size: int | None = None, traffic_token_ids: bool = False
    ) -> None:
        """``traffic_token_ids``: the engine's other ``generate`` calls pass
        ``token_ids_logprob`` (see :attr:`SGLangScoring.traffic_token_ids`)."""
        super().__init__()
        self.engine = engine
        self.traffic_token_ids = traffic_token_ids
        self._vocab_size = vocab_size
        self._info: dict[str, Any] | None = None
        self._caps: Capabilities | None = None

    @classmethod
    def launch(cls, **server_args: Any) -> SGLangEngineTeacher:
        """Start an ``sglang.Engine(**server_args)`` in this process and wrap it."""
        with needed("SGLangEngineTeacher.launch", "sglang"):
            import sglang
        return cls(sglang.Engine(**server_args))

    def _call(self, what: str, fn: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except TeacherError:
            raise
        except Exception as e:  # the engine's own errors: KeyError on resume, asserts, ...
            raise TeacherError(f"sglang.Engine.{what} raised {type(e).__name__}: {e}") from e

    def _prefill(
        self,
        sequences: list[list[int]],
        top_k: int,
        logprob_start_len: int,
        temperature: float | None,
        token_ids: list[list[int]] | None,
    ) -> Any:
        """One prefill-only ``Engine.generate``, as the HTTP client posts it."""
        return self._call(
            "generate",
            self.engine.generate,
            input_ids=sequences,
            sampling_params=sampling_params(temperature),
            return_logprob=True,
            logprob_start_len=logprob_start_len,
            top_logprobs_num=top_k if top_k > 0 else None,
            token_ids_logprob=token_ids,
        )

    @property
    def capabilities(self) -> Capabilities:
        """What the engine's SGLang version can do (its server info's ``version``, read once)."""
        self._learn_tags()
        assert self._caps is not None
        return self._caps

    def _learn_tags(self) -> None:
        if self._caps is None:
            info = self._info if self._info is not None else self.server_info()
            self._caps = capabilities_for(info.get("version"))
            self.sleep_state.tags_supported = self._caps.tags

    def _release(self, tags: tuple[str, ...]) -> None:
        _check_result(
            self._call(
                "release_memory_occupation", self.engine.release_memory_occupation, tags=list(tags)
            ),
            "release_memory_occupation",
        )

    def _resume(self, tags: tuple[str, ...]) -> None:
        _check_result(
            self._call(
                "resume_memory_occupation", self.engine.resume_memory_occupation, tags=list(tags)
            ),
            "resume_memory_occupation",
        )

    def reload_weights(self, model_path: str | None = None) -> None:
        """``Engine.update_weights_from_disk`` in place, from ``model_path`` or the engine's own;
        only while awake (loading into released memory kills the scheduler, and with it this
        process)."""
        self.sleep_state.check_awake("reload the weights")
        path = model_path or self.server_info().get("model_path")
        if not path:
            raise TeacherError("reload_weights: the engine reports no model_path; pass one")
        _check_result(
            self._call("update_weights_from_disk", self.engine.update_weights_from_disk, path),
            "update_weights_from_disk",
        )

    def flush_cache(self) -> None:
        self.sleep_state.check_awake("flush the cache")
        _check_result(self._call("flush_cache", self.engine.flush_cache), "flush_cache")

    def server_info(self) -> dict[str, Any]:
        info = self._call("get_server_info", self.engine.get_server_info)
        if not isinstance(info, dict):
            raise TeacherError(f"get_server_info returned {type(info).__name__}, not a dict")
        self._info = info
        return info

    @property
    def vocab_size(self) -> int | None:
        if self._vocab_size is None:
            info = self._info if self._info is not None else self.server_info()
            self._vocab_size = read_vocab_size(info.get("model_path"))
        return self._vocab_size

    def shutdown(self) -> None:
        """Shut the engine down (``Engine.shutdown``) if it has that method."""
        if hasattr(self.engine, "shutdown"):
            self.engine.shutdown()
