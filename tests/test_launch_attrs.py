"""The driver structs that cuLaunchKernelEx reads (engine.gpu.launch): CUlaunchAttribute's layout and values (a
c_char array field would return a copy, and the value would never reach the struct); these bytes are what the
driver sees."""
import ctypes

from engine.gpu import launch as K


def test_launch_attribute_bytes():
    attrs = K.launch_attrs([K._CU_LAUNCH_ATTRIBUTE_COOPERATIVE, K._CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION])
    assert ctypes.sizeof(K._LaunchAttr) == 72  # id, pad to 8, a 64-byte union
    raw = bytes(attrs)
    for i, attr_id in enumerate((2, 6)):
        one = raw[72 * i:72 * (i + 1)]
        assert int.from_bytes(one[0:4], "little") == attr_id
        assert int.from_bytes(one[8:12], "little") == 1  # cooperative / programmaticStreamSerializationAllowed
        assert one[12:] == bytes(60)


def test_launch_config_points_at_the_attributes():
    attrs = K.launch_attrs([K._CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION])
    cfg = K._LaunchConfig(3, 1, 1, 256, 1, 1, 1024, None, attrs, 1)
    assert ctypes.sizeof(K._LaunchConfig) == 56  # 7 uints, then the stream at offset 32
    assert K._LaunchConfig.hStream.offset == 32 and K._LaunchConfig.attrs.offset == 40
    assert cfg.numAttrs == 1 and cfg.attrs[0].id == 6 and cfg.attrs[0].value == 1


def test_launch_attribute_choice():
    """A cooperative launch's mode: 0 cooperative (after the kernel before it), 1 cooperative and programmatic, 2
    programmatic without the cooperative attribute (its grid sized to be resident); plain kernels programmatic
    under PDL only."""
    coop, pss = K._CU_LAUNCH_ATTRIBUTE_COOPERATIVE, K._CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION
    want = {0: ([coop], [coop]), 1: ([coop, pss], [coop]), 2: ([pss], [coop])}  # (under PDL, plain) a cooperative kernel
    for mode, (under_pdl, plain) in want.items():
        assert K.launch_attr_ids(True, True, mode) == under_pdl and K.launch_attr_ids(True, False, mode) == plain
        assert K.launch_attr_ids(False, True, mode) == [pss] and K.launch_attr_ids(False, False, mode) == []
