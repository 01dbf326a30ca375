"""Two real hosts on one machine, for multi-node tests.

:func:`two_hosts` builds two Linux network namespaces joined by one veth pair, and nothing else:

- each namespace is a host with its own loopback and one end of the veth pair, addressed
  ``127.N.0.1/24`` (host A, ``gpu01``) and ``127.N.0.2/24`` (host B, ``gpu02``), ``N`` random
  per fixture (the pair sits in no other namespace, so no other set-up's addresses can clash);
- ``/etc/netns/<ns>/hosts`` names both hosts (``ip netns exec`` mounts it over /etc/hosts), and
  every command runs in its own UTS namespace whose host name is the host's;
- every port is free in a fresh namespace, and the only peer a process can reach is the other
  end of the veth pair: the traffic of the tests never leaves it.

Why real hosts: on one loopback every address is the right one. A rank that dials 127.0.0.1
instead of rank 0's host, or a gloo pair that picks the wrong interface, still meets its peers
there; across two namespaces it cannot, so these bugs fail here as they fail on a cluster.
The host names matter as well: gloo resolves this host's own name to choose the address it
listens on and announces to its peers (an unresolvable name falls back to 127.0.0.1, which the
other host cannot reach), and SLURM names nodes, not addresses.

The addresses are in 127.0.0.0/8 because those never leave a machine; the kernel routes them
over the veth only with ``route_localnet=1``, set inside each namespace (sysctls are per
namespace). Teardown, also after a failure: every process in the namespaces is killed, the
namespaces deleted (the veth pair goes with them) and /etc/netns/<ns> removed. Without root,
or where namespaces cannot be made (an unprivileged container), the fixture skips and says why.
"""

from __future__ import annotations

import os
import random
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO

import pytest

NETNS_ETC = Path("/etc/netns")
# Variables that would tell a process where the job meets (or route it elsewhere): a host's
# processes get only what each test gives them.
_HOST_ENV_DROP = (
    "MASTER_ADDR",
    "MASTER_PORT",
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "GLOO_SOCKET_IFNAME",
    "TP_SOCKET_IFNAME",
    "NCCL_SOCKET_IFNAME",
)
_HOST_ENV_DROP_PREFIXES = ("SLURM", "TORCHELASTIC_", "PET_")
_PROXIES = ("http_proxy", "https_proxy", "all_proxy", "no_proxy", "grpc_proxy")


@dataclass(frozen=True)
class Host:
    """One host: a network namespace, its name and address, and a working directory of its own."""

    name: str
    netns: str
    addr: str
    cwd: Path

    def argv(self, cmd: list[str]) -> list[str]:
        """``cmd`` run on this host: in its network namespace, under its host name."""
        set_name = "import os, socket, sys; socket.sethostname(sys.argv[1]); os.execvp(sys.argv[2], sys.argv[2:])"
        return [
            "ip",
            "netns",
            "exec",
            self.netns,
            "unshare",
            "--uts",
            "--",
            sys.executable,
            "-c",
            set_name,
            self.name,
            *cmd,
        ]

    def env(self, extra: dict[str, str] | None = None) -> dict[str, str]:
        """The test's environment less any rendezvous, launcher, interface or proxy variable."""
        from conftest import cli_env  # here: conftest imports this module

        env = {
            k: v
            for k, v in cli_env().items()
            if k not in _HOST_ENV_DROP and not k.startswith(_HOST_ENV_DROP_PREFIXES) and k.lower() not in _PROXIES
        }
        env.update(extra or {})
        return env


@dataclass
class Job:
    """A command started on a host, and its output files."""

    host: Host
    proc: subprocess.Popen
    out: IO[str]
    err: IO[str]

    def result(self, returncode: int | None) -> Result:
        texts = []
        for f in (self.out, self.err):
            f.flush()
            f.seek(0)
            texts.append(f.read())
            f.close()
        return Result(self.host, returncode, *texts)


@dataclass
class Result:
    host: Host
    returncode: int | None  # None: killed at the time limit
    stdout: str
    stderr: str

    def tail(self, n: int = 3000) -> str:
        state = "killed at the time limit" if self.returncode is None else f"exit {self.returncode}"
        return f"--- {self.host.name} ({state}) stdout:\n{self.stdout[-n:]}\n--- stderr:\n{self.stderr[-n:]}\n"


class TwoHosts:
    """Hosts ``a`` (gpu01) and ``b`` (gpu02), and running commands on them with bounded time."""

    def __init__(self, root: Path):
        tag = f"{os.getpid()}-{random.randrange(16**4):04x}"
        octet = random.randrange(16, 255)
        self._root = root
        self._tag = tag
        self.a = Host("gpu01", f"ddprl-a-{tag}", f"127.{octet}.0.1", root / "gpu01")
        self.b = Host("gpu02", f"ddprl-b-{tag}", f"127.{octet}.0.2", root / "gpu02")
        self._procs: list[subprocess.Popen] = []
        self._made: list[str] = []
        self._jobs = 0  # commands run so far: names their log files
        self._veth: dict[Host, str] = {}

    @property
    def hosts(self) -> tuple[Host, Host]:
        return self.a, self.b

    # -- building and tearing down ------------------------------------------------------------
    def build(self) -> None:
        hosts_file = f"127.0.0.1 localhost\n::1 localhost\n{self.a.addr} {self.a.name}\n{self.b.addr} {self.b.name}\n"
        for host in self.hosts:
            _ip("netns", "add", host.netns)
            self._made.append(host.netns)
            etc = NETNS_ETC / host.netns
            etc.mkdir(parents=True)
            (etc / "hosts").write_text(hosts_file)
            # No name server to ask: names come from the hosts file or not at all.
            (etc / "resolv.conf").write_text("options timeout:1 attempts:1\n")
            host.cwd.mkdir(parents=True)
        self._veth = veth = {self.a: f"dva{self._tag[-4:]}", self.b: f"dvb{self._tag[-4:]}"}
        _ip(
            "link",
            "add",
            veth[self.a],
            "netns",
            self.a.netns,
            "type",
            "veth",
            "peer",
            "name",
            veth[self.b],
            "netns",
            self.b.netns,
        )
        for host in self.hosts:
            _ip("-n", host.netns, "link", "set", "lo", "up")
            _ip("-n", host.netns, "addr", "add", f"{host.addr}/24", "dev", veth[host])
            _ip("-n", host.netns, "link", "set", veth[host], "up")
            _ip(
                "netns",
                "exec",
                host.netns,
                "sysctl",
                "-q",
                "-w",
                "net.ipv4.conf.all.route_localnet=1",
                f"net.ipv4.conf.{veth[host]}.route_localnet=1",
            )

    def check(self) -> None:
        """Each host has a loopback and its end of the veth pair, nothing else, and reaches the
        other by name over the pair."""
        for host in self.hosts:
            res = subprocess.run(
                ["ip", "-n", host.netns, "-o", "link", "show"], capture_output=True, text=True, timeout=30, check=True
            )
            names = sorted(line.split(":")[1].strip().split("@")[0] for line in res.stdout.splitlines())
            assert names == sorted(["lo", self._veth[host]]), res.stdout
        # What gloo does: this host's own name resolves to an address it can listen on.
        own = (
            "import socket; name = socket.gethostname(); addr = socket.gethostbyname(name); "
            "socket.socket().bind((addr, 0)); print(name, addr)"
        )
        for host in self.hosts:
            res = subprocess.run(
                host.argv([sys.executable, "-c", own]), capture_output=True, text=True, timeout=60, check=False
            )
            assert res.returncode == 0 and res.stdout.split() == [host.name, host.addr], res.stderr
        reach = "import socket, sys; socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=10).close()"
        listen = (
            "import socket, sys; s = socket.socket(); s.settimeout(30); s.bind((sys.argv[1], 0)); s.listen(1); "
            "print(s.getsockname()[1], flush=True); c, peer = s.accept(); print(peer[0])"
        )
        server = self._popen(self.a, [sys.executable, "-c", listen, self.a.name], self.a.env(), subprocess.PIPE)
        port = server.stdout.readline().strip()
        res = subprocess.run(
            self.b.argv([sys.executable, "-c", reach, self.a.name, port]),
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert res.returncode == 0, res.stderr
        assert server.stdout.readline().strip() == self.b.addr  # came from host B's end of the pair
        server.wait(timeout=30)

    def _sweep(self) -> None:
        """Kill every process left in the namespaces."""
        for ns in self._made:
            deadline = time.monotonic() + 30
            while (pids := _netns_pids(ns)) and time.monotonic() < deadline:
                for pid in pids:
                    try:
                        os.kill(pid, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
                time.sleep(0.1)

    def teardown(self) -> None:
        for p in self._procs:
            _kill_group(p)
        self._sweep()
        for p in self._procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
        for ns in self._made:
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=30, check=False)
            shutil.rmtree(NETNS_ETC / ns, ignore_errors=True)
        try:
            NETNS_ETC.rmdir()  # only when no other namespace keeps files there
        except OSError:
            pass

    # -- running ----------------------------------------------------------------------------
    def _popen(self, host: Host, cmd: list[str], env: dict[str, str], out, err=subprocess.PIPE) -> subprocess.Popen:
        p = subprocess.Popen(
            host.argv(cmd), cwd=host.cwd, env=env, stdout=out, stderr=err, text=True, start_new_session=True
        )
        self._procs.append(p)
        return p

    def start(self, jobs: list[tuple[Host, list[str], dict[str, str] | None]]) -> list[Job]:
        """Start ``(host, argv, extra env)`` jobs at once, each in its host's working directory,
        its output to a log beside the hosts' directories (read with :meth:`Job.result`)."""
        logs = self._root / "logs"  # beside the hosts' working directories, not in them
        logs.mkdir(exist_ok=True)
        started = []
        for host, argv, extra in jobs:
            self._jobs += 1
            out, err = (open(logs / f"{self._jobs:02d}-{host.name}.{kind}", "w+") for kind in ("out", "err"))
            started.append(Job(host, self._popen(host, argv, host.env(extra), out, err), out, err))
        return started

    def wait(self, jobs: list[Job], timeout: float, grace: float = 30.0) -> list[Result]:
        """Wait for every job; at ``timeout`` the rest are killed, and once one has failed the
        others get ``grace`` seconds more (a peer of a dead rank would wait out its whole
        dist_timeout). Whatever is left in the namespaces is killed afterwards."""
        deadline = time.monotonic() + timeout
        failed = False
        try:
            while time.monotonic() < deadline:
                codes = [job.proc.poll() for job in jobs]
                if None not in codes:
                    break
                if not failed and any(c not in (None, 0) for c in codes):
                    failed = True
                    deadline = min(deadline, time.monotonic() + grace)
                time.sleep(0.2)
        finally:
            killed = [job.proc.poll() is None for job in jobs]
            for job in jobs:
                _kill_group(job.proc)
                job.proc.wait(timeout=30)
            self._sweep()  # whatever left its process group: the next command starts alone
        return [
            job.result(None if was_killed else job.proc.returncode)
            for job, was_killed in zip(jobs, killed, strict=True)
        ]

    def run(self, jobs: list[tuple[Host, list[str], dict[str, str] | None]], timeout: float) -> list[Result]:
        """:meth:`start` the jobs and :meth:`wait` for them."""
        return self.wait(self.start(jobs), timeout)

    def pids(self, host: Host) -> list[int]:
        """The processes running on ``host`` now."""
        return _netns_pids(host.netns)

    def cut(self, host: Host) -> None:
        """Take ``host``'s end of the link down: nothing passes between the hosts until :meth:`mend`."""
        _ip("-n", host.netns, "link", "set", self._veth[host], "down")

    def mend(self, host: Host) -> None:
        _ip("-n", host.netns, "link", "set", self._veth[host], "up")

    def run_one(self, host: Host, argv: list[str], timeout: float) -> Result:
        return self.run([(host, argv, None)], timeout)[0]


def _ip(*args: str) -> None:
    res = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30, check=False)
    if res.returncode != 0:
        raise OSError(f"ip {' '.join(args)}: {res.stderr.strip()}")


def _netns_pids(ns: str) -> list[int]:
    res = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True, timeout=30, check=False)
    return [int(p) for p in res.stdout.split()]


def _kill_group(p: subprocess.Popen) -> None:
    if p.poll() is None:
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def cannot_build() -> str | None:
    """Why two hosts cannot be built here, or None."""
    if sys.platform != "linux":
        return "two hosts need Linux network namespaces"
    if os.geteuid() != 0:
        return "two hosts need root (ip netns add, veth pairs, /etc/netns)"
    missing = [tool for tool in ("ip", "unshare") if shutil.which(tool) is None]
    if missing:
        return f"two hosts need {' and '.join(missing)} (iproute2, util-linux)"
    return None


@pytest.fixture
def two_hosts(tmp_path):
    """Hosts A (gpu01) and B (gpu02) on one veth pair, each with its own working directory
    under ``tmp_path``; torn down afterwards, whatever the test did."""
    reason = cannot_build()
    if reason:
        pytest.skip(reason)
    hosts = TwoHosts(tmp_path)
    try:
        try:
            hosts.build()
        except OSError as e:
            pytest.skip(f"cannot build two hosts here: {e}")
        hosts.check()
        yield hosts
    finally:
        hosts.teardown()
