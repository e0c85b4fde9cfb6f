"""A teacher's launch command line, SGLang's or Relax's, read into the server arguments the
teacher will run with."""

from __future__ import annotations

import json
import shlex
from typing import Any

_BOOL_PREFIXES = ("enable_", "disable_", "use_", "skip_", "sglang_enable_", "sglang_disable_")
_BOOL_NAMES = frozenset(
    {
        "colocate",
        "hybrid",
        "offload_rollout",
        "offload_train",
        "debug_train_only",
        "trust_remote_code",
    }
)
_RELAX_MARKERS = frozenset(
    {
        "use_opd",
        "opd_type",
        "teacher_hf_checkpoint",
        "opd_teacher_routes",
        "opd_teacher_url",
        "colocate",
        "offload_rollout",
        "resource",
    }
)


PREFLIGHT_FLAGS = frozenset(
    {
        "enable_memory_saver",
        "enable_weights_cpu_backup",
        "weight_cache_mode",
        "enable_deterministic_inference",
        "rl_on_policy_target",
    }
)
"""The SGLang flags preflight's verdict reads (``docs/sglang-contract.md`` §2.4, §2.5)."""

SGLANG_FLAGS = PREFLIGHT_FLAGS | frozenset(
    {  # the SGLang launch_server flags this package's docs, tests and examples use
        "model_path", "model", "tokenizer_path", "tokenizer_mode", "trust_remote_code", "dtype",
        "kv_cache_dtype", "quantization", "context_length", "device", "served_model_name",
        "host", "port", "api_key", "admin_api_key", "mem_fraction_static",
        "max_running_requests", "max_total_tokens", "chunked_prefill_size", "tp_size",
        "dp_size", "pp_size", "ep_size", "random_seed", "log_level", "dist_init_addr",
        "nnodes", "node_rank", "attention_backend", "sampling_backend", "disable_radix_cache",
        "disable_cuda_graph", "disable_cuda_graph_padding", "enable_torch_compile",
        "enable_mixed_chunk", "enable_dp_attention", "allow_auto_truncate", "cuda_graph_max_bs",
        "skip_server_warmup", "skip_tokenizer_init", "load_format", "base_gpu_id",
        "enable_metrics", "watchdog_timeout", "enable_return_hidden_states",
        "disable_overlap_schedule", "page_size", "revision", "download_dir", "chat_template",
    }
)  # fmt: skip
"""SGLang flags preflight knows by name: an unknown flag one or two letters from one of these
is reported as a likely misspelling (:func:`misspelt_flags`)."""


def misspelt_flags(flags: dict[str, Any], known: frozenset[str] = SGLANG_FLAGS) -> dict[str, str]:
    """``{given: meant}`` for each flag (``parse_flags`` keys) that is not in ``known`` but
    close to one that is (difflib ratio ≥ 0.88: a letter or two added, dropped or swapped).
    SGLang refuses an unknown flag at launch, and preflight reads the command without it."""
    import difflib

    out: dict[str, str] = {}
    for name in flags:
        if name in known:
            continue
        close = difflib.get_close_matches(name, sorted(known), n=1, cutoff=0.88)
        if close:
            out[name] = close[0]
    return out


def _is_bool(name: str) -> bool:
    bare = name.removeprefix("teacher_")
    return bare in _BOOL_NAMES or bare.startswith(_BOOL_PREFIXES)


def parse_flags(tokens: list[str]) -> dict[str, Any]:
    """``--some-flag value`` / ``--some-flag=value`` / bare ``--switch`` into ``{"some_flag": ...}``.

    Bare switches are True; ``--no-x`` sets ``x`` False. Tokens before the first flag (the program,
    ``-m module``, environment assignments) and stray positionals are ignored; the last repeat wins.
    """
    flags: dict[str, Any] = {}
    i = 0
    while i < len(tokens):
        tok = tokens[i]
        i += 1
        if not tok.startswith("--") or tok == "--":
            continue
        name, eq, value = tok[2:].partition("=")
        key = name.replace("-", "_")
        if eq:
            flags[key] = value
        elif key.startswith("no_") and _is_bool(key[3:]):
            flags[key[3:]] = False
        elif _is_bool(key) or i >= len(tokens) or tokens[i].startswith("--"):
            flags[key] = True
        else:
            flags[key] = tokens[i]
            i += 1
    return flags


def truthy(value: Any) -> bool:
    """A flag's value as a switch: "0", "false", "no", "off", "none" and "" are off."""
    if isinstance(value, str):
        return value.strip().lower() not in ("", "0", "false", "no", "off", "none")
    return bool(value)


def parse_launch_command(cmd: str) -> dict[str, Any]:
    """The teacher's effective server arguments from a launch command line.

    Returns SGLang server-argument keys (``enable_memory_saver``, ``enable_weights_cpu_backup``,
    ``weight_cache_mode``, ``enable_deterministic_inference``, ``model_path``) plus ``launcher``
    (``"sglang"`` or ``"relax"``) and, for Relax, how it was derived: ``teacher_managed``,
    ``colocate``, ``offload_rollout``, ``backup_source``. For Relax the rules of
    ``build_teacher_overrides`` apply: the teacher's memory saver is on exactly for a managed
    teacher colocated with the actor (``--colocate``, not ``--hybrid``); its backup comes from
    ``--teacher-sglang-enable-weights-cpu-backup``, else from the student's inherited
    ``--sglang-enable-weights-cpu-backup``, else it is off.
    """
    tokens = shlex.split(cmd.replace("\\\n", " "))
    flags = parse_flags(tokens)
    relax = any(k in _RELAX_MARKERS or k.startswith("teacher_sglang_") for k in flags)
    if not relax:
        return {
            "launcher": "sglang",
            "model_path": flags.get("model_path") or flags.get("model"),
            "enable_memory_saver": truthy(flags.get("enable_memory_saver", False)),
            "enable_weights_cpu_backup": truthy(flags.get("enable_weights_cpu_backup", False)),
            "weight_cache_mode": flags.get("weight_cache_mode", "off"),
            "enable_deterministic_inference": truthy(
                flags.get("enable_deterministic_inference", False)
            )
            or flags.get("rl_on_policy_target") == "fsdp",
            "flags": flags,
        }
    return _relax_teacher_args(flags)


def _relax_teacher_args(flags: dict[str, Any]) -> dict[str, Any]:
    def teacher_or_student(name: str) -> tuple[Any, str | None]:
        for prefix in ("teacher_sglang_", "sglang_"):
            if prefix + name in flags:
                return flags[prefix + name], "--" + (prefix + name).replace("_", "-")
        return None, None

    resource: dict[str, Any] = {}
    if isinstance(flags.get("resource"), str):
        try:
            resource = json.loads(flags["resource"])
        except ValueError:
            resource = {}
    has_teacher_resource = "teacher" in resource if resource else True  # unknown: assume present
    managed = (
        truthy(flags.get("use_opd", False))
        and str(flags.get("opd_type", "sglang")) == "sglang"
        and bool(flags.get("teacher_hf_checkpoint") or flags.get("opd_teacher_routes"))
        and has_teacher_resource
        and not truthy(flags.get("debug_train_only", False))
    )
    colocate = (
        managed
        and truthy(flags.get("colocate", False))
        and not truthy(flags.get("hybrid", False))
        and (not resource or ("actor" in resource and "rollout" in resource))
    )
    backup, backup_source = teacher_or_student("enable_weights_cpu_backup")
    cache_mode, _ = teacher_or_student("weight_cache_mode")
    det, _ = teacher_or_student("enable_deterministic_inference")
    target, _ = teacher_or_student("rl_on_policy_target")
    return {
        "launcher": "relax",
        "model_path": flags.get("teacher_hf_checkpoint"),
        "teacher_managed": managed,
        "colocate": colocate,
        "offload_rollout": truthy(flags.get("offload_rollout", colocate)),
        "enable_memory_saver": colocate,
        "enable_weights_cpu_backup": truthy(backup) if backup is not None else False,
        "backup_source": backup_source,
        "weight_cache_mode": cache_mode or "off",
        "enable_deterministic_inference": (truthy(det) if det is not None else False)
        or target == "fsdp",
        "flags": flags,
    }
