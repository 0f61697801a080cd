"""Output helpers: units, the error format, confirmation, tables that never truncate in a pipe."""
from __future__ import annotations

import io
import json

import pytest

from ninfer_cli import output


@pytest.mark.parametrize(("n", "text"), [(None, "-"), (0, "0 B"), (999, "999 B"), (1000, "1.0 KB"), (270_000, "270 KB"),
                                         (98_400_000, "98.4 MB"), (18_982_458_624, "19.0 GB"), (3 * 10**15, "3000 TB")])
def test_human_bytes(n, text):
    assert output.human_bytes(n) == text


def test_human_gib():
    assert output.human_gib(150109880320) == "139.80 GiB" and output.human_gib(None) == "-"


def test_error_format(capsys):
    output.error("no model named 'x'", "run `ninfer ls`")
    output.error("plain")
    assert capsys.readouterr().err == "error: no model named 'x'\n-> run `ninfer ls`\nerror: plain\n"


@pytest.mark.parametrize(("answer", "default", "expected"), [("y\n", False, True), ("YES\n", False, True), ("n\n", True, False),
                                                              ("\n", True, True), ("\n", False, False), ("", True, True),
                                                              ("maybe\n", False, False)])
def test_confirm(monkeypatch, capsys, answer, default, expected):
    monkeypatch.setattr("sys.stdin", io.StringIO(answer))
    assert output.confirm("delete?", default=default) is expected
    assert capsys.readouterr().err.startswith("delete? [")


def test_table_is_not_truncated_in_a_pipe(capsys):
    long = "hf://org/" + "x" * 300 + "@rev/file.ninfer"
    output.table(("NAME", "SIZE", "SOURCE"), [("m:latest", "1 GB", long)], right=("SIZE",))
    out = capsys.readouterr().out
    assert long in out and out.splitlines()[0].split() == ["NAME", "SIZE", "SOURCE"]


def test_print_json_and_key_values(capsys):
    output.print_json({"a": 1, "p": output})  # unknown types fall back to str
    output.key_values([("name", "x"), ("longer key", None)])
    out = capsys.readouterr().out
    data = json.loads(out[: out.index("}") + 1])
    assert data["a"] == 1 and "module" in data["p"]
    assert out.endswith("name        x\nlonger key  \n")
