"""The GPU load's upload progress, on the CPU: from_artifact with NumPy standing in for CuPy."""
import io

import numpy as np

from engine.gpu import weights as gpu_weights
from engine.artifact.container import open_artifact
from engine.artifact.writer import write_artifact
from engine.synthetic import TINY_CUDA as CFG
from engine.synthetic import artifact_tensors
from ninfer_cli.model_session import UploadProgress


def _tiny_artifact(tmp_path):
    return open_artifact(write_artifact(tmp_path / "tiny.ninfer", {"text": {"config": CFG}}, artifact_tensors(CFG)))


def test_progress_counts_every_packed_byte_once(tmp_path):
    art = _tiny_artifact(tmp_path)
    calls = []
    out = gpu_weights.from_artifact(art, progress=lambda d, t: calls.append((d, t)), xp=np)
    total = gpu_weights.upload_bytes(art)
    assert total > 0 and calls and calls[-1] == (total, total)
    assert all(b[0] > a[0] for a, b in zip(calls, calls[1:]))  # strictly growing
    assert all(t == total for _, t in calls)
    # the planes are the file's bytes, unchanged (packed weights stay packed)
    name = next(n for n in out if isinstance(out[n], gpu_weights.DevMatrix) and out[n].fmt != "bf16")
    s = art.packed(name)[0]
    assert np.array_equal(np.asarray(out[name].buf), np.asarray(art.object_bytes(s.object_id)))


def test_upload_progress_line(tmp_path):
    buf = io.StringIO()
    bar = UploadProgress("tiny", stream=buf)
    bar(10, 100)
    bar(100, 100)  # completes: the bar goes, one summary line stays
    bar.close()
    text = buf.getvalue()
    assert "loaded 0.00 GB of weights to the GPU in" in text and text.count("loaded") == 1


def test_the_proposal_head_loads_beside_the_mtp_head(tmp_path):
    """The published files store the proposal head as text/draft_head (q4) and text/draft_head_token_ids (int32),
    bound as proposal/head and proposal/token_ids: the GPU load uploads both (the ids as int32)."""
    rows, H = 128, CFG["hidden_size"]
    rng = np.random.default_rng(0)
    ids = rng.permutation(CFG["vocab_size"])[:rows].astype(np.int32)
    tensors = artifact_tensors(CFG) + [
        ("text/draft_head", "q4_g64_fp16", "row_split_k128_v1", (rows, H), rng.standard_normal((rows, H)) * 0.05),
        ("text/draft_head_token_ids", "int32", "contiguous_le_v1", (rows,), ids)]
    bindings = {t[0]: {"object": t[0]} for t in tensors[:-2]}
    bindings.update({"proposal/head": {"object": "text/draft_head"},
                     "proposal/token_ids": {"object": "text/draft_head_token_ids"}})
    art = open_artifact(write_artifact(tmp_path / "p.ninfer", {"text": {"config": CFG}}, tensors, bindings=bindings))
    out = gpu_weights.from_artifact(art, xp=np)
    head = out["proposal/head"]
    assert isinstance(head, gpu_weights.DevMatrix) and (head.fmt, head.n, head.k) == ("q4_g64_fp16", rows, H)
    assert out["proposal/token_ids"].dtype == np.int32 and np.array_equal(out["proposal/token_ids"], ids)
