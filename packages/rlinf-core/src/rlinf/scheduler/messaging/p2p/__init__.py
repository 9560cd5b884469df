"""Point-to-point communication between any two workers: communicator, API, broadcast, endpoints."""
