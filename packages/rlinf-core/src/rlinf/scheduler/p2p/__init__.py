"""Point-to-point communication between any two workers."""
