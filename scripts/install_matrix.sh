#!/usr/bin/env bash
# The install matrix: build this working tree's wheel and sdist, install them into clean venvs
# (python3 -m venv, then torch, then the package), and check, for each extra, that its feature
# fails naming the extra without it and works with it. Writes the table to docs/install-matrix.md
# (or $1). Several minutes; not part of `make test`.
#
#   scripts/install_matrix.sh [OUT.md]        (make install-matrix)
#   TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu scripts/install_matrix.sh   (PyPI on Linux)
#
# sglang is left out of the "with" column: it pins its own CUDA torch (gigabytes). Needs bash 4.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
OUT_MD=${1:-$ROOT/docs/install-matrix.md}
PYTHON=${PYTHON:-python3}
TORCH_SPEC=${TORCH_SPEC:-torch==2.13.0}
TORCH_INDEX_URL=${TORCH_INDEX_URL:-}
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
LOG=${MATRIX_LOG:-/tmp/install-matrix.log}  # every pip and check output
: >"$LOG"
ROWS=$WORK/rows.txt
: >"$ROWS"

say() { echo "== $*" | tee -a "$LOG"; }
run() { "$@" >>"$LOG" 2>&1; }

# ---- build: a copy of the tracked and new files (no stale egg-info, no build/ in the checkout)
say "build wheel and sdist from $ROOT"
mkdir -p "$WORK/src" "$WORK/dist"
(cd "$ROOT" && git ls-files -co --exclude-standard -z | tar --null -T - -cf - 2>/dev/null) | tar -xf - -C "$WORK/src"
run "$PYTHON" -m venv "$WORK/buildenv"
run "$WORK/buildenv/bin/pip" install --quiet "setuptools>=77"
(cd "$WORK/src" && "$WORK/buildenv/bin/python" -c "
from setuptools import build_meta as b
print(b.build_wheel('$WORK/dist'), b.build_sdist('$WORK/dist'))" >>"$LOG" 2>&1)
WHEEL=$(ls "$WORK"/dist/*.whl)
SDIST=$(ls "$WORK"/dist/*.tar.gz)
say "built $(basename "$WHEEL") and $(basename "$SDIST")"

new_venv() {  # new_venv DIR: python3 -m venv, then torch
  run "$PYTHON" -m venv "$1"
  run "$1/bin/pip" install --quiet "$TORCH_SPEC" ${TORCH_INDEX_URL:+--index-url "$TORCH_INDEX_URL"}
}

# ---- the feature each extra brings, as a Python snippet run in the venv
declare -A FEATURE=(
  [hf]="from distill_guard.testing.tiny import build_tiny_qwen3; from distill_guard.teachers import TorchTeacher; build_tiny_qwen3('$WORK/tiny', vocab_size=64); TorchTeacher.from_pretrained('$WORK/tiny')"
  [lightning]="from distill_guard.integrations.lightning import DistillGuardCallback; DistillGuardCallback('default')"
  [server]="from distill_guard.testing.reference_server.serve import ServerThread; from distill_guard.testing.reference_server.app import create_app; create_app(None)"
  [plot]="from distill_guard.report import replay_figure; replay_figure(None)"
  [gpu]="import distill_guard.triton_kernels"
  [sglang]="from distill_guard.teachers.sglang_engine import SGLangEngineTeacher; SGLangEngineTeacher.launch(model_path='m')"
)
# [trl] adds trl to [hf]'s transformers integration; [wandb] must never be needed (alerts skip it)
FEATURE_TRL="import distill_guard.integrations.transformers, trl; from trl import DistillationTrainer"
FEATURE_WANDB="from distill_guard.alerts.wandb import WandbSink; import sys; sys.exit(0 if WandbSink.available() else 'wandb not seen')"

without() {  # without PY EXTRA SNIPPET: the snippet must fail with an error naming the extra
  local out
  if out=$("$1" -c "$3" 2>&1); then echo "no error (feature worked without it)"; return; fi
  if grep -q "pip install 'distill_guard\[$2\]'" <<<"$out"; then echo "yes"; else
    echo "NO: $(tail -1 <<<"$out" | cut -c1-120)"; fi
}
with() {  # with PY SNIPPET: the snippet must work
  local out
  if out=$("$1" -c "$2" 2>&1); then echo "yes"; else echo "NO: $(tail -1 <<<"$out" | cut -c1-120)"; fi
}

# ---- the wheel with no extras
V=$WORK/venv-wheel
say "venv $V: $TORCH_SPEC, then the wheel with no extras"
new_venv "$V"
run "$V/bin/pip" install --quiet "$WHEEL"
PY=$V/bin/python
CORE=$("$V/bin/pip" list --format=freeze 2>/dev/null | wc -l)
VERSION=$("$PY" -c "import distill_guard; print(distill_guard.__version__)")
CLI_VERSION=$("$V/bin/distill-guard" --version)
"$PY" -c "
import json, math
with open('$WORK/h.jsonl', 'w') as f:
    for s in range(30):
        f.write(json.dumps({'_step': s, 'train/loss': 0.3 - 0.002 * s, 'train/entropy': 2.0}) + '\n')"
set +e
REPLAY=$("$V/bin/distill-guard" replay "$WORK/h.jsonl" --vocab-size 1000 2>"$WORK/replay.err"); REPLAY_RC=$?
set -e
REPLAY_ERR=$(if [ -s "$WORK/replay.err" ]; then echo "stderr: $(head -c 200 "$WORK/replay.err" | tr '\n' ' ')"; else echo "nothing on stderr"; fi)
NOT_CORE=$("$PY" -c "
import importlib.util as u
print(' '.join(m for m in ('wandb', 'transformers', 'lightning', 'fastapi', 'matplotlib')
               if u.find_spec(m) is not None) or 'none')")
say "core: $CORE packages; version $VERSION; '$CLI_VERSION'; replay exit $REPLAY_RC, $REPLAY_ERR; optional present: $NOT_CORE"
echo "$REPLAY" >>"$LOG"

declare -A WITHOUT WITH
for e in hf lightning server plot gpu sglang; do WITHOUT[$e]=$(without "$PY" "$e" "${FEATURE[$e]}"); done
WITHOUT[trl]="n/a: no module of the package imports trl (the trainers come from the user)"
WITHOUT[wandb]=$(if "$PY" -c "$FEATURE_WANDB" >/dev/null 2>&1; then echo "NO: wandb found"; else
  "$PY" -c "
from distill_guard import build_guard
g = build_guard('default', ['alerts.use_wandb=true'])
print('ok')" >/dev/null 2>&1 && echo "no error: not a sink (as intended)" || echo "NO: build_guard failed"; fi)
SERVE=$( "$V/bin/distill-guard" serve-reference --model "$WORK/m" --port 1 2>&1 ; echo "exit $?")
say "serve-reference without extras: $(tr '\n' ' ' <<<"$SERVE")"

# ---- each extra, one at a time, into the same venv
for e in hf trl lightning server plot wandb gpu; do
  say "install wheel[$e]"
  if ! run "$V/bin/pip" install --quiet "$WHEEL[$e]"; then WITH[$e]="NO: pip install failed (see log)"; continue; fi
  case $e in
    trl) WITH[$e]=$(with "$PY" "$FEATURE_TRL") ;;
    wandb) WITH[$e]=$(with "$PY" "$FEATURE_WANDB") ;;
    plot) WITH[$e]=$(with "$PY" "import subprocess, sys; sys.exit(subprocess.call(['$V/bin/distill-guard', 'replay', '$WORK/h.jsonl', '--vocab-size', '1000', '--plot', '$WORK/p.png'], stdout=subprocess.DEVNULL) or not __import__('os').path.getsize('$WORK/p.png'))") ;;
    server) WITH[$e]=$(with "$PY" "
import subprocess, sys, time, httpx
p = subprocess.Popen(['$V/bin/distill-guard', 'serve-reference', '--model', '$WORK/srv', '--port', '39517', '--build-tiny', '64'])
try:
    for _ in range(600):
        try:
            httpx.get('http://127.0.0.1:39517/health', timeout=1); break
        except httpx.HTTPError:
            time.sleep(0.2)
    rc = subprocess.call(['$V/bin/distill-guard', 'preflight', '--url', 'http://127.0.0.1:39517'])
    sys.exit(0 if rc in (0, 1) else f'preflight exit {rc}')
finally:
    p.terminate(); p.wait(20)") ;;
    *) WITH[$e]=$(with "$PY" "${FEATURE[$e]}") ;;
  esac
done
WITH[sglang]="not installed here (sglang pins its own CUDA torch)"

# ---- the sdist, once
S=$WORK/venv-sdist
say "venv $S: $TORCH_SPEC, then the sdist"
new_venv "$S"
SDIST_RESULT="NO: install failed"
if run "$S/bin/pip" install --quiet "$SDIST"; then
  SDIST_RESULT="\`$("$S/bin/distill-guard" --version)\`; the installed presets compose: $("$S/bin/python" -c "
from distill_guard import build_guard
print('build_guard(\'strict\') halts after', build_guard('strict').policy.halt_after_critical_steps, 'critical steps')")"
fi
say "sdist: $SDIST_RESULT"

# ---- the table
{
  echo "# Install matrix"
  echo
  echo "Generated $(date -u +%Y-%m-%d) by \`scripts/install_matrix.sh\` (\`make install-matrix\`) on"
  echo "$(uname -sm), $("$PYTHON" --version), $TORCH_SPEC${TORCH_INDEX_URL:+ from $TORCH_INDEX_URL}."
  echo "Clean venvs (\`python3 -m venv\`), torch first, then the wheel built from the working tree:"
  echo "$(basename "$WHEEL"), $(basename "$SDIST")."
  echo
  echo "The wheel with no extras: \`distill_guard.__version__\` = $VERSION; \`distill-guard --version\` ="
  echo "\`$CLI_VERSION\`; \`distill-guard replay\` on a generated 30-step history: exit $REPLAY_RC, $REPLAY_ERR;"
  echo "$CORE packages in the venv; optional modules present: $NOT_CORE."
  echo "\`distill-guard serve-reference\` without extras: \`$(head -1 <<<"$SERVE")\` ($(tail -1 <<<"$SERVE"))."
  echo
  echo "| extra | without it: the feature's error names the extra | with it: the feature works |"
  echo "|---|---|---|"
  for e in hf trl lightning server plot gpu sglang wandb; do
    echo "| \`$e\` | ${WITHOUT[$e]} | ${WITH[$e]} |"
  done
  echo
  echo "The sdist, installed into its own clean venv: $SDIST_RESULT."
  echo
  echo "Features checked: hf: build a tiny Qwen3 and \`TorchTeacher.from_pretrained\`; trl: the"
  echo "transformers integration and \`trl.DistillationTrainer\`; lightning: \`DistillGuardCallback\`;"
  echo "server: \`distill-guard serve-reference\` answering \`distill-guard preflight --url\`; plot:"
  echo "\`distill-guard replay --plot\`; gpu: the Triton kernels module; wandb: the alerts' wandb sink."
} >"$OUT_MD"
cat "$OUT_MD"
echo "(full log: $LOG)"
