"""The CUDA executor (CuPy + the kernels of `cuda/`), by composition.

plan.py (the frozen decode plan chosen once at load: the kernel and form of every op), kernel_names.py (the
template instantiations and the shared-memory sizes of the sources), launch.py (the module compile, `Launch`,
`Concurrent`), gemv.py (`DevMatrix`, `GemvPlan`, the fused GEMV launches), gemv_tuning.py (the measured GEMV
table); one module a block: norm.py, attention.py, gdn.py, mlp.py (dense MLP), moe.py; decode.py (`CudaQwen35`,
the step of M token rows as one CUDA graph), columns.py (T consecutive tokens of one sequence), prefill*.py (the
tensor-core prefill: GEMM weights, attention, MoE); weights.py (device weights), memory.py (the memory plan).
"""
