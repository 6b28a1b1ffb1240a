"""Rank 0's direct line to every other rank: one TCP socket each, for commands and small all-reduces.

Commands go from rank 0 down each socket as raw int64 bytes (plan.py's header, then its
payload); rank 0 does not wait for them to arrive. The custom all-reduce of CPU ranks (the
default; `--disable-custom-all-reduce` uses torch.distributed's gloo instead) is a star: every
rank sends its tensor's bytes to rank 0, which adds them in rank order and sends the sum back,
so every rank ends with the same bits. Worked example, 3 ranks holding [1.], [2.], [4.]:

    rank 1 -> 0: [2.]   rank 2 -> 0: [4.]   rank 0: 1 + 2 + 4 = [7.]   0 -> 1, 0 -> 2: [7.]

For the small activations of a decode step this is one round trip, where gloo's all-reduce hands
the tensor through its worker and I/O threads on both sides (measured here on 2 busy cores, 16 x 64
float32: about 35 us against 270-480 us). Every socket operation has --dist-timeout; a peer that
dies closes its socket, and the pending receive fails at once.
"""
from __future__ import annotations

import socket
import struct

import torch


class PeerGone(ConnectionError):
    """The other end closed its socket (its process ended)."""


def _bytes(t: torch.Tensor) -> memoryview:
    return memoryview(t.view(torch.uint8).numpy()).cast("B")  # the tensor's own storage, any dtype


def _recv_into(s: socket.socket, m: memoryview) -> None:
    got = 0
    while got < len(m):
        n = s.recv_into(m[got:])
        if not n:
            raise PeerGone("the peer rank closed its connection")
        got += n


class Star:
    """Rank 0 holds one socket per other rank (index r-1); every other rank holds one to rank 0."""

    def __init__(self, rank: int, ranks: int, store, timeout_s: float) -> None:
        self.rank, self.ranks = rank, ranks
        if rank == 0:
            with socket.socket() as ls:
                ls.bind(("127.0.0.1", 0))
                ls.listen(ranks)
                ls.settimeout(timeout_s)
                store.set("star/port", str(ls.getsockname()[1]))
                peers: dict[int, socket.socket] = {}
                while len(peers) < ranks - 1:
                    s, _ = ls.accept()
                    s.settimeout(timeout_s)
                    head = bytearray(8)
                    _recv_into(s, memoryview(head))
                    peers[struct.unpack("<q", head)[0]] = s
            self.socks = [peers[r] for r in range(1, ranks)]
        else:
            s = socket.create_connection(("127.0.0.1", int(store.get("star/port"))), timeout=timeout_s)
            s.settimeout(timeout_s)
            s.sendall(struct.pack("<q", rank))
            self.socks = [s]
        for s in self.socks:
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def send(self, *tensors: torch.Tensor) -> None:
        """Rank 0: the tensors' bytes, in order, to every other rank."""
        data = b"".join(bytes(_bytes(t)) for t in tensors)
        for s in self.socks:
            s.sendall(data)

    def recv_into(self, t: torch.Tensor) -> None:
        """Other ranks: fill t (contiguous, CPU) from rank 0."""
        if t.numel():
            _recv_into(self.socks[0], _bytes(t))

    def all_reduce(self, t: torch.Tensor) -> torch.Tensor:
        """Sum a contiguous CPU tensor over the ranks, in place (rank order: the same bits everywhere)."""
        if self.rank == 0:
            part = torch.empty_like(t)
            for s in self.socks:
                _recv_into(s, _bytes(part))
                t += part
            data = _bytes(t)
            for s in self.socks:
                s.sendall(data)
        else:
            s = self.socks[0]
            s.sendall(_bytes(t))
            _recv_into(s, _bytes(t))
        return t

    def close(self) -> None:
        for s in self.socks:
            s.close()
