"""`--spec off|mtp:K` on run, chat and serve: parsed at the command line, refused with the next action where the
engine or the model cannot speculate (the rounds themselves: tests/model/test_speculative.py)."""
import types

import pytest
from typer.testing import CliRunner

from engine.errors import NinferError
from engine.speculative import check_spec
from ninfer_cli import main as cli


@pytest.mark.parametrize("cmd", ["run", "chat", "serve"])
def test_a_bad_spec_is_a_usage_error(cmd):
    r = CliRunner().invoke(cli.app, [cmd, "--spec", "mtp:9", "hello"], prog_name="ninfer")
    assert r.exit_code == 2 and "1..5" in r.output


def test_which_engines_can_speculate():
    numpy_mtp = types.SimpleNamespace(device="cpu", model=types.SimpleNamespace(mtp_layer=object()))
    assert check_spec(numpy_mtp, "mtp:2") == ("mtp", 2) and check_spec(numpy_mtp, None) == ("off", 0)
    with pytest.raises(NinferError, match="needs a model with an MTP head"):
        check_spec(types.SimpleNamespace(device="cpu", model=types.SimpleNamespace(mtp_layer=None)), "mtp:3")
    def cuda(moe=False, mtp=True):
        model = types.SimpleNamespace(args=types.SimpleNamespace(is_moe=moe), mtp_weights={"mtp/fc": 0} if mtp else {})
        return types.SimpleNamespace(device="gpu", model=model, speculator=lambda k: None)

    assert check_spec(cuda(), "mtp:3") == ("mtp", 3)
    with pytest.raises(NinferError, match="dense models only"):
        check_spec(cuda(moe=True), "mtp:3")
    with pytest.raises(NinferError, match="needs a model with an MTP head"):
        check_spec(cuda(mtp=False), "mtp:3")
