"""`completions/` matches what the app generates, and TAB completes commands and installed model names."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from ninfer_cli import completions_gen
from ninfer_cli.store import Store


@pytest.mark.parametrize("shell", sorted(completions_gen.FILES))
def test_committed_script_matches_regenerated(shell):
    committed = completions_gen.DIR / completions_gen.FILES[shell]
    assert committed.is_file(), f"missing {committed}: run python -m ninfer_cli.completions_gen"
    assert completions_gen.render(shell) == committed.read_text(), (
        f"{committed.name} is stale: run python -m ninfer_cli.completions_gen and commit the result"
    )


def test_zsh_script_starts_with_compdef():
    assert (completions_gen.DIR / "_ninfer").read_text().startswith("#compdef ninfer\n")


def _complete_bash(words: str, cword: int, home) -> list[str]:
    env = {**os.environ, "COMP_WORDS": words, "COMP_CWORD": str(cword),
           completions_gen.COMPLETE_VAR: "complete_bash", "NINFER_HOME": str(home)}
    code = "from ninfer_cli.main import app; app(prog_name='ninfer')"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    return out.stdout.split()


def test_tab_completes_commands_and_model_names(tmp_path):
    src = tmp_path / "a.ninfer"
    src.write_bytes(b"x")
    Store(tmp_path / "store").add("smollm2-135m", src, source="test")
    assert "show" in _complete_bash("ninfer sh", 1, tmp_path / "store")
    assert _complete_bash("ninfer show smo", 2, tmp_path / "store") == ["smollm2-135m", "smollm2-135m:latest"]
    assert _complete_bash("ninfer rm q", 2, tmp_path / "store") == []
