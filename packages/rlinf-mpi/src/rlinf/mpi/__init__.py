"""rlinf over MPI: a launcher that hosts workers on MPI ranks and a transport over MPI.

Run an unchanged rlinf program with ``mpiexec -n N python -m rlinf.mpi program.py``:
rank 0 runs the program, every other rank hosts one worker at a time.  A plain
``python program.py`` with ``RLINF_LAUNCHER=mpi`` spawns the worker ranks with
MPI dynamic processes instead.  See ``docs/mpi.md``.
"""
