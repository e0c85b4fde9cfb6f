#!/usr/bin/env bash
# SDPO on SciKnowEval Biology, guarded: Relax's own recipe
#   redai-infra/Relax @6bc26c5 examples/on_policy_distillation/sdpo/run-sciknoweval-biology-4xgpu-colocate.sh
# (its flags recorded in flags/recipe-sdpo-biology-6bc26c5.flags) with distill_guard's hooks and settings.
# For the SDPO line of Relax (redai-infra/Relax @6bc26c5). Current redai-studio/Relax has no
# --opd-feedback-class and no sdpo/ directory: use run-opd-guarded-redai-studio.sh there.
#
# From the root of a Relax checkout (or with RELAX_DIR=/path/to/Relax), distill_guard installed in
# the environment Relax runs in:
#   STUDENT_MODEL_PATH=/models/Qwen3-8B SDPO_DATA_ROOT=/data/sdpo WANDB_API_KEY=... \
#     bash /path/to/distill_guard/examples/relax/run-sciknoweval-biology-4xgpu-colocate-guarded.sh
# DRY_RUN=1 prints the exported environment (NAME=value lines) and the command, and runs nothing.
# TEACHER_CPU_BACKUP=0 drops the teacher's weights CPU backup: the teacher then wakes with lost
# weights every step (docs/invariants.md), which is what the guard is for.
#
# Every flag of the recipe is passed as the recipe passes it, except these (the test reads them):
#   changed --opd-feedback-class: relax.utils.opd.sdpo.feedback.GoldenAnswerSDPOFeedback becomes
#     distill_guard.integrations.relax.GuardedGoldenAnswerSDPOFeedback, a subclass of it that also
#     checks every sample's teacher top-K (the per-sample "feedback" gate), configured by the added
#     --opd-feedback-kwargs '{"guard_on_collapse": "mask"}' (mask the sample; "raise" stops the run).
#   changed --teacher-sglang-enable-weights-cpu-backup: passed only with TEACHER_CPU_BACKUP=1 (the
#     default, as in the recipe); TEACHER_CPU_BACKUP=0 leaves it out to reproduce the failure.
# Added, not in the recipe:
#   --opd-feedback-kwargs: the guarded feedback class's settings (above).
#   --save "$SAVE_DIR" --save-interval "$SAVE_INTERVAL" (default 50): the guard's halt checkpoints
#     every trainer rank through Relax's own save, which writes to --save; the recipe saves nothing.
#   --load "$LOAD_DIR" (only when LOAD_DIR is set): resume the trainer from a checkpoint of --save,
#     e.g. the one a guard halt wrote, once the teacher is fixed (docs/after-a-halt.md).
#   --dynamic-sampling-filter-path, --custom-convert-samples-to-train-data-path,
#   --custom-megatron-before-train-step-hook-path, --custom-rollout-log-function-path,
#   --custom-eval-rollout-log-function-path: the guard's hooks.
# Not flags: MODEL_ARGS come from $RELAX_DIR/scripts/models/qwen3-8B.sh and the recipe's
# examples/on_policy_distillation/sdpo/env.sh is sourced when present, as the recipe does (under
# DRY_RUN without a checkout, stand-in Qwen3-8B flags are printed: see guard-common.sh). DRY_RUN
# prints the --wandb-key value as REDACTED.
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
GUARD_ON_COLLAPSE="${GUARD_ON_COLLAPSE:-mask}"
case "${GUARD_ON_COLLAPSE}" in mask | raise) ;; *) guard_die "GUARD_ON_COLLAPSE must be mask or raise" ;; esac

# ---- Relax's recipe ------------------------------------------------------------------------------
guard_model_args
if [ -f examples/on_policy_distillation/sdpo/env.sh ]; then
  # shellcheck disable=SC1091
  source examples/on_policy_distillation/sdpo/env.sh
fi

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
experiment_name="${EXPERIMENT_NAME:-sdpo-sciknoweval-biology-${now}}"
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
  --custom-rm-path examples.on_policy_distillation.sdpo.reward.score
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
  --opd-feedback-class distill_guard.integrations.relax.GuardedGoldenAnswerSDPOFeedback
  --opd-feedback-kwargs "{\"guard_on_collapse\": \"${GUARD_ON_COLLAPSE}\"}"
  --opd-type sglang
  --teacher-hf-checkpoint "${teacher_model}"
  --teacher-num-gpus-per-engine 1
  --teacher-sglang-mem-fraction-static 0.5
)
if [ "${TEACHER_CPU_BACKUP}" = 1 ]; then
  OPD_ARGS+=(--teacher-sglang-enable-weights-cpu-backup)
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
  --wandb-project relax-sdpo
  --wandb-group "${WANDB_RUN_GROUP:-sdpo-sciknoweval-biology}"
  --wandb-key "${WANDB_API_KEY}"
)

# ---- distill_guard -------------------------------------------------------------------------------
guard_env filter,convert,train_step,log,feedback
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
  "${WANDB_ARGS[@]}" "${GUARD_ARGS[@]}"
