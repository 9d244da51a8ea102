"""Hostile and lying doctor peers on a real gloo group (issue 23, items 8 and 9).

Every bad peer must be one failed check naming its rank and the real cause, on every honest rank, in
seconds: never an ``AttributeError``, never "another rank stopped or ran out of time". A rank that lies about
its place in the world is named by ``nodes``, and prints the world's verdict itself.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from doctor_launch import DOCTOR, Ranks, check, rank_environ
from tests._zygote import popen

HOSTILE = str(Path(__file__).with_name("hostile_peer.py"))
#: Each hostile rank's mode and the words its rank's verdict must carry (the real cause).
MODES = {
    "facts-list": "facts: Input should be an object",
    "local-string": "local: Input should be a valid array",
    "port": "endpoint.1: Input should be less than or equal to 65535",
    "nested": "recursion limit exceeded",
    "wrong-shape": "the document: Input should be an object",
    "huge-size": "announced a document size out of bounds",
    "rank-out-of-world": "claims rank 1000000 in a world of 9",
}


@pytest.mark.timeout(240)
def test_hostile_peers_are_each_named_with_the_real_cause(ranks: Ranks, port: int, tmp_path: Path) -> None:
    """One world of 9: two honest doctors (rank 0 --json, rank 1 human) and seven hostile peers, one per attack."""
    world = 2 + len(MODES)
    ranks.start(rank_environ(0, world, port), args=["--json", "--timeout", "90"])
    hostile: list[subprocess.Popen[bytes]] = []
    honest: subprocess.Popen[bytes] | None = None
    try:
        for rank, mode in enumerate(MODES, start=2):
            with (tmp_path / f"hostile{rank}.out").open("wb") as out:
                env = rank_environ(rank, world, port)
                hostile.append(popen([sys.executable, HOSTILE, mode], env=env, stdout=out, stderr=out))
        honest = popen(
            [*DOCTOR, "--timeout", "90"],
            env=rank_environ(1, world, port),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        said, errors = honest.communicate(timeout=180)
        for proc in hostile:
            proc.wait(timeout=60)
    finally:
        for proc in [*hostile, *([honest] if honest else [])]:
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=10)
    sent = [(tmp_path / f"hostile{rank}.out").read_text() for rank in range(2, world)]
    assert all(text.startswith("sent ") for text in sent), sent
    status, report = ranks.results(180)[0]
    found = check(report, "consensus")
    assert found["status"] == "fail" and found["ranks"] == list(range(2, world)), found
    invalid = found["evidence"]["invalid_documents"]
    for rank, mode in enumerate(MODES, start=2):
        assert MODES[mode] in invalid[str(rank)], (mode, invalid[str(rank)])
        assert "AttributeError" not in invalid[str(rank)]
    assert check(report, "world")["status"] == "pass"  # the group formed: the documents were bad, not the ranks
    assert [c["id"] for c in report["checks"] if c["status"] == "fail"] == ["consensus"]
    assert status == 1 and not report["ok"]
    text = said.decode()
    assert honest.returncode == 1, errors.decode()[-3000:]
    assert text.count("\n") == 1 and "FAILED (1 failed: consensus)" in text, text  # the world's verdict, one line
    assert "ran out of time" not in text


@pytest.mark.timeout(120)
def test_a_rank_lying_about_its_node_prints_the_worlds_verdict(ranks: Ranks, port: int) -> None:
    """Rank 1 claims local rank 0 of node 0, which rank 0 holds: ``nodes`` names it, and it says FAILED."""
    alone = {"LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1"}
    ranks.start(rank_environ(0, 2, port, NODE_RANK="0", **alone), args=["--json", "--timeout", "60"])
    liar = popen(
        [*DOCTOR, "--timeout", "60"],
        env=rank_environ(1, 2, port, NODE_RANK="0", **alone),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        said, errors = liar.communicate(timeout=90)
    finally:
        if liar.poll() is None:
            liar.kill()
            liar.wait(timeout=10)
    ((status, report),) = ranks.results(90)
    assert check(report, "nodes")["status"] == "fail" and status == 1, check(report, "nodes")
    text = said.decode()
    assert liar.returncode == 1, errors.decode()[-3000:]
    assert text.startswith("distinit doctor: rank 1 (") and "FAILED" in text and "nodes" in text, text
    assert ": ok;" not in text
