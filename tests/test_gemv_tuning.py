"""The GEMV tuning table: well-formed, and every entry is a variant the kernel module compiles."""
from engine.ops import gemv_tuning, kernels


def test_table_entries_are_compiled_variants():
    for table in (gemv_tuning.H200_F16, gemv_tuning.H200_I16):
        for (fmt, n, k), cfg in table.items():
            assert fmt in kernels.FMT_IDS and n > 0 and k > 0
            assert cfg["rows"] in kernels.GEMV_ROWS and cfg["unroll"] in kernels.GEMV_UNROLL and cfg["splits"] >= 1
            kern = "gemv_rs_pre" if cfg.get("pre2") else "gemv_rs"
            name = f"{kern}<{kernels.FMT_IDS[fmt]},{cfg['rows']},1,{cfg['unroll']}>"
            assert name in kernels._names()


def test_table_follows_the_staged_x_format():
    assert gemv_tuning.H200 is (gemv_tuning.H200_I16 if kernels.XI16 else gemv_tuning.H200_F16)


def test_default_cfg_is_a_copy():
    a = gemv_tuning.default_cfg()
    a[("q4_g64_fp16", 7168, 5120)]["rows"] = 4
    assert gemv_tuning.H200[("q4_g64_fp16", 7168, 5120)]["rows"] == 2
