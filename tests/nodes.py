"""Emulated nodes on this machine: each a network namespace with its own host name, address,
hosts file and private folder, on one bridge; `mpiexec` launches across them as across real
nodes (Hydra's rsh launcher, through a script that enters the node), MPI's traffic on the
network (UCX over TCP: the nodes share no memory) and the bytes over each node's link counted.

Each node's processes see their own folder at one path (`EmulatedNodes.local`: a bind mount in
the node's mount namespace), as a node-local disk: a silo whose files are on another node
cannot open them. Everything else of the machine (the project, the results folder) is shared,
as a cluster's shared file system is. Needs root (`ip netns`, `unshare`); skips otherwise.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
from jobs import PROJECT_ROOT, mpirun, require_slow_marker

# MPI on the network between the nodes: UCX over TCP only (without it UCX reaches a rank of
# another namespace through shared memory), on the node's own interface.
NETWORK_ENV = {"UCX_TLS": "tcp,self", "UCX_NET_DEVICES": "eth0"}

LAUNCHER = """#!/bin/bash
# Hydra's rsh launcher: $1 the node, the rest the command (a string a remote shell would run).
host=$1; shift
case "$host" in
{cases}
  *) echo "no emulated node $host" >&2; exit 1 ;;
esac
exec ip netns exec "$ns" unshare --uts --mount bash -c \\
  'hostname "$0" && mount --bind "$1" "$2" && eval "exec $3"' "$host" "{disks}/$host" "{local}" "$*"
"""


OWNER = "cfl_owner"  # in /etc/netns/NAMESPACE: the pid of the test process that made it, and its bridge


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=check)


def _remove_orphans() -> None:
    """Remove the nodes of test processes that died before their teardown ran (a run stopped
    by SIGTERM or SIGKILL): no fixture could remove them."""
    for mark in Path("/etc/netns").glob(f"cfl*/{OWNER}"):
        pid, bridge = mark.read_text().split()
        if Path(f"/proc/{pid}").exists():
            continue
        namespace = mark.parent.name
        for process in _ip("netns", "pids", namespace, check=False).stdout.split():
            try:
                os.kill(int(process), signal.SIGKILL)
            except ProcessLookupError:
                pass
        _ip("netns", "del", namespace, check=False)
        _ip("link", "del", bridge, check=False)
        shutil.rmtree(mark.parent, ignore_errors=True)


@dataclass(frozen=True)
class Node:
    host: str  # its host name (node1, node2, ...)
    namespace: str
    address: str
    link: str  # the bridge side of its veth pair: what it sends and receives crosses it


class EmulatedNodes:
    """`count` nodes on one bridge; `close` removes every trace (also after a failed test)."""

    made = 0  # in this process: each set's names and subnet its own

    def __init__(self, count: int, root: Path) -> None:
        EmulatedNodes.made += 1
        tag, net = f"{os.getpid()}{EmulatedNodes.made % 10}", (os.getpid() + EmulatedNodes.made) % 250
        self.root, self.bridge = root, f"cflb{tag}"
        self.local = root / "local"  # where each node sees its own folder
        self.disks = root / "disks"
        self.head = f"10.213.{net}.254"
        self.nodes = [
            Node(f"node{i}", f"cfl{tag}n{i}", f"10.213.{net}.{i}", f"cfl{tag}v{i}") for i in range(1, count + 1)
        ]
        self.launcher = root / "enter_node.sh"
        self._made: list[Node] = []
        _remove_orphans()
        try:
            self._make()
        except BaseException:
            self.close()
            raise

    def _make(self) -> None:
        _ip("link", "add", self.bridge, "type", "bridge")
        _ip("addr", "add", f"{self.head}/24", "dev", self.bridge)
        _ip("link", "set", self.bridge, "up")
        hosts = "127.0.0.1 localhost\n" + "".join(f"{n.address} {n.host}\n" for n in self.nodes)
        for node in self.nodes:
            _ip("netns", "add", node.namespace)
            self._made.append(node)
            _ip("link", "add", node.link, "type", "veth", "peer", "name", "eth0", "netns", node.namespace)
            _ip("link", "set", node.link, "master", self.bridge, "up")
            _ip("-n", node.namespace, "addr", "add", f"{node.address}/24", "dev", "eth0")
            _ip("-n", node.namespace, "link", "set", "eth0", "up")
            _ip("-n", node.namespace, "link", "set", "lo", "up")
            etc = Path("/etc/netns") / node.namespace  # `ip netns exec` mounts its hosts file
            etc.mkdir(parents=True, exist_ok=True)
            (etc / "hosts").write_text(hosts)
            (etc / OWNER).write_text(f"{os.getpid()} {self.bridge}\n")
            self.folder(node.host).mkdir(parents=True, exist_ok=True)
        self.local.mkdir(parents=True, exist_ok=True)
        cases = "\n".join(f"  {n.host}) ns={n.namespace} ;;" for n in self.nodes)
        self.launcher.write_text(LAUNCHER.format(cases=cases, disks=self.disks, local=self.local))
        self.launcher.chmod(0o755)

    def folder(self, host: str) -> Path:
        """Node `host`'s private folder, as this (the head's) process sees it."""
        return self.disks / host

    def node(self, host: str) -> Node:
        return next(n for n in self.nodes if n.host == host)

    # ------------------------------------------------------------------ jobs
    def command(self, ranks: dict[str, int], args: list[str]) -> list[str]:
        """`mpiexec` placing `ranks[host]` consecutive ranks on each node, running `python args`."""
        hosts = ",".join(f"{host}:{n}" for host, n in ranks.items())
        return [
            mpirun(), "-launcher", "rsh", "-launcher-exec", str(self.launcher), "-iface", self.bridge,
            "-hosts", hosts, "-n", str(sum(ranks.values())), sys.executable, *args,
        ]  # fmt: skip

    def env(self) -> dict[str, str]:
        return {**os.environ, **NETWORK_ENV, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}

    def hydra_env(self, ranks: dict[str, int]) -> dict[str, str]:
        """What makes a plain `mpirun -n N` (python -m cfl_mpi.commands.launch's) launch across the nodes:
        Hydra's own variables for its host file, launcher and interface."""
        hosts = self.root / "hosts"
        hosts.write_text("".join(f"{host}:{n}\n" for host, n in ranks.items()))
        return {**self.env(), "HYDRA_HOST_FILE": str(hosts), "HYDRA_LAUNCHER": "rsh",
                "HYDRA_LAUNCHER_EXEC": str(self.launcher), "HYDRA_IFACE": self.bridge}  # fmt: skip

    def start(self, ranks: dict[str, int], args: list[str], launch: bool = False) -> subprocess.Popen:
        """Start a job across the nodes (output captured as text); the caller waits. With
        `launch`, `args` go to `python -m cfl_mpi.commands.launch`, which runs mpirun and watches it."""
        require_slow_marker("a job across emulated nodes")
        command = [sys.executable, "-m", "cfl_mpi.commands.launch", *args] if launch else self.command(ranks, args)
        return subprocess.Popen(
            command, cwd=PROJECT_ROOT, env=self.hydra_env(ranks) if launch else self.env(), stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, text=True, start_new_session=True,
        )  # fmt: skip

    def run(self, ranks: dict[str, int], args: list[str], timeout: float = 600) -> subprocess.CompletedProcess:
        proc = self.start(ranks, args)
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired as expired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, err = proc.communicate()
            raise AssertionError(
                f"job across nodes still running after {timeout} s:\n{out[-2000:]}\n{err[-3000:]}"
            ) from expired
        return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)

    # ------------------------------------------------------------------ the network
    def link_bytes(self) -> dict[str, int]:
        """Bytes each node sent and received over its link so far."""
        stats = Path("/sys/class/net")
        return {
            n.host: sum(int((stats / n.link / "statistics" / f).read_text()) for f in ("rx_bytes", "tx_bytes"))
            for n in self.nodes
        }

    def pids(self, host: str) -> list[int]:
        """Every process of node `host`."""
        found = _ip("netns", "pids", self.node(host).namespace, check=False).stdout.split()
        return [int(p) for p in found]

    def kill(self, host: str) -> None:
        """Every process of node `host` SIGKILLed at once, as a node that crashes."""
        for pid in self.pids(host):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def cut(self, host: str) -> None:
        """Node `host`'s link down: its processes live on, nothing reaches them or leaves."""
        _ip("-n", self.node(host).namespace, "link", "set", "eth0", "down")

    def slow(self, host: str, rate: str) -> None:
        """Node `host`'s outgoing traffic rate-limited (a token bucket: `tc ... tbf`; netem's
        delay would be the closer model, but kernels without sch_netem are common, this
        machine's among them)."""
        subprocess.run(
            ["ip", "netns", "exec", self.node(host).namespace, "tc", "qdisc", "add", "dev", "eth0", "root",
             "tbf", "rate", rate, "burst", "64kb", "latency", "1s"],
            check=True, capture_output=True, text=True,
        )  # fmt: skip

    # ------------------------------------------------------------------ cleaning up
    def close(self) -> None:
        for node in self._made:
            for _ in range(50):  # processes first: a namespace with processes outlives its deletion
                if not self.pids(node.host):
                    break
                self.kill(node.host)
                time.sleep(0.1)
            _ip("link", "del", node.link, check=False)  # both ends, even while the namespace lingers
            _ip("netns", "del", node.namespace, check=False)
            shutil.rmtree(Path("/etc/netns") / node.namespace, ignore_errors=True)
        self._made = []
        _ip("link", "del", self.bridge, check=False)


def can_make_nodes() -> str | None:
    """Why emulated nodes cannot be made here, or None."""
    if sys.platform != "linux":
        return "emulated nodes need Linux network namespaces"
    if os.geteuid() != 0:
        return "emulated nodes need root (ip netns, unshare, mount)"
    for tool in ("ip", "unshare", "tc"):
        if shutil.which(tool) is None:
            return f"emulated nodes need {tool} (iproute2, util-linux)"
    probe, link = f"cflprobe{os.getpid()}", f"cflpv{os.getpid()}"
    steps = [
        ["ip", "netns", "add", probe],
        ["ip", "link", "add", link, "type", "veth", "peer", "name", "eth0", "netns", probe],
        ["ip", "netns", "exec", probe, "tc", "qdisc", "add", "dev", "eth0", "root", "tbf", "rate", "5mbit",
         "burst", "64kb", "latency", "1s"],
        ["ip", "netns", "exec", probe, "unshare", "--uts", "--mount", "true"],
    ]  # fmt: skip
    try:
        for step in steps:
            done = subprocess.run(step, capture_output=True, text=True)
            if done.returncode != 0:
                return f"cannot make an emulated node here ({' '.join(step[:4])} ...: {done.stderr.strip()[:120]})"
    finally:
        _ip("link", "del", link, check=False)
        _ip("netns", "del", probe, check=False)
    return None


@pytest.fixture
def emulated_nodes(tmp_path):
    """A factory: `emulated_nodes(3)` makes 3 nodes for this test; all removed at its end."""
    why = can_make_nodes()
    if why:
        pytest.skip(why)
    made: list[EmulatedNodes] = []

    def make(count: int) -> EmulatedNodes:
        nodes = EmulatedNodes(count, tmp_path / f"cluster{len(made)}")
        made.append(nodes)
        return nodes

    yield make
    for nodes in made:
        nodes.close()
