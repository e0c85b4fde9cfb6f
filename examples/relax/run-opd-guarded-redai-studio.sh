#!/usr/bin/env bash
# OPD on SciKnowEval Biology, guarded, for current redai-studio/Relax (@02bf712a): the SDPO recipe
#   redai-infra/Relax @6bc26c5 examples/on_policy_distillation/sdpo/run-sciknoweval-biology-4xgpu-colocate.sh
# (its flags recorded in flags/recipe-sdpo-biology-6bc26c5.flags) with every flag this line defines, its
# data, rollout and optimizer numbers unchanged, plus distill_guard's hooks and settings. This line
# has no --opd-feedback-class and no sdpo/ directory, so the run is plain OPD: the teacher scores
# the student's samples on the student's prompt (no golden-answer feedback in the teacher prompt).
# For the SDPO branch itself use run-sciknoweval-biology-4xgpu-colocate-guarded.sh.
#
# From the root of a redai-studio/Relax checkout (or with RELAX_DIR=/path/to/Relax), distill_guard
# installed in the environment Relax runs in:
#   STUDENT_MODEL_PATH=/models/Qwen3-8B SDPO_DATA_ROOT=/data/sdpo WANDB_API_KEY=... \
#     bash /path/to/distill_guard/examples/relax/run-opd-guarded-redai-studio.sh
# DRY_RUN=1 prints the exported environment (NAME=value lines) and the command, and runs nothing.
# TEACHER_CPU_BACKUP=0 turns the teacher's weights CPU backup OFF; on this line it is on by default
# (build_teacher_overrides: setdefault("enable_weights_cpu_backup", True), PR #287) and no flag
# turns it off, so the launcher writes $SAVE_DIR/distill_guard/relax-config.yaml with
# "teacher_sglang_enable_weights_cpu_backup: false" and passes --custom-config-path (Relax sets every
# key of that YAML on its args after parsing). The YAML is written under DRY_RUN too.
#
# Every flag of the recipe is passed as the recipe passes it, except these (the test reads them):
#   dropped --opd-feedback-class: not defined on this line (its parser would drop it silently), and
#     the guarded feedback class needs the SDPO branch's relax.utils.opd.sdpo.feedback.
#   changed --custom-rm-path: the recipe's examples.on_policy_distillation.sdpo.reward.score is not
#     in redai-studio; copy the SDPO branch's examples/on_policy_distillation/sdpo/reward.py (and
#     its __init__.py files) into the checkout, or set CUSTOM_RM_PATH to your own scorer.
#   changed --teacher-sglang-enable-weights-cpu-backup: passed only with TEACHER_CPU_BACKUP=1 (the
#     default: explicit, as in the recipe, so the backup is on even without the PR #287 fix);
#     TEACHER_CPU_BACKUP=0 leaves it out and adds --custom-config-path (above).
# Added, not in the recipe:
#   --custom-config-path (TEACHER_CPU_BACKUP=0 only, above).
#   --save "$SAVE_DIR" --save-interval "$SAVE_INTERVAL" (default 50): the guard's halt checkpoints
#     every trainer rank through Relax's own save, which writes to --save; the recipe saves nothing.
#   --load "$LOAD_DIR" (only when LOAD_DIR is set): resume the trainer from a checkpoint of --save,
#     e.g. the one a guard halt wrote, once the teacher is fixed (docs/after-a-halt.md).
#   --dynamic-sampling-filter-path, --custom-convert-samples-to-train-data-path,
#   --custom-megatron-before-train-step-hook-path, --custom-rollout-log-function-path,
#   --custom-eval-rollout-log-function-path: the guard's hooks.
#   changed --wandb-project: relax-opd instead of relax-sdpo, as this is an OPD run (the default
#     --wandb-group and experiment name say opd- too).
# Not flags: MODEL_ARGS come from $RELAX_DIR/scripts/models/qwen3-8B.sh (not in redai-studio's stored
# scripts/models/: copy it from the SDPO branch), as the recipe sources it (under DRY_RUN without it,
# stand-in Qwen3-8B flags are printed: see guard-common.sh). The recipe's sdpo/env.sh does not exist
# here. The top-K token selection needs SGLang's per-position token-id support
# (RELAX_OPD_PER_POS_TOKEN_IDS=1, set below, as the recipe does). DRY_RUN prints the --wandb-key
# value as REDACTED.
# Environment: besides the DISTILL_GUARD_* settings, RELAX_OPD_PER_POS_TOKEN_IDS (set by the recipe) is
# appended to RELAX_PROPAGATE_ENV_VARS, as Relax's later SDPO launchers do, so that the Ray actors
# starting the SGLang engines see it too.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=guard-common.sh
source "${HERE}/guard-common.sh"

RELAX_DIR="$(cd "${RELAX_DIR:-$(pwd)}" && pwd)"
cd "${RELAX_DIR}"
TEACHER_CPU_BACKUP="${TEACHER_CPU_BACKUP:-1}"
case "${TEACHER_CPU_BACKUP}" in 0 | 1) ;; *) guard_die "TEACHER_CPU_BACKUP must be 0 or 1" ;; esac

# ---- the recipe, on this line --------------------------------------------------------------------
guard_model_args

export CUDA_DEVICE_MAX_CONNECTIONS="${CUDA_DEVICE_MAX_CONNECTIONS:-1}"

export RELAX_OPD_PER_POS_TOKEN_IDS=1
guard_propagate RELAX_OPD_PER_POS_TOKEN_IDS

if guard_dry_run; then
  SDPO_DATA_ROOT="${SDPO_DATA_ROOT:-<SDPO_DATA_ROOT>}"
  WANDB_API_KEY="${WANDB_API_KEY:-<WANDB_API_KEY>}"
fi
student_model="${STUDENT_MODEL_PATH:?Set STUDENT_MODEL_PATH}"
teacher_model="${TEACHER_MODEL_PATH:-${student_model}}"
data_path="${DATA_PATH:-${SDPO_DATA_ROOT:?Set SDPO_DATA_ROOT}/sciknoweval/biology/train.jsonl}"
eval_path="${EVAL_PATH:-${SDPO_DATA_ROOT:?Set SDPO_DATA_ROOT}/sciknoweval/biology/eval.jsonl}"
now="$(date '+%Y-%m-%d-%H:%M:%S')"
experiment_name="${EXPERIMENT_NAME:-opd-sciknoweval-biology-${now}}"
SAVE_DIR="${SAVE_DIR:-${RELAX_DIR}/save/${experiment_name}}"
SAVE_INTERVAL="${SAVE_INTERVAL:-50}"

CKPT_ARGS=(
  --hf-checkpoint "${student_model}"
  --megatron-to-hf-mode bridge
  --attention-backend flash
  --save "${SAVE_DIR}"
  --save-interval "${SAVE_INTERVAL}"
)
if [ -n "${LOAD_DIR:-}" ]; then
  CKPT_ARGS+=(--load "${LOAD_DIR}")
fi

ROLLOUT_ARGS=(
  --prompt-data "${data_path}"
  --input-key prompt
  --label-key label
  --metadata-key metadata
  --apply-chat-template
  --group-rm
  --custom-rm-path "${CUSTOM_RM_PATH:-examples.on_policy_distillation.sdpo.reward.score}"
  --reward-key score
  --num-rollout 5000
  --rollout-batch-size 32
  --n-samples-per-prompt 8
  --global-batch-size 256
  --rollout-max-prompt-len 2048
  --rollout-max-response-len 8192
  --rollout-temperature 1.0
  --use-fault-tolerance
)

EVAL_ARGS=(
  --eval-interval 5
  --eval-prompt-data sciknoweval-biology "${eval_path}"
  --n-samples-per-eval-prompt 16
)

OPD_ARGS=(
  --use-opd
  --opd-type sglang
  --teacher-hf-checkpoint "${teacher_model}"
  --teacher-num-gpus-per-engine 1
  --teacher-sglang-mem-fraction-static 0.5
)
CONFIG_ARGS=()
if [ "${TEACHER_CPU_BACKUP}" = 1 ]; then
  OPD_ARGS+=(--teacher-sglang-enable-weights-cpu-backup)
else
  relax_config="${SAVE_DIR}/distill_guard/relax-config.yaml"
  mkdir -p "$(dirname "${relax_config}")"
  cat >"${relax_config}" <<'YAML'
# Written by distill_guard's run-opd-guarded-redai-studio.sh for TEACHER_CPU_BACKUP=0.
# Relax sets every key below on its args after parsing (--custom-config-path); the managed
# teacher's overrides then keep the CPU backup off.
teacher_sglang_enable_weights_cpu_backup: false
YAML
  CONFIG_ARGS=(--custom-config-path "${relax_config}")
fi
OPD_ARGS+=(
  --opd-loss-coef 1.0
  --opd-kl-coef 0.0
  --opd-disable-rl-reward
  --opd-token-selection student_topk
  --opd-log-prob-top-k 16
  --opd-kl-type jsd
  --opd-jsd-alpha 0.5
  --opd-norm-mode tail
  --opd-teacher-timeout-s 600
  --use-rollout-logprobs
)

GRPO_ARGS=(
  --advantage-estimator grpo
  --eps-clip 0.2
  --eps-clip-high 0.28
)

OPTIMIZER_ARGS=(
  --optimizer adam
  --lr 1e-6
  --lr-decay-style constant
  --weight-decay 0.01
  --clip-grad 1.0
)

PERF_ARGS=(
  --tensor-model-parallel-size 4
  --context-parallel-size 1
  --pipeline-model-parallel-size 1
  --calculate-per-token-loss
  --no-masked-softmax-fusion
  --optimizer-cpu-offload
  --selective-offload
  --use-precision-aware-optimizer
  --recompute-granularity full
  --recompute-method uniform
  --recompute-num-layers 1
  --qkv-format bshd
  --micro-batch-size 1
)

SGLANG_ARGS=(
  --rollout-num-gpus 3
  --rollout-num-gpus-per-engine 1
  --sglang-load-format dummy
  --sglang-mem-fraction-static 0.45
)

MISC_ARGS=(
  --resource '{"actor": [1, 4], "rollout": [1, 3], "teacher": [1, 1]}'
  --max-staleness 0
  --num-data-storage-units 1
  --colocate
  --train-env-vars '{"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}'
  --use-health-check
  --actor-num-gpus-per-node 4
  --num-gpus-per-node 4
  --tb-experiment-name "${experiment_name}"
)

WANDB_ARGS=(
  --use-wandb
  --wandb-project relax-opd
  --wandb-group "${WANDB_RUN_GROUP:-opd-sciknoweval-biology}"
  --wandb-key "${WANDB_API_KEY}"
)

# ---- distill_guard -------------------------------------------------------------------------------
guard_env filter,convert,train_step,log
HOOKS=distill_guard.integrations.relax
GUARD_ARGS=(
  --dynamic-sampling-filter-path "${HOOKS}.dynamic_sampling_filter"
  --custom-convert-samples-to-train-data-path "${HOOKS}.convert_samples_to_train_data"
  --custom-megatron-before-train-step-hook-path "${HOOKS}.before_train_step_hook"
  --custom-rollout-log-function-path "${HOOKS}.rollout_log_function"
  --custom-eval-rollout-log-function-path "${HOOKS}.eval_rollout_log_function"
)

GUARD_EXPORTS=(CUDA_DEVICE_MAX_CONNECTIONS RELAX_OPD_PER_POS_TOKEN_IDS)
guard_run python -m relax.entrypoints.train \
  "${MODEL_ARGS[@]}" \
  "${CKPT_ARGS[@]}" "${ROLLOUT_ARGS[@]}" "${EVAL_ARGS[@]}" \
  "${OPD_ARGS[@]}" "${GRPO_ARGS[@]}" "${OPTIMIZER_ARGS[@]}" \
  "${PERF_ARGS[@]}" "${SGLANG_ARGS[@]}" "${MISC_ARGS[@]}" \
  "${WANDB_ARGS[@]}" "${CONFIG_ARGS[@]}" "${GUARD_ARGS[@]}"
