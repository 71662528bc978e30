"""A free TCP port on loopback, for the servers and process groups the tests start (S3 servers,
DDP rendezvous). The port is free when returned; the caller binds it soon after."""

from __future__ import annotations

import socket


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]
