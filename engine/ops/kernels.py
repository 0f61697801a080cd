"""The old path of `engine.gpu.launch`, for engine/models/qwen3_5_cuda_sampling.py (which imports it from here until it moves):
the same module object."""
import sys

import engine.gpu.launch as _moved

sys.modules[__name__] = _moved
