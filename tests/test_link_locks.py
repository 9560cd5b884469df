"""``HeldWithin``: the lock a transport takes for one operation on a link."""

import ctypes
import threading
import time

import pytest

from rlinf.scheduler.plugins.transport import HeldWithin, LinkBusy


def _interrupt(thread: threading.Thread) -> None:
    """Raise KeyboardInterrupt in ``thread`` as soon as it next runs Python code (as Ctrl-C would in the main one)."""
    ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(thread.ident), ctypes.py_object(KeyboardInterrupt))


def test_an_interrupt_just_after_the_lock_was_taken_releases_it():
    """A send waits behind another; it is interrupted, and the interrupt lands the moment the lock is
    handed to it, before its block began.  The lock must not stay held with no owner: every later
    operation on the link would wait for it (LinkBusy, or for ever without a deadline)."""
    lock = threading.RLock()
    outcome = []

    def waiting_send():
        try:
            with HeldWithin(lock, time.monotonic() + 20, "send"):
                outcome.append("ran")
        except BaseException as exc:
            outcome.append(type(exc).__name__)

    lock.acquire()  # another thread's send, stalled
    waiter = threading.Thread(target=waiting_send)
    waiter.start()
    time.sleep(0.2)
    _interrupt(waiter)  # delivered when it next runs Python code: once it holds the lock
    time.sleep(0.1)
    lock.release()  # the stalled send ends
    waiter.join(10)
    assert outcome == ["KeyboardInterrupt"]
    assert lock.acquire(timeout=1), "the interrupted send left the lock held"
    lock.release()


def test_a_wait_behind_another_ends_at_its_deadline_with_linkbusy():
    lock = threading.RLock()
    held, done = threading.Event(), threading.Event()

    def hold():
        with lock:
            held.set()
            done.wait(20)

    holder = threading.Thread(target=hold)
    holder.start()
    assert held.wait(20)  # the other send holds the lock now
    start = time.monotonic()
    with pytest.raises(LinkBusy):
        with HeldWithin(lock, time.monotonic() + 0.2, "send"):
            pass
    assert time.monotonic() - start < 3  # its deadline (0.2 s), not the holder's 20 s
    done.set()
    holder.join(10)
    with HeldWithin(lock, time.monotonic() + 1, "send"):  # free again
        assert lock._is_owned()
    assert not lock._is_owned()


def test_an_operation_inside_another_on_the_same_thread_is_refused():
    lock = threading.RLock()
    with HeldWithin(lock, None, "send"):
        with pytest.raises(RuntimeError):
            with HeldWithin(lock, None, "send"):
                pass
    assert lock.acquire(False)
    lock.release()
