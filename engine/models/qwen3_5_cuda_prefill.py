"""The old path of `engine.gpu.prefill`, for engine/gpu_engine.py (which imports it from here until it moves):
the same module object."""
import sys

import engine.gpu.prefill as _moved

sys.modules[__name__] = _moved
