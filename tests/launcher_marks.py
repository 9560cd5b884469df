"""Which launcher the suite runs on, and the marks for tests that only fit one of them.

``RLINF_TEST_LAUNCHER`` (default ``ray``) picks it; ``mpi`` is set when the
suite runs as the program of an MPI job (``tests/test_mpi.py`` starts one).
"""

import os

import pytest

TEST_LAUNCHER = os.environ.get("RLINF_TEST_LAUNCHER", "ray")
#: skip reason for tests that kill a worker process: MPI ends the whole job when a rank dies
MPI_ENDS_JOB = "under mpiexec a rank that dies ends the whole MPI job (tested in tests/test_mpi.py)"
survives_worker_death = pytest.mark.skipif(TEST_LAUNCHER == "mpi", reason=MPI_ENDS_JOB)
cpu_transport_internals = pytest.mark.skipif(
    TEST_LAUNCHER == "mpi", reason="inspects the cpu transport's internals; under MPI workers talk over the mpi transport")
#: skip reason for tests of the Ray launcher's own records (how a worker ended): other launchers keep none
RAY_RECORDS = "inspects the Ray launcher's record of how a worker ended"
ray_launcher_records = pytest.mark.skipif(TEST_LAUNCHER != "ray", reason=RAY_RECORDS)
