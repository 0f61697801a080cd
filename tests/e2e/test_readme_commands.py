"""README's newcomer commands, and the wheel that `pip install .` (the first command) builds.

The full first command (fresh venv + `ninfer chat` on the default model) needs the network and an
interactive terminal; `.ci/run` runs the second command verbatim. Here: the README's shape, and the
built wheel installed on its own (not the editable checkout) answering --version, --help, env and ls.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def _bash_blocks() -> list[str]:
    return re.findall(r"^```bash\n(.*?)^```$", (REPO / "README.md").read_text(), re.M | re.S)


def test_readme_has_exactly_the_two_newcomer_commands():
    blocks = [b.strip() for b in _bash_blocks()]
    assert len(blocks) == 2, blocks
    run, test = blocks
    assert run.startswith("python3 -m venv .venv && ") and "pip install ." in run and run.endswith("ninfer chat")
    assert "pip install -e '.[test]'" in test and test.endswith('pytest -q -m "not gpu"')
    assert "\n" not in run and "\n" not in test, "each command is one line a newcomer can paste"


def test_ci_runs_the_readme_test_command():
    ci = (REPO / ".ci" / "run").read_text()
    assert "grep -m1 'pytest'" in ci and 'bash -euo pipefail -c "$test_cmd"' in ci
    assert os.access(REPO / ".ci" / "run", os.X_OK)


@pytest.mark.slow
def test_built_wheel_installs_and_runs(tmp_path):
    build = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(tmp_path / "dist"), str(REPO)],
                           capture_output=True, text=True, timeout=600)
    if build.returncode != 0 and "No matching distribution" in build.stderr:
        pytest.skip("cannot fetch the build backend (offline)")
    assert build.returncode == 0, build.stderr[-2000:]
    wheel = next((tmp_path / "dist").glob("ninfer-*.whl"))
    names = zipfile.ZipFile(wheel).namelist()
    assert "ninfer_cli/main.py" in names and "engine/errors.py" in names
    assert not [n for n in names if n.startswith("cuda/")], "cuda/ must not be a top-level package"
    assert [n for n in names if n.startswith("engine/_cuda/")], "CUDA sources must ship under engine/_cuda"
    entry = next(n for n in names if n.endswith(".dist-info/entry_points.txt"))
    assert "ninfer = ninfer_cli.main:main" in zipfile.ZipFile(wheel).read(entry).decode()

    site = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-index", "--target", str(site), str(wheel)],
                   check=True, timeout=300)
    env = {**os.environ, "PYTHONPATH": str(site), "NINFER_HOME": str(tmp_path / "home")}
    env.pop("NINFER_DEBUG", None)

    def ninfer(*args):
        code = "import sys; from ninfer_cli.main import main; sys.argv = ['ninfer', *sys.argv[1:]]; main()"
        return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, env=env,
                              cwd=tmp_path, timeout=120)

    where = subprocess.run([sys.executable, "-c", "import ninfer_cli; print(ninfer_cli.__file__)"], capture_output=True,
                           text=True, env=env, cwd=tmp_path, check=True).stdout
    assert where.startswith(str(site)), f"testing the checkout, not the wheel: {where}"
    version = ninfer("--version")
    assert version.returncode == 0 and re.fullmatch(r"ninfer \d+\.\d+\.\d+\S*\n", version.stdout), version
    assert "+checkout" not in version.stdout
    help_ = ninfer("--help")
    assert help_.returncode == 0 and "Models" in help_.stdout and "Utils" in help_.stdout
    env_ = ninfer("env")
    assert env_.returncode == 0 and "model store" in env_.stdout, env_.stderr
    assert ninfer("ls", "--json").stdout.strip() == "[]"
    missing = ninfer("show", "nope")
    assert missing.returncode == 1 and missing.stderr.startswith("error: ")


def test_readme_models_table_matches_the_catalog(monkeypatch):
    from ninfer_cli import catalog
    from ninfer_cli.output import human_bytes

    monkeypatch.delenv("NINFER_CATALOG", raising=False)
    section = (REPO / "README.md").read_text().split("## Models", 1)[1].split("\n## ", 1)[0]
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in section.splitlines() if line.startswith("| `")]
    assert rows, "README has no models table"
    known = catalog.entries()
    for name, _, _, download, _ in rows:
        entry = known.get(name.strip("`"))
        assert entry is not None, f"README lists {name}, which the catalog does not know"
        assert download == human_bytes(entry.size), f"{name}: README says {download}, catalog {human_bytes(entry.size)}"
