"""MPI launcher and transport for rlinf (placeholder: not implemented yet)."""
