"""The Teacher protocol, its result type, typed errors, and the sleep-state tracker every teacher uses."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import torch

from distill_guard.errors import GuardError, GuardTypeError, GuardValueError

ALL_TAGS: tuple[str, ...] = ("weights", "kv_cache", "cuda_graph")
"""SGLang's memory tags (``GPU_MEMORY_ALL_TYPES``); ``None`` or ``[]`` in a request means all."""


class TeacherError(GuardError, RuntimeError):
    """A teacher call failed. The guard turns these into findings; it never lets them crash a run."""


class TeacherUnreachable(TeacherError):
    """No answer: connection refused, DNS failure, or the call ran past its timeout."""

    def __init__(self, message: str, *, endpoint: str | None = None) -> None:
        super().__init__(message)
        self.endpoint = endpoint


class TeacherHTTPError(TeacherError):
    """The teacher answered with an error: HTTP status >= 400, or ``"success": false``.

    ``message`` is the server's own text, taken from whichever error body SGLang used
    (``{"error": {"message": ...}}``, ``{"error": "..."}``, ``{"success": false, "message": ...}``,
    FastAPI's ``{"detail": ...}``, or plain text).
    """

    def __init__(
        self, endpoint: str, status: int | None, message: str, *, body: Any = None
    ) -> None:
        where = f"{endpoint} -> HTTP {status}" if status is not None else endpoint
        super().__init__(f"{where}: {message}")
        self.endpoint = endpoint
        self.status = status
        self.message = message
        self.body = body


class TeacherStateError(TeacherError):
    """Refused by the guard's own sleep-state tracking, before anything reached the teacher.

    SGLang has no "is asleep" query, and a second release of a released tag kills its scheduler
    (torch_memory_saver calls ``exit(1)``), so the guard must know the state itself.
    """


class ReleaseUnsafe(TeacherError):
    """The guard did not release the teacher: on this version no release is safe now (no pause
    route, or requests still running or waiting where the release counts them). The teacher was
    left awake and serving; nothing was lost."""


@dataclass(frozen=True)
class ScoreResult:
    """Per-token logprobs of given token sequences, one entry per sequence, in input order.

    For a sequence of length L scored with ``logprob_start_len = s`` each tensor has
    ``n = L - s - 1`` rows: row j is ``log p(ids[s + 1 + j] | ids[: s + 1 + j])``. SGLang's leading
    ``null`` entry (position ``s`` has no prediction) is already dropped.
    """

    token_logprobs: list[torch.Tensor]
    """``[n]`` float32 per sequence: logprob of the token actually there."""
    topk_logprobs: list[torch.Tensor] | None = None
    """``[n, K]`` float32 per sequence, sorted descending; ``None`` when ``top_k = 0``."""
    topk_ids: list[torch.Tensor] | None = None
    """``[n, K]`` int64 per sequence, the ids of ``topk_logprobs``; ``None`` when ``top_k = 0``."""
    token_ids_logprobs: list[torch.Tensor] | None = None
    """``[n, M]`` float32 per sequence: at every row, the logprob of each of the M token ids
    asked for (:meth:`Teacher.score_token_ids`), in the order asked; ``None`` otherwise."""

    def __len__(self) -> int:
        return len(self.token_logprobs)


@runtime_checkable
class Teacher(Protocol):
    """What the guard needs from a teacher: score, sleep and wake, reload, describe itself.

    Implementations track sleep state themselves (:class:`SleepState`): ``release`` of a tag that is
    already released and ``score`` while asleep raise :class:`TeacherStateError`.
    """

    def score(
        self, sequences: Sequence[Sequence[int]], *, top_k: int = 0, logprob_start_len: int = 0
    ) -> ScoreResult:
        """Logprobs of ``ids[logprob_start_len + 1:]`` for each sequence, plus top-k if asked."""
        ...

    def score_token_ids(
        self,
        sequences: Sequence[Sequence[int]],
        token_ids: Sequence[Sequence[int]],
        *,
        logprob_start_len: int = 0,
    ) -> ScoreResult:
        """As :meth:`score`, plus the logprob of each id of ``token_ids[i]`` at every row of
        sequence ``i`` (SGLang's ``token_ids_logprob``): how a student's own top-K is scored."""
        ...

    def release(self, tags: Sequence[str] | None = None) -> None:
        """Put the teacher to sleep (``None`` = all tags)."""
        ...

    def resume(self, tags: Sequence[str] | None = None) -> None:
        """Wake the teacher (``None`` = every released tag)."""
        ...

    def reload_weights(self, model_path: str | None = None) -> None:
        """Load weights in place from disk (``None`` = the teacher's own ``model_path``)."""
        ...

    def flush_cache(self) -> None:
        """Drop cached prefixes so nothing computed with old weights is reused."""
        ...

    def server_info(self) -> dict[str, Any]:
        """Server arguments as flat keys, like SGLang's ``/server_info``."""
        ...

    @property
    def vocab_size(self) -> int | None:
        """Width of the output distribution, or None when the teacher cannot tell."""
        ...

    @property
    def asleep(self) -> bool:
        """True while any tag is released (tracked by the guard, not asked of the server)."""
        ...

    def mark_released(self, tags: Sequence[str] | None = None) -> None:
        """Record a release done by someone else (a framework's own offload)."""
        ...

    def mark_resumed(self, tags: Sequence[str] | None = None) -> None:
        """Record a resume done by someone else (a framework's own onload)."""
        ...


def normalize_tags(tags: Sequence[str] | None) -> tuple[str, ...]:
    """SGLang's reading of a tags argument: None or empty means all; unknown tags are an error."""
    if tags is None or len(tags) == 0:
        return ALL_TAGS
    if isinstance(tags, str):
        raise GuardTypeError(f"tags must be a sequence of strings, not the string {tags!r}")
    unknown = [t for t in tags if t not in ALL_TAGS]
    if unknown:
        raise GuardValueError(f"unknown memory tags {unknown}; SGLang knows {list(ALL_TAGS)}")
    return tuple(dict.fromkeys(tags))


class SleepState:
    """Which memory tags are released, as the guard has seen them (SGLang cannot be asked).

    ``check_*`` methods raise :class:`TeacherStateError` for the transitions that SGLang turns into
    a dead scheduler (second release) or an error (resume of a tag never released), and for
    scoring while asleep. ``mark_*`` record what happened; call them when sleep and wake are done
    by someone else (e.g. the training framework) so the tracked state stays true.
    """

    def __init__(self, *, tags_supported: bool = True) -> None:
        self._released: set[str] = set()
        self.tags_supported = tags_supported
        """False for old servers that ignore tags: every release and resume acts on all tags."""
        self.by_host = False
        """The release was the host's, through its own handle (:meth:`mark_released`)."""
        self.unknown: str | None = None
        """Why the state cannot be known (a release or resume that got no answer, a host call
        that raised): until someone says what the teacher is (``mark_*``), no call is made to it,
        since a resume of an awake teacher and a forward on a released one both kill it."""

    @property
    def released(self) -> frozenset[str]:
        return frozenset(self._released)

    @property
    def asleep(self) -> bool:
        return bool(self._released)

    def _effective(self, tags: Sequence[str] | None) -> tuple[str, ...]:
        return ALL_TAGS if not self.tags_supported else normalize_tags(tags)

    def check_known(self, what: str) -> None:
        """Raise :class:`TeacherStateError` if the state is unknown: ``what`` would be a guess."""
        if self.unknown is not None:
            raise TeacherStateError(
                f"refusing to {what}: whether the teacher is released cannot be known "
                f"({self.unknown}), and SGLang cannot be asked. A resume of an awake teacher and "
                "a forward on a released one both kill it. Check the server, then say what it "
                "is: mark_resumed(), or mark_released(by_host=False) for a release of its own."
            )

    def mark_unknown(self, reason: str) -> None:
        self.unknown = reason

    def check_release(self, tags: Sequence[str] | None) -> tuple[str, ...]:
        """The tags a release would act on; raises if any of them is already released."""
        self.check_known("release")
        eff = self._effective(tags)
        again = sorted(set(eff) & self._released)
        if again:
            raise TeacherStateError(
                f"refusing to release {again}: already released and not resumed since. A second "
                "release of a released tag kills SGLang's scheduler (torch_memory_saver exit(1)). "
                "Resume first, or call mark_resumed() if the teacher was woken outside the guard."
            )
        return eff

    def check_resume(self, tags: Sequence[str] | None) -> tuple[str, ...]:
        """The tags a resume would act on (None = all released); raises if one is not released."""
        self.check_known("resume")
        if tags is None or not self.tags_supported:
            eff = tuple(t for t in ALL_TAGS if t in self._released)
        else:
            eff = normalize_tags(tags)
        missing = sorted(set(eff) - self._released) if eff else list(ALL_TAGS)
        if missing:
            raise TeacherStateError(
                f"refusing to resume {missing}: not released (SGLang answers KeyError). "
                f"Released now: {sorted(self._released) or 'nothing'}."
            )
        return eff

    def check_score(self) -> None:
        self.check_awake("score")

    def check_awake(self, what: str) -> None:
        """Raise :class:`TeacherStateError` unless the teacher is known to be awake: ``what``
        (a score, a checksum, a reload, a flush) reaches its memory, and SGLang does not stop a
        call on released memory; the CUDA error kills it."""
        self.check_known(what)
        if self._released:
            raise TeacherStateError(
                f"refusing to {what} while asleep (released: {sorted(self._released)}): "
                "resume the teacher first; SGLang does not stop a call on released memory, and "
                "it dies of it."
            )

    def mark_released(self, tags: Sequence[str] | None, *, by_host: bool = True) -> None:
        """Record a release; ``by_host``: made through another handle (a framework's own
        offload), which also resumes it, so only the host can say when it is awake again."""
        self.unknown = None
        self._released.update(self._effective(tags))
        self.by_host = by_host

    def mark_resumed(self, tags: Sequence[str] | None) -> None:
        self.unknown = None
        if tags is None or not self.tags_supported:
            self._released.clear()
        else:
            self._released.difference_update(normalize_tags(tags))
        if not self._released:
            self.by_host = False


def unknown_state(teacher: object) -> str | None:
    """Why ``teacher``'s sleep state cannot be known, or None (a teacher that does not track it
    is known by its ``asleep``)."""
    return getattr(teacher, "state_unknown", None)


def check_score_args(
    sequences: Sequence[Sequence[int]], top_k: int, logprob_start_len: int
) -> None:
    """Reject requests SGLang would reject or silently misread, with the reason."""
    if top_k < 0:
        raise GuardValueError(f"top_k must be >= 0, got {top_k}")
    if logprob_start_len < 0:
        raise GuardValueError(f"logprob_start_len must be >= 0, got {logprob_start_len}")
    if len(sequences) == 0:
        raise GuardValueError("score needs at least one sequence")
    for i, seq in enumerate(sequences):
        if len(seq) == 0:
            raise GuardValueError(f"sequence {i} is empty")
        if logprob_start_len >= len(seq):
            raise GuardValueError(
                f"logprob_start_len={logprob_start_len} leaves nothing to score in sequence {i} "
                f"of length {len(seq)} (it must be < the length)"
            )


def check_token_ids(
    sequences: Sequence[Sequence[int]], token_ids: Any, vocab_size: int | None
) -> list[list[int]]:
    """``token_ids`` as one non-empty list of ids in ``[0, V)`` per sequence. SGLang indexes its
    logprobs with them unchecked: on a GPU an id past the vocabulary is a device-side assert that
    kills the server, and a negative one silently reads another token's logprob."""
    if isinstance(token_ids, (str, bytes)) or not isinstance(token_ids, Sequence):
        raise GuardValueError(f"token_ids must be one list of ids per sequence, got {token_ids!r}")
    if len(token_ids) != len(sequences):
        raise GuardValueError(
            f"token_ids has {len(token_ids)} lists for {len(sequences)} sequences (one each)"
        )
    out = []
    for i, ids in enumerate(token_ids):
        if isinstance(ids, (str, bytes)) or not isinstance(ids, Sequence) or len(ids) == 0:
            raise GuardValueError(f"token_ids[{i}] must be a non-empty list of ids, got {ids!r}")
        if not all(isinstance(t, int) and not isinstance(t, bool) for t in ids):
            raise GuardValueError(f"token_ids[{i}] must hold ints only")
        bad = [t for t in ids if t < 0 or (vocab_size is not None and t >= vocab_size)]
        if bad:
            raise GuardValueError(
                f"token_ids[{i}] holds {len(bad)} id(s) outside the vocabulary "
                f"[0, {vocab_size if vocab_size is not None else '?'}), first {bad[0]}"
            )
        out.append([int(t) for t in ids])
    return out


class TrackedTeacher:
    """Shared sleep-state logic: subclasses implement ``_score``, ``_release``, ``_resume``.

    The public methods check the tracked state first, call the backend, and only then record the
    new state, so a failed release or resume leaves the tracked state unchanged.
    """

    def __init__(self, *, tags_supported: bool = True) -> None:
        self.sleep_state = SleepState(tags_supported=tags_supported)

    @property
    def asleep(self) -> bool:
        return self.sleep_state.asleep

    def score(
        self, sequences: Sequence[Sequence[int]], *, top_k: int = 0, logprob_start_len: int = 0
    ) -> ScoreResult:
        return self._checked_score(sequences, top_k, logprob_start_len)

    def _checked_score(
        self, sequences: Sequence[Sequence[int]], top_k: int, logprob_start_len: int, *extra: Any
    ) -> ScoreResult:
        """Arguments and sleep state checked, then the backend's ``_score`` (``extra`` goes to
        backends whose ``score`` takes more, the SGLang clients' temperature)."""
        check_score_args(sequences, top_k, logprob_start_len)
        self.sleep_state.check_score()
        seqs = [list(map(int, s)) for s in sequences]
        return self._score(seqs, top_k, logprob_start_len, *extra)

    def score_token_ids(
        self,
        sequences: Sequence[Sequence[int]],
        token_ids: Sequence[Sequence[int]],
        *,
        logprob_start_len: int = 0,
    ) -> ScoreResult:
        check_score_args(sequences, 0, logprob_start_len)
        ids = check_token_ids(sequences, token_ids, getattr(self, "vocab_size", None))
        self.sleep_state.check_score()
        seqs = [list(map(int, s)) for s in sequences]
        return self._score_token_ids(seqs, ids, logprob_start_len)

    def _score_token_ids(
        self, sequences: list[list[int]], token_ids: list[list[int]], logprob_start_len: int
    ) -> ScoreResult:
        raise TeacherError(f"{type(self).__name__} cannot score given token ids")

    def release(self, tags: Sequence[str] | None = None) -> None:
        self._learn_tags()
        eff = self.sleep_state.check_release(tags)
        self._unanswered("release", lambda: self._release(eff))
        self.sleep_state.mark_released(eff, by_host=False)

    def resume(self, tags: Sequence[str] | None = None) -> None:
        self._learn_tags()
        eff = self.sleep_state.check_resume(tags)
        self._unanswered("resume", lambda: self._resume(eff))
        self.sleep_state.mark_resumed(eff)

    def _unanswered(self, what: str, call: Any) -> None:
        """Run a release or resume; one that got no answer may have happened or not, so the
        state becomes unknown (an error answer means it was not done: the state stands)."""
        try:
            call()
        except TeacherUnreachable as e:
            self.sleep_state.mark_unknown(f"the {what} got no answer: {e}")
            raise

    def mark_released(self, tags: Sequence[str] | None = None, *, by_host: bool = True) -> None:
        """Record a release made through another handle (``by_host``: the host resumes it too);
        ``by_host=False`` says it was this teacher's own release, which the guard may resume."""
        self.sleep_state.mark_released(tags, by_host=by_host)

    def mark_resumed(self, tags: Sequence[str] | None = None) -> None:
        self.sleep_state.mark_resumed(tags)

    def _learn_tags(self) -> None:
        """Before the first release or resume: whether the backend honours memory tags (a server
        client reads it from its version; in process it is known)."""

    @property
    def released_by_host(self) -> bool:
        """Asleep through the host's own handle (:meth:`mark_released`): only the host wakes it."""
        return self.sleep_state.asleep and self.sleep_state.by_host

    @property
    def state_unknown(self) -> str | None:
        """Why the sleep state cannot be known, or None when it is."""
        return self.sleep_state.unknown

    def mark_unknown(self, reason: str) -> None:
        """Record that the state cannot be known (a host's release or resume that raised)."""
        self.sleep_state.mark_unknown(reason)

    def drain(self) -> bool:
        """Before a release the guard makes: hold new requests and make sure the release's idle
        check will pass, or raise :class:`ReleaseUnsafe` with the teacher left serving. Whether
        traffic is now held (until :meth:`undrain`); in process there is nothing to drain."""
        return False

    def undrain(self) -> None:
        """After the wake: let held requests run again."""

    def _score(self, sequences: list[list[int]], top_k: int, logprob_start_len: int) -> ScoreResult:
        raise NotImplementedError

    def _release(self, tags: tuple[str, ...]) -> None:
        raise NotImplementedError

    def _resume(self, tags: tuple[str, ...]) -> None:
        raise NotImplementedError


def read_vocab_size(model_path: str | Path | None) -> int | None:
    """``vocab_size`` from ``config.json`` at a local model path, or None if it cannot be read."""
    if not model_path:
        return None
    cfg = Path(model_path) / "config.json"
    try:
        data = json.loads(cfg.read_text())
    except (OSError, ValueError):
        return None
    v = data.get("vocab_size") or (data.get("text_config") or {}).get("vocab_size")
    return int(v) if v else None


SECRET_KEY_PARTS = ("key", "token", "secret", "password", "credential")


def redact(info: Any) -> Any:
    """Server arguments with every key-like value replaced: ``/server_info`` returns SGLang's
    resolved arguments as they are, ``--api-key`` included (``docs/sglang-contract.md`` §7.7)."""
    if isinstance(info, dict):
        return {
            k: (
                "<redacted>"
                if v and any(p in str(k).lower() for p in SECRET_KEY_PARTS)
                else redact(v)
            )
            for k, v in info.items()
        }
    if isinstance(info, list):
        return [redact(v) for v in info]
    return info
