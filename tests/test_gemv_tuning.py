"""The GEMV tuning table: well-formed, and every entry is a variant the kernel module compiles."""
from engine.gpu import gemv_tuning, kernel_names
from engine.gpu import launch as kernels


def test_table_entries_are_compiled_variants():
    for (fmt, n, k), cfg in gemv_tuning.H200.items():
        assert fmt in kernels.FMT_IDS and n > 0 and k > 0 and cfg["splits"] >= 1
        kern = "gemv_rs_pre" if cfg.get("pre2") else "gemv_rs"
        name = f"{kern}<{kernels.FMT_IDS[fmt]},{cfg['rows']},1,{cfg['unroll']}>"
        assert name in kernel_names.all_names()


def test_default_cfg_is_a_copy():
    a = gemv_tuning.default_cfg()
    a[("q4_g64_fp16", 7168, 5120)]["rows"] = 4
    assert gemv_tuning.H200[("q4_g64_fp16", 7168, 5120)]["rows"] == 2


def test_tc_table_entries_are_compiled_forms():
    for (fmt, n, k), form in gemv_tuning.H200_TC.items():
        gu, stages, wt, *slices = form
        assert fmt in kernels.FMT_IDS and n > 0 and k > 0 and gu in (2, 4) and stages >= 2 and wt in (None, 1, 2, 4, 8)
        assert len(slices) <= 1 and all(s is None or s >= 1 for s in slices)
        assert kernel_names.gemv_tc_form(fmt, n, k) == form
        for m in (2, 4, 8):
            assert kernel_names.gemv_tc_name(kernels.FMT_IDS[fmt], m, gu, stages) in kernel_names.all_names()
    assert kernel_names.gemv_tc_form("q6_g64_fp16", 1, 1) == (kernel_names.GEMV_TC_GU, kernel_names.GEMV_TC_STAGES, None)
