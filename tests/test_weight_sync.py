"""Weight sync: ``broadcast`` of a state dict, received in place, over shared memory and over TCP.

One group of five workers (a source, three receivers and a spare) on the session's
Ray; ``path`` forces the links: ``shm`` (the source writes one segment all
receivers read) or ``tcp`` (``RLINF_CPU_LOCAL=0``: a chunked chain).
"""

import os
import time

import pytest
import torch

from rlinf.scheduler import CommunicationError, NodePlacementStrategy, PeerDiedError

from launcher_marks import cpu_transport_internals, survives_worker_death
from p2p_helpers import Peer, ship

PATHS = ["shm", "tcp"]


def _use_path(path: str) -> None:
    os.environ["RLINF_CPU_LOCAL"] = "0" if path == "tcp" else "1"
    os.environ["RLINF_BROADCAST_EAGER_KB"] = "0"  # every payload takes the written-once path these tests check


def _counts() -> dict:
    """This process's descriptors and memfd mappings, from /proc."""
    with open("/proc/self/maps") as f:
        maps = sum("memfd:" in line for line in f)
    return {"fds": len(os.listdir("/proc/self/fd")), "memfd_maps": maps}


def _state(step: float) -> dict:
    """A small state dict with a tied entry (same tensor under two keys), as models with tied embeddings have."""
    emb = torch.full((64, 32), step)
    return {"emb": emb, "head": emb, "w": torch.arange(50000, dtype=torch.float32) + step,
            "b": torch.full((7,), int(step), dtype=torch.int64), "empty": torch.zeros(0, 3)}


def _zeros_like(sd: dict) -> dict:
    out = {k: torch.zeros_like(v) for k, v in sd.items()}
    out["head"] = out["emb"]
    return out


@pytest.fixture(scope="module")
def five(cluster):
    """Ranks 0-3 take part; the death tests (last) kill one rank each and bring in rank 4."""
    g = Peer.create_group().launch(cluster, NodePlacementStrategy([0] * 5), name="wsync")
    yield g
    g.stop()


def _on(group, ranks, fn, *args):
    return [group.execute_on(r).run(ship(fn), *args) for r in ranks]


def _sync_round(w, path):
    """Source and receivers: a dict in place, a list in place, then the plain form; returns checks."""
    _use_path(path)
    groups = [("wsync", [0, 1, 2, 3])]
    if w._rank == 0:
        for step in (1.0, 2.0):
            w.broadcast(_state(step), groups=groups, timeout=60)
        w.broadcast([torch.ones(5), torch.arange(3)], groups=groups, timeout=60)
        w.broadcast({"step": 3, "t": torch.full((4,), 3.0)}, groups=groups, timeout=60)
        return _counts()
    out = _zeros_like(_state(0.0))
    ptrs = {k: v.data_ptr() for k, v in out.items()}
    seen = []
    for step in (1.0, 2.0):
        got = w.broadcast(groups=groups, out=out, timeout=60)
        assert got is out
        expect = _state(step)
        seen.append(all(torch.equal(out[k], expect[k]) for k in expect))
    assert {k: v.data_ptr() for k, v in out.items()} == ptrs  # filled in place
    lst = [torch.zeros(5), torch.zeros(3, dtype=torch.int64)]
    w.broadcast(groups=groups, out=lst, timeout=60)
    plain = w.broadcast(groups=groups, timeout=60)
    step, t = plain["step"], plain["t"].tolist()
    del plain  # its views were the only ones of the segment it came in
    return seen, lst[0].tolist(), lst[1].tolist(), step, t, _counts()


@cpu_transport_internals
@pytest.mark.parametrize("path", PATHS)
def test_in_place_dict_and_list_to_three_receivers(five, path):
    before = [r.wait(timeout=60)[0] for r in _on(five, range(4), lambda w: _counts())]
    rounds = [[r.wait(timeout=120)[0] for r in _on(five, range(4), _sync_round, path)] for _ in range(2)]
    for r in range(1, 4):
        seen, l0, l1, step, t, _ = rounds[1][r]
        assert seen == [True, True] and l0 == [1.0] * 5 and l1 == [0, 1, 2] and step == 3 and t == [3.0] * 4
    # nothing accumulates: the second round leaves every process as the first did, and a
    # receiver holds one mapping of the source's segment at most (kept for its next broadcast)
    for r in range(1, 4):
        assert rounds[1][r][-1] == rounds[0][r][-1], (r, rounds)
        assert rounds[1][r][-1]["memfd_maps"] <= before[r]["memfd_maps"] + 1, (r, before, rounds)
    assert rounds[1][0] == rounds[0][0], rounds
    # a source gone quiet: its kept segment is unmapped (housekeeping does this after RLINF_IDLE_LINK_TIMEOUT)
    dropped = [r.wait(timeout=60)[0] for r in _on(five, range(1, 4), _drop_kept)]
    for r, (n, counts) in zip(range(1, 4), dropped):
        assert n == (1 if path == "shm" else 0) and counts["memfd_maps"] <= before[r]["memfd_maps"], (r, dropped)


def _drop_kept(w):
    from rlinf.scheduler.messaging.p2p.communicator import local_communicator

    return local_communicator().broadcast_state.drop_idle(0.0), _counts()


def _mismatch(w, path):
    _use_path(path)
    groups = [("wsync", [0, 1, 2, 3])]
    if w._rank == 0:
        try:
            w.broadcast(_state(5.0), groups=groups, timeout=60)
        except CommunicationError as exc:
            return type(exc).__name__, str(exc)
        return None
    out = _zeros_like(_state(0.0))
    if w._rank == 2:
        out["w"] = torch.zeros(49999)  # one element short
    try:
        w.broadcast(groups=groups, out=out, timeout=60)
    except ValueError as exc:
        return str(exc), all(float(v.abs().sum()) == 0 for v in out.values())  # nothing written
    return None, all(torch.equal(out[k], v) for k, v in _state(5.0).items())


@cpu_transport_internals
@pytest.mark.parametrize("path", PATHS)
def test_mismatch_is_refused_before_any_write(five, path):
    root, r1, r2, r3 = [r.wait(timeout=120)[0] for r in _on(five, range(4), _mismatch, path)]
    assert r1 == (None, True) and r3 == (None, True)  # the others got it, also past the refusing one (chain)
    text, untouched = r2
    assert "out['w']" in text and "(49999,)" in text and "(50000,)" in text and untouched
    kind, message = root
    assert kind == "CommunicationError" and "rank 2" in message, root
    assert "out['w']" in message


def _views(w):
    """Receivers without out= get zero-copy tensors: each one's writes stay its own, and later
    broadcasts never write into memory an earlier result still uses."""
    _use_path("shm")
    groups = [("wsync", [0, 1, 2, 3])]
    if w._rank == 0:
        first = {"a": torch.full((1 << 18,), 1.0), "b": torch.arange(10)}
        w.broadcast(first, groups=groups, timeout=60)
        w.broadcast(groups=groups, timeout=60)  # the receivers' writes are done
        first["a"].fill_(9.0)  # the source's own tensors are not shared either
        w.broadcast({"a": torch.full((1 << 18,), 2.0), "b": torch.arange(10) * 2}, groups=groups, timeout=60)
        return None
    kept = w.broadcast(groups=groups, timeout=60)
    if w._rank == 1:
        kept["a"][:5] = -1.0
    w.broadcast(None, groups=groups, timeout=60)
    second = w.broadcast(groups=groups, timeout=60)
    mine = -1.0 if w._rank == 1 else 1.0
    return (float(kept["a"][0]) == mine and float(kept["a"][-1]) == 1.0 and kept["b"].tolist() == list(range(10))
            and float(second["a"][0]) == 2.0 and second["b"].tolist() == [2 * i for i in range(10)])


@cpu_transport_internals
def test_receivers_without_out_get_private_views(five):
    assert [r.wait(timeout=120)[0] for r in _on(five, range(4), _views)] == [None, True, True, True]


def _memfd_inodes() -> set:
    """Inodes of the memfd files this process maps, from /proc (one per segment)."""
    with open("/proc/self/maps") as f:
        return {line.split()[4] for line in f if "memfd:rlinf" in line}


def _lending(w, rounds):
    """Receivers keep each round's views until the next round has arrived (a rollout worker
    swapping weights); one of them keeps the first round's views to the end.  The source
    reuses a segment once every holder dropped its views, and never one still held."""
    _use_path("shm")
    groups = [("wsync", [0, 1, 2, 3])]
    if w._rank == 0:
        before, seen = _memfd_inodes(), set()  # segments of earlier tests, kept in the pool
        for step in range(rounds):
            w.broadcast({"a": torch.full((1 << 20,), float(step)), "b": torch.arange(5) + step}, groups=groups,
                        timeout=60)
            seen |= _memfd_inodes()
        return len(seen - before)
    first = current = w.broadcast(groups=groups, timeout=60)
    if w._rank != 1:
        first = None  # only rank 1 holds on to round 0
    checks = []
    for step in range(1, rounds):
        current = w.broadcast(groups=groups, timeout=60)  # the previous round's views go only now
        checks.append(float(current["a"][0]) == step and float(current["a"][-1]) == step
                      and current["b"].tolist() == [step + i for i in range(5)])
    if first is not None:  # never written over, though later rounds reused segments
        checks.append(float(first["a"][0]) == 0.0 and float(first["a"][-1]) == 0.0 and first["b"].tolist() == list(range(5)))
    return all(checks)


@cpu_transport_internals
def test_segments_lent_as_views_are_reused_once_released_and_never_before(five):
    rounds = 8
    made, *ok = [r.wait(timeout=180)[0] for r in _on(five, range(4), _lending, rounds)]
    assert ok == [True, True, True]
    # a fresh segment per round would be 8; double buffering plus the one rank 1 keeps is 3
    assert made <= 4, made


def _segment_of(t) -> str:
    """The inode of the memfd segment ``t``'s memory lies in ('' if none), from /proc."""
    where = t.untyped_storage().data_ptr()
    with open("/proc/self/maps") as f:
        for line in f:
            fields = line.split()
            lo, hi = (int(x, 16) for x in fields[0].split("-"))
            if lo <= where < hi:
                return fields[4] if "memfd:rlinf" in line else ""
    return ""


def _model_like(sd: dict) -> tuple[dict, dict]:
    """``(parameters, state_dict)``: zeroed parameters shaped as ``sd`` (``head`` tied to ``emb``) and detached
    aliases of them, as ``model.state_dict()`` returns."""
    params = {k: torch.nn.Parameter(torch.zeros_like(v), requires_grad=v.is_floating_point())
              for k, v in sd.items() if k != "head"}
    params["head"] = params["emb"]
    out = {k: p.detach() for k, p in params.items() if k != "head"}
    out["head"] = out["emb"]
    return params, out


def _shared(w, mixed):
    """Receivers with ``share_memory=True``: the storages behind their state dicts move onto the segment
    the source wrote (their parameters read the new values, and all three hold one copy); the source
    never writes a segment a receiver is on, so they alternate between two.  ``mixed``: rank 3 copies."""
    _use_path("shm")
    groups = [("wsync", [0, 1, 2, 3])]
    if w._rank == 0:
        for step in (1.0, 2.0, 3.0, 4.0):
            w.broadcast(_state(step), groups=groups, timeout=60)
        w.broadcast(groups=groups, timeout=60)  # every receiver checked the last weights
        w.broadcast(groups=groups, timeout=60)  # rank 1 wrote into its tensors before this one
        w.broadcast(_state(9.0), groups=[("wsync", [0, 1])], timeout=60)  # rank 1 alone, copying
        w.broadcast(groups=groups, timeout=60)
        return None
    params, out = _model_like(_state(0.0))
    share = not (mixed and w._rank == 3)
    seen, segments, waited = [], [], None
    for step in (1.0, 2.0, 3.0, 4.0):
        if step == 2.0 and w._rank == 1:
            time.sleep(1.0)  # the source writes the next weights meanwhile, never into the memory we read
            waited = float(params["w"][0]) == 1.0 and float(params["emb"][0, 0]) == 1.0
        w.broadcast(groups=groups, out=out, timeout=60, share_memory=share)
        expect = _state(step)
        seen.append(all(torch.equal(params[k].detach(), expect[k]) for k in expect))
        segments.append(_segment_of(params["w"]))
    w.broadcast(None, groups=groups, timeout=60)
    if w._rank == 1:
        params["b"].data[0] = 99  # memory shared with the other receivers of that broadcast: they see it
    w.broadcast(None, groups=groups, timeout=60)
    b0 = int(params["b"][0])
    if w._rank == 1:  # copying into shared tensors gives them private memory first: the others keep theirs
        w.broadcast(groups=[("wsync", [0, 1])], out=out, timeout=60)
    w.broadcast(None, groups=groups, timeout=60)
    after = float(params["w"][0])
    return seen, waited, segments, b0, after, params["head"] is params["emb"]


@cpu_transport_internals
@pytest.mark.parametrize("mixed", [False, True])
def test_receivers_that_share_memory_hold_one_copy_the_source_never_writes_under_them(five, mixed):
    got = [r.wait(timeout=120)[0] for r in _on(five, range(4), _shared, mixed)][1:]
    for rank, (seen, waited, segments, b0, after, tied) in zip((1, 2, 3), got):
        assert seen == [True] * 4 and tied, (rank, got)
        if rank == 1:
            assert waited is True and after == 9.0, got
        else:
            assert after == 4.0, (rank, got)  # rank 1's copy did not reach them
        if mixed and rank == 3:
            assert segments == [""] * 4 and b0 == 4, got  # its own memory, copied into
            continue
        x, y = segments[:2]
        assert x and y and x != y and segments == [x, y, x, y], (rank, got)  # two segments in turn
        assert b0 == 99, (rank, got)
    assert got[0][2] == got[1][2], got  # one copy for the receivers that share


def _timed_out_keeps_weights(w):
    """A receiver that gives up on a broadcast (its timeout passes while the source waits for a slower
    one) keeps the weights it had: the source writes a segment nobody is on."""
    _use_path("shm")
    groups = [("wsync", [0, 1, 2])]
    if w._rank == 0:
        w.broadcast(_state(1.0), groups=groups, timeout=60)
        try:
            w.broadcast(_state(2.0), groups=groups, timeout=30)
            outcome = None
        except CommunicationError as exc:
            outcome = str(exc)
        w.broadcast(groups=groups, timeout=60)
        return outcome
    params, out = _model_like(_state(0.0))
    w.broadcast(groups=groups, out=out, timeout=60, share_memory=True)
    if w._rank == 1:
        try:
            w.broadcast(groups=groups, out=out, timeout=0.5, share_memory=True)
            gave_up = False
        except CommunicationError:
            gave_up = True
        time.sleep(2.5)  # the source has written and sent the next weights by now
    else:
        time.sleep(2.0)
        w.broadcast(groups=groups, out=out, timeout=60, share_memory=True)
        gave_up = None
    w.broadcast(groups=groups, timeout=60)
    expect = _state(1.0 if w._rank == 1 else 2.0)
    return gave_up, all(torch.equal(params[k].detach(), expect[k]) for k in expect)


@cpu_transport_internals
def test_a_receiver_that_gave_up_keeps_its_weights_while_the_source_writes_the_next(five):
    outcome, r1, r2 = [r.wait(timeout=120)[0] for r in _on(five, range(3), _timed_out_keeps_weights)]
    assert r1 == (True, True) and r2 == (None, True), (r1, r2)
    assert outcome is not None and "rank 1" in outcome, outcome


def _two_models(w):
    """The same receivers share two state dicts of one layout (a policy and a reference model), broadcast in
    turn: neither is ever written by the other's broadcast.  Small enough to be eager: the source returns
    before the receivers have it, and its next broadcast must still not write what they are on."""
    _use_path("shm")
    os.environ.pop("RLINF_BROADCAST_EAGER_KB")  # the default: these payloads are served eagerly
    groups = [("wsync", [0, 1, 2])]
    if w._rank == 0:
        for step in (1.0, 2.0, 3.0):
            w.broadcast(_state(step), groups=groups, timeout=60)
            w.broadcast(_state(10 * step), groups=groups, timeout=60)
        w.broadcast({"done": torch.ones(1 << 20)}, groups=groups, timeout=60)  # not eager: all have had all
        return None
    policy, policy_out = _model_like(_state(0.0))
    ref, ref_out = _model_like(_state(0.0))
    ok = []
    for step in (1.0, 2.0, 3.0):
        w.broadcast(groups=groups, out=policy_out, timeout=60, share_memory=True)
        w.broadcast(groups=groups, out=ref_out, timeout=60, share_memory=True)
        ok.append(all(torch.equal(policy[k].detach(), v) for k, v in _state(step).items())
                  and all(torch.equal(ref[k].detach(), v) for k, v in _state(10 * step).items()))
    w.broadcast(groups=groups, timeout=60)
    return ok


@cpu_transport_internals
def test_two_shared_state_dicts_of_one_layout_never_overwrite_each_other(five):
    got = [r.wait(timeout=120)[0] for r in _on(five, range(3), _two_models)]
    assert got == [None, [True] * 3, [True] * 3], got


def _share_memory_elsewhere(w):
    """Forced over TCP the receivers are not on the source's host: out is filled by copying; and a receiver
    asking to share memory without out= is told so."""
    _use_path("tcp")
    groups = [("wsync", [0, 1, 2])]
    if w._rank == 0:
        w.broadcast(_state(4.0), groups=groups, timeout=60)
        return None
    out = _zeros_like(_state(0.0))
    before = out["w"].untyped_storage().data_ptr()
    w.broadcast(groups=groups, out=out, timeout=60, share_memory=True)
    ok = all(torch.equal(out[k], v) for k, v in _state(4.0).items()) and out["w"].untyped_storage().data_ptr() == before
    try:
        w.broadcast(groups=groups, timeout=60, share_memory=True)
    except ValueError as exc:
        return ok, str(exc)
    return ok, None


@cpu_transport_internals
def test_share_memory_across_hosts_fills_out_by_copying_and_needs_out(five):
    got = [r.wait(timeout=120)[0] for r in _on(five, range(3), _share_memory_elsewhere)]
    assert got[0] is None
    for ok, text in got[1:]:
        assert ok and text is not None and "needs out=" in text, got


def _eager_source(w):
    os.environ.pop("RLINF_BROADCAST_EAGER_KB", None)
    os.environ["RLINF_CPU_LOCAL"] = "1"
    start = time.monotonic()
    got = w.broadcast({"step": 7, "t": torch.arange(4)}, groups=[("wsync", [0, 1, 2])], timeout=60)
    return got["step"], time.monotonic() - start


def _eager_receiver(w):
    os.environ["RLINF_CPU_LOCAL"] = "1"  # the plan every member derives must be the same
    got = w.broadcast(groups=[("wsync", [0, 1, 2])], timeout=60)
    return got["step"], got["t"].tolist()


@cpu_transport_internals
def test_small_broadcast_returns_at_the_source_before_any_receiver_called(five):
    """Small payloads are eager, as a send is: a program may wait on the source before it calls the receivers."""
    step, took = five.execute_on(0).run(ship(_eager_source)).wait(timeout=60)[0]
    assert step == 7 and took < 30, took  # returned although no receiver has called broadcast yet
    got = [r.wait(timeout=60)[0] for r in _on(five, [1, 2], _eager_receiver)]
    assert got == [(7, [0, 1, 2, 3])] * 2


@survives_worker_death
@cpu_transport_internals
@pytest.mark.parametrize("path,members,victim", [("shm", [0, 1, 2, 3], 2), ("tcp", [0, 1, 3, 4], 3)])
def test_receiver_that_dies_mid_broadcast_is_named_on_the_source(five, path, members, victim):
    res = {r: five.execute_on(r).run(ship(_death_named), path, members, victim, "wsync") for r in members}
    outcome, took, before, after = res[0].wait(timeout=120)[0]
    assert outcome is not None and outcome[0] == "PeerDiedError", outcome
    assert f"rank {victim}" in outcome[1], outcome
    assert took < 30, took  # bounded well within the timeout, not a hang
    # the survivors broadcast again; the source holds no more descriptors or mappings than before
    for r in members[1:]:
        if r != victim:
            assert res[r].wait(timeout=120)[0] == [1.0, 1.0]
    assert after["fds"] <= before["fds"] and after["memfd_maps"] <= before["memfd_maps"], (before, after)


def _death_named(w, path, members, victim, group):
    """The source broadcasts 64 MiB twice; ``victim`` exits during the second, before taking the payload; then
    the rest go on."""
    _use_path(path)
    groups = [(group, members)]
    rest = [(group, [r for r in members if r != victim])]
    big = {f"t{i}": torch.full((1 << 20,), float(i)) for i in range(16)}  # 64 MiB
    if w._rank == 0:
        w.broadcast(big, groups=groups, timeout=60)  # warm: the segment exists now
        before = _counts()
        start = time.monotonic()
        try:
            w.broadcast(big, groups=groups, timeout=60)
            outcome = None
        except CommunicationError as exc:
            outcome = (type(exc).__name__, str(exc))
        took = time.monotonic() - start
        w.broadcast({"after": torch.ones(2)}, groups=rest, timeout=60)
        return outcome, took, before, _counts()
    out = {k: torch.zeros_like(v) for k, v in big.items()}
    w.broadcast(groups=groups, out=out, timeout=60)
    if w._rank == victim:
        # die mid-broadcast every time: the description has arrived, the payload is not taken or acknowledged
        # (exiting a moment after an async broadcast began let a fast receiver finish first now and then)
        from rlinf.scheduler.messaging.p2p import broadcast_receiver

        def _exit_on_payload(*_args, **_kwargs):
            os._exit(0)

        broadcast_receiver._receive_payload = _exit_on_payload
        w.broadcast(groups=groups, out=out, timeout=60)
        os._exit(0)  # not reached: the source must name us, not hang
    try:
        w.broadcast(groups=groups, out=out, timeout=60)
    except CommunicationError:
        pass  # downstream of the victim in a chain: its feeder went away
    return w.broadcast(groups=rest, timeout=60)["after"].tolist()


# -- the segment pool's bookkeeping, in one process (no cluster) ---------------------------------


def _lent_state():
    from rlinf.scheduler.messaging.p2p.broadcast_links import _State

    state = _State()
    seg = state.acquire_segment(1 << 20)
    return state, seg


def test_a_stale_release_report_never_frees_a_segment_lent_again():
    """Each lending has its own token: a report about an earlier lending of the same segment (a
    receiver dropping an old result late) cannot send a segment back to the pool while the receiver
    still holds views of its current lending."""
    state, seg = _lent_state()
    try:
        first = seg.token
        state.release_segment(seg, {"g:1"}, reusable=True)
        state._returned("g:1", [first])
        assert state.free == [seg] and not state.lent
        again = state.acquire_segment(1 << 20)
        assert again is seg and again.token != first  # reused (warm), under a new name
        state.release_segment(again, {"g:1"}, reusable=True)
        state._returned("g:1", [first])  # stale
        assert list(state.lent) == [again.token] and not state.free
        state._returned("g:1", [again.token])
        assert state.free == [seg] and not state.lent
    finally:
        state.close()


def test_a_release_reported_before_the_lending_is_recorded_still_counts():
    """A fast receiver may drop its views and connect again while the source still waits for a slower
    one's acknowledgement: its report arrives before the lending is recorded."""
    state, seg = _lent_state()
    try:
        state._returned("g:1", [seg.token])
        state.release_segment(seg, {"g:1", "g:2"}, reusable=True)
        assert state.lent[seg.token][1] == {"g:2"}
        state._returned("g:2", [seg.token])
        assert state.free == [seg]
    finally:
        state.close()


def test_views_dropped_while_the_pool_lock_is_held_do_not_deadlock():
    """The release report is made by a garbage-collector finalizer, which runs on whichever thread
    drops the last view: here one holding the pool's lock, as housekeeping does."""
    import gc
    import threading

    import numpy as np

    from rlinf.scheduler.transports.shm import map_private

    state, seg = _lent_state()
    try:
        views = [np.frombuffer(map_private(seg.fd, 4096), dtype=np.uint8)]
        state.lend("g:0", seg.token, views[0].base)
        views.append(views)  # a cycle: freed by a collection, not by reference counting

        def drop():
            with state.segment_lock:
                views.clear()
                gc.collect()

        t = threading.Thread(target=drop, daemon=True)
        t.start()
        t.join(10)
        assert not t.is_alive(), "the finalizer waited for the lock its own thread holds"
        assert list(state.reports) == [("g:0", seg.token)]
    finally:
        state.close()


def test_sharing_moves_whole_storages_and_leaves_views_of_larger_ones_to_be_copied():
    """In one process, on a real segment: a parameter behind its detached alias moves (the parameter reads
    the segment), a view of a larger tensor is left to be copied; the segment is reported released once no
    storage is on it any more (a copy into the tensors first gives them private memory)."""
    import numpy as np

    from rlinf.scheduler.messaging.p2p import broadcast as bc
    from rlinf.scheduler.transports.shm import DATA_OFFSET, create_segment

    sent = {"w": torch.arange(1000, dtype=torch.float32), "v": torch.full((10,), 7.0)}
    payload = bc.encode(sent)
    offsets, total = bc._layout(payload.meta["sizes"])
    seg = create_segment(1, total)
    state = bc._State()
    try:
        whole = np.frombuffer(seg.view, dtype=np.uint8)
        for b, off in zip(payload.buffers, offsets):
            whole[DATA_OFFSET + off : DATA_OFFSET + off + b.nbytes] = np.frombuffer(b, dtype=np.uint8)
        param = torch.nn.Parameter(torch.zeros(1000))
        big = torch.zeros(20)
        out = {"w": param.detach(), "v": big[:10]}
        mapping = state.shared_mapping("g:0", "uid", seg.fd, DATA_OFFSET + seg.capacity)
        left, moved = bc._share(out, {**payload.meta, "token": "t1"}, mapping,
                                [DATA_OFFSET + off for off in offsets], state, "g:1", "g:1")
        assert moved and [t is out["v"] for _i, t in left] == [True]
        assert torch.equal(param.detach(), sent["w"]) and float(big[0]) == 0.0
        assert not state.reports  # lent while the parameter is on it
        assert bc._unshare(out) and torch.equal(param.detach(), sent["w"])
        assert list(state.reports) == [("g:1", "t1")]
    finally:
        state.close()
        seg.close()


def test_memory_a_moved_tensor_left_stays_valid_until_the_next_broadcast():
    """Another thread reads the parameters while broadcasts move them (an inference loop beside an
    ``async_op`` sync): the private memory they left is freed only at the next broadcast, so a kernel
    already running on it finishes instead of reading freed (unmapped) memory.  And two tensors of the
    receiver for one buffer the source tied stay two: the second is left to be copied into."""
    import threading

    import numpy as np

    from rlinf.scheduler.messaging.p2p import broadcast as bc
    from rlinf.scheduler.transports.shm import DATA_OFFSET, create_segment

    n = 4 << 20  # 16 MiB of float32: glibc maps it on its own, and unmaps it when freed
    emb = torch.ones(8)
    sent = {"w": torch.full((n,), 2.0), "emb": emb, "head": emb}
    payload = bc.encode(sent)
    offsets, total = bc._layout(payload.meta["sizes"])
    state = bc._State()
    segs = [create_segment(k, total) for k in (1, 2)]
    param = torch.nn.Parameter(torch.zeros(n))
    out = {"w": param.detach(), "emb": torch.zeros(8), "head": torch.zeros(8)}
    stop = threading.Event()
    sums = []

    def infer():
        while not stop.is_set():
            sums.append(float(param.detach().sum()))

    reader = threading.Thread(target=infer, daemon=True)
    try:
        for seg in segs:
            whole = np.frombuffer(seg.view, dtype=np.uint8)
            for b, off in zip(payload.buffers, offsets):
                whole[DATA_OFFSET + off : DATA_OFFSET + off + b.nbytes] = np.frombuffer(b, dtype=np.uint8)
        reader.start()
        time.sleep(0.05)
        old = param.untyped_storage().data_ptr()
        for k, seg in enumerate(segs):
            mapping = state.shared_mapping("g:0", f"uid{k}", seg.fd, DATA_OFFSET + seg.capacity)
            left, moved = bc._share(out, {**payload.meta, "token": f"t{k}"}, mapping,
                                    [DATA_OFFSET + off for off in offsets], state, "g:0", "g:1")
            assert moved and [t is out["head"] for _i, t in left] == [True]
            assert out["head"].data_ptr() != out["emb"].data_ptr()
            retired = [r.untyped_storage().data_ptr() for r in state.retired.get("g:0", [])]
            assert (old in retired) if k == 0 else not retired, (k, retired, old)  # freed at the second one
            time.sleep(0.1)
        stop.set()
        reader.join(10)
        assert not reader.is_alive() and sums and set(sums) <= {0.0, 2.0 * n}, sorted(set(sums))[:5]
        assert torch.equal(param.detach(), sent["w"])
    finally:
        stop.set()
        reader.join(10)
        state.close()
        for seg in segs:
            seg.close()


_EXIT_PROGRAM = """
import atexit
held = {}
atexit.register(lambda: print("at exit", float(held["p"].sum()), flush=True))  # registered before torch
import numpy as np, torch
from rlinf.scheduler.messaging.p2p import broadcast as bc
from rlinf.scheduler.transports.shm import DATA_OFFSET, create_segment
n = 1 << 22
payload = bc.encode({"w": torch.full((n,), 3.0)})
offsets, total = bc._layout(payload.meta["sizes"])
seg = create_segment(1, total)
np.frombuffer(seg.view, dtype=np.uint8)[DATA_OFFSET : DATA_OFFSET + 4 * n] = np.frombuffer(payload.buffers[0], np.uint8)
state = bc._State()
held["p"] = torch.zeros(n)
mapping = state.shared_mapping("g:0", "uid", seg.fd, DATA_OFFSET + seg.capacity)
bc._share({"w": held["p"]}, {**payload.meta, "token": "t"}, mapping, [DATA_OFFSET + offsets[0]], state, "g:0", "me")
"""


def test_parameters_on_shared_memory_are_readable_at_interpreter_exit(tmp_path):
    """An exit hook (a checkpoint on exit) may read the weights after the mapping's finalizers ran."""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", _EXIT_PROGRAM], capture_output=True, text=True, timeout=120,
                          cwd=tmp_path)
    assert done.returncode == 0 and f"at exit {3.0 * (1 << 22)}" in done.stdout, (done.returncode, done.stderr[-2000:])


def test_chain_chunks_are_sized_so_the_pipeline_fill_is_an_eighth_of_a_transfer(monkeypatch):
    from rlinf.scheduler.messaging.p2p.broadcast_plan import CHUNK_ENV, _chunk_for

    monkeypatch.delenv(CHUNK_ENV, raising=False)
    mib = 1 << 20
    assert _chunk_for(64 * mib, 8) == mib  # 8 chunks of fill: an eighth of 64 MiB
    assert _chunk_for(512 * mib, 8) == 4 * mib  # at most 4 MiB
    assert _chunk_for(4 * mib, 8) == 256 << 10  # at least 256 KiB
    assert _chunk_for(64 * mib, 1) == 4 * mib  # no chain to fill
    monkeypatch.setenv(CHUNK_ENV, "2")
    assert _chunk_for(64 * mib, 8) == 2 * mib  # set by the user: as given
