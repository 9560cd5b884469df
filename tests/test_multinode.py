"""Placement across nodes, on a Ray cluster of two simulated nodes (one machine).

The cluster is shared with tests/test_accelerators.py (tests/two_nodes.py).
"""

import pytest

from two_nodes import verdict


@pytest.mark.timeout(360)
def test_node_placement_across_two_nodes():
    failure = verdict("MULTINODE")
    assert not failure, failure
