"""The engine process shell: its main, the Engine's life cycle, and where it runs (placement, NUMA)."""
