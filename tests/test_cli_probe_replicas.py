"""``distill-guard probe`` of a teacher made of replicas: ``--url`` repeated, or ``--router``
(the real sglang-router's workers); each replica reported, all alive afterwards."""

from __future__ import annotations

import importlib.util
import json
import socket
from pathlib import Path

import pytest

from distill_guard.testing.router import reference_replicas, sglang_router
from distill_guard.testing.tiny import build_tiny_qwen3

FAST = ("--cycles", "2", "--canary-length", "16", "--top-k", "4", "--timeout", "5")


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_qwen3(tmp_path_factory.mktemp("probe_replicas"), vocab_size=512)


def _alive(replicas) -> None:
    """Every replica still serves and is awake: a canary-sized scoring call answers."""
    for r in replicas:
        assert r.server.dead_reason is None
        assert not r.teacher.asleep
        r.teacher.score([[1, 2, 3, 4]], top_k=2)


def test_probe_of_four_replicas_names_the_one_waking_zeroed(tiny_dir, run_cli) -> None:
    with reference_replicas(tiny_dir, [True, False, True, True]) as replicas:
        argv = ["probe", *(a for r in replicas for a in ("--url", r.url)), *FAST]
        code, out, err = run_cli(*argv)
        assert code == 1, out + err
        rows = {line.split()[0]: line for line in out.splitlines() if line.startswith("http")}
        assert set(rows) == {r.url for r in replicas}
        bad = replicas[1].url
        assert "UNHEALTHY: teacher.fingerprint_mismatch (repaired and verified)" in rows[bad]
        assert all(rows[r.url].endswith("healthy") for r in replicas if r.url != bad)
        assert f"UNHEALTHY: 1 of 4 replica(s) failed ({bad}) (exit 1)" in out
        assert "--enable-weights-cpu-backup" in out  # the failed replica's findings follow
        _alive(replicas)

        code, out, _ = run_cli(*argv, "--json")
        assert code == 1
        body = json.loads(out)
        assert body["ok"] is False and body["router"] is None
        entries = {e["url"]: e for e in body["replicas"]}
        assert [e["url"] for e in body["replicas"]] == [r.url for r in replicas]
        assert entries[bad]["ok"] is False and entries[bad]["repaired"] is True
        assert all(entries[r.url]["ok"] for r in replicas if r.url != bad)
        assert all(len(e["cycles"]) == 2 for u, e in entries.items() if u != bad)
        _alive(replicas)


@pytest.mark.skipif(
    importlib.util.find_spec("sglang_router") is None,
    reason="needs sglang-router: pip install 'distill_guard[router]'",
)
def test_probe_of_a_router_probes_each_worker_at_its_own_address(tiny_dir, run_cli) -> None:
    with (
        reference_replicas(tiny_dir, [True, True, False]) as replicas,
        sglang_router([r.url for r in replicas]) as router,
    ):
        code, out, _ = run_cli("probe", "--router", router, *FAST, "--json")
        assert code == 1
        body = json.loads(out)
        assert body["router"] == router
        assert {e["url"]: e["ok"] for e in body["replicas"]} == {
            replicas[0].url: True,
            replicas[1].url: True,
            replicas[2].url: False,
        }
        canaries = [r.calls["generate"] for r in replicas]
        assert min(canaries) > 0  # scored directly, each at its own address
        _alive(replicas)


def test_a_replica_that_does_not_answer_is_reported_and_the_others_probed(
    tiny_dir, run_cli
) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{s.getsockname()[1]}"
    with reference_replicas(tiny_dir, [True]) as replicas:
        code, out, _ = run_cli("probe", "--url", replicas[0].url, "--url", dead, *FAST)
        assert code == 1
        rows = {line.split()[0]: line for line in out.splitlines() if line.startswith("http")}
        assert rows[replicas[0].url].endswith("healthy")
        assert "NOT PROBED: TeacherUnreachable" in rows[dead]


def test_several_replicas_refuse_conformance_and_a_repeated_url(run_cli) -> None:
    code, _, err = run_cli("probe", "--url", "http://a:1", "--url", "http://b:2", "--conformance")
    assert code == 2 and "--conformance checks one server" in err
    code, _, err = run_cli("probe", "--url", "http://a:1", "--url", "http://a:1/")
    assert code == 2 and "given twice" in err
