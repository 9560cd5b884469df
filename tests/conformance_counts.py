"""Counting conformance runs: every test of the kit ran and passed, none skipped.

A conformance class whose tests all skip (an unusable transport, a missing
peer) would otherwise leave a green suite behind, so each run is counted
against the kit itself: the number of ``test_*`` methods it defines.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET


def kit_tests(kit_cls) -> set:
    """Names of the tests a conformance kit class defines (its own and inherited)."""
    return {name for name in dir(kit_cls) if name.startswith("test_") and callable(getattr(kit_cls, name))}


def junit_outcomes(path) -> dict:
    """``{(classname, name): outcome}`` from a pytest ``--junitxml`` file; outcome is
    ``passed``, ``skipped: <message>``, ``failed`` or ``error``."""
    out = {}
    for case in ET.parse(path).getroot().iter("testcase"):
        key = (case.get("classname", ""), case.get("name", ""))
        outcome = "passed"
        for child in case:
            if child.tag == "skipped":
                outcome = f"skipped: {child.get('message', '')}"
            elif child.tag in ("failure", "error"):
                outcome = "failed" if child.tag == "failure" else "error"
        out[key] = outcome
    return out


def assert_class_ran_whole_kit(outcomes: dict, classname: str, expected: set) -> None:
    """Exactly the ``expected`` tests of ``classname`` ran, and every one passed."""
    got = {name: outcome for (cls, name), outcome in outcomes.items() if cls == classname or cls.endswith("." + classname)}
    assert set(got) == expected, f"{classname}: ran {sorted(got)}, expected {sorted(expected)}"
    not_passed = {n: o for n, o in got.items() if o != "passed"}
    assert not not_passed, f"{classname}: not passed: {not_passed}"


def assert_session_ran_whole_kit(request, classes: dict) -> None:
    """In-session variant: ``classes`` maps a test class to the kit it must fully run.

    Reads the reports pytest's terminal reporter kept for this session; runs
    only when the class's tests were selected (a ``-k`` run of one test skips it).
    """
    reporter = request.config.pluginmanager.get_plugin("terminalreporter")
    assert reporter is not None, "needs pytest's terminal reporter (do not run with -p no:terminal)"
    collected = {item.nodeid for item in request.session.items}
    checked = 0
    for test_cls, kit in classes.items():
        mine = {n for n in collected if n.split("::")[-2:-1] == [test_cls.__name__]}
        if not mine:
            continue
        expected = {n.split("::")[0] + f"::{test_cls.__name__}::{t}" for n in mine for t in kit_tests(kit)}
        assert mine == expected, f"{test_cls.__name__}: collected {sorted(mine)}, the kit has {sorted(expected)}"
        outcomes = {}
        for category, reports in reporter.stats.items():
            if not category:  # passed setup/teardown phases
                continue
            for rep in reports:
                nodeid = getattr(rep, "nodeid", None)
                if nodeid in mine and (rep.when == "call" or category != "passed"):
                    outcomes.setdefault(nodeid, set()).add(category)
        bad = {n: sorted(o) for n, o in outcomes.items() if o != {"passed"}}
        missing = sorted(mine - set(outcomes))
        assert not bad and not missing, f"{test_cls.__name__}: not passed {bad}, did not run {missing}"
        checked += 1
    if not checked:
        import pytest

        pytest.skip("the conformance classes were not selected in this run")
