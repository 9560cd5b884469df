"""The per-pair turnstile's lock-free ticket draw keeps call order and its try_take never blocks the pair."""

import threading
import time

from rlinf.scheduler.transports.ordering import Turnstile


def test_try_take_while_busy_gives_none_and_later_operations_still_run_in_order():
    ts = Turnstile()
    first = ts.take()
    ts.wait_turn(first, time.monotonic() + 1)
    assert ts.try_take() is None  # an operation is running: the housekeeper's try must not wait
    second = ts.take()
    ts.done(first)
    ts.wait_turn(second, time.monotonic() + 1)  # the abandoned try's ticket is skipped, not waited for
    ts.done(second)
    third = ts.try_take()
    assert third is not None  # nothing running or queued: the turn is ours at once
    ts.done(third)


def test_tickets_taken_across_threads_run_one_at_a_time_in_ticket_order():
    ts = Turnstile()
    ran, errors, running = [], [], [0]
    lock = threading.Lock()

    def worker():
        for _ in range(200):
            ticket = ts.take()
            try:
                ts.wait_turn(ticket, time.monotonic() + 10)
                with lock:
                    running[0] += 1
                    if running[0] != 1:
                        errors.append("two operations at once")
                ran.append(ticket)
                with lock:
                    running[0] -= 1
            finally:
                ts.done(ticket)
            if ticket % 17 == 0:
                t = ts.try_take()
                if t is not None:
                    ran.append(t)
                    ts.done(t)

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not any(t.is_alive() for t in threads)
    assert not errors
    assert ran == sorted(ran) and len(ran) == len(set(ran)) >= 800
