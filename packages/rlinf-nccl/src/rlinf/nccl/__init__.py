"""rlinf GPU transports: ``torch-nccl`` and ``cupy-nccl`` for CUDA tensors, ``torch-gloo`` for CPU ones.

All three register through ``rlinf_register_transports`` (module
``rlinf.nccl.plugin``) like every rlinf backend, set up each pair over the
built-in CPU transport (``rendezvous``), and give each pair its own
communicator so that a failed pair leaves the others alone.  See
``docs/gpu.md``.
"""
