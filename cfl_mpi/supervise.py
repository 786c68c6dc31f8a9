"""The launcher, watched: `python -m cfl_mpi.launch` runs mpirun as its child and, where the job
ends without a word from cfl_mpi, says what happened, in failure.txt too.

That is the case of a node whose processes all die at once (a crash, the OOM killer): MPICH's
Hydra keeps a proxy on every node, and when one goes, mpiexec tears the job down within a
fraction of a second, SIGKILLing every rank before any can notice, and says only
`assert (!closed) failed`. The launcher's children are those proxies (or the ssh that started
each, `--proxy-id K` in either's command line): the first of them to end names the node, in the
order of the job's hosts the server wrote to `nodes.json`. A node cut off by its link leaves the
launcher unaware; the ranks' heartbeats catch that one (channel/liveness.py).
"""

from __future__ import annotations

import json
import os
import re
import select
import signal
import subprocess
import threading
from pathlib import Path

from .cli import EXIT_CONFIG
from .console import spans
from .results import FAILURE, NODES, record_failure
from .runtime.checkpoint import resume_hint
from .runtime.stop import EXIT_INTERRUPTED

__all__ = ["ProxyWatch", "supervise"]

PROXY_ID = re.compile(rb"--proxy-id\x00(\d+)")
LOOK_S = 0.2  # how often the watch looks for the launcher's new children
# Exit codes of a job whose ranks said why on the console: a config error, Ctrl-C.
SPOKEN = (EXIT_CONFIG, EXIT_INTERRUPTED)


class ProxyWatch(threading.Thread):
    """Watches the children of the launcher `pid` that carry a proxy id, each through a pidfd
    (readable the moment its process ends), and remembers the id of the first to end."""

    def __init__(self, pid: int) -> None:
        super().__init__(name="proxy-watch", daemon=True)
        self.pid = pid
        self.first_gone: int | None = None
        self._watched: dict[int, tuple[int, int]] = {}  # pidfd -> (pid, proxy id)
        self._ended = threading.Event()

    def stop(self) -> None:
        self._ended.set()

    def _look(self) -> None:
        """Open a pidfd for each proxy child not yet watched."""
        seen = {pid for pid, _ in self._watched.values()}
        for child in _children(self.pid) - seen:
            try:
                found = PROXY_ID.search(Path(f"/proc/{child}/cmdline").read_bytes())
                fd = os.pidfd_open(child)
            except OSError:  # ended meanwhile
                continue
            if found is None:
                os.close(fd)
                continue
            self._watched[fd] = (child, int(found.group(1)))

    def run(self) -> None:
        try:
            while not self._ended.is_set() and self.first_gone is None:
                self._look()
                ready, _, _ = select.select(list(self._watched), [], [], LOOK_S)
                if ready:  # the first to end: the others end only after it, torn down by mpiexec
                    self.first_gone = self._watched[ready[0]][1]
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


def supervise(command: list[str], out: Path) -> int:
    """Run the launcher `command` for the job whose results folder is `out`; its exit code.
    Ctrl-C reaches the launcher as before (it passes it on to the ranks); SIGTERM is passed on."""
    failure = out / FAILURE
    said = failure.stat().st_size if failure.exists() else 0
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)  # the launcher gets it from the terminal
    launcher = subprocess.Popen(command)
    signal.signal(signal.SIGTERM, lambda signum, frame: launcher.send_signal(signum))
    watch = ProxyWatch(launcher.pid)
    if hasattr(os, "pidfd_open"):  # Linux
        watch.start()
    code = launcher.wait()
    watch.stop()
    if watch.is_alive():
        watch.join()
    signal.signal(signal.SIGINT, previous)
    spoke = code in SPOKEN or (failure.exists() and failure.stat().st_size > said)
    if code != 0 and out.is_dir() and not spoke:
        text = f"cfl_mpi: {_what_ended(out, code, watch.first_gone)}; {resume_hint(out)}"
        print(text, flush=True)
        record_failure(out, text)
    return code


def _what_ended(out: Path, code: int, proxy: int | None) -> str:
    """The node that went first, with its ranks and silos, where the watch and nodes.json tell it."""
    ended = f"the launcher ended the job (exit {code}) before any rank could say why"
    try:
        nodes = json.loads((out / NODES).read_text())["nodes"]
    except (OSError, ValueError, KeyError, TypeError):
        return ended
    if proxy is None or not 0 <= proxy < len(nodes):
        return f"{ended} (a rank killed, or a node lost: the launcher's lines above say more)"
    node = nodes[proxy]
    ranks, silos = node["ranks"], node["silos"]
    return (
        f"node {node['host']} lost: its processes ended, ranks {spans(ranks)} (silos {spans(silos)}) with them, "
        f"and {ended}"
    )
