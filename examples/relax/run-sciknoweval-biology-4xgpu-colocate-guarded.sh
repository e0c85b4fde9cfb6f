#!/usr/bin/env bash
# SDPO on SciKnowEval Biology: Qwen3-8B student and teacher, 4 GPUs, colocated teacher, with
# distill_guard in. The flags are those of Relax's
# examples/on_policy_distillation/sdpo/run-sciknoweval-biology-4xgpu-colocate.sh (@6bc26c5);
# the guard adds its hooks (GUARD_ARGS) and its environment (DISTILL_GUARD_*).
#
# Run from the root of a Relax checkout, with distill_guard installed in the same environment:
#   STUDENT_MODEL_PATH=/models/Qwen3-8B bash run-sciknoweval-biology-4xgpu-colocate-guarded.sh
# DRY_RUN=1 prints the command instead of running it.
set -euo pipefail

RELAX_DIR=${RELAX_DIR:-$(pwd)}
STUDENT_MODEL_PATH=${STUDENT_MODEL_PATH:?set STUDENT_MODEL_PATH to a Qwen3-8B checkpoint}
TEACHER_MODEL_PATH=${TEACHER_MODEL_PATH:-$STUDENT_MODEL_PATH}
DATA_DIR=${DATA_DIR:-/root/data/sciknoweval/biology}  # prepare_data.py --dataset sciknoweval --domain biology --eval-ratio 0.1
SAVE_DIR=${SAVE_DIR:-/root/ckpt/sdpo-sciknoweval-biology-guarded}
# Relax's training entry point, as the original launcher calls it (check your checkout).
RELAX_TRAIN=${RELAX_TRAIN:-train.py}

# Relax's launcher passes --teacher-sglang-enable-weights-cpu-backup: the workaround. With
# TEACHER_CPU_BACKUP=0 the teacher wakes with zeroed weights every step (the failure of
# docs/invariants.md §1) and the guard repairs it and keeps the poisoned samples out of the loss.
TEACHER_CPU_BACKUP=${TEACHER_CPU_BACKUP:-1}

# ---- distill_guard -------------------------------------------------------------------------
# Preset: default (repair, then halt after 3 bad steps) | strict | monitor_only (alerts only).
export DISTILL_GUARD_PRESET=${DISTILL_GUARD_PRESET:-default}
# Qwen3's vocabulary makes the -ln V test exact; beta is --opd-jsd-alpha (read from the args too).
export DISTILL_GUARD_OVERRIDES="run.vocab_size=151936 run.beta=0.5 ${DISTILL_GUARD_OVERRIDES:-}"
# Event file (JSONL: findings, decisions, repairs, alerts, halt) and halt marker next to it.
export DISTILL_GUARD_EVENTS=${DISTILL_GUARD_EVENTS:-${SAVE_DIR}/distill_guard.jsonl}
# raise: a halt fails the rollout, so the poisoned step never trains (last periodic checkpoint
# kept). mark: the rollout is masked and every trainer rank checkpoints, then stops.
export DISTILL_GUARD_HALT=${DISTILL_GUARD_HALT:-raise}
# The guard repairs the teacher at --opd-teacher-url (set by Relax for its managed teacher).
# Per-sample check in the SDPO feedback: mask (drop a uniform sample, let the rollout hook repair
# the teacher) or raise (fail the step at the first uniform sample).
GUARD_FEEDBACK_MODE=${GUARD_FEEDBACK_MODE:-mask}

GUARD_ARGS=(
  --custom-rollout-log-function-path distill_guard.integrations.relax.rollout_log_function
  --custom-eval-rollout-log-function-path distill_guard.integrations.relax.eval_rollout_log_function
)
if [ "${DISTILL_GUARD_HALT}" = "mark" ]; then
  GUARD_ARGS+=(--custom-megatron-before-train-step-hook-path
               distill_guard.integrations.relax.before_train_step_hook)
fi

# ---- Relax's recipe ----------------------------------------------------------------------
MODEL_ARGS=()
if [ -f "${RELAX_DIR}/scripts/models/qwen3-8B.sh" ]; then
  # shellcheck disable=SC1091
  source "${RELAX_DIR}/scripts/models/qwen3-8B.sh"  # defines MODEL_ARGS
elif [ -z "${DRY_RUN:-}" ]; then
  echo "run from a Relax checkout (scripts/models/qwen3-8B.sh not found under ${RELAX_DIR})" >&2
  exit 1
fi
if [ -f "${RELAX_DIR}/examples/on_policy_distillation/sdpo/env.sh" ]; then
  # shellcheck disable=SC1091
  source "${RELAX_DIR}/examples/on_policy_distillation/sdpo/env.sh"
fi
export RELAX_OPD_PER_POS_TOKEN_IDS=1

RESOURCE_ARGS=(
  --resource '{"actor":[1,4],"rollout":[1,3],"teacher":[1,1]}'
  --colocate
  --tensor-model-parallel-size 4
  --rollout-num-gpus 3
  --rollout-num-gpus-per-engine 1
  --teacher-num-gpus-per-engine 1
  --teacher-sglang-mem-fraction-static 0.5
  --sglang-mem-fraction-static 0.45
  --sglang-load-format dummy
)

ROLLOUT_ARGS=(
  --hf-checkpoint "${STUDENT_MODEL_PATH}"  # the student (slime-lineage flag)
  --prompt-data "${DATA_DIR}/train.jsonl"
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
  --eval-prompt-data sciknoweval-biology "${DATA_DIR}/eval.jsonl"
  --n-samples-per-eval-prompt 16
)

OPD_ARGS=(
  --use-opd
  --opd-feedback-class distill_guard.integrations.relax.GuardedGoldenAnswerSDPOFeedback
  --opd-feedback-kwargs "{\"guard_vocab_size\": 151936, \"guard_on_collapse\": \"${GUARD_FEEDBACK_MODE}\"}"
  --opd-type sglang
  --teacher-hf-checkpoint "${TEACHER_MODEL_PATH}"
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
if [ "${TEACHER_CPU_BACKUP}" = "1" ]; then
  OPD_ARGS+=(--teacher-sglang-enable-weights-cpu-backup)
fi

GRPO_ARGS=(
  --advantage-estimator grpo
  --eps-clip 0.2
  --eps-clip-high 0.28
  --calculate-per-token-loss
)

OPTIMIZER_ARGS=(
  --lr 1e-6
  --lr-decay-style constant
  --clip-grad 1.0
)

# Megatron's checkpoint flags (not in Relax's launcher): the guard's halt keeps what is saved here.
CKPT_ARGS=(
  --save "${SAVE_DIR}"
  --save-interval 20
)

WANDB_ARGS=(
  --use-wandb
  --wandb-project relax-sdpo
)

CMD=(python3 "${RELAX_TRAIN}"
  "${MODEL_ARGS[@]}" "${RESOURCE_ARGS[@]}" "${ROLLOUT_ARGS[@]}" "${EVAL_ARGS[@]}"
  "${OPD_ARGS[@]}" "${GRPO_ARGS[@]}" "${OPTIMIZER_ARGS[@]}" "${CKPT_ARGS[@]}" "${WANDB_ARGS[@]}"
  "${GUARD_ARGS[@]}")

if [ -n "${DRY_RUN:-}" ]; then
  env | grep -E '^(DISTILL_GUARD_|RELAX_OPD_)' | sort
  printf '%q ' "${CMD[@]}"
  echo
  exit 0
fi
mkdir -p "${SAVE_DIR}"
cd "${RELAX_DIR}"
exec "${CMD[@]}"
