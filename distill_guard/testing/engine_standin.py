"""A stand-in for an in-process ``sglang.Engine``, as harsh as SGLang: for tests and the docs.

Not SGLang. It has ``sglang.Engine``'s method signatures and return shapes over a
:class:`~distill_guard.teachers.TorchTeacher`, and where SGLang's scheduler dies in process (and
SIGQUITs its host, the trainer) it raises :class:`ProcessKilled`: a forward over released memory,
a second release, a resume of a tag that is not released (``docs/sglang-contract.md`` §7.1).
"""

from __future__ import annotations

from typing import Any

from distill_guard.errors import GuardValueError
from distill_guard.teachers._sglang_wire import build_score_item
from distill_guard.teachers.base import TeacherError, normalize_tags
from distill_guard.teachers.torch_teacher import TorchTeacher

__all__ = ["EngineRefused", "EngineStandIn", "ProcessKilled"]


class ProcessKilled(BaseException):
    """What a dying in-process scheduler does to its host: SIGQUIT, then the process tree is
    killed. A BaseException, so no ``except Exception`` in the adapter can turn it into an error."""


class EngineRefused(GuardValueError):
    """The ``ValueError`` SGLang's tokenizer manager raises for a request it refuses, as the
    stand-in raises it (the adapter wraps it into a ``TeacherError``, as it wraps SGLang's)."""


class EngineStandIn:
    """sglang.Engine's surface over a TorchTeacher, as harsh as SGLang: a resume of a tag that
    is not released, or a second release, kills the calling process (``docs/sglang-contract.md``
    §7.1)."""

    def __init__(self, teacher: TorchTeacher) -> None:
        self.t = teacher
        self.calls: list[tuple[str, Any]] = []
        self.offload_tags: set[str] = set()

    def generate(self, prompt=None, sampling_params=None, input_ids=None, image_data=None,
                 return_logprob=False, logprob_start_len=None, top_logprobs_num=None,
                 token_ids_logprob=None, lora_path=None, custom_logit_processor=None,
                 return_hidden_states=False, stream=False, rid=None):  # fmt: skip
        self.calls.append(("generate", sampling_params))
        if self.offload_tags:
            raise ProcessKilled(f"a forward over released memory ({sorted(self.offload_tags)})")
        assert sampling_params["max_new_tokens"] == 0 and return_logprob
        k = top_logprobs_num or 0
        res = self.t.score(input_ids, top_k=k, logprob_start_len=logprob_start_len)
        asked = self._token_ids(token_ids_logprob, len(input_ids))
        by_ids = (
            self.t.score_token_ids(input_ids, asked, logprob_start_len=logprob_start_len)
            if asked is not None
            else None
        )
        return [
            build_score_item(
                ids,
                res.token_logprobs[i],
                res.topk_logprobs[i] if k else None,
                res.topk_ids[i] if k else None,
                logprob_start_len,
                token_ids=asked[i] if asked else None,
                token_ids_logprobs=by_ids.token_ids_logprobs[i] if by_ids else None,
            )  # fmt: skip
            for i, ids in enumerate(input_ids)
        ]

    def _token_ids(self, given: Any, n: int) -> list[list[int]] | None:
        """``token_ids_logprob`` per input, checked as 0.5.14+ checks it (the newest row of
        ``fatal_token_id_past_vocab``: a ``ValueError`` unless ids in ``[0, V)``)."""
        if not given:
            return None
        lists = given if isinstance(given[0], list) else [list(given)] * n
        v = self.t.vocab_size
        for ids in lists:
            bad = [t for t in ids if t < 0 or (v is not None and t >= v)]
            if bad:
                raise EngineRefused(
                    f"token_ids_logprob must hold token ids in [0, {v}), got {bad[0]}"
                )
        return [list(ids) for ids in lists]

    def release_memory_occupation(self, tags=None):
        self.calls.append(("release", tags))
        tags = normalize_tags(tags)
        if set(tags) & self.offload_tags:
            raise ProcessKilled("second release: torch_memory_saver exit(1)")
        self.t.release(tags)
        self.offload_tags |= set(tags)

    def resume_memory_occupation(self, tags=None):
        self.calls.append(("resume", tags))
        for tag in normalize_tags(tags):
            if tag not in self.offload_tags:
                raise ProcessKilled(f"KeyError {tag!r} in the scheduler: SIGQUIT to the host")
            self.offload_tags.remove(tag)
        self.t.resume(normalize_tags(tags))

    def update_weights_from_disk(self, model_path, load_format=None):
        self.calls.append(("update_weights_from_disk", model_path))
        try:
            self.t.reload_weights(model_path)
        except TeacherError as e:
            return False, str(e), 0
        return True, "Succeeded to update model weights.", 0

    def flush_cache(self):
        self.calls.append(("flush_cache", None))

    def get_server_info(self):
        return {**self.t.server_info(), "version": "0.5.23"}
