"""SmolLM2's own chat template renders exactly as transformers does (fixture strings)."""
import json
from pathlib import Path

import pytest

from engine.text.chat_template import ChatTemplate

GOLDEN = json.loads((Path(__file__).parents[1] / "fixtures/text/smollm2_golden.json").read_text("utf-8"))
# The template string stored in the GGUF (tokenizer.chat_template); checked against the GGUF in tests/model.
SMOL_TEMPLATE = (Path(__file__).parents[1] / "fixtures/text/smollm2_chat_template.jinja").read_text("utf-8")


@pytest.mark.parametrize("i", range(len(GOLDEN["templates"])))
def test_smollm2_template_matches_transformers(i):
    case = GOLDEN["templates"][i]
    assert ChatTemplate(SMOL_TEMPLATE).render(case["messages"], add_generation_prompt=True) == case["rendered"]


def test_default_system_prompt_only_without_system():
    out = ChatTemplate(SMOL_TEMPLATE).render([{"role": "user", "content": "hi"}])
    assert out.startswith("<|im_start|>system\nYou are a helpful AI assistant named SmolLM")
    out = ChatTemplate(SMOL_TEMPLATE).render([{"role": "system", "content": "S"}, {"role": "user", "content": "hi"}])
    assert out == "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
