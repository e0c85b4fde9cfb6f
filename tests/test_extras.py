"""Every optional import fails, without its extra, naming the feature and the pip line to run.

One fresh interpreter with every optional module blocked (``sys.modules[name] = None``, which
makes ``import name`` raise ``ModuleNotFoundError`` as if it were not installed) tries each
feature in turn and reports the error it got.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from distill_guard.extras import EXTRAS, MissingExtra, install_line, needed

REPO = Path(__file__).resolve().parents[1]

PROBE = r"""
import contextlib, io, json, sys
BLOCKED = sys.argv[1].split(",")
import torch  # noqa: F401  (torch is core; import it before numpy is blocked)
for name in list(sys.modules):
    if name.split(".")[0] in BLOCKED:
        del sys.modules[name]
for name in BLOCKED:
    sys.modules[name] = None
tmp = sys.argv[2]

def attempt(code):
    try:
        exec(code, {"tmp": tmp})
    except Exception as exc:
        return type(exc).__name__ + ": " + str(exc)
    return "no error"

FEATURES = json.loads(sys.argv[3])
out = {key: attempt(code) for key, code in FEATURES.items()}

from distill_guard.cli import main
with open(tmp + "/h.jsonl", "w") as f:
    for s in range(12):
        f.write(json.dumps({"_step": s, "train/loss": 0.3, "train/entropy": 2.0}) + "\n")
for key, argv in {
    "cli serve-reference": ["serve-reference", "--model", tmp, "--port", "1"],
    "cli replay --plot": ["replay", tmp + "/h.jsonl", "--plot", tmp + "/p.png"],
}.items():
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        code = main(argv)
    out[key] = {"code": code, "stderr": err.getvalue()}

from distill_guard import build_guard
from distill_guard.alerts.wandb import WandbSink
build_guard("default", ["alerts.use_wandb=true"])
out["wandb sink available"] = WandbSink.available()
print(json.dumps(out))
"""

FEATURES = {  # feature code → the extra its error must name
    "import distill_guard.integrations.transformers": "hf",
    "from distill_guard.testing.tiny import build_tiny_qwen3; build_tiny_qwen3(tmp, vocab_size=32)": "hf",
    "from distill_guard.teachers import TorchTeacher; TorchTeacher.from_pretrained(tmp)": "hf",
    "from distill_guard.teachers.torch_teacher import _load_safetensors_dir; _load_safetensors_dir(tmp)": "hf",
    "import distill_guard.integrations.lightning": "lightning",
    "from distill_guard.testing.reference_server.app import create_app; create_app(None)": "server",
    "from distill_guard.testing.reference_server.serve import ServerThread; ServerThread(None)": "server",
    "from distill_guard.report import replay_figure; replay_figure(None)": "plot",
    "from distill_guard.teachers.sglang_engine import SGLangEngineTeacher; SGLangEngineTeacher.launch()": "sglang",
    "import distill_guard.triton_kernels": "gpu",
    "from distill_guard.teachers.torch_teacher import _TMSRegion; _TMSRegion('w', cpu_backup=True, hook_mode=None)": "gpu",
    "from distill_guard.integrations.relax.ray_board import RayBoard; RayBoard('r').wait(0, 0)": "ray",
    "from distill_guard.testing.router import sglang_router; sglang_router([]).__enter__()": "router",
}
RELAX = "from distill_guard.integrations.relax.samples import numeric; numeric([1.0])"
BLOCKED = sorted({m for modules in EXTRAS.values() for m in modules} | {"numpy"})


@pytest.fixture(scope="module")
def probe(tmp_path_factory) -> dict:
    tmp = tmp_path_factory.mktemp("extras")
    features = {**{code: code for code in FEATURES}, RELAX: RELAX}
    proc = subprocess.run(
        [sys.executable, "-c", PROBE, ",".join(BLOCKED), str(tmp), json.dumps(features)],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("code", list(FEATURES))
def test_a_feature_without_its_extra_names_it(probe, code) -> None:
    message = probe[code]
    assert message.startswith("MissingExtra: "), message
    assert f"pip install 'distill_guard[{FEATURES[code]}]'" in message
    assert "is not installed" in message


def test_every_extra_with_an_import_site_is_covered() -> None:
    named = set(FEATURES.values())
    # trl: no module of the package imports it (the user's trainer brings it); wandb: optional
    # by design (test_wandb_missing_is_not_an_error)
    assert named == set(EXTRAS) - {"trl", "wandb"}


def test_relax_without_numpy_says_pip_install_numpy(probe) -> None:
    message = probe[RELAX]
    assert message.startswith("MissingExtra: the Relax integration needs numpy"), message
    assert message.endswith("pip install numpy")


def test_cli_missing_extra_is_one_line_and_exit_2(probe) -> None:
    serve = probe["cli serve-reference"]
    assert serve["code"] == 2
    assert serve["stderr"].count("\n") == 1 and "Traceback" not in serve["stderr"]
    assert "serve-reference needs" in serve["stderr"]
    assert "pip install 'distill_guard[server,hf]'" in serve["stderr"]
    plot = probe["cli replay --plot"]
    assert plot["code"] == 2 and plot["stderr"].count("\n") == 1
    assert "pip install 'distill_guard[plot]'" in plot["stderr"]


def test_wandb_missing_is_not_an_error(probe) -> None:
    """The alerts ask for wandb, it is not there: the guard builds; wandb is just not a sink."""
    assert probe["wandb sink available"] is False


def test_needed_passes_other_errors_through() -> None:
    with pytest.raises(ModuleNotFoundError) as info, needed("x", "hf"):
        import distill_guard.no_such_module  # noqa: F401
    assert not isinstance(info.value, MissingExtra)  # our own missing module is a bug
    with pytest.raises(ValueError, match="unknown extra"):
        install_line("hf,nope")
    with pytest.raises(MissingExtra, match=r"^f needs nope_mod, which is not installed: pip install 'distill_guard\[hf,server\]'$"), needed("f", "hf,server"):  # fmt: skip
        import nope_mod  # noqa: F401
