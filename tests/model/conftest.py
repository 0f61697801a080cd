import json
from pathlib import Path

import numpy as np
import pytest

GOLDEN = Path(__file__).resolve().parent.parent / "fixtures" / "golden"


def rel_l2(a, b) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


def load_golden(kind: str):
    """(hf config dict, {hf_name: array}, tokens, logits) of tests/fixtures/golden/qwen35_<kind>.npz."""
    z = np.load(GOLDEN / f"qwen35_{kind}.npz")
    cfg = json.loads(str(z["config_json"]))
    weights = {k[2:]: z[k] for k in z.files if k.startswith("w:")}
    return cfg, weights, z["tokens"], z["logits"]


@pytest.fixture(scope="session", params=["dense", "moe"])
def golden(request):
    return (request.param, *load_golden(request.param))
