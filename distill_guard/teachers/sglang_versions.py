"""SGLang's behaviour per released version: the one table the clients, the capabilities and the
reference server are derived from.

Each :class:`Fact` is a row of ``docs/sglang-contract.md`` §7.2, with the wheel lines it was read
from; ``tests/docs/test_sglang_table.py`` checks that the document's table is :func:`markdown`
of these rows, and ``tests/testing/test_reference_server_versions.py`` has a test per row showing
the reference server does what the wheel does. A value holds from its version until the next
one in the row. Versions after the newest read are not guessed at: :func:`value_at` answers
``None`` for them, and :mod:`.capabilities` reads that conservatively.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any

Version = tuple[int, int, int]

RELEASES_READ: tuple[Version, ...] = (
    (0, 4, 7),
    (0, 4, 8),
    (0, 4, 9),
    (0, 4, 10),
    *((0, 5, n) for n in range(1, 24)),
)
"""The wheels read (``docs/sglang-contract.md`` §7): 0.4.7–0.4.10 and 0.5.1–0.5.23."""
OLDEST_READ, NEWEST_READ = RELEASES_READ[0], RELEASES_READ[-1]


class Pause(enum.Enum):
    """What ``/pause_generation`` is on a version."""

    NONE = "no route (404)"
    ABORT_ALL = (
        "takes no body; aborts every request in flight and answers at once, before its running "
        "requests' last forward"
    )
    MODES = (
        "body required (`{}` at least): `mode` abort / in_place / retract; retract answers "
        "before it is applied, and is applied before any later release or flush"
    )


class IdleCheck(enum.Enum):
    """What a release asserts, or a flush requires, of the scheduler (a failed release assert
    kills the server; a refused flush answers 400)."""

    NOTHING = "nothing"
    NO_REQUEST_WITH_WAITING = "no request running or waiting"
    NO_REQUEST = "no request running (waiting not counted)"
    FULLY_IDLE_WITH_WAITING = "fully idle, waiting counted"
    FULLY_IDLE_UNLESS_PAUSED = "fully idle, waiting not counted while paused"

    @property
    def counts_retracted(self) -> bool:
        """A request put back in the waiting queue by a pause fails this check."""
        return self in (IdleCheck.NO_REQUEST_WITH_WAITING, IdleCheck.FULLY_IDLE_WITH_WAITING)


class Checksum(enum.Enum):
    """The ``/weights_checker {"action": "checksum"}`` answer on a version."""

    NONE = "none"
    PER_TENSOR = "per-tensor hashes only (`ranks[].checksums`)"
    PER_ENGINE_STRING = "`per_engine_checksum`, a string (and `ranks[].checksums`)"


class Outcome(enum.Enum):
    """What a call SGLang cannot serve does to the server."""

    KILLS = "kills the server"
    REFUSED = "answers 400, the new weights in"
    SKIPPED_503 = "skipped: 503 after 20 s"
    KILLS_FORWARD = "runs a forward: kills"
    REFUSED_400 = "answers 400"
    HARMLESS = "served (no error)"


@dataclass(frozen=True)
class Fact:
    """One engine behaviour the guard relies on, per version, and where it was read."""

    name: str
    """The :class:`~distill_guard.teachers.capabilities.Capabilities` field it becomes."""
    what: str
    """The behaviour, as the document's row names it."""
    since: tuple[tuple[Version, Any], ...]
    """``(first version, value)``, oldest first; a value holds until the next entry."""
    cite: str
    """Where in the wheels (``sglang/srt/...``, lines per wheel)."""

    def value_at(self, version: Version) -> Any:
        """The value on ``version``; None outside the releases read."""
        if not OLDEST_READ <= version <= NEWEST_READ:
            return None
        value = None
        for first, v in self.since:
            if version >= first:
                value = v
        return value


def _v(text: str) -> Version:
    a, b, c = (int(x) for x in text.split("."))
    return (a, b, c)


FACTS: tuple[Fact, ...] = (
    Fact(
        "tags",
        "release/resume honour `tags`",
        ((_v("0.4.7"), False), (_v("0.4.8"), True)),
        "0.4.7 `managers/io_struct.py` (`ReleaseMemoryOccupationReqInput` has no fields); "
        "0.4.8 `io_struct.py` `tags: Optional[List[str]]` (sgl-project/sglang#7099)",
    ),
    Fact(
        "default_tags",
        "what an untagged release or resume acts on",
        (
            (_v("0.4.7"), ("weights", "kv_cache")),
            (_v("0.5.5"), ("weights", "kv_cache", "cuda_graph")),
        ),
        "`constants.py` `GPU_MEMORY_ALL_TYPES` (0.5.5 adds `cuda_graph`)",
    ),
    Fact(
        "cuda_graph_tag",
        "`cuda_graph` is a memory tag",
        ((_v("0.4.7"), False), (_v("0.5.5"), True)),
        "0.5.5 `constants.py` `GPU_MEMORY_TYPE_CUDA_GRAPH`",
    ),
    Fact(
        "weights_cpu_backup",
        "`--enable-weights-cpu-backup` exists",
        ((_v("0.4.7"), False), (_v("0.5.3"), True)),
        "0.5.3 `server_args.py` `enable_weights_cpu_backup` (sgl-project/sglang#10873)",
    ),
    Fact(
        "server_info",
        "`/server_info`, `/model_info` (else only `/get_server_info`, `/get_model_info`)",
        ((_v("0.4.7"), False), (_v("0.5.6"), True)),
        '0.5.6 `entrypoints/http_server.py` `@app.get("/server_info")`, `/model_info`',
    ),
    Fact(
        "pause",
        "`/pause_generation`",
        ((_v("0.4.7"), Pause.NONE), (_v("0.4.9"), Pause.ABORT_ALL), (_v("0.5.6"), Pause.MODES)),
        "0.4.9 `http_server.py:715-722`, `managers/tokenizer_manager.py:910-913` "
        "(`abort_request(abort_all=True)`, nothing awaited); 0.5.6 `io_struct.py:1068-1099` "
        "(`mode`, no default body), `tokenizer_manager.py:1264-1283` (retract: sent, no reply), "
        "`scheduler.py:2439-2444` (`retract_all` → waiting queue); 0.5.5 `schedule_batch.py"
        ":156-169` (`to_finish`: one more forward)",
    ),
    Fact(
        "held_while_paused",
        "a `/generate` sent while paused waits until `/continue_generation`",
        ((_v("0.4.7"), False), (_v("0.4.9"), True)),
        "0.4.9 `tokenizer_manager.py:426-427`; 0.5.6 `:470-471`; 0.5.23 `:938-939` "
        "(`is_pause_cond.wait_for`); release, resume, flush, `/weights_checker`, "
        "`/get_server_info` are not held",
    ),
    Fact(
        "release_check",
        "what the release asserts (a failed assert kills)",
        (
            (_v("0.4.7"), IdleCheck.NOTHING),
            (_v("0.5.5"), IdleCheck.NO_REQUEST_WITH_WAITING),
            (_v("0.5.6"), IdleCheck.NO_REQUEST),
            (_v("0.5.10"), IdleCheck.FULLY_IDLE_WITH_WAITING),
            (_v("0.5.21"), IdleCheck.FULLY_IDLE_UNLESS_PAUSED),
        ),
        "0.4.8 `scheduler.py:2244-2261` (none); 0.5.5 mixin `:106-112`, `scheduler.py:2328-2345` "
        "`_is_no_request()`; 0.5.6 mixin `:111-116`, `scheduler.py:2205-2223`; 0.5.10 mixin "
        "`:124-129`, 0.5.17 `scheduler_components/weight_updater.py:202-205` `is_fully_idle()`; "
        "0.5.21 `weight_updater.py:318-322`, 0.5.23 `:337-341` `ignore_waiting=_engine_paused`",
    ),
    Fact(
        "flush_check",
        "what `/flush_cache` requires (else 400; it only drops the caches)",
        (
            (_v("0.4.7"), IdleCheck.NO_REQUEST_WITH_WAITING),
            (_v("0.5.6"), IdleCheck.NO_REQUEST),
            (_v("0.5.10"), IdleCheck.FULLY_IDLE_WITH_WAITING),
            (_v("0.5.21"), IdleCheck.FULLY_IDLE_UNLESS_PAUSED),
        ),
        "0.4.8 `scheduler.py:2011-2017`, `http_server.py:404-411`; 0.5.5 `scheduler.py:2349-2351`; "
        "0.5.6 `:2225-2227`; 0.5.10 `:3041-3043`; 0.5.23 `:5518-5540` (a `timeout` > 0 still "
        "counts waiting: `:1340-1343`)",
    ),
    Fact(
        "flush_timeout",
        "`/flush_cache?timeout=S` waits for idle (else the parameter is ignored)",
        ((_v("0.4.7"), False), (_v("0.5.10"), True)),
        "0.5.10 `http_server.py:718-733`, `scheduler.py:2845-2887`; 0.5.9 `http_server.py:710-719` "
        "takes no parameter",
    ),
    Fact(
        "reload_fields",
        "`/update_weights_from_disk` fields the guard may send besides `model_path`",
        (
            (_v("0.4.7"), ()),
            (_v("0.5.1"), ("weight_version",)),
            (_v("0.5.6"), ("weight_version", "flush_cache")),
        ),
        "`io_struct.py` `UpdateWeightFromDiskReqInput`: 0.4.9 `abort_all_requests`, 0.5.1 "
        "`weight_version`, 0.5.6 `flush_cache=True`",
    ),
    Fact(
        "reload_flush_refused",
        "a reload whose own flush is refused (requests running or waiting in the scheduler)",
        ((_v("0.4.7"), Outcome.KILLS), (_v("0.5.22"), Outcome.REFUSED)),
        "0.4.8 `scheduler.py:2200-2208` … 0.5.21 `weight_updater.py:117-122` "
        "(`assert flush_cache_success`); 0.5.23 `weight_updater.py:120-133`; unpaused it waits "
        "for in-flight requests first (`model_update_lock`), paused (0.5.6+) it does not",
    ),
    Fact(
        "checksum",
        '`/weights_checker {"action": "checksum"}`',
        (
            (_v("0.4.7"), Checksum.NONE),
            (_v("0.5.12"), Checksum.PER_TENSOR),
            (_v("0.5.13"), Checksum.PER_ENGINE_STRING),
        ),
        "0.5.6 `/weights_checker` with `snapshot`/`reset_tensors`/`compare` only; 0.5.12 "
        "`http_server.py:1294-1303`; 0.5.13 `tokenizer_control_mixin.py:766-777`, 0.5.23 "
        "`:890-911` (sha256 hexdigest)",
    ),
    Fact(
        "health_while_released",
        "`/health_generate` on an idle released server (`/health` is a plain 200 on "
        "0.4.8–0.4.10; the reference server answers it like `/health_generate` everywhere)",
        (
            (_v("0.4.7"), Outcome.KILLS_FORWARD),
            (_v("0.5.1"), Outcome.SKIPPED_503),
            (_v("0.5.10"), Outcome.KILLS_FORWARD),
        ),
        "0.4.10 `scheduler.py:1003-1008`; 0.5.1 `scheduler.py:1062-1068` (skipped while "
        "`offload_tags`); 0.5.10 `scheduler.py:1594-1600`, 0.5.23 `:2241-2247` (the skip is gone)",
    ),
    Fact(
        "fatal_resume_unreleased",
        "a resume of a tag that is not released",
        ((_v("0.4.7"), Outcome.KILLS),),
        "0.4.8 `scheduler.py:2263-2276` (`AttributeError`); 0.5.1 mixin `:97-104`, 0.5.23 "
        "`weight_updater.py:383-390` (`offload_tags.remove` → `KeyError`)",
    ),
    Fact(
        "fatal_second_release",
        "a second release of a released tag (memory saver on)",
        ((_v("0.4.7"), Outcome.KILLS),),
        "torch_memory_saver `csrc/core.cpp`: `exit(1)` on pausing a region that is not ACTIVE",
    ),
    Fact(
        "fatal_forward_released",
        "a forward (`/generate`, a checksum, a reload) over released memory",
        ((_v("0.4.7"), Outcome.KILLS),),
        "no `/generate` gate reads `offload_tags`; the CUDA error leaves the scheduler loop "
        "(0.5.5 `scheduler.py:2846`, 0.5.9 `:3190`, 0.5.17 `:4951`, 0.5.23 `:6372`); measured "
        "on an H200: an illegal memory access that poisons the context",
    ),
    Fact(
        "token_ids_logprob",
        "`/generate` and `Engine.generate` answer `token_ids_logprob` (one id list per input) "
        "as `input_token_ids_logprobs`, laid out as `input_top_logprobs`",
        ((_v("0.4.7"), True),),
        "0.4.7 `io_struct.py:80`, `:352-360`, 0.5.23 `:237`, `:809-822` (`GenerateReqInput`); "
        "0.5.23 `scheduler_components/logprob_result_processor.py:116-150` (entry 0 `None`, "
        "the sampling row popped); `entrypoints/engine.py` `generate(token_ids_logprob=)`",
    ),
    Fact(
        "fatal_token_id_past_vocab",
        "a `token_ids_logprob` id at or past the vocabulary (before 0.5.14 a negative one wraps)",
        ((_v("0.4.7"), Outcome.KILLS), (_v("0.5.14"), Outcome.REFUSED_400)),
        "0.5.13 and before: no check on the generate path, the scheduler indexes "
        "`logprobs[pt : pt + pruned_len, token_ids_tensor]` (on a GPU a device-side assert); "
        "0.5.14 `managers/tokenizer_manager.py:1063-1082` `_validate_token_ids_logprob` "
        "(`ValueError` unless a flat list of ints in `[0, vocab_size)`)",
    ),
    Fact(
        "fatal_mixed_token_ids_batch",
        "a prefill batch where one request asks `token_ids_logprob` and another asks input "
        "logprobs without it",
        (
            (_v("0.4.7"), Outcome.HARMLESS),
            (_v("0.5.10"), Outcome.KILLS),
            (_v("0.5.16"), Outcome.HARMLESS),
        ),
        "the batch-wide `extend_token_ids_logprob = any(x is not None ...)` (0.5.12 "
        "`layers/logits_processor.py:164-166`) sends every request through "
        "`get_token_ids_logprobs_raw`; from 0.5.10 its prefill branch calls "
        "`torch.tensor(token_ids)` for a request whose ids are `None` (0.5.12 "
        "`layers/utils/logprob.py:154`): a `TypeError` in the scheduler. 0.5.9 indexes "
        "`logprobs[..., None]` instead (no error); 0.5.16 "
        "`layers/logprob_processor.py:141` skips `None`",
    ),
    Fact(
        "engine_pause",
        "in-process `sglang.Engine` has a pause or a checksum",
        ((_v("0.4.7"), False),),
        "`entrypoints/engine.py` (0.4.8 … 0.5.23): `flush_cache`, `release_`/"
        "`resume_memory_occupation(tags=)`, `update_weights_from_disk(model_path, load_format)`; "
        "no `pause_generation`, no `weights_checker`",
    ),
)

FACT_BY_NAME = {f.name: f for f in FACTS}


def bands() -> list[tuple[Version, Version]]:
    """The runs of releases read over which no fact changes, oldest first (the table's columns)."""
    out: list[list[Version]] = []
    for v in RELEASES_READ:
        row = tuple(f.value_at(v) for f in FACTS)
        if out and tuple(f.value_at(out[-1][0]) for f in FACTS) == row:
            out[-1].append(v)
        else:
            out.append([v])
    return [(run[0], run[-1]) for run in out]


def _fmt_version(v: Version) -> str:
    return ".".join(map(str, v))


def band_label(band: tuple[Version, Version]) -> str:
    first, last = band
    return _fmt_version(first) if first == last else f"{_fmt_version(first)}–{_fmt_version(last)}"


def _cell(value: Any) -> str:
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, enum.Enum):
        return str(value.value)
    if isinstance(value, tuple):
        return ", ".join(value) if value else "—"
    return str(value)


def spans(fact: Fact) -> list[tuple[str, Any]]:
    """``(versions, value)`` of a fact, e.g. ``("0.4.9–0.5.5", Pause.ABORT_ALL)``."""
    out = []
    for i, (first, value) in enumerate(fact.since):
        nxt = fact.since[i + 1][0] if i + 1 < len(fact.since) else None
        last = max(v for v in RELEASES_READ if nxt is None or v < nxt)
        out.append((band_label((first, last)), value))
    return out


def markdown() -> str:
    """The table of ``docs/sglang-contract.md`` §7.2: a row per fact, its value per version."""
    lines = ["| behaviour | per version | read in |", "|---|---|---|"]
    for fact in FACTS:
        cells = " · ".join(f"**{versions}**: {_cell(value)}" for versions, value in spans(fact))
        lines.append(f"| {fact.what} | {cells} | {fact.cite} |")
    return "\n".join(lines)
