"""The launcher, watched: `python -m cfl_mpi.launch` runs mpirun as its child and, where the job
ends without a word from cfl_mpi, says what happened, in failure.txt too.

That is the case of a rank, or a whole node, whose processes die at once (a crash, the OOM
killer): MPICH's Hydra then tears the job down within a fraction of a second, SIGKILLing every
rank before any can notice. Where a rank died, Hydra names its process id and host (`BAD
TERMINATION ... PID P RUNNING AT H`), which `nodes.json` (the server's record of each rank's
host, process id and silos) turns into the rank and its silos. Where a node's proxy died with
it, mpiexec says only `assert (!closed) failed`; the launcher's children are those proxies (or
the ssh that started each, `--proxy-id K` in either's command line), and the first of them to
end names the node, in the order of the hosts in `nodes.json`. A node cut off by its link leaves
the launcher unaware; the ranks' heartbeats catch that one (channel/liveness.py).
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
from pathlib import Path
from typing import IO

from .cli import EXIT_CONFIG
from .console import numbered
from .results import FAILURE, NODES, record_failure
from .runtime.checkpoint import resume_hint
from .runtime.stop import EXIT_INTERRUPTED

__all__ = ["LauncherWords", "ProxyWatch", "supervise"]

PROXY_ID = re.compile(rb"--proxy-id\x00(\d+)")
# What MPICH's mpiexec says when a rank ends badly, and when a node's proxy is gone.
BAD_TERMINATION = re.compile(r"PID (\d+) RUNNING AT (\S+)")
PROXY_GONE = re.compile(r"^\[mpiexec@[^]]*\] control_cb .*assert \(!closed\) failed")
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
    ended the job: the first badly ended process (its id and host), or that a node's proxy is
    gone. A thread: the processes of a node cut off may hold the stream open long after the
    launcher ended."""

    def __init__(self, stream: IO[str], to: IO[str]) -> None:
        super().__init__(name="launcher-words", daemon=True)
        self.stream, self.to = stream, to
        self.bad_termination: tuple[int, str] | None = None
        self.proxy_gone = False

    def run(self) -> None:
        for line in self.stream:
            self.to.write(line)
            self.to.flush()
            found = BAD_TERMINATION.search(line)
            if found and self.bad_termination is None:
                self.bad_termination = (int(found.group(1)), found.group(2))
            self.proxy_gone = self.proxy_gone or bool(PROXY_GONE.search(line))


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
        text = f"cfl_mpi: {_what_ended(out, code, bad, gone)}; {resume_hint(out)}"
        print(text, flush=True)
        record_failure(out, text)
    return code


def _what_ended(out: Path, code: int, bad: tuple[int, str] | None, proxy: int | None) -> str:
    """The rank that died (by the process id the launcher named) or the node lost (by its proxy,
    the first to end), with ranks and silos from nodes.json, where they tell it."""
    ended = f"the launcher ended the job (exit {code}) before any rank could say why"
    try:
        nodes = [(node["host"], node["ranks"]) for node in json.loads((out / NODES).read_text())["nodes"]]
        ranks = {(host, r["pid"]): (r["rank"], r["silos"]) for host, rs in nodes for r in rs}
    except (OSError, ValueError, KeyError, TypeError):
        return ended
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
