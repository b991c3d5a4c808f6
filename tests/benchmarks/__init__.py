"""The benchmark suite and the GPU command in their quick CPU forms, so they cannot rot."""
