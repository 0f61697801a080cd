"""`ninfer pull` against a fake Hub: full pull, resume across processes, and every failure path."""
from __future__ import annotations

import errno
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections import namedtuple
from pathlib import Path

import pytest
from typer.testing import CliRunner

from hub_fixture import SIZE, hub_env, write_catalog  # noqa: F401
from ninfer_cli import download
from ninfer_cli.catalog import HubFile
from ninfer_cli.main import app
from ninfer_cli.store import Store

ROOT = Path(__file__).resolve().parents[2]
runner = CliRunner()
Usage = namedtuple("Usage", "total used free")
REAL_OPEN = download._open_part


def pull(*args):
    return runner.invoke(app, ["pull", *args], prog_name="ninfer")


def cdn_gets(env):
    return env.hub.log.ranges()


def installed(env):
    return Store(env.home).find("tiny")


def assert_installed(env):
    m = installed(env)
    assert m is not None
    data = m.artifact_path.read_bytes()
    assert len(data) == SIZE and hashlib.sha256(data).hexdigest() == env.spec.sha256
    assert m.sha256 == env.spec.sha256 and m.revision == env.spec.revision and m.container_version == 3
    return m


def test_full_pull_verifies_and_installs(hub_env):
    r = pull("tiny")
    assert r.exit_code == 0, r.output
    m = assert_installed(hub_env)
    assert r.stdout.strip() == str(m.artifact_path)
    assert m.source == f"hf://org/tiny-ninfer@{hub_env.spec.revision}/tiny.ninfer"
    assert hub_env.hub.log.bytes_served == SIZE
    assert cdn_gets(hub_env) == [None]
    heads = [p for s, p, _ in hub_env.hub.log.requests if s == "hub" and p.startswith("HEAD")]
    assert heads == [f"HEAD /org/tiny-ninfer/resolve/{hub_env.spec.revision}/tiny.ninfer"]
    assert not (hub_env.home / ".partial").exists(), "the partial folder is removed after a clean pull"

    again = pull("tiny")
    assert again.exit_code == 0 and "up to date" in again.stderr
    assert hub_env.hub.log.bytes_served == SIZE, "an installed, verified model is not fetched again"

    forced = pull("tiny", "--force")
    assert forced.exit_code == 0, forced.output
    assert hub_env.hub.log.bytes_served == 2 * SIZE
    assert_installed(hub_env)


def downloaded(env) -> int:
    """Bytes the partial holds (a parallel partial is preallocated, so ask its segment record)."""
    spec = env.spec
    f = HubFile(spec.repo, spec.revision, spec.filename, SIZE, spec.sha256)
    return download.Partial(env.partial(), f).have()


@pytest.mark.parametrize("conns", [1, 3], ids=["one-stream", "parallel"])
@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGINT], ids=["kill-9", "ctrl-c"])
def test_stopped_process_resumes_with_range_and_fetches_only_the_rest(hub_env, sig, conns):
    hub_env.behaviour.delay_after = 1024 * 1024  # slow after 1 MiB so the first process is stopped mid-way
    env = dict(hub_env.env, PYTHONPATH=str(ROOT), NINFER_PULL_CONNECTIONS=str(conns))
    # (SIGINT back to its default in the child, as a terminal's process has it: a test run started in the background
    # of a non-interactive shell ignores SIGINT, which Python's ctrl-c handling then inherits and keeps off)
    proc = subprocess.Popen([sys.executable, "-m", "ninfer_cli.main", "pull", "tiny"], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, cwd=hub_env.home.parent,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline = time.time() + 30
    try:
        while time.time() < deadline and proc.poll() is None and downloaded(hub_env) < 1024 * 1024:
            time.sleep(0.02)
    finally:
        os.kill(proc.pid, sig)
        err = proc.communicate(timeout=30)[1]
    if sig == signal.SIGKILL:
        assert proc.returncode == -signal.SIGKILL
    else:
        assert proc.returncode == 130, err
        assert "error: interrupted:" in err and "-> run `ninfer pull tiny:latest` again to resume" in err
    have = downloaded(hub_env)
    assert 1024 * 1024 <= have < SIZE, have
    assert installed(hub_env) is None
    first_run = len(cdn_gets(hub_env))
    assert first_run == conns
    segments = download.Partial(hub_env.partial(), HubFile(hub_env.spec.repo, hub_env.spec.revision,
                                                           hub_env.spec.filename, SIZE, None)).segments()

    monkeypatch_env = {"NINFER_PULL_CONNECTIONS": str(conns)}
    hub_env.behaviour.delay_after = None
    with _env(monkeypatch_env):
        r = pull("tiny")
    assert r.exit_code == 0, r.output
    resumed = cdn_gets(hub_env)[first_run:]
    if conns == 1:
        assert resumed == [f"bytes={have}-"]
    else:
        assert sorted(resumed) == sorted(f"bytes={a + d}-{b - 1}" for a, b, d in segments if a + d < b)
    assert sum(hub_env.hub.log.per_get[first_run:]) == SIZE - have  # the second process fetched only the rest
    assert_installed(hub_env)


class _env:
    """Set environment variables for a block (the CliRunner run shares this process's environment)."""

    def __init__(self, values):
        self.values, self.old = values, {}

    def __enter__(self):
        for k, v in self.values.items():
            self.old[k] = os.environ.get(k)
            os.environ[k] = v

    def __exit__(self, *exc):
        for k, v in self.old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def test_parallel_pull_splits_the_file_into_ranges(hub_env, monkeypatch):
    monkeypatch.setenv("NINFER_PULL_CONNECTIONS", "4")
    r = pull("tiny")
    assert r.exit_code == 0, r.output
    ranges = sorted(cdn_gets(hub_env), key=lambda h: int(h.split("=")[1].split("-")[0]))
    assert len(ranges) == 3  # 3.2 MB in segments of at least 1 MiB
    spans = [tuple(int(x) for x in h.split("=")[1].split("-")) for h in ranges]
    assert spans[0][0] == 0 and spans[-1][1] == SIZE - 1
    assert all(b[0] == a[1] + 1 for a, b in zip(spans, spans[1:]))
    assert hub_env.hub.log.bytes_served == SIZE
    assert_installed(hub_env)


def test_parallel_pull_falls_back_when_ranges_are_ignored(hub_env, monkeypatch):
    monkeypatch.setenv("NINFER_PULL_CONNECTIONS", "4")
    hub_env.behaviour.ignore_range = True
    r = pull("tiny")
    assert r.exit_code == 0, r.output
    assert cdn_gets(hub_env)[-1] is None  # the fallback is one plain GET
    assert_installed(hub_env)


def test_parallel_disk_full_keeps_segments_and_resumes(hub_env, monkeypatch):
    from ninfer_cli import segments

    monkeypatch.setenv("NINFER_PULL_CONNECTIONS", "3")
    written = []

    def full_after_2mb(fd, data, offset):
        if sum(written) + len(data) > 2 * 1024 * 1024:
            raise OSError(errno.ENOSPC, "No space left on device")
        written.append(len(data))
        return os.pwrite(fd, data, offset)

    monkeypatch.setattr(segments, "_pwrite", full_after_2mb)
    r = pull("tiny")
    assert r.exit_code == 1 and "error: disk full while downloading tiny.ninfer" in r.stderr
    have = downloaded(hub_env)
    assert 0 < have <= 2 * 1024 * 1024
    first_run = len(cdn_gets(hub_env))
    monkeypatch.setattr(segments, "_pwrite", os.pwrite)
    r = pull("tiny")
    assert r.exit_code == 0, r.output
    assert sum(hub_env.hub.log.per_get[first_run:]) == SIZE - have
    assert_installed(hub_env)


def test_parallel_checksum_mismatch_sets_the_file_aside(hub_env, monkeypatch):
    monkeypatch.setenv("NINFER_PULL_CONNECTIONS", "3")
    hub_env.behaviour.corrupt = True
    r = pull("tiny")
    assert r.exit_code == 1 and "SHA-256 mismatch for tiny.ninfer" in r.stderr
    assert len(list(hub_env.partial().glob("*.rejected"))) == 1 and installed(hub_env) is None


class _Writer:
    """A partial-file writer that fails (disk full, Ctrl+C) once `limit` bytes are written."""

    def __init__(self, path, limit, exc):
        self.f, self.limit, self.exc = open(path, "ab"), limit, exc

    def write(self, b):
        if self.f.tell() + len(b) > self.limit:
            self.f.write(b[: self.limit - self.f.tell()])
            raise self.exc
        return self.f.write(b)

    def flush(self):
        self.f.flush()

    def __enter__(self):
        return self

    def __exit__(self, *a):
        self.f.close()


def test_disk_full_mid_way_keeps_the_partial_and_a_rerun_finishes(hub_env, monkeypatch):
    limit = 2 * 1024 * 1024
    monkeypatch.setattr(download, "_open_part", lambda p: _Writer(p, limit, OSError(errno.ENOSPC, "No space left")))
    r = pull("tiny")
    assert r.exit_code == 1
    assert "error: disk full after 2.1 MB of 3.2 MB" in r.stderr and "partial file is kept" in r.stderr
    assert "-> free at least" in r.stderr and "again to resume" in r.stderr
    assert hub_env.part_file().stat().st_size == limit
    assert installed(hub_env) is None

    monkeypatch.setattr(download, "_open_part", REAL_OPEN)
    r = pull("tiny")
    assert r.exit_code == 0, r.output
    assert cdn_gets(hub_env)[-1] == f"bytes={limit}-"
    assert_installed(hub_env)


def test_ctrl_c_keeps_the_partial_and_exits_130(hub_env, monkeypatch):
    limit = 1024 * 1024
    monkeypatch.setattr(download, "_open_part", lambda p: _Writer(p, limit, KeyboardInterrupt()))
    r = pull("tiny")
    assert r.exit_code == 130
    assert "error: interrupted: 1.0 MB of 3.2 MB of tiny.ninfer kept" in r.stderr
    assert "-> run `ninfer pull tiny:latest` again to resume" in r.stderr
    assert hub_env.part_file().stat().st_size == limit

    dry = pull("tiny", "--dry-run")
    assert dry.exit_code == 0 and "1.0 MB already here, resumes" in dry.stdout
    listed = runner.invoke(app, ["ls", "--available", "--json"])
    row = next(r for r in json.loads(listed.stdout) if r["name"] == "tiny")
    assert row["status"] == "partial 33%" and row["partial_bytes"] == limit


def test_checksum_mismatch_sets_the_file_aside(hub_env):
    hub_env.behaviour.corrupt = True
    r = pull("tiny")
    assert r.exit_code == 1
    assert "SHA-256 mismatch for tiny.ninfer" in r.stderr and "not added to the store" in r.stderr
    assert "--force" in r.stderr
    rejected = list(hub_env.partial().glob("*.rejected"))
    assert len(rejected) == 1 and rejected[0].stat().st_size == SIZE
    assert installed(hub_env) is None and not hub_env.part_file().exists()

    hub_env.behaviour.corrupt = False
    assert pull("tiny").exit_code == 0
    assert_installed(hub_env)
    assert not rejected[0].exists() and not (hub_env.home / ".partial").exists()


def test_finished_file_left_in_the_partial_folder_is_reused(hub_env):
    hub_env.partial().mkdir(parents=True)
    (hub_env.partial() / hub_env.spec.filename).write_bytes(hub_env.spec.data)
    r = pull("tiny")
    assert r.exit_code == 0, r.output
    assert cdn_gets(hub_env) == []
    assert_installed(hub_env)


def test_complete_partial_is_verified_without_a_transfer(hub_env):
    hub_env.partial().mkdir(parents=True)
    hub_env.part_file().write_bytes(hub_env.spec.data)
    (hub_env.partial() / (hub_env.part_file().name + ".json")).write_text(json.dumps({
        "repo": hub_env.spec.repo, "revision": hub_env.spec.revision, "filename": hub_env.spec.filename,
        "etag": hub_env.spec.sha256, "size": SIZE}))
    r = pull("tiny")
    assert r.exit_code == 0, r.output
    assert cdn_gets(hub_env) == [] and hub_env.hub.log.bytes_served == 0
    assert_installed(hub_env)


def test_network_drop_resumes_in_process(hub_env, monkeypatch):
    monkeypatch.setattr(download, "RETRY_PAUSE", 0.0)
    hub_env.behaviour.drop_after = 2 * 1024 * 1024
    r = pull("tiny")
    assert r.exit_code == 0, r.output
    assert cdn_gets(hub_env) == [None, f"bytes={2 * 1024 * 1024}-"]
    assert hub_env.hub.log.bytes_served == SIZE
    assert_installed(hub_env)


def test_server_ignoring_range_restarts_instead_of_splicing(hub_env, monkeypatch):
    limit = 1024 * 1024
    monkeypatch.setattr(download, "_open_part", lambda p: _Writer(p, limit, KeyboardInterrupt()))
    assert pull("tiny").exit_code == 130
    monkeypatch.setattr(download, "_open_part", REAL_OPEN)
    hub_env.behaviour.ignore_range = True
    r = pull("tiny")
    assert r.exit_code == 0, r.output
    assert_installed(hub_env)


def test_401_without_token_names_hf_token_and_token_is_honoured(hub_env, monkeypatch):
    hub_env.behaviour.token = "secret"
    r = pull("tiny")
    assert r.exit_code == 1
    assert "HTTP 401" in r.stderr and "HF_TOKEN" in r.stderr
    assert cdn_gets(hub_env) == []
    monkeypatch.setenv("HF_TOKEN", "secret")
    r = pull("tiny")
    assert r.exit_code == 0, r.output
    assert_installed(hub_env)


def test_gated_repository_says_what_to_do(hub_env, monkeypatch):
    hub_env.behaviour.gated = True
    monkeypatch.setenv("HF_TOKEN", "whatever")
    r = pull("tiny")
    assert r.exit_code == 1
    assert "gated repository and this token has no access" in r.stderr
    assert "accept its terms" in r.stderr and "HF_TOKEN" in r.stderr
    monkeypatch.delenv("HF_TOKEN")
    monkeypatch.setattr("huggingface_hub.get_token", lambda: None)
    r = pull("tiny")
    assert r.exit_code == 1 and "gated repository and no Hugging Face token is set" in r.stderr


def test_404s_are_one_line_each(hub_env):
    write_catalog(hub_env.catalog, hub_env.spec, filename="missing.ninfer")
    r = pull("tiny")
    assert r.exit_code == 1 and "error: missing.ninfer not found in org/tiny-ninfer@" in r.stderr
    write_catalog(hub_env.catalog, hub_env.spec, repo="org/nope")
    r = pull("tiny")
    assert r.exit_code == 1 and "error: repository org/nope not found" in r.stderr
    write_catalog(hub_env.catalog, hub_env.spec, revision="f" * 40)
    r = pull("tiny")
    assert r.exit_code == 1 and "revision ffffffffffff of org/tiny-ninfer not found" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 2  # error line + next action, no traceback


def test_offline_mode_makes_no_request(hub_env, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    r = pull("tiny")
    assert r.exit_code == 1
    assert "offline mode is on" in r.stderr and "--from PATH" in r.stderr
    assert hub_env.hub.log.requests == []
    monkeypatch.delenv("HF_HUB_OFFLINE")
    assert pull("tiny").exit_code == 0
    monkeypatch.setenv("NINFER_OFFLINE", "1")
    r = pull("tiny")
    assert r.exit_code == 0 and "up to date" in r.stderr, "an installed model needs no network"


def test_two_pulls_of_one_file_do_not_share_the_partial(hub_env):
    import fcntl

    hub_env.partial().mkdir(parents=True)
    lock = hub_env.partial() / f"{hub_env.spec.filename}.{hub_env.spec.revision[:12]}.lock"
    with open(lock, "a+b") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        r = pull("tiny")
    assert r.exit_code == 1 and "another `ninfer pull` is downloading tiny.ninfer" in r.stderr
    assert cdn_gets(hub_env) == []
    assert pull("tiny").exit_code == 0
    assert not (hub_env.home / ".partial").exists()


def test_unreachable_hub_is_one_line(hub_env, monkeypatch):
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # discard port: connection refused
    r = pull("tiny")
    assert r.exit_code == 1 and "cannot reach http://127.0.0.1:9" in r.stderr and "partial files are kept" in r.stderr


def test_short_disk_refuses_before_downloading(hub_env, monkeypatch):
    monkeypatch.setattr(shutil, "disk_usage", lambda p: Usage(10**12, 10**12 - 10**6, 10**6))
    r = pull("tiny")
    assert r.exit_code == 1
    assert "not enough disk space for tiny:latest" in r.stderr and "need 3.2 MB, have 1.0 MB" in r.stderr
    assert cdn_gets(hub_env) == [] and hub_env.hub.log.requests == []


def test_dry_run_changes_nothing(hub_env, monkeypatch):
    monkeypatch.setattr(shutil, "disk_usage", lambda p: Usage(10**12, 0, 5 * 10**9))
    r = pull("tiny", "--dry-run")
    assert r.exit_code == 0, r.output
    assert "download  3.2 MB" in r.stdout and "have 5.0 GB" in r.stdout and ": fits" in r.stdout
    assert hub_env.hub.log.requests == [] and installed(hub_env) is None
    assert not (hub_env.home / ".partial").exists()


def test_old_container_on_disk_is_offered_convert(hub_env, monkeypatch, tmp_path):
    legacy = tmp_path / "legacy"
    legacy.mkdir()
    (legacy / "tiny.ninfer").write_bytes(b"NINFER\x00\x02" + b"\0" * 100)
    monkeypatch.setenv("NINFER_MODEL_DIR", str(legacy))
    r = pull("tiny")
    assert r.exit_code == 1
    assert "a v2 artifact of tiny is already on disk" in r.stderr and "ninfer convert" in r.stderr
    assert hub_env.hub.log.requests == []
    assert pull("tiny", "--force").exit_code == 0


def test_pinned_size_disagreeing_with_the_hub_downloads_nothing(hub_env):
    write_catalog(hub_env.catalog, hub_env.spec, size=SIZE + 1)
    r = pull("tiny")
    assert r.exit_code == 1 and f"catalog pins {SIZE + 1:,}" in r.stderr
    assert cdn_gets(hub_env) == []


def test_partial_of_another_file_is_not_spliced(hub_env):
    folder = hub_env.partial()
    folder.mkdir(parents=True)
    hub_env.part_file().write_bytes(b"x" * 1000)
    (folder / (hub_env.part_file().name + ".json")).write_text(json.dumps({"etag": "other"}))
    r = pull("tiny")
    assert r.exit_code == 0, r.output
    assert cdn_gets(hub_env) == [None]
    assert_installed(hub_env)


def test_identical_copy_in_the_hf_cache_is_reused_not_downloaded(hub_env, monkeypatch, tmp_path):
    cache = tmp_path / "hfcache"
    snap = cache / "models--org--tiny-ninfer" / "snapshots" / hub_env.spec.revision
    snap.mkdir(parents=True)
    blob = cache / "models--org--tiny-ninfer" / "blobs" / hub_env.spec.sha256
    blob.parent.mkdir(parents=True)
    blob.write_bytes(hub_env.spec.data)
    (snap / "tiny.ninfer").symlink_to(blob)
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    dry = pull("tiny", "--dry-run")
    assert f"{blob} has the pinned size" in dry.stdout
    r = pull("tiny")
    assert r.exit_code == 0, r.output
    assert "reused" in r.stderr and hub_env.hub.log.requests == []
    m = assert_installed(hub_env)
    assert m.artifact_path.stat().st_ino == blob.stat().st_ino, "same filesystem: hard link, no second copy"
    assert blob.exists()


def test_copy_in_models_folder_with_wrong_bytes_is_ignored(hub_env):
    (hub_env.home.parent / "models").mkdir()
    (hub_env.home.parent / "models" / "tiny.ninfer").write_bytes(b"NINFER\x00\x03" + b"\0" * (SIZE - 8))
    r = pull("tiny")
    assert r.exit_code == 0, r.output
    assert "not the pinned SHA-256; ignoring it" in r.stderr and cdn_gets(hub_env) == [None]
    assert_installed(hub_env)


def test_progress_row_shows_size_speed_and_eta():
    import io

    from rich.console import Console

    buf = io.StringIO()
    progress = download.make_progress(Console(file=buf, width=100, force_terminal=False))
    with progress:
        task = progress.add_task("qwen3_8_27b.ninfer", total=18_982_458_624)
        progress.update(task, completed=6_000_000_000)
        time.sleep(0.05)
        progress.update(task, completed=6_200_000_000)
    row = [line for line in buf.getvalue().splitlines() if line.strip()][-1]
    assert row.startswith("qwen3_8_27b.ninfer") and "6.2/19.0 GB" in row
    assert "B/s" in row and ":" in row.split("B/s")[1]  # speed, then an h:mm:ss ETA
