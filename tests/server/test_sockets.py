"""The socket ``kvwatch serve`` binds before uvicorn: its connections send at once.

asyncio sets ``TCP_NODELAY`` on an accepted connection only when the listening
socket names its protocol as TCP. Without it a response written in two parts
(uvicorn writes the head, then the body) waits for the client's delayed ACK on
a kept-alive connection: about 40 ms a request.
"""

from __future__ import annotations

import asyncio
import socket

from kvwatch.sockets import listen_socket


def accepted_nodelay(sock: socket.socket) -> int:
    """TCP_NODELAY of the first connection an asyncio server on ``sock`` accepts."""

    async def main() -> int:
        seen: asyncio.Future = asyncio.get_running_loop().create_future()

        class Once(asyncio.Protocol):
            def connection_made(self, transport) -> None:
                raw = transport.get_extra_info("socket")
                seen.set_result(raw.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))
                transport.close()

        server = await asyncio.get_running_loop().create_server(Once, sock=sock)
        host, port = sock.getsockname()[:2]
        _, writer = await asyncio.open_connection(host, port)
        try:
            return await asyncio.wait_for(seen, 10)
        finally:
            writer.close()
            server.close()

    return asyncio.run(main())


def test_a_served_connection_sends_without_waiting_for_acks():
    sock = listen_socket("127.0.0.1", 0)
    sock.listen()
    assert sock.proto == socket.IPPROTO_TCP
    assert accepted_nodelay(sock) != 0


def test_a_socket_of_protocol_zero_would_not():
    """The check above can fail: the socket ``listen_socket`` made before."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    sock.listen()
    assert accepted_nodelay(sock) == 0
