"""Raw HTTP/1.1 over asyncio streams for scripts/soak.py (standard library only).

Raw rather than http.client so that the soak can send what a well-behaved client never would
(broken JSON, a body larger than the limit, bytes that are not UTF-8) and drop a connection at
an exact point of a stream. One connection per request (`Connection: close`). A plain socket
rather than asyncio's streams: when the server answers a too-large body (413) and closes while
the body is still being written, the write fails, and a StreamReader would then refuse to hand
over the answer it already holds; the socket still gives what arrived.
"""

import asyncio
import json
import socket
import struct


class SockReader:
    """readline / readexactly / read over a non-blocking socket."""

    def __init__(self, sock):
        self.sock = sock
        self.buf = b""
        self.eof = False

    async def _fill(self):
        data = await asyncio.get_running_loop().sock_recv(self.sock, 65536)
        if not data:
            self.eof = True
        self.buf += data

    async def readline(self):
        while b"\n" not in self.buf and not self.eof:
            await self._fill()
        i = self.buf.find(b"\n")
        cut = len(self.buf) if i < 0 else i + 1
        line, self.buf = self.buf[:cut], self.buf[cut:]
        return line

    async def readexactly(self, n):
        while len(self.buf) < n and not self.eof:
            await self._fill()
        if len(self.buf) < n:
            raise asyncio.IncompleteReadError(self.buf, n)
        data, self.buf = self.buf[:n], self.buf[n:]
        return data

    async def read(self, n):
        if not self.buf and not self.eof:
            await self._fill()
        data, self.buf = self.buf[:n], self.buf[n:]
        return data


class Response:
    def __init__(self, status, headers, reader):
        self.status = status
        self.headers = headers
        self.reader = reader

    def close(self, abort=False):
        """Closes the connection; `abort` resets it (RST) instead of a clean FIN."""
        close(self.reader.sock, abort)

    async def chunks(self):
        """Yields the body as it arrives (chunked or Content-Length or until EOF)."""
        te = self.headers.get("transfer-encoding", "").lower()
        if "chunked" in te:
            while True:
                size_line = await self.reader.readline()
                if not size_line:
                    raise ConnectionError("the connection closed inside a chunked body")
                size = int(size_line.split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    # Trailers, then the empty line.
                    while (await self.reader.readline()) not in (b"\r\n", b"\n", b""):
                        pass
                    return
                data = await self.reader.readexactly(size)
                await self.reader.readexactly(2)
                yield data
        elif "content-length" in self.headers:
            left = int(self.headers["content-length"])
            while left > 0:
                data = await self.reader.read(min(left, 65536))
                if not data:
                    raise ConnectionError("the connection closed inside the body")
                left -= len(data)
                yield data
        else:
            while True:
                data = await self.reader.read(65536)
                if not data:
                    return
                yield data

    async def body(self):
        parts = []
        async for c in self.chunks():
            parts.append(c)
        return b"".join(parts)

    async def lines(self):
        """Yields the body's lines (without line endings), for server-sent events."""
        buf = b""
        async for c in self.chunks():
            buf += c
            while b"\n" in buf:
                line, buf = buf.split(b"\n", 1)
                yield line.rstrip(b"\r").decode("utf-8", "replace")
        if buf:
            yield buf.rstrip(b"\r").decode("utf-8", "replace")


def close(sock, abort=False):
    if sock.fileno() < 0:
        return
    if abort:
        # SO_LINGER with a zero timeout: close() sends RST and drops what is unsent.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    sock.close()


async def request(host, port, method, path, body=None, headers=None, content_type="application/json"):
    """Sends one request and returns the Response once its head has arrived.

    `body` is bytes, a str, or any other value (sent as JSON). The body is written concurrently
    with reading the answer: a server may answer (413) before it has read all of a large body,
    and the client must still see that answer.
    """
    if body is not None and not isinstance(body, (bytes, str)):
        body = json.dumps(body)
    if isinstance(body, str):
        body = body.encode()
    loop = asyncio.get_running_loop()
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setblocking(False)
    sender = None
    try:
        await loop.sock_connect(sock, (host, port))
        head = [f"{method} {path} HTTP/1.1", f"Host: {host}:{port}", "Connection: close"]
        if body is not None:
            head.append(f"Content-Type: {content_type}")
            head.append(f"Content-Length: {len(body)}")
        for k, v in (headers or {}).items():
            head.append(f"{k}: {v}")
        data = ("\r\n".join(head) + "\r\n\r\n").encode() + (body or b"")

        async def send():
            try:
                await loop.sock_sendall(sock, data)
            except OSError:
                pass  # the server answered early and closed; its answer is still read

        sender = asyncio.ensure_future(send())
        reader = SockReader(sock)
        status_line = await reader.readline()
        if not status_line:
            raise ConnectionError("the server closed the connection without answering")
        parts = status_line.decode("latin-1").split(" ", 2)
        status = int(parts[1])
        hdrs = {}
        while True:
            line = await reader.readline()
            if line in (b"\r\n", b"\n", b""):
                break
            k, _, v = line.decode("latin-1").partition(":")
            hdrs[k.strip().lower()] = v.strip()
        if not sender.done():
            sender.cancel()
        await asyncio.gather(sender, return_exceptions=True)
        return Response(status, hdrs, reader)
    except BaseException:
        if sender is not None:
            sender.cancel()
        close(sock, abort=True)
        raise
