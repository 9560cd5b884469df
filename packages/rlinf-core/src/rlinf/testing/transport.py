"""``TransportConformance``: what every transport plugin must do.

The suite starts a real second process (``rlinf.testing._echo_peer``) that
listens with the transport under test and echoes messages back, then checks
the ``Transport``/``Link`` contract from this process: authentication (a
process with another cluster secret is refused), handshake, frames of
every size, raw flags, order, ``recv_into`` with size checks, both
directions, deadlines (a peer that stops reading: bounded buffering, and every
send ends by its own deadline), and what happens when the peer dies.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

MiB = 1 << 20


class _Peer:
    """An echo peer in its own process (``module`` runs it); its endpoint is its first line of output."""

    def __init__(self, name: str, env: dict, module: str = "rlinf.testing._echo_peer", args: tuple = ()):
        self.proc = subprocess.Popen(
            [sys.executable, "-m", module, name, *args],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env,
        )
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"the echo peer for transport {name!r} did not start (exit code {self.proc.wait(30)})")
        self.endpoint = json.loads(line)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.stdin.close()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()


class TransportConformance:
    """Subclass and set ``transport_name`` (and ``peer_env`` to add environment variables).

    pytest collects the subclass's ``test_*`` methods; each gets a fresh
    ``transport`` (skipped when the plugin's ``check`` says it is unusable here)
    and ``peer``, a second process listening with the same transport that
    echoes each message back (the ``hello`` first; ``die`` makes it exit with
    code 17; ``hold`` makes it stop reading).  Override ``connect`` or
    ``deadline`` when the transport needs other arguments or more time.

    Example:
        ```python
        class TestMyTransport(TransportConformance):
            transport_name = "my-transport"
            big_message = 4 << 20  # 4 MiB: a slow transport
        ```
    """

    transport_name: str = ""
    peer_env: dict = {}
    #: largest message the suite sends; lower it for slow transports
    big_message = 16 * MiB

    @pytest.fixture
    def transport(self):
        from rlinf.scheduler.plugins import get_registry

        entry = get_registry().transport(self.transport_name)
        reason = entry.unusable_reason()
        if reason:
            pytest.skip(f"transport {self.transport_name!r} is not usable here: {reason}")
        t = entry.descriptor.factory()
        yield t
        t.close()

    @pytest.fixture
    def peer(self):
        from rlinf.scheduler.base.security import cluster_secret

        cluster_secret()  # made here if absent, so the peer inherits the same one
        env = dict(os.environ, **self.peer_env)
        p = _Peer(self.transport_name, env)
        yield p
        p.close()

    def connect(self, transport, peer, hello=b"conformance"):
        """Open a link to the echo peer; every test connects through this.

        Override it when the transport needs more than ``connect(endpoint, hello, deadline)`` (options, a
        device); the link returned must implement ``Link``.  Returns the link.

        Args:
            transport (Transport): the transport under test (the ``transport`` fixture).
            peer (_Peer): the echo peer (the ``peer`` fixture); ``peer.endpoint`` is what its listener
                published.
            hello (bytes): the handshake payload the listener receives first (the peer echoes it back first).
        """
        return transport.connect(peer.endpoint, hello, time.monotonic() + 30)

    @staticmethod
    def deadline(seconds=30.0):
        """The ``time.monotonic()`` deadline ``seconds`` from now that the suite gives each send and receive.

        Override it (or pass a longer ``seconds`` in a subclass's own tests) for a transport slower than
        the default allows.

        Args:
            seconds (float): how long from now.
        """
        return time.monotonic() + seconds

    # -- the contract ----------------------------------------------------------------
    def test_endpoint_is_json(self, peer):
        """The endpoint a listener publishes is a JSON object that survives a round trip through JSON.

        Fixture: ``peer`` (the echo process, whose first line of output is its endpoint).
        """
        assert isinstance(peer.endpoint, dict) and json.loads(json.dumps(peer.endpoint)) == peer.endpoint

    def test_hello_reaches_the_listener(self, transport, peer):
        """The ``hello`` given to ``connect`` is the first message the listener receives, before any send.

        Fixtures: ``transport`` (the plugin's transport, built by its factory) and ``peer`` (the echo process).
        """
        link = self.connect(transport, peer, b"hi there")
        link.send([b"hello?"], self.deadline())
        raw, frames = link.recv(self.deadline())
        assert [bytes(f) for f in frames] == [b"hi there", b"hello?"] and raw is False

    def test_a_process_with_another_secret_is_refused(self, transport, peer, monkeypatch):
        """The listener authenticates (``rlinf.scheduler.base.security``): another cluster's process cannot connect.

        A connection made with another cluster secret raises ``ConnectionError`` (at connect or at the first
        send or receive, never echoed, never showing the right secret), and the listener keeps serving its
        own cluster.  Fixtures: ``transport``, ``peer`` and ``monkeypatch`` (which swaps the secret).
        """
        from rlinf.scheduler.base.security import SECRET_ENV

        right = os.environ[SECRET_ENV]
        monkeypatch.setenv(SECRET_ENV, "another-cluster-" + "0" * 32)
        with pytest.raises(ConnectionError) as refused:
            link = self.connect(transport, peer, b"intruder")
            link.send([b"hello?"], self.deadline(5))  # refused only now: still must never be echoed
            link.recv(self.deadline(5))
        assert right not in str(refused.value)
        monkeypatch.setenv(SECRET_ENV, right)
        link = self.connect(transport, peer, b"member")  # the listener still serves its cluster
        link.send([b"hello?"], self.deadline())
        assert [bytes(f) for f in link.recv(self.deadline())[1]] == [b"member", b"hello?"]

    def test_frames_of_every_size_round_trip(self, transport, peer):
        """Frames of 0 bytes to ``big_message`` bytes in one message come back byte for byte.

        Fixtures: ``transport`` (the plugin's transport, built by its factory) and ``peer`` (the echo process).
        """
        link = self.connect(transport, peer)
        frames = [b"", b"x", bytes(range(256)) * 4, os.urandom(MiB + 3), bytearray(self.big_message)]
        frames[-1][::4096] = b"\x07" * len(frames[-1][::4096])
        link.send(frames, self.deadline())
        raw, back = link.recv(self.deadline())
        assert [bytes(f) for f in back] == [bytes(f) for f in frames]

    def test_raw_flag_and_memoryviews(self, transport, peer):
        """``send`` takes memoryviews (of any item size) and the ``raw`` flag arrives with the message.

        Fixtures: ``transport`` (the plugin's transport, built by its factory) and ``peer`` (the echo process).
        """
        import array

        link = self.connect(transport, peer)
        data = array.array("d", [1.5, -2.0, 3.25])
        link.send([memoryview(b"fp"), memoryview(data)], self.deadline(), raw=True)
        raw, back = link.recv(self.deadline())
        assert raw is True and bytes(back[1]) == data.tobytes()

    def test_messages_keep_their_order(self, transport, peer):
        """200 messages of growing size sent back to back are received in the order sent.

        Fixtures: ``transport`` (the plugin's transport, built by its factory) and ``peer`` (the echo process).
        """
        link = self.connect(transport, peer)
        for i in range(200):
            link.send([str(i).encode(), bytes(i * 97)], self.deadline())
        got = [bytes(link.recv(self.deadline())[1][0]) for _ in range(200)]
        assert got == [str(i).encode() for i in range(200)]

    def test_recv_into_fills_and_checks_sizes(self, transport, peer):
        """``recv_into`` fills the caller's buffers and returns the raw flag; a message whose frames do not
        match the buffers' sizes raises ``ValueError`` and is consumed, not left for the next receive.

        Fixtures: ``transport`` (the plugin's transport, built by its factory) and ``peer`` (the echo process).
        """
        link = self.connect(transport, peer)
        link.send([b"abcd", bytes(range(100))], self.deadline(), raw=True)
        link.send([b"ab"], self.deadline())
        link.send([b"ok"], self.deadline())
        head, body = bytearray(4), bytearray(100)
        assert link.recv_into([head, body], self.deadline()) is True
        assert bytes(head) == b"abcd" and bytes(body) == bytes(range(100))
        with pytest.raises(ValueError):
            link.recv_into([bytearray(5)], self.deadline())  # wrong size: consumed, not left behind
        out = bytearray(2)
        link.recv_into([out], self.deadline())
        assert bytes(out) == b"ok"

    def test_both_directions_at_once(self, transport, peer):
        """Large messages in flight both ways on one link: no deadlock.

        Three ``big_message`` sends go out before any reply is read, while the peer echoes them back.
        Fixtures: ``transport`` (the plugin's transport, built by its factory) and ``peer`` (the echo process).
        """
        link = self.connect(transport, peer)
        big = bytes(self.big_message)
        for _ in range(3):
            link.send([b"m", big], self.deadline(60))
        for _ in range(3):
            assert len(link.recv(self.deadline(60))[1][1]) == len(big)

    def test_recv_deadline(self, transport, peer):
        """A receive with nothing to read raises ``TimeoutError`` at its deadline, and the link still works.

        Fixtures: ``transport`` (the plugin's transport, built by its factory) and ``peer`` (the echo process).
        """
        link = self.connect(transport, peer)
        start = time.monotonic()
        with pytest.raises(TimeoutError):
            link.recv(time.monotonic() + 0.3)
        assert time.monotonic() - start < 5
        link.send([b"still works"], self.deadline())
        assert bytes(link.recv(self.deadline())[1][0]) == b"still works"

    def test_sends_to_a_peer_that_reads_nothing_end_by_their_deadlines(self, transport, peer):
        """A peer that stops reading makes a link push back (bounded buffering), and then every send
        on it ends by its own deadline: the one that stalls, and one waiting behind it in another
        thread (sent, or ``TimeoutError``; never a wait on the other's deadline).

        Fixtures: ``transport`` (the plugin's transport, built by its factory) and ``peer`` (the echo process).
        """
        import threading

        link = self.connect(transport, peer)
        link.send([b"hold"], self.deadline())  # the peer's echo loop stops reading this link
        big = bytes(self.big_message)
        limit = max(64, (1 << 30) // len(big))  # at most 1 GiB: a link must push back before that
        done, outcome = [], []

        def stalled():
            try:
                for _ in range(limit):
                    link.send([b"m", big], time.monotonic() + 5)
                    done.append(time.monotonic())
                outcome.append("never pushed back")
            except BaseException as exc:
                outcome.append(exc)

        first = threading.Thread(target=stalled, daemon=True)
        started = time.monotonic()
        first.start()
        while first.is_alive() and time.monotonic() - (done[-1] if done else started) < 1.0:
            assert time.monotonic() - started < 60, "the sends neither stalled nor finished in 60 s"
            time.sleep(0.05)
        assert first.is_alive(), f"{len(done)} sends of {len(big)} bytes to a peer that reads nothing: {outcome}"
        begin = time.monotonic()
        try:
            link.send([b"second"], time.monotonic() + 0.5)
        except TimeoutError:
            pass
        assert time.monotonic() - begin < 3, "a send waited past its own deadline behind another one"
        first.join(15)
        assert not first.is_alive(), "a stalled send did not end by its deadline"
        assert isinstance(outcome[0], TimeoutError), outcome
        if link.is_open():  # then nothing of it left: a next send may time out, but must not find the link broken
            try:
                link.send([b"after"], time.monotonic() + 0.5)
            except TimeoutError:
                pass

    def test_peer_death_raises_connection_error(self, transport, peer):
        """When the peer process dies, a pending receive raises ``ConnectionError`` within seconds, and
        ``probe`` then reports the endpoint dead.

        Fixtures: ``transport`` (the plugin's transport, built by its factory) and ``peer`` (the echo process).
        """
        link = self.connect(transport, peer)
        link.send([b"die"], self.deadline())
        start = time.monotonic()
        with pytest.raises(ConnectionError):
            link.recv(self.deadline(20))
        assert time.monotonic() - start < 15
        assert peer.proc.wait(10) == 17
        assert transport.probe(peer.endpoint) is False

    def test_probe_sees_a_live_peer(self, transport, peer):
        """``probe`` answers True for the endpoint of a live listener.

        Fixtures: ``transport`` (the plugin's transport, built by its factory) and ``peer`` (the echo process).
        """
        assert transport.probe(peer.endpoint) is True

    def test_connect_to_nothing_fails_fast(self, transport, peer):
        """Connecting to the endpoint of a listener that has exited fails (``ConnectionError``, ``OSError`` or
        ``TimeoutError``) within seconds, at connect or at the first send or receive.

        Fixtures: ``transport`` (the plugin's transport, built by its factory) and ``peer`` (the echo process).
        """
        link = self.connect(transport, peer)
        link.send([b"die"], self.deadline())
        peer.proc.wait(10)
        start = time.monotonic()
        with pytest.raises((ConnectionError, OSError, TimeoutError)):
            l2 = transport.connect(peer.endpoint, b"late", time.monotonic() + 5)
            l2.send([b"x"], time.monotonic() + 5)
            l2.recv(time.monotonic() + 5)
        assert time.monotonic() - start < 15
