"""Every attention backend on CUDA against the float64 CPU reference (skipped without a GPU;
benchmarks/gpu.py runs it)."""
