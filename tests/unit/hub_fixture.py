"""Fixtures for `ninfer pull` tests: a fake Hub, a catalog pointing at it, and an empty store.

Import the fixtures into a test module with `from hub_fixture import hub_env, tiny  # noqa: F401`.
"""
from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/ holds hubserver.py

from hubserver import Behaviour, FakeHub, HubFileSpec  # noqa: E402

SIZE = 3 * 1024 * 1024 + 12345  # a few MB, not a multiple of any chunk size


def tiny_bytes(size: int = SIZE, version: int = 3) -> bytes:
    """Deterministic pseudo-random bytes that start like a `.ninfer` of `version`."""
    import numpy as np  # noqa: PLC0415

    body = np.random.default_rng(1234).integers(0, 256, size, dtype=np.uint8).tobytes()
    return b"NINFER\x00" + bytes([version]) + body[8:]


@dataclass
class HubEnv:
    """A running fake Hub, the catalog file naming its files, and the store root."""

    hub: FakeHub
    spec: HubFileSpec
    home: Path
    catalog: Path
    env: dict

    @property
    def behaviour(self) -> Behaviour:
        return self.hub.behaviour

    def partial(self, name: str = "tiny") -> Path:
        """The partial download folder of `name:latest`."""
        return self.home / ".partial" / name / "latest"

    def part_file(self) -> Path:
        return self.partial() / f"{self.spec.filename}.{self.spec.revision[:12]}.part"


def write_catalog(path: Path, spec: HubFileSpec, **overrides) -> None:
    """A one-entry catalog (`tiny`) for `spec`; `overrides` replace fields of its file record."""
    record = {"repo": spec.repo, "revision": spec.revision, "filename": spec.filename,
              "size": len(spec.data), "sha256": spec.sha256}
    record.update(overrides)
    path.write_text(json.dumps([{"name": "tiny", "title": "tiny test model", "kind": "hf",
                                 "files": [record], "gpu_only": False}]))


@pytest.fixture
def hub_env(tmp_path, monkeypatch):
    """Start a fake Hub serving `org/tiny-ninfer/tiny.ninfer` and point ninfer at it."""
    spec = HubFileSpec("org/tiny-ninfer", "tiny.ninfer", tiny_bytes())
    with FakeHub([spec]) as hub:
        catalog = tmp_path / "catalog.json"
        write_catalog(catalog, spec)
        env = {
            "HF_ENDPOINT": hub.url,
            "HF_HOME": str(tmp_path / "hf"),
            "NINFER_HOME": str(tmp_path / "store"),
            "NINFER_CATALOG": str(catalog),
            "HF_HUB_DISABLE_TELEMETRY": "1",
        }
        for k, v in env.items():
            monkeypatch.setenv(k, v)
        for k in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HF_HUB_OFFLINE", "NINFER_OFFLINE", "NINFER_MODEL_DIR"):
            monkeypatch.delenv(k, raising=False)
        monkeypatch.chdir(tmp_path)  # `./models` (a legacy location) must not come from the checkout
        from huggingface_hub import constants

        # read once at import: without this, the user-agent's agent detection may call the real Hub
        monkeypatch.setattr(constants, "HF_HUB_DISABLE_TELEMETRY", True)
        yield HubEnv(hub=hub, spec=spec, home=tmp_path / "store", catalog=catalog, env=dict(os.environ))
