"""Who stopped answering: the heartbeats in a real store, the roll call, a process that was
stopped noticing it, and the one line a rank says when a peer is gone."""

from __future__ import annotations

import datetime
import signal
import subprocess
import sys
import textwrap
import time

import pytest
import torch.distributed as dist

from ddprl.runtime import failures, liveness
from ddprl.runtime.placement import free_port

RESET = (
    "[/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:537] Read error [10.0.0.7]:49841: "
    "Connection reset by peer. This is typically caused by a remote worker hanging or bugs in the "
    "application. Check the logs of the remote worker before reporting an error. GLHF! 🏖️"
)
TIMEOUT = (
    "[/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:78] Timed out waiting "
    "20000ms for recv operation to complete"
)


def test_a_collectives_error_without_what_gloo_adds():
    assert failures.peer_error(RuntimeError(RESET)) == "Read error [10.0.0.7]:49841: Connection reset by peer"
    assert failures.peer_error(RuntimeError(TIMEOUT)) == "Timed out waiting 20000ms for recv operation to complete"
    assert failures.peer_error(RuntimeError("Connection closed by peer\nException raised from x")) == (
        "Connection closed by peer Exception raised from x"
    )


def test_ranks_grouped_by_host():
    hosts = ["gpu01", "gpu01", "gpu02", "gpu02"]
    assert failures.ranks_on_hosts([3, 2], hosts) == "ranks 2, 3 on gpu02"
    assert failures.ranks_on_hosts([1, 3], hosts) == "rank 1 on gpu01 and rank 3 on gpu02"
    assert failures.ranks_on_hosts([5], hosts) == "rank 5 on an unknown host"


@pytest.mark.parametrize(
    ("rank", "silent", "store_lost", "frozen_s", "line"),
    [
        (0, [2, 3], False, 0.0, "ranks 2, 3 on gpu02 stopped answering (rank 0 on gpu01: E)"),
        (2, None, True, 0.0, "rank 2 on gpu02 lost contact with gpu01, the host of rank 0 (E)"),
        (1, None, True, 0.0, "rank 1 on gpu01 failed: E"),  # rank 0 beside it ended: that blames nobody
        (0, None, False, 0.0, "rank 0 on gpu01 failed: E"),  # no heartbeat to read: say only what happened
        (0, [], False, 0.0, "rank 0 on gpu01 failed: E"),  # every peer still beats: a slow one, say so plainly
        (
            3,
            None,
            False,
            21.4,
            "rank 3 on gpu02 was not running for 21 s (stopped, or its machine froze), and its peers went on "
            "without it: E",
        ),
    ],
)
def test_the_line_of_a_rank_whose_peer_is_gone(rank, silent, store_lost, frozen_s, line):
    hosts = ["gpu01", "gpu01", "gpu02", "gpu02"]
    assert failures.lost_peers(rank, hosts, "E", silent, store_lost, frozen_s) == line


def test_an_echo_that_names_who_stopped_is_the_root_cause_among_echoes():
    plain = failures.Failure(index=0, rank=0, time=1.0, summary="E", consequence=True, host="a")
    named = failures.Failure(
        index=1,
        rank=1,
        time=2.0,
        summary="rank 3 on b stopped answering (...)",
        consequence=True,
        named=True,
        whole_line=True,
    )
    assert failures.root_cause([plain, named]) is named
    assert named.message() == "rank 3 on b stopped answering (...)"
    assert plain.message() == "rank 0 on a failed: E"
    died = failures.Failure(
        index=0, rank=2, time=0.5, summary="exited with code -9 (SIGKILL)", reported=False, host="b"
    )
    assert failures.root_cause([named, died]).message() == "rank 2 on b exited with code -9 (SIGKILL)"


@pytest.fixture
def store(monkeypatch):
    """A real TCPStore served here, with heartbeats ten times faster than a job's."""
    monkeypatch.setattr(liveness, "BEAT_S", 0.1)
    monkeypatch.setattr(liveness, "ROLL_CALL_S", 0.5)
    port = free_port()
    server = dist.TCPStore("127.0.0.1", port, is_master=True, timeout=datetime.timedelta(seconds=30))
    yield port
    del server


def _beating(port: int, rank: int, world_size: int) -> liveness.Heartbeat:
    hb = liveness.Heartbeat("127.0.0.1", port, rank, world_size)
    deadline = time.monotonic() + 30
    while hb._store is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert hb._store is not None, "the heartbeat never reached the store"
    return hb


def test_the_roll_call_names_the_ranks_whose_heartbeat_stopped(store):
    beats = [_beating(store, r, 4) for r in range(3)]  # rank 3 never beats
    try:
        assert beats[0].silent_ranks() == [3]
        beats[2].stop()
        time.sleep(0.3)
        assert beats[1].silent_ranks() == [2, 3]
        assert not beats[0].store_lost and beats[0].frozen_s(within_s=60) == 0.0
    finally:
        for hb in beats:
            hb.stop()


@pytest.mark.slow
def test_without_its_store_the_roll_call_cannot_tell():
    hb = liveness.Heartbeat("127.0.0.1", free_port(), 0, 2)  # nobody serves this port
    try:
        assert hb.silent_ranks() is None
    finally:
        hb.stop()


@pytest.mark.slow
def test_a_stopped_process_knows_it_was_not_running(tmp_path):
    """SIGSTOP for 1.5 s, then SIGCONT: the process says it was not running (here the thresholds
    are scaled down ten times, as in the store fixture)."""
    port = free_port()
    server = dist.TCPStore("127.0.0.1", port, is_master=True, timeout=datetime.timedelta(seconds=30))
    child = textwrap.dedent(
        f"""
        import sys, time
        from ddprl.runtime import liveness
        liveness.BEAT_S, liveness.FROZEN_S = 0.1, 0.5
        hb = liveness.Heartbeat("127.0.0.1", {port}, 1, 2)
        while hb._store is None:
            time.sleep(0.05)
        time.sleep(0.3)
        print("before", hb.frozen_s(within_s=60), flush=True)
        sys.stdin.readline()  # stopped and continued meanwhile
        print("after", hb.frozen_s(within_s=60), flush=True)
        time.sleep(0.5)  # beats again: the freeze stays on record
        print("later", hb.frozen_s(within_s=60), hb.frozen_s(within_s=0.1), flush=True)
        hb.stop()
        """
    )
    p = subprocess.Popen([sys.executable, "-c", child], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert p.stdout.readline().split() == ["before", "0.0"]
        p.send_signal(signal.SIGSTOP)
        time.sleep(1.5)
        p.send_signal(signal.SIGCONT)
        p.stdin.write("\n")
        p.stdin.flush()
        after = float(p.stdout.readline().split()[1])
        assert 1.2 < after < 5.0, after
        _, recorded, long_ago = p.stdout.readline().split()
        assert 1.2 < float(recorded) < 5.0 and float(long_ago) == 0.0
        assert p.wait(timeout=30) == 0
    finally:
        p.kill()
        del server
