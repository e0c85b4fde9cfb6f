"""examples/multigpu_colocate on 2 real gloo processes (CPU): the guard's decisions agree across
ranks while one rank's colocated teacher loses its weights at every wake."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from distill_guard.events import read_events
from distill_guard.findings import Code
from examples.multigpu_colocate import run

ROOT = Path(__file__).resolve().parents[2]
SMALL = ["--device", "cpu", "--vocab-size", "512", "--batch-size", "2", "--gen-len", "8"]
SMALL += ["--timeout-s", "50", "--consensus-timeout-s", "20"]


def _main(forkserver, *argv: str) -> int:
    """``run.main``, its 2 ranks forked from the session's fork server (not 2 fresh imports)."""
    return run.main([*SMALL, *argv], start_method=forkserver.get_start_method())


def _run(forkserver, tmp_path: Path, *extra: str) -> tuple[int, list[dict]]:
    rc = _main(forkserver, "--out", str(tmp_path), *extra)
    mode = "no_guard" if "--no-guard" in extra else "guard"
    ranks = [json.loads((tmp_path / mode / f"rank{r}.json").read_text()) for r in (0, 1)]
    return rc, ranks


def _actions(rank: dict) -> list[dict]:
    return [s["actions"] for s in rank["steps"]]


def _events(rank: dict) -> list[dict]:
    """The rank's guard events; a guard that never had anything to say writes no file."""
    path = Path(rank["events"])
    return read_events(path) if path.exists() else []


@pytest.mark.timeout(60)
def test_repair_policy_repairs_the_faulty_rank_at_every_wake_and_both_train_on(
    tmp_path, capfd, forkserver
):
    rc, (r0, r1) = _run(forkserver, tmp_path, "--faulty-rank", "1", "--steps", "3")
    assert rc == 0
    assert _actions(r0) == _actions(r1)
    assert [a["wake"] for a in _actions(r0)] == ["rewake"] * 3
    assert all(a["scores"] == "continue" for a in _actions(r0))  # scored by a repaired teacher
    assert [s["repaired"] for s in r1["steps"]] == [True] * 3 and r1["repairs"] == 3
    assert [s["repaired"] for s in r0["steps"]] == [False] * 3 and r0["repairs"] == 0
    assert all(s["trained"] for r in (r0, r1) for s in r["steps"])
    assert r0["halted_step"] is None and r1["halted_step"] is None
    assert r0["student_sha256"] == r1["student_sha256"]  # DDP kept the replicas identical
    assert [r0["teacher_cpu_backup"], r1["teacher_cpu_backup"]] == [True, False]
    kinds1 = [e["kind"] for e in _events(r1)]
    assert kinds1.count("repair.ok") == 3
    assert not any(e["kind"].startswith("repair") for e in _events(r0))
    out = capfd.readouterr().out
    assert "same decision on every rank at every step: yes" in out
    assert "repairs per rank: rank 0: 0, rank 1: 3" in out


@pytest.mark.timeout(60)
def test_halt_policy_halts_both_ranks_at_the_same_step_with_a_checkpoint(tmp_path, forkserver):
    rc, (r0, r1) = _run(
        forkserver, tmp_path, "--faulty-rank", "1", "--steps", "3", "--policy", "halt"
    )
    assert rc == 0
    assert _actions(r0) == _actions(r1) == [{"wake": "halt"}]
    assert r0["halted_step"] == r1["halted_step"] == 0
    assert not any(s["trained"] for r in (r0, r1) for s in r["steps"])  # no poisoned update
    ckpt = Path(r0["checkpoint"])
    assert r1["checkpoint"] == str(ckpt)
    assert {p.name for p in ckpt.iterdir()} == {"student.pt", "guard.rank0.pt", "guard.rank1.pt"}
    saved = torch.load(ckpt / "student.pt", weights_only=True)
    assert saved["step"] == 0 and saved["student"]
    for r in (r0, r1):
        (halt,) = [e for e in _events(r) if e["kind"] == "halt"]
        assert halt["step"] == 0 and halt["stage"] == "wake"
        assert Code.TEACHER_UNIFORM in halt["message"]
    assert r0["halt_reason"].startswith("rank 1: halt")


@pytest.mark.timeout(60)
def test_healthy_ranks_see_nothing_and_compare_prints_the_step_time_ratio(
    tmp_path, capfd, forkserver
):
    rc = _main(forkserver, "--out", str(tmp_path), "--steps", "3", "--compare")
    assert rc == 0
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert set(summary["modes"]) == {"guard", "no_guard"} and summary["step_time_ratio"]["mean"] > 0
    for r in (0, 1):
        rank = json.loads((tmp_path / "guard" / f"rank{r}.json").read_text())
        assert all(a == dict.fromkeys(run.STAGES, "continue") for a in _actions(rank))
        loud = [e for e in _events(rank) if e.get("severity") in ("warn", "critical")]
        assert loud == [] and rank["repairs"] == 0
    assert "step time with guard / without:" in capfd.readouterr().out


@pytest.mark.timeout(60)
def test_the_watchdog_turns_a_hang_into_exit_124_with_stacks():
    code = (
        "import time; from examples.multigpu_colocate.run import start_watchdog; "
        "start_watchdog(0.5, rank=1); time.sleep(30)"
    )
    root = Path(__file__).resolve().parents[2]
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=root, capture_output=True, text=True, timeout=50
    )
    assert proc.returncode == 124
    assert "[rank 1] watchdog: the run did not finish within --timeout-s 0.5 s" in proc.stderr
    assert 'File "<string>", line 1 in <module>' in proc.stderr  # the stuck main thread


def test_a_rank_that_cannot_see_the_checkpoints_stops_saying_out_must_be_shared(
    tmp_path, monkeypatch
):
    """Several nodes with --out on a node-local disk: rank 0 wrote the checkpoints on its node;
    a rank of another node stops at the start, naming the fix (was a HFValidationError)."""
    monkeypatch.setattr(run.dist, "barrier", lambda: None)
    args = run.parse_args(["--device", "cpu", "--out", str(tmp_path)])
    with pytest.raises(SystemExit, match="--out must be a directory every node sees"):
        run.checkpoints(args, rank=1)


def test_the_slurm_script_starts_one_torchrun_per_node_with_a_shared_out():
    """examples/multigpu_colocate/slurm.sh: valid bash, srun + torchrun --nnodes at the first
    node's address, --out under the submit directory (every node sees it), and the arguments
    it passes are run.py's."""
    script = ROOT / "examples" / "multigpu_colocate" / "slurm.sh"
    assert subprocess.run(["bash", "-n", str(script)]).returncode == 0
    text = script.read_text()
    assert "#SBATCH --ntasks-per-node=1" in text and "srun --kill-on-bad-exit=1 torchrun" in text
    assert '--nnodes "${SLURM_NNODES:-2}"' in text and "--rdzv-backend c10d" in text
    assert "OUT=${OUT:-$PWD/outputs/" in text
    run.parse_args(["--faulty-rank", "1", "--out", "/shared/x", "--compare"])
    docs = (ROOT / "docs" / "integrations.md").read_text()
    section = docs.split("### Several nodes", 1)[1].split("\n## ", 1)[0]
    for said in ("consensus_timeout_s", "guard.consensus_failed", "guard.rank<r>.jsonl",
                 "distill_guard_state.pt", "teacher.reference_unavailable", "GLOO_SOCKET_IFNAME",
                 "examples/multigpu_colocate/slurm.sh"):  # fmt: skip
        assert said in section, said
