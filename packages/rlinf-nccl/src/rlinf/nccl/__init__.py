"""NCCL GPU transports for rlinf (placeholder: not implemented yet)."""
