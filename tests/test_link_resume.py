"""The CPU link's receive that times out keeps the message and the next one resumes it whole.

A socket link over TCP loopback (frames inline), fed by hand: the bytes of a
two-frame message are written up to the first byte of the second frame, a
receive times out there, the rest is written, and the next receive must
return exactly the two frames sent.
"""

import socket
import time

import pytest

from rlinf.scheduler.transports.cpu_link import SocketLink

A, B = b"a" * 3000, b"b" * 5000


def _tcp_pair():
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(10)  # accept: bounded (the connection is made already)
    try:
        out = socket.create_connection(listener.getsockname(), timeout=10)
        inc, _ = listener.accept()
    finally:
        listener.close()
    return out, inc


def _wire(frames) -> bytes:
    """The bytes a link writes for ``frames``."""
    out, inc = _tcp_pair()
    sender = SocketLink(out, local=False)
    sender.send(frames, time.monotonic() + 10)
    inc.settimeout(10)
    data = b""
    sender.sock.shutdown(socket.SHUT_WR)
    while True:
        chunk = inc.recv(1 << 16)
        if not chunk:
            break
        data += chunk
    inc.close()
    sender.sock.close()
    return data


@pytest.mark.timeout(60)
@pytest.mark.parametrize("into", [False, True], ids=["recv", "recv_into"])
def test_a_receive_that_times_out_at_a_frame_boundary_resumes_with_the_frames_sent(into):
    raw = _wire([A, B])
    split = len(raw) - len(B)  # the first byte of the second frame
    feed, inc = _tcp_pair()
    link = SocketLink(inc, local=False)
    try:
        feed.sendall(raw[:split])
        bufs = [bytearray(len(A)), bytearray(len(B))]
        with pytest.raises(TimeoutError):
            if into:
                link.recv_into(bufs, time.monotonic() + 0.2)
            else:
                link.recv(time.monotonic() + 0.2)
        feed.sendall(raw[split:])
        if into:
            link.recv_into(bufs, time.monotonic() + 10)
            got = [bytes(b) for b in bufs]
        else:
            _raw, frames = link.recv(time.monotonic() + 10)
            got = [bytes(f) for f in frames]
        assert got == [A, B]
    finally:
        feed.close()
        link.sock.close()
