"""`ninfer run --synthetic GEOMETRY`: random weights of a benchmark geometry through the run path (GPU only), and
the stand-in tokenizer it reads and writes ids with."""
from typer.testing import CliRunner

from ninfer_cli import main as cli


def test_synthetic_run_needs_a_gpu_and_says_so(monkeypatch):
    monkeypatch.setenv("NINFER_DEVICE", "cpu")
    r = CliRunner().invoke(cli.app, ["run", "--synthetic", "qwen3.8-27b", "hello"], prog_name="ninfer")
    assert r.exit_code == 1 and "needs a CUDA GPU" in r.output and "Traceback" not in r.output


def test_synthetic_tokenizer_covers_the_vocabulary():
    from engine.synthetic import tokenizer

    tk = tokenizer(1000)
    assert tk.encode("any words at all") == [0, 0, 0, 0]
    assert tk.decode([5, 999]) == "t5 t999"
    d = tk.detokenizer()
    assert d.add(5) + d.add(6) + d.flush() == "t5t6"
