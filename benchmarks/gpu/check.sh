#!/usr/bin/env bash
# The GPU check: device-transport conformance tests, a send_tensor bandwidth table (each
# transport and CUDA IPC against raw NCCL send/recv and a raw device copy, same run), and the
# seed's GPU examples through the MPI launcher.  Two plain processes and a TCPStore; no Ray.
# Prints "SKIP <part>: <reason>" for every part it cannot run here (cross-GPU paths need two
# GPUs) and exits 0 on a machine without a GPU.  Exits non-zero when a part that ran failed.
#
#   benchmarks/gpu/check.sh            # PYTHON=/path/to/python to choose the interpreter
# Worst case under 8 minutes: each part runs under its own timeout (150 + 200 + 120 s).
set -u
cd "$(dirname "$0")/../.."
PY="${PYTHON:-python}"
# the packages from this checkout, found without installing them; plugins named explicitly
export PYTHONPATH="packages/rlinf-core/src:packages/rlinf-nccl/src:packages/rlinf-mpi/src:${PYTHONPATH:-}"
export RLINF_PLUGINS_AUTOLOAD=0
export RLINF_PLUGINS="cpu=rlinf.scheduler.transports.cpu_plugin,accelerators=rlinf.scheduler.plugins.accelerator_plugin,mpi=rlinf.mpi.plugin,nccl=rlinf.nccl.plugin"
export GLOO_SOCKET_IFNAME="${GLOO_SOCKET_IFNAME:-lo}"
status=0

ngpu=$("$PY" -c 'import torch; print(torch.cuda.device_count() if torch.cuda.is_available() else 0)' 2>/dev/null)
if [ -z "$ngpu" ]; then
  echo "SKIP gpu conformance tests: torch is not importable with $PY"
  echo "SKIP bandwidth table: torch is not importable with $PY"
  echo "SKIP seed GPU examples: torch is not importable with $PY"
  exit 0
fi
if [ "$ngpu" = 0 ]; then
  echo "SKIP gpu conformance tests: no CUDA device is visible (torch.cuda.is_available() is False)"
  echo "SKIP bandwidth table: no CUDA device is visible"
  echo "SKIP seed GPU examples: no CUDA device is visible"
  exit 0
fi
echo "== $ngpu GPU(s) visible"
"$PY" -m rlinf.scheduler plugins || true

echo "== device-transport conformance"
if "$PY" -c 'import pytest' 2>/dev/null; then
  timeout 150 "$PY" -m pytest tests/test_gpu_transports.py -q -rs -p no:cacheprovider -o addopts="" || status=1
  [ "$ngpu" -lt 2 ] && echo "SKIP cross-GPU conformance (torch-nccl, cupy-nccl): needs 2 GPUs, $ngpu visible"
else
  echo "SKIP gpu conformance tests: pytest is not installed for $PY"
fi

echo "== send_tensor bandwidth"
timeout 200 "$PY" benchmarks/gpu/bandwidth.py || status=1

echo "== seed GPU examples (MPI launcher)"
if command -v mpiexec >/dev/null 2>&1 && "$PY" -c 'import mpi4py' 2>/dev/null; then
  n=$(( ngpu < 4 ? ngpu : 4 ))
  timeout 120 mpiexec -n $(( 1 + 2 * n )) "$PY" -m rlinf.mpi benchmarks/gpu/seed_examples.py "$n" || status=1
  [ "$ngpu" -lt 2 ] && echo "SKIP seed examples across GPUs: needs 2 GPUs, $ngpu visible (ran the single-GPU parts)"
else
  echo "SKIP seed GPU examples: mpiexec or mpi4py is not available"
fi
exit $status
