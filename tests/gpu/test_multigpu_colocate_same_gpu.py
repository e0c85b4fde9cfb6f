"""examples/multigpu_colocate with 2 gloo ranks sharing cuda:0, each teacher in a real
torch_memory_saver region (skipped without CUDA or torch_memory_saver, see conftest.py)."""

from __future__ import annotations

import json

import pytest

from examples.multigpu_colocate import run


@pytest.mark.timeout(300)
def test_same_gpu_repairs_the_faulty_ranks_real_region_and_ranks_agree(tmp_path, capfd):
    rc = run.main(
        ["--device", "cuda", "--same-gpu", "--faulty-rank", "1", "--steps", "4", "--compare"]
        + ["--out", str(tmp_path), "--timeout-s", "240"]
    )
    print(capfd.readouterr().out)  # the table, for the record (pytest -s)
    assert rc == 0
    r0, r1 = (json.loads((tmp_path / "guard" / f"rank{r}.json").read_text()) for r in (0, 1))
    assert r0["torch_memory_saver"] and r1["torch_memory_saver"]
    assert [s["actions"] for s in r0["steps"]] == [s["actions"] for s in r1["steps"]]
    assert [s["actions"]["wake"] for s in r0["steps"]] == ["rewake"] * 4
    assert (r0["repairs"], r1["repairs"]) == (0, 4)
    assert all(s["trained"] for r in (r0, r1) for s in r["steps"])
    assert r0["student_sha256"] == r1["student_sha256"]
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["agreed"] and summary["step_time_ratio"]["mean"] > 0
