"""The torch-gloo transport (rlinf-nccl): the conformance kit, pair setup, deadlines and
failure isolation of the torch pair transports, run with gloo on CPU tensors.

torch-nccl shares all of this code with gloo swapped for NCCL; its GPU-only
parts run in tests/test_gpu_transports.py and benchmarks/gpu/check.sh.
"""

from __future__ import annotations

import time

import pytest

from rlinf.testing import TransportConformance

torch = pytest.importorskip("torch")


class TestTorchGloo(TransportConformance):
    transport_name = "torch-gloo"


def test_listed_usable_and_never_the_default():
    from rlinf.scheduler.plugins import get_registry

    reg = get_registry()
    entry = reg.transport("torch-gloo")
    assert entry.source.distribution == "rlinf-nccl" and entry.unusable_reason() is None
    assert reg.transport(None, "cpu").name == "cpu"


def test_nccl_transports_for_cpu_tensors_is_a_clear_error():
    from rlinf.scheduler.errors import PluginError
    from rlinf.scheduler.plugins import get_registry

    for name in ("torch-nccl", "cupy-nccl"):
        with pytest.raises(PluginError, match=name):
            get_registry().transport(name, "cpu")
