# shellcheck shell=bash
# Shared by the guarded Relax launchers in this directory: sourced by them, not run by itself.
# The caller sets RELAX_DIR and SAVE_DIR first; DRY_RUN (any value but empty or 0) prints instead of
# running.

guard_dry_run() {
  [ -n "${DRY_RUN:-}" ] && [ "${DRY_RUN}" != 0 ]
}

guard_die() {
  echo "$(basename "$0"): $*" >&2
  exit 2
}

# guard_propagate NAME...: appends each NAME to RELAX_PROPAGATE_ENV_VARS (comma-separated), keeping
# the value already there. Relax copies the variables it lists from the driver's environment into
# every Ray actor (relax/utils/utils.py::post_process_env); the guard's hooks run in those actors
# and read their settings only from DISTILL_GUARD_*, so nothing else would carry them there.
guard_propagate() {
  local name
  for name in "$@"; do
    case ",${RELAX_PROPAGATE_ENV_VARS:-}," in
      *",${name},"*) ;;
      *) RELAX_PROPAGATE_ENV_VARS="${RELAX_PROPAGATE_ENV_VARS:+${RELAX_PROPAGATE_ENV_VARS},}${name}" ;;
    esac
  done
  export RELAX_PROPAGATE_ENV_VARS
}

# guard_env GATES: exports the guard's settings (docs/relax.md; distill_guard/integrations/relax),
# then propagates every DISTILL_GUARD_* variable set, the caller's own ones included
# (DISTILL_GUARD_TEACHER_URL, DISTILL_GUARD_INNER_FILTER, ...).
guard_env() {
  export DISTILL_GUARD_PRESET="${DISTILL_GUARD_PRESET:-default}"
  export DISTILL_GUARD_OVERRIDES="${DISTILL_GUARD_OVERRIDES:-run.vocab_size=151936}"
  # JSONL event file; the verdict board the trainer ranks read sits beside it, so it must be on a
  # file system every node sees.
  export DISTILL_GUARD_EVENTS="${DISTILL_GUARD_EVENTS:-${SAVE_DIR}/distill_guard/events.jsonl}"
  # The gates this launcher wires: the guard refuses to start when Relax did not load one of them.
  export DISTILL_GUARD_GATES="$1"
  # halt: checkpoint every trainer rank and stop at the first dead wake; repair: reload the
  # teacher, verify it and re-score.
  export DISTILL_GUARD_ON_DEAD_TEACHER="${DISTILL_GUARD_ON_DEAD_TEACHER:-halt}"
  case "${DISTILL_GUARD_ON_DEAD_TEACHER}" in
    halt | repair) ;;
    *) guard_die "DISTILL_GUARD_ON_DEAD_TEACHER must be halt or repair, got '${DISTILL_GUARD_ON_DEAD_TEACHER}'" ;;
  esac
  local names
  names="$(compgen -e | grep '^DISTILL_GUARD_' | sort)"
  # shellcheck disable=SC2086  # one name per word
  guard_propagate ${names}
}

# guard_model_args: MODEL_ARGS from the Relax checkout's scripts/models/qwen3-8B.sh, as the recipe
# sources it. Relax's own copy of that file is not in the stored index; under DRY_RUN without it the
# flags below stand in. They are a STAND-IN copied from slime's scripts/models/qwen3-8B.sh
# (zyzshishui/slime @f80d8133bb059096920cb7e95b4f5fa134b77911; Relax's scripts/models/ follows
# slime's, e.g. its qwen3-4B.sh @a06f465d has the same flags), not Relax's file.
guard_model_args() {
  if [ -f "${RELAX_DIR}/scripts/models/qwen3-8B.sh" ]; then
    # shellcheck disable=SC1091
    source "${RELAX_DIR}/scripts/models/qwen3-8B.sh"
  elif guard_dry_run; then
    echo "DRY_RUN: no ${RELAX_DIR}/scripts/models/qwen3-8B.sh; printing the stand-in Qwen3-8B flags" >&2
    # shellcheck disable=SC2034  # read by the launcher that sources this file
    MODEL_ARGS=(
      --swiglu
      --num-layers 36
      --hidden-size 4096
      --ffn-hidden-size 12288
      --num-attention-heads 32
      --group-query-attention
      --num-query-groups 8
      --use-rotary-position-embeddings
      --disable-bias-linear
      --normalization "RMSNorm"
      --norm-epsilon 1e-6
      --rotary-base 1000000
      --vocab-size 151936
      --kv-channels 128
      --qk-layernorm
      --untie-embeddings-and-output-weights
    )
  else
    guard_die "run from a Relax checkout: ${RELAX_DIR}/scripts/models/qwen3-8B.sh not found (set RELAX_DIR)"
  fi
}

# guard_run COMMAND...: under DRY_RUN prints NAME=value for every variable named in GUARD_EXPORTS
# and every DISTILL_GUARD_* one, then the command as one shell-quoted line (the --wandb-key value
# shown as REDACTED), and exits; otherwise runs the command from RELAX_DIR.
guard_run() {
  if guard_dry_run; then
    local name arg redact=0
    local shown=()
    for name in "${GUARD_EXPORTS[@]}" $(compgen -e | grep '^DISTILL_GUARD_' | sort) RELAX_PROPAGATE_ENV_VARS; do
      printf '%s=%s\n' "${name}" "${!name}"
    done
    for arg in "$@"; do
      if [ "${redact}" = 1 ]; then
        shown+=(REDACTED)
        redact=0
        continue
      fi
      [ "${arg}" = --wandb-key ] && redact=1
      shown+=("${arg}")
    done
    printf '%q ' "${shown[@]}"
    echo
    exit 0
  fi
  mkdir -p "$(dirname "${DISTILL_GUARD_EVENTS}")"
  cd "${RELAX_DIR}" || exit 1
  exec "$@"
}
