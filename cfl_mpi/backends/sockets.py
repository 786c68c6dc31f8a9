"""`python -m cfl_mpi.backends.sockets -n PROCESSES CONFIG [--out DIR] [--resume DIR] [--set key=value ...]`

A job on processes of one machine talking over local sockets, without MPI: process 0 is the
server, processes 1..N host the silos in the blocks an MPI job of N + 1 ranks gives them (the
same config and seed give its results, bit for bit). The job runner (job.py) does the rest:
this module is all a new transport needs, how the processes connect, gather, place themselves
and pass messages, and how one that dies is noticed (its connection closes without a goodbye).
"""

from __future__ import annotations

import argparse
import os
import selectors
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any, NoReturn

import numpy as np

from .. import console
from ..channel import SERVER, Channel, LocalChannel, LocalHub, Pending, RankLayout
from ..channel.local import Fetch, Frame, expected
from ..cli import exit_rank, run_arguments
from ..config import Config, check_world
from ..config.runtime import RuntimeConfig
from ..runtime.placement import Placement, usable_cores
from ..runtime.stop import defer_stop_signals
from ..wire.messages import MAX_HEADER_BYTES, Expect, ProtocolError, decode_header, read_header

DESCRIPTION = "Run a clustered federated learning job on processes of this machine that talk over local sockets."
ENV = "CFL_SOCKETS"  # a child's place in the job: "index size folder"
CONNECT_S, REPORT_S = 60.0, 10.0  # to connect at most; for the others of a failed process to report it
MAX_ARRAYS, MAX_ARRAY_BYTES = 4096, 1 << 34  # in one message: far above any model's state dict
MESSAGE, GOODBYE = 0, 1  # a frame's first field: a message follows, or the sender is done


def read_exactly(peer: socket.socket, size: int) -> bytearray:
    buffer, got = bytearray(size), 0
    view = memoryview(buffer)
    while got < size:
        n = peer.recv_into(view[got:])
        if n == 0:
            raise ConnectionError("its connection closed")
        got += n
    return buffer


def numbers(peer: socket.socket, count: int) -> list[int]:
    return np.frombuffer(read_exactly(peer, 8 * count), dtype="<u8").tolist()


class StreamFrame(Frame):
    """A message from another process: its header, and its arrays' bytes as they came."""

    def __init__(self, header: bytes, buffers: list[bytearray]) -> None:
        self.header, self.buffers = header, buffers

    def header_json(self, who: str) -> object:
        return read_header(self.header)

    def contents(self, src: int, who: str, expect: Expect, fetch: Fetch | None) -> tuple[dict[str, np.ndarray], dict]:
        layout, meta = decode_header(self.header, src, who, expect)
        sizes = [np.dtype(dtype).itemsize * int(np.prod(shape, dtype=np.int64)) for _, dtype, shape in layout]
        if sizes != [len(b) for b in self.buffers]:
            raise ProtocolError(f"{who} sent a payload of {expected(expect)} that does not fit its header")
        arrays = {
            name: np.frombuffer(b, dtype=dtype).reshape(shape) for (name, dtype, shape), b in zip(layout, self.buffers)
        }
        return arrays, meta


class SocketBackend:
    """The job runner's backend: this process is `index` of `size`, connected to every other."""

    def __init__(self, index: int, size: int, peers: dict[int, socket.socket]) -> None:
        self.index, self.size, self.peers, self.units = index, size, peers, ("process", "processes")
        self.layout: RankLayout | None = None
        self.locks = {j: threading.Lock() for j in peers}  # one writer at a time per connection

    @classmethod
    def connect(cls, index: int, size: int, folder: Path) -> SocketBackend:
        """Listen at folder/<index>; connect to every lower index, and take every higher one's."""
        listener = socket.socket(socket.AF_UNIX)
        listener.bind(str(folder / str(index)))
        listener.listen(size)
        listener.settimeout(CONNECT_S)
        peers, deadline = {}, time.monotonic() + CONNECT_S
        for j in range(index):
            peer = socket.socket(socket.AF_UNIX)
            while peer.connect_ex(str(folder / str(j))) != 0:
                if time.monotonic() > deadline:
                    raise ConnectionError(f"process {j} did not listen within {CONNECT_S:g} s")
                time.sleep(0.05)
            peer.sendall(np.array([index], dtype="<u8").tobytes())
            peers[j] = peer
        for _ in range(index + 1, size):
            peer, _ = listener.accept()
            peer.settimeout(None)
            (j,) = numbers(peer, 1)
            if not index < j < size or j in peers:
                raise ConnectionError(f"a process connected as process {j}")
            peers[j] = peer
        listener.close()
        return cls(index, size, peers)

    def parties(self, cfg: Config) -> list[list[int]]:
        self.layout = RankLayout(cfg.silos, check_world(cfg, self.size))
        return [[SERVER] if r == 0 else list(self.layout.silos_on(r)) for r in range(self.size)]

    def all_gather(self, data: bytes) -> list[bytes]:
        def write() -> None:
            for peer in self.peers.values():
                peer.sendall(len(data).to_bytes(8, "little") + data)

        with ThreadPoolExecutor(1) as writer:  # the writes go while the reads take the others'
            sent = writer.submit(write)
            every = [data if j == self.index else bytes(self._read(j)) for j in range(self.size)]
            sent.result()
        return every

    def _read(self, j: int) -> bytearray:  # a gather's part: its size, then its bytes
        return read_exactly(self.peers[j], *numbers(self.peers[j], 1))

    def place(self, silos: int) -> Placement:
        """One node: every process's silos share this machine's cores."""
        hosted = [int.from_bytes(b, "little") for b in self.all_gather(silos.to_bytes(8, "little"))]
        local = sum(1 for h in hosted[: self.index] if h) if silos else -1
        return Placement(self.index, sum(hosted), local, silos, usable_cores())

    def send(self, process: int, kind: int, src: int = 0, dest: int = 0, header: bytes = b"", arrays: Any = ()) -> None:
        """A frame to `process`: its kind, the parties, the header's and the arrays' sizes, then
        the header and each array's bytes (addresses as two's complement: SERVER is -1)."""
        fields = [kind, src, dest, len(header), len(arrays), *(a.nbytes for a in arrays)]
        head = np.array(fields, dtype="<i8").view("<u8")
        with self.locks[process]:
            self.peers[process].sendall(head.tobytes() + header)
            for a in arrays:
                self.peers[process].sendall(np.ascontiguousarray(a).reshape(-1).view(np.uint8).data)

    @contextmanager
    def channels(
        self, cfg: Config, hub: LocalHub, hosts: list[str], lost: Callable[[str], None]
    ) -> Iterator[Callable[[int], Channel]]:
        """A thread files what arrives from the other processes in the hub until each said
        goodbye; one that closes its connection before is lost."""
        assert self.layout is not None, "parties() places the silos first"
        layout, rt = self.layout, cfg.runtime
        receiving = threading.Thread(target=self._receive, args=(hub, layout, lost), name="sockets-inbox", daemon=True)
        receiving.start()
        yield lambda address: SocketChannel(address, self, layout, hub, rt)
        for j in self.peers:
            self.send(j, GOODBYE)
        receiving.join()

    def _receive(self, hub: LocalHub, layout: RankLayout, lost: Callable[[str], None]) -> None:
        selector = selectors.DefaultSelector()
        for j, peer in self.peers.items():
            selector.register(peer, selectors.EVENT_READ, j)
        open_peers = set(self.peers)
        while open_peers:
            for key, _ in selector.select():
                try:
                    if self._take(key.data, hub, layout):
                        open_peers.discard(key.data)
                        selector.unregister(key.fileobj)
                except (ConnectionError, ProtocolError) as err:
                    lost(f"process {key.data} is lost: {err}")  # ends this process
                    return

    def _take(self, j: int, hub: LocalHub, layout: RankLayout) -> bool:
        """File process j's next frame; whether it was its goodbye."""
        kind, src, dest, header_size, count = numbers(self.peers[j], 5)
        if kind == GOODBYE:
            return True
        senders = [SERVER] if j == 0 else list(layout.silos_on(j))
        receivers = [SERVER] if self.index == 0 else list(layout.silos_on(self.index))
        src, dest = np.array([src, dest], dtype="<u8").view("<i8").tolist()
        if not (kind == MESSAGE and src in senders and dest in receivers and header_size <= MAX_HEADER_BYTES):
            raise ProtocolError(f"a frame of kind {kind} from {src} to {dest} with a header of {header_size} bytes")
        sizes = numbers(self.peers[j], count) if count <= MAX_ARRAYS else [MAX_ARRAY_BYTES + 1]
        if any(size > MAX_ARRAY_BYTES for size in sizes):
            raise ProtocolError(f"a message of {count} arrays, of up to {max(sizes)} bytes")
        header = bytes(read_exactly(self.peers[j], header_size))
        hub.deliver(src, dest, StreamFrame(header, [read_exactly(self.peers[j], size) for size in sizes]))
        return False

    def name(self, process: int) -> str:
        return f"process {process}"

    def who(self, role: str) -> str:
        return f"process {self.index} ({role})"

    def abort(self) -> NoReturn:
        sys.stderr.flush()
        os._exit(1)  # the others see its connections close; the launcher ends them

    def finish(self) -> None:
        return None  # every process said goodbye before its channels closed

    def exit(self, code: int) -> NoReturn:
        exit_rank(code)


class Sent(Pending):
    """A message written to its connection (the receiving process reads every frame)."""

    def wait(self) -> None:
        return None

    def done(self) -> bool:
        return True


class SocketChannel(LocalChannel):
    """A party whose co-located peers share the hub; the others get a frame on their process's connection."""

    def __init__(self, me: int, backend: SocketBackend, layout: RankLayout, hub: LocalHub, rt: RuntimeConfig) -> None:
        super().__init__(me, hub, rt.message_timeout_s, rt.max_poll_sleep_ms / 1000)
        self.backend, self.layout = backend, layout

    def _post(self, dest: int, header: bytes, arrays: list[np.ndarray]) -> Pending:
        process = self.layout.rank_of(dest)
        if process == self.backend.index:
            return super()._post(dest, header, arrays)
        self.backend.send(process, MESSAGE, self.me, dest, header, arrays)
        return Sent()

    def _post_all(self, dests: list[int], header: bytes, arrays: list[np.ndarray]) -> Pending:
        here = [d for d in dests if self.layout.rank_of(d) == self.backend.index]
        for d in dests:
            if d not in here:
                self._post(d, header, arrays)
        return super()._post_all(here, header, arrays) if here else Sent()

    def _processes(self, dests: list[int]) -> int:
        """A copy for each party of another process, one for those of this one."""
        remote = sum(self.layout.rank_of(d) != self.backend.index for d in dests)
        return remote + (remote < len(dests))


def arguments() -> argparse.ArgumentParser:
    parser = run_arguments("python -m cfl_mpi.backends.sockets", DESCRIPTION)
    parser.add_argument(
        "-n", "--processes", type=int, required=True, help="the server's and the silos' (2 to silos + 1)"
    )
    return parser


def child(argv: list[str]) -> NoReturn:
    """A process of the job, its place in $CFL_SOCKETS."""
    from .job import run_job

    defer_stop_signals()
    index, size, folder = os.environ[ENV].split(" ", 2)
    args = arguments().parse_args(argv)
    console.setup(console.level_of(args.quiet, args.verbose))
    run_job(args, SocketBackend.connect(int(index), int(size), Path(folder)))


def main(argv: list[str] | None = None) -> NoReturn:
    """Start the processes, forward SIGTERM to them, end them all when one fails; exit with the
    job's code (the first failing process's)."""
    argv = sys.argv[1:] if argv is None else argv
    size = arguments().parse_args(argv).processes
    with tempfile.TemporaryDirectory(prefix="cfl-sockets-") as folder:
        command = [sys.executable, "-m", "cfl_mpi.backends.sockets", *argv]
        children = [subprocess.Popen(command, env={**os.environ, ENV: f"{i} {size} {folder}"}) for i in range(size)]

        def forward(signum: int, frame: object) -> None:
            for c in children:
                c.send_signal(signum)

        signal.signal(signal.SIGTERM, forward)
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the children themselves
        code = 0
        while any(c.poll() is None for c in children) and not code:
            time.sleep(0.1)
            code = next((c.returncode for c in children if c.returncode), 0)
        deadline = time.monotonic() + REPORT_S
        for c in children:  # after a failure the others end on their own (they report it), or are ended
            try:
                c.wait(timeout=max(0.0, deadline - time.monotonic()) if code else None)
            except subprocess.TimeoutExpired:
                c.kill()
        codes = [c.wait() for c in children]
    sys.exit(code or next((c for c in codes if c), 0))


if __name__ == "__main__":
    child(sys.argv[1:]) if ENV in os.environ else main()
