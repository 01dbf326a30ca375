"""Shared-memory collectives between the CPU ranks of one machine: the same sums and objects as gloo,
chunked tensors, DDP's buckets, and a wait that ends when a peer's process is gone or the timeout passes."""

from __future__ import annotations

import functools
import glob
import multiprocessing
import os
import threading
import time

import dist_fns
import pytest
import torch

from ddprl.config import load_config
from ddprl.runtime import launch, shm

pytestmark = pytest.mark.skipif(shm.supported() is not None, reason=str(shm.supported()))


@pytest.mark.parametrize("mode", ["shm", "gloo"])
@pytest.mark.slow
def test_host_collectives_sum_what_gloo_sums(tmp_path, mode):
    cfg = load_config(["world_size=2", "dist_timeout=60", "progress=false", f"host_collectives={mode}"])
    files_before = set(glob.glob("/dev/shm/ddprl-*"))
    launch(functools.partial(dist_fns.host_collectives, out=str(tmp_path)), cfg)
    r0, r1 = (torch.load(tmp_path / f"rank{r}.pt") for r in range(2))
    n = shm.SLOT_BYTES // 4 * 2 + 5
    for r in (r0, r1):
        assert r["shm"] == (mode == "shm")
        assert torch.equal(
            r["float64"],
            torch.tensor([0.1, 1e-20], dtype=torch.float64) + torch.tensor([0.2, 2e-20], dtype=torch.float64),
        )
        assert torch.equal(r["int64"], torch.tensor([2**41 + 1]))
        assert torch.equal(r["big"], torch.arange(n, dtype=torch.float32) * 3)  # 3 chunks, exact in float32
        assert torch.equal(r["region_mean"], torch.tensor([0.5, 1.5]))
        assert torch.equal(r["compiled_region_mean"], torch.arange(n, dtype=torch.float32) * 1.5)
        # compiled, the mean goes through shared memory too (gloo's would cross TCP: 1.69M floats 8-10 ms vs 3)
        assert ("shm_all_reduce_sum" in r["region_graph"]) == (mode == "shm")
        assert torch.equal(r["transposed"], torch.arange(6.0).view(2, 3).t() * 3)
        assert r["collective_s"] > 0
        assert r["gathered"] == [{"rank": 0, "empty": ""}, {"rank": 1, "empty": ""}]
        assert r["broadcast"] == "from rank 1"
        assert r["mixed"] == [3, shm.SLOT_BYTES] and r["after"] == [0, 10]
    # DDP's mean of the two ranks' gradients (inputs 1 and 2 everywhere: mean 1.5 x 4 rows)
    assert torch.equal(r0["grad"], r1["grad"])
    assert torch.allclose(r0["grad"], torch.full((2, 3), 6.0))
    assert set(glob.glob("/dev/shm/ddprl-*")) <= files_before  # unlinked once every rank mapped it


def _publish_nothing(path: str, seconds: float) -> None:
    group = shm.SharedMemoryGroup(path, 1, 2, timeout_s=60, pids=[])
    time.sleep(seconds)
    group.close()


@pytest.mark.parametrize("peer_lives_s", [0.0, 30.0])
def test_a_missing_peer_ends_the_wait(peer_lives_s):
    path = shm.create_file(2)
    try:
        peer = multiprocessing.get_context("spawn").Process(target=_publish_nothing, args=(path, peer_lives_s))
        peer.start()
        timeout_s = 1.0
        group = shm.SharedMemoryGroup(path, 0, 2, timeout_s=timeout_s, pids=[os.getpid(), peer.pid])
        if peer_lives_s == 0:
            peer.join(30)
        start = time.monotonic()
        with pytest.raises(shm.PeerLost, match="rank" + (" 1 \\(pid" if peer_lives_s == 0 else "\\(s\\) 1 did not")):
            group.all_reduce_sum_(torch.ones(3))
        assert time.monotonic() - start < timeout_s + 2 * shm.CHECK_PEERS_S + 1
        group.close()
    finally:
        os.unlink(path)
        peer.kill()
        peer.join(30)


@pytest.mark.slow
def test_doctor_names_the_collectives_and_their_latency(cli):
    result = cli(["doctor", "world_size=2", "size_mb=1"], timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    line = next(x for x in result.stdout.splitlines() if x.startswith("collectives:"))
    assert line.startswith("collectives: shared memory; all_reduce latency (32 B): ")
    assert float(line.split(": ")[-1].split()[0]) > 0
    gloo = cli(["doctor", "world_size=2", "size_mb=1", "host_collectives=gloo"], timeout=120)
    assert "collectives: gloo;" in gloo.stdout, gloo.stderr[-2000:]


def test_objects_cross_in_one_round_and_too_large_ones_fall_back_on_every_rank():
    path = shm.create_file(2)
    try:
        groups = [shm.SharedMemoryGroup(path, r, 2, timeout_s=60, pids=[os.getpid()] * 2) for r in range(2)]
    finally:
        os.unlink(path)
    large = b"x" * (shm.SLOT_BYTES - 7)  # with its 8-byte length, one byte more than a slot

    def both(payloads):
        out = [None, None]
        threads = [
            threading.Thread(target=lambda r=r: out.__setitem__(r, groups[r].all_gather_bytes(payloads[r])))
            for r in range(2)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        return out

    assert both([b"ab", b""]) == [[b"ab", b""]] * 2
    assert both([b"small", large]) == [None, None]  # every rank learns that some rank's does not fit
    assert both([large[:-1], b"c"]) == [[large[:-1], b"c"]] * 2  # a full slot, rounds still in step
    for group in groups:
        group.close()
