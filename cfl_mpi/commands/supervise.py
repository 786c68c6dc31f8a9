"""The launcher, watched: `python -m cfl_mpi.commands.launch` runs mpirun as its child (the sbatch scripts
run srun through `python -m cfl_mpi.commands.supervise -- srun ...`) and, where the job ends without a
word from cfl_mpi, says what happened, in failure.txt too.

That is the case of a rank, or a whole node, whose processes die at once (a crash, the OOM
killer): MPICH's Hydra then tears the job down within a fraction of a second, SIGKILLing every
rank before any can notice. Where a rank died, Hydra names its process id and host (`BAD
TERMINATION ... PID P RUNNING AT H`), which `nodes.json` (the server's record of each rank's
host, process id and silos) turns into the rank and its silos. Where a node's proxy died with
it, mpiexec says only `assert (!closed) failed`; the launcher's children are those proxies (or
the ssh that started each, `--proxy-id K` in either's command line), and the first of them to
end names the node, in the order of the hosts in `nodes.json`. A node cut off by its link leaves
the launcher unaware; the ranks' heartbeats catch that one (backends/mpi/liveness.py). srun names
the first task to end badly and its node (`srun: error: node3: task 4: Killed`; a task is a
rank), or the node SLURM lost (`srun: error: Node failure on node3`).
"""

from __future__ import annotations

import json
import os
import re
import select
import signal
import subprocess
import sys
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import IO

from ..cli import EXIT_CONFIG
from ..console import numbered
from ..reporting.results import FAILURE, NODES, record_failure
from ..runtime.checkpoint import resume_hint
from ..runtime.stop import EXIT_INTERRUPTED

__all__ = ["LauncherWords", "ProxyWatch", "out_of", "supervise"]

PROXY_ID = re.compile(rb"--proxy-id\x00(\d+)")
# What MPICH's mpiexec says when a rank ends badly, and when a node's proxy is gone.
BAD_TERMINATION = re.compile(r"PID (\d+) RUNNING AT (\S+)")
PROXY_GONE = re.compile(r"^\[mpiexec@[^]]*\] control_cb .*assert \(!closed\) failed")
# ... and what srun says: a task (an MPI rank) that ended badly, and a node SLURM lost
SRUN_TASKS_ENDED = re.compile(r"^srun: error: (\S+): tasks? ([\d,-]+): (.+)$")
SRUN_NODE_FAILURE = re.compile(r"^srun: error: Node failure on (\S+)")
LOOK_S = 0.2  # how often the watch looks for the launcher's new children
LAST_WORDS_S = 0.5  # how long the launcher's last lines may take to come through once it ended
# Exit codes of a job whose ranks said why on the console: a config error, Ctrl-C.
SPOKEN = (EXIT_CONFIG, EXIT_INTERRUPTED)


class ProxyWatch(threading.Thread):
    """Watches the children of the launcher `pid` that carry a proxy id, each through a pidfd
    (readable the moment its process ends), and records the order in which they end."""

    def __init__(self, pid: int) -> None:
        super().__init__(name="proxy-watch", daemon=True)
        self.pid = pid
        self.ended: list[int] = []  # proxy ids, in the order their processes ended
        self._watched: dict[int, int] = {}  # pidfd -> proxy id, of those still running
        self._seen: set[int] = set()  # their pids
        self._stop_event = threading.Event()

    def stop(self) -> None:
        self._stop_event.set()

    def _look(self) -> None:
        """Open a pidfd for each proxy child not yet watched."""
        for child in _children(self.pid) - self._seen:
            self._seen.add(child)
            try:
                found = PROXY_ID.search(Path(f"/proc/{child}/cmdline").read_bytes())
                fd = os.pidfd_open(child)
            except OSError:  # ended meanwhile
                continue
            if found is None:
                os.close(fd)
                continue
            self._watched[fd] = int(found.group(1))

    def run(self) -> None:
        try:
            while not self._stop_event.is_set():
                self._look()
                ready, _, _ = select.select(list(self._watched), [], [], LOOK_S)
                for fd in ready:
                    self.ended.append(self._watched.pop(fd))
                    os.close(fd)
        finally:
            for fd in self._watched:
                os.close(fd)


def _children(pid: int) -> set[int]:
    found: set[int] = set()
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            found |= {int(c) for c in (task / "children").read_text().split()}
        except OSError:
            pass
    return found


class LauncherWords(threading.Thread):
    """Passes one of the launcher's streams on (to `to`) as it comes, and reads in it what
    ended the job: the first badly ended process (mpiexec: its id and host; srun: its ranks,
    host and how), that a node's proxy is gone, or the node SLURM lost. A thread: the
    processes of a node cut off may hold the stream open long after the launcher ended."""

    def __init__(self, stream: IO[str], to: IO[str]) -> None:
        super().__init__(name="launcher-words", daemon=True)
        self.stream, self.to = stream, to
        self.bad_termination: tuple[int, str] | None = None
        self.proxy_gone = False
        self.tasks_ended: tuple[str, list[int], str] | None = None
        self.node_failure: str | None = None

    def run(self) -> None:
        for line in self.stream:
            self.to.write(line)
            self.to.flush()
            found = BAD_TERMINATION.search(line)
            if found and self.bad_termination is None:
                self.bad_termination = (int(found.group(1)), found.group(2))
            self.proxy_gone = self.proxy_gone or bool(PROXY_GONE.search(line))
            tasks = SRUN_TASKS_ENDED.search(line.rstrip("\n"))
            if tasks and self.tasks_ended is None:
                self.tasks_ended = (tasks.group(1), _task_list(tasks.group(2)), tasks.group(3))
            node = SRUN_NODE_FAILURE.search(line)
            if node and self.node_failure is None:
                self.node_failure = node.group(1)


def _task_list(text: str) -> list[int]:
    """srun's task list (`4`, `1-2,5`) as ranks."""
    ranks: list[int] = []
    for part in text.split(","):
        low, _, high = part.partition("-")
        ranks += range(int(low), int(high or low) + 1)
    return ranks


def supervise(command: list[str], out: Path) -> int:
    """Run the launcher `command` for the job whose results folder is `out`; its exit code.
    Ctrl-C reaches the launcher as before (it passes it on to the ranks); SIGTERM is passed on."""
    failure = out / FAILURE
    said = failure.stat().st_size if failure.exists() else 0
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)  # the launcher gets it from the terminal
    launcher = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, errors="replace")
    signal.signal(signal.SIGTERM, lambda signum, frame: launcher.send_signal(signum))
    watch = ProxyWatch(launcher.pid)
    if hasattr(os, "pidfd_open"):  # Linux
        watch.start()
    assert launcher.stdout is not None and launcher.stderr is not None
    streams = [LauncherWords(launcher.stdout, sys.stdout), LauncherWords(launcher.stderr, sys.stderr)]
    for stream in streams:
        stream.start()
    code = launcher.wait()
    signal.signal(signal.SIGINT, previous)
    for stream in streams:
        stream.join(LAST_WORDS_S)
    watch.stop()
    if watch.is_alive():
        watch.join()
    spoke = code in SPOKEN or (failure.exists() and failure.stat().st_size > said)
    if code != 0 and out.is_dir() and not spoke:
        bad = next((s.bad_termination for s in streams if s.bad_termination), None)
        gone = watch.ended[0] if any(s.proxy_gone for s in streams) and watch.ended else None
        node = next((s.node_failure for s in streams if s.node_failure), None)
        tasks = next((s.tasks_ended for s in streams if s.tasks_ended), None)
        what = (
            _srun_ended(out, code, node, tasks, het_components(os.environ))
            if node or tasks
            else _what_ended(out, code, bad, gone)
        )
        text = f"cfl_mpi: {what}; {resume_hint(out)}"
        print(text, flush=True)
        record_failure(out, text)
    return code


def _nodes(out: Path) -> list[tuple[str, list[dict]]] | None:
    """(host, its ranks: rank, pid, silos) of nodes.json, in its order; None where unreadable."""
    try:
        return [
            (node["host"], [{"rank": r["rank"], "pid": r["pid"], "silos": r["silos"]} for r in node["ranks"]])
            for node in json.loads((out / NODES).read_text())["nodes"]
        ]
    except (OSError, ValueError, KeyError, TypeError):
        return None


def het_components(env: Mapping[str, str]) -> list[int]:
    """The task count of each component of a heterogeneous SLURM job (the batch script's
    environment), or [] for a job of one component."""
    try:
        return [int(env[f"SLURM_NTASKS_HET_GROUP_{c}"]) for c in range(int(env.get("SLURM_HET_SIZE", "0")))]
    except (KeyError, ValueError):
        return []


def _srun_ended(
    out: Path, code: int, node: str | None, tasks: tuple[str, list[int], str] | None, components: list[int]
) -> str:
    """The node SLURM lost, or the ranks srun saw end first, with their silos from nodes.json
    where it tells them. srun numbers tasks within their component of a heterogeneous job
    (`components`: the task counts), so a task is the rank, of the component's ranks, that
    runs on the host it names."""
    ended = f"srun ended the job (exit {code}) before any rank could say why"
    nodes = _nodes(out) or []
    silos = {r["rank"]: r["silos"] for _, rs in nodes for r in rs}
    if node is not None:
        rs = next((rs for host, rs in nodes if host == node), [])
        named = f": {_ranks_and_silos([r['rank'] for r in rs], silos)} with it" if rs else ""
        return f"node {node} lost (SLURM: node failure){named}, and {ended}"
    assert tasks is not None
    host, numbers, how = tasks
    on_host = {r["rank"] for h, rs in nodes if h == host for r in rs}
    starts = [sum(components[:c]) for c in range(len(components))] or [0]
    sizes = components or [sys.maxsize]
    ranks = []
    for task in numbers:
        candidates = [start + task for start, size in zip(starts, sizes) if task < size]
        placed = [rank for rank in candidates if rank in on_host]
        if len(placed) != 1 and len(candidates) != 1:  # which component's task srun meant: unknown
            return f"{numbered('task', numbers)} of srun's step on {host} ended ({how}), and {ended}"
        ranks.append(placed[0] if len(placed) == 1 else candidates[0])
    return f"{_ranks_and_silos(ranks, silos)} on {host} ended ({how}), and {ended}"


def _ranks_and_silos(ranks: list[int], silos: dict[int, list[int]]) -> str:
    held = [s for r in ranks for s in silos.get(r, [])]
    return numbered("rank", ranks) + (f" ({numbered('silo', held)})" if held else "")


def _what_ended(out: Path, code: int, bad: tuple[int, str] | None, proxy: int | None) -> str:
    """The rank that died (by the process id the launcher named) or the node lost (by its proxy,
    the first to end), with ranks and silos from nodes.json, where they tell it."""
    ended = f"the launcher ended the job (exit {code}) before any rank could say why"
    nodes = _nodes(out)
    if nodes is None:
        return ended
    ranks = {(host, r["pid"]): (r["rank"], r["silos"]) for host, rs in nodes for r in rs}
    if bad is not None:
        pid, host = bad
        if (host, pid) not in ranks:
            return f"a process on {host} (pid {pid}) ended without a word, and {ended}"
        rank, silos = ranks[(host, pid)]
        return f"rank {rank} ({numbered('silo', silos)}) on {host} ended without a word, and {ended}"
    if proxy is not None and 0 <= proxy < len(nodes):
        host, rs = nodes[proxy]
        named = f"{numbered('rank', [r['rank'] for r in rs])} ({numbered('silo', [s for r in rs for s in r['silos']])})"
        return f"node {host} lost: its processes ended, {named} with them, and {ended}"
    return f"{ended} (a rank killed, or a node lost: the launcher's lines above say more)"


def out_of(command: list[str]) -> Path | None:
    """The results folder a launcher command line names (`--out DIR` or `--resume DIR`, the last)."""
    found = None
    for flag, value in zip(command, command[1:]):
        if flag in ("--out", "--resume"):
            found = Path(value)
    return found


USAGE = "usage: python -m cfl_mpi.commands.supervise -- LAUNCHER ... -m cfl_mpi.main CONFIG --out DIR"
DESCRIPTION = (
    "Run a launcher line (srun or mpirun) that starts cfl_mpi.main, watched: where the job ends without a "
    "word from cfl_mpi (a rank killed, a node lost), say which rank, node and silos, on the console and "
    "in failure.txt; exit with the launcher's code."
)


def main(argv: list[str] | None = None) -> None:
    """`python -m cfl_mpi.commands.supervise -- LAUNCHER ...`: run a launcher line that starts
    `cfl_mpi.main ... --out DIR` (srun in the sbatch scripts), watched; its exit code."""
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] in (["-h"], ["--help"]):
        print(f"{USAGE}\n\n{DESCRIPTION}")
        return
    command = args[1:] if args[:1] == ["--"] else args
    out = out_of(command)
    if not command or out is None:
        print(USAGE, file=sys.stderr)
        sys.exit(EXIT_CONFIG)
    sys.exit(supervise(command, out))


if __name__ == "__main__":
    main()
