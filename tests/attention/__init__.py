"""The attention backends and their one dispatch, against a float64 reference, in float32 and half
precision (CPU; CUDA: tests/cuda)."""
