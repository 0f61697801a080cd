"""The old path of `engine.gpu.columns`, for engine/gpu_engine.py (which imports it from here until it moves):
the same module object."""
import sys

import engine.gpu.columns as _moved

sys.modules[__name__] = _moved
