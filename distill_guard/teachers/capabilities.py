"""What an SGLang server can do, from the ``version`` in ``/get_server_info`` (every version has it).

Every field is a row of the version table (:mod:`.sglang_versions`, ``docs/sglang-contract.md``
§7.2). A version the table does not cover (unparseable, older than 0.4.7, newer than the newest
release read) is read conservatively and says so: memory tags ignored (every release and resume
acts on everything), no ``/model_info``, no checksum, and a release only once the server is
idle with nothing waiting (the strictest check any release asserts).
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass

from distill_guard.errors import GuardTypeError
from distill_guard.teachers.sglang_versions import (
    FACT_BY_NAME,
    NEWEST_READ,
    Checksum,
    IdleCheck,
    Outcome,
    Pause,
    Version,
)

ALL_THREE = ("weights", "kv_cache", "cuda_graph")


class SleepPlan(enum.Enum):
    """How the guard's own sleep releases a teacher of a given version (:func:`plan_sleep`)."""

    NEVER = "not released: nothing can hold the traffic (no pause route); said once"
    AT_ONCE = "`retract` pause (nothing lost), then release at once"
    AFTER_ABORT = (
        "pause (it aborts what is in flight, as this version always does), wait until the "
        "scheduler is idle twice in a row, release"
    )
    ONLY_IF_IDLE = (
        "wait for quiet (`/flush_cache?timeout=`), `retract` pause, release only if nothing "
        "runs or waits; else let the traffic run on, not released this time, said once"
    )


@dataclass(frozen=True)
class Capabilities:
    """The SGLang behaviour the guard relies on, for one server version."""

    version: str | None
    known: bool
    """The version parsed as an SGLang release the table covers."""
    tags: bool
    """``release`` / ``resume_memory_occupation`` honour ``tags`` (else they act on everything)."""
    default_tags: tuple[str, ...]
    """What an untagged release or resume acts on."""
    cuda_graph_tag: bool
    """``cuda_graph`` is a memory tag."""
    weights_cpu_backup: bool
    """The ``enable_weights_cpu_backup`` server argument exists."""
    server_info: bool
    """``/server_info`` and ``/model_info`` exist (else ``/get_server_info``, ``/get_model_info``)."""
    pause: Pause = Pause.NONE
    """What ``/pause_generation`` is."""
    release_check: IdleCheck = IdleCheck.FULLY_IDLE_WITH_WAITING
    """What the release asserts (a failed assert kills the server)."""
    flush_timeout: bool = False
    """``/flush_cache?timeout=S`` waits for idle (else a busy server answers 400 at once)."""
    flush_check: IdleCheck = IdleCheck.FULLY_IDLE_WITH_WAITING
    """What ``/flush_cache`` requires (else it answers 400)."""
    checksum_shape: Checksum = Checksum.NONE
    """The ``/weights_checker`` checksum's answer."""
    reload_fields: tuple[str, ...] = ()
    """``/update_weights_from_disk`` fields the guard may send besides ``model_path``."""
    reload_flush_refused: Outcome = Outcome.KILLS
    """What a reload whose own flush is refused does."""
    health_while_released: Outcome = Outcome.KILLS_FORWARD
    """What ``/health`` does on an idle released server."""
    token_id_past_vocab: Outcome = Outcome.KILLS
    """What a ``token_ids_logprob`` id outside ``[0, V)`` does (the clients never send one)."""
    mixed_token_ids_batch: Outcome = Outcome.KILLS
    """What a prefill batch mixing a ``token_ids_logprob`` request with a logprob request
    without it does (0.5.10–0.5.15 kill): the clients then send ``token_ids_logprob`` on every
    request or on none, as the server's other traffic does (:func:`token_ids_to_send`)."""

    @property
    def checksum(self) -> bool:
        """``/weights_checker {"action": "checksum"}`` exists."""
        return self.checksum_shape is not Checksum.NONE

    @property
    def memory_tags(self) -> tuple[str, ...]:
        """The tags a request may name on this version."""
        return ALL_THREE if self.cuda_graph_tag else ("weights", "kv_cache")

    @property
    def release_waits_for_idle(self) -> bool:
        """After the pause, the release must wait until nothing runs or waits: the pause returns
        before its aborted requests' last forward, or the release counts the requests a
        ``retract`` pause put back in the waiting queue."""
        return self.pause is Pause.ABORT_ALL or self.release_check.counts_retracted

    @property
    def note(self) -> str:
        if self.known:
            return f"SGLang {self.version}"
        what = "a pre-release" if is_prerelease(self.version) else "unknown server version"
        return (
            f"{what} {self.version!r} (the table covers SGLang 0.4.7–"
            f"{'.'.join(map(str, NEWEST_READ))}): treated conservatively (memory tags ignored, "
            "so every release and resume acts on everything; no /model_info; no checksum; a "
            "release only once the server is idle with nothing waiting)"
        )


def plan_sleep(caps: Capabilities) -> SleepPlan:
    """The guard's release on ``caps``: the only one that version's idle check lets pass."""
    if caps.pause is Pause.NONE:
        return SleepPlan.NEVER
    if not caps.release_waits_for_idle:
        return SleepPlan.AT_ONCE
    if not caps.flush_check.counts_retracted:  # no idle test that sees what the release counts
        return SleepPlan.NEVER
    return SleepPlan.AFTER_ABORT if caps.pause is Pause.ABORT_ALL else SleepPlan.ONLY_IF_IDLE


def wake_plan(caps: Capabilities) -> str:
    """What the guard checks before the traffic its pause held runs again."""
    if plan_sleep(caps) is SleepPlan.NEVER:
        return "never released by the guard: canary at each wake"
    if caps.checksum:
        return "resume, checksum against the one before the sleep, then continue, then canary"
    return "resume, continue, then canary (no checksum: held requests run beside the canary)"


def repair_plan(caps: Capabilities) -> str:
    """How a repair reloads and flushes on ``caps``."""
    if "flush_cache" not in caps.reload_fields:
        return "reload (its own flush, asserted); only when nothing runs in the scheduler"
    if caps.flush_timeout:
        return "reload with `flush_cache: false`, then `/flush_cache?timeout=`; retried alone"
    return "reload with `flush_cache: false`, then `/flush_cache` asked again until idle"


def guard_table() -> str:
    """``docs/teachers.md`` §7.1: what the guard does on each version (a row per band)."""
    from distill_guard.teachers.sglang_versions import band_label, bands

    lines = [
        "| SGLang | the guard's sleep | its wake | its repair |",
        "|---|---|---|---|",
    ]
    rows: list[tuple[list[tuple[Version, Version]], tuple[str, str, str]]] = []
    for band in bands():
        caps = capabilities_for(".".join(map(str, band[0])))
        row = (plan_sleep(caps).value, wake_plan(caps), repair_plan(caps))
        if rows and rows[-1][1] == row:
            rows[-1][0].append(band)
        else:
            rows.append(([band], row))
    for runs, (sleep, wake, repair) in rows:
        versions = band_label((runs[0][0], runs[-1][1]))
        lines.append(f"| {versions} | {sleep} | {wake} | {repair} |")
    other = capabilities_for(None)
    lines.append(
        f"| any other version (unparseable, older, newer than the newest read) | "
        f"{plan_sleep(other).value} | {wake_plan(other)} | {repair_plan(other)} |"
    )
    return "\n".join(lines)


def parse_version(text: object) -> Version | None:
    """``"0.5.23"``, ``"v0.5.6.post2"``, ``"0.5.5rc1"`` → (0, 5, 23) …; None if not a version.

    Raises :class:`~distill_guard.errors.GuardTypeError` for anything but a string or None
    (a server whose ``version`` is the JSON number 0.5 is not telling its release)."""
    if text is None:
        return None
    if not isinstance(text, str):
        raise GuardTypeError(
            f"an SGLang version is a string such as '0.5.23', got {type(text).__name__} {text!r}"
        )
    m = re.fullmatch(r"\s*v?(\d+)\.(\d+)\.(\d+)(?:[.+\-]?(?:post|rc|dev|a|b)?\d*.*)?\s*", text)
    return (int(m.group(1)), int(m.group(2)), int(m.group(3))) if m else None


def is_prerelease(text: object) -> bool:
    """``0.5.23rc1``, ``0.5.23.dev3``, ``0.5.23a1``: built before 0.5.23, so neither its row nor
    the one before is known to hold (a ``.postN`` is the release with fixes, read as it)."""
    return isinstance(text, str) and bool(
        re.search(r"\d(?:[.\-]?)(?:rc|dev|a|b|alpha|beta)\d*", text.split("+")[0])
    )


def capabilities_for(version: object) -> Capabilities:
    """The capability row of ``version`` (``docs/sglang-contract.md`` §7.2); a version that is not
    a string, or a pre-release (:func:`is_prerelease`), is read as unknown."""
    try:
        v = parse_version(version)
    except GuardTypeError:
        v = None
    if v is not None and is_prerelease(version):  # before its release: not that release's row
        v = None
    shown = version if isinstance(version, str) or version is None else repr(version)
    values = {name: fact.value_at(v) for name, fact in FACT_BY_NAME.items()} if v else {}
    if not values or any(x is None for x in values.values()):
        return Capabilities(
            shown,
            known=False,
            tags=False,
            default_tags=ALL_THREE[:2],
            cuda_graph_tag=False,
            weights_cpu_backup=False,
            server_info=False,
            pause=Pause.MODES,
            release_check=IdleCheck.FULLY_IDLE_WITH_WAITING,
        )
    return Capabilities(
        version=shown,
        known=True,
        tags=values["tags"],
        default_tags=values["default_tags"],
        cuda_graph_tag=values["cuda_graph_tag"],
        weights_cpu_backup=values["weights_cpu_backup"],
        server_info=values["server_info"],
        pause=values["pause"],
        release_check=values["release_check"],
        flush_timeout=values["flush_timeout"],
        flush_check=values["flush_check"],
        checksum_shape=values["checksum"],
        reload_fields=values["reload_fields"],
        reload_flush_refused=values["reload_flush_refused"],
        health_while_released=values["health_while_released"],
        token_id_past_vocab=values["fatal_token_id_past_vocab"],
        mixed_token_ids_batch=values["fatal_mixed_token_ids_batch"],
    )
