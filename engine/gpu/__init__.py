"""The CUDA executor's pieces that need no GPU to be built: the decode plan (`plan.py`)."""
