"""nginx <-> engine: the shm ABI and arena, the doorbell socket, the answer ring, the arena on the GPU."""
