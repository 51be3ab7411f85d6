"""Listening sockets for the servers kvwatch runs: bind first, then serve.

Binding before the server starts means the caller knows the port at once,
so port 0 (a free port, chosen by the kernel) needs no guess made in advance
that another process could take in the meantime.
"""

from __future__ import annotations

import socket


def listen_socket(host: str, port: int) -> socket.socket:
    """A TCP socket bound to ``host:port``, as uvicorn would bind it; port 0 takes a free one.

    The caller binds, so it knows the port before the server runs: ``--port 0``
    cannot race another process for a port picked in advance.

    The protocol is named (``IPPROTO_TCP``, as ``getaddrinfo`` names it when asyncio
    binds a socket itself): asyncio turns Nagle's algorithm off (``TCP_NODELAY``) only
    on connections whose socket says TCP. With protocol 0 every answer on a kept-alive
    connection waited for the client's delayed ACK, about 40 ms a request.
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
    except OSError:
        sock.close()
        raise
    sock.set_inheritable(True)
    return sock


def socket_url(sock: socket.socket) -> str:
    host, port = sock.getsockname()[:2]
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"
