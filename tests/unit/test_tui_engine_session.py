"""The engine adapter under the app: the text front end's ChatSession on a scripted engine, so the
real template, reasoning split, thinking budget and sampling presets are exercised without a model."""
from __future__ import annotations

import threading

from engine.generate import Response
from engine.text.chat_template import ChatTemplate
from engine.text.presets import sampling_preset
from engine.text.session import ChatSession as TextSession
from engine.text.tokenizer import Tokenizer, build_bpe_json, bytes_to_unicode
from ninfer_cli.tui.engine_session import EngineSession
from ninfer_cli.tui.session import ChatSettings, ModelInfo
from ninfer_cli.tui.widgets import AssistantMessage

from tui_helpers import make_app, run, send

TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
            "{% if add_generation_prompt %}<|im_start|>assistant\n"
            "{% if enable_thinking is defined and enable_thinking is false %}<think>\n\n</think>\n\n"
            "{% else %}<think>\n{% endif %}{% endif %}")


def _tokenizer() -> Tokenizer:
    spell = bytes_to_unicode()
    specials = [(256, "<|im_start|>", True), (257, "<|im_end|>", True)]
    return Tokenizer.from_json(build_bpe_json({spell[b]: b for b in range(256)}, [], specials, "default"),
                               {"eos_token": "<|im_end|>"})


class ByteEngine:
    """Answers every prompt with `reply`, one byte-token at a time, honouring cancel."""

    def __init__(self, reply: str) -> None:
        self.tokenizer = _tokenizer()
        self.config = {"model_type": "qwen3_5_text"}
        self.reply = reply
        self.prompts: list[str] = []
        self.configs = []
        self.device, self.max_context = "cpu", 2048

    def stream(self, prompt_ids, config, *, cancel=None):
        self.prompts.append(self.tokenizer.decode(prompt_ids))
        self.configs.append(config)
        detok = self.tokenizer.detokenizer()
        ids = self.tokenizer.encode(self.reply)
        for n, tok in enumerate(ids[:config.max_tokens], 1):
            if cancel is not None and cancel.is_set():
                yield Response(detok.flush(), None, generation_tokens=n - 1, finish_reason="cancelled")
                return
            yield Response(detok.add(tok), tok, prompt_tokens=len(prompt_ids), generation_tokens=n,
                           generation_tps=100.0)
        if len(ids) > config.max_tokens:
            yield Response(detok.flush(), None, generation_tokens=config.max_tokens, finish_reason="length")
        else:
            yield Response(detok.flush(), 257, generation_tokens=len(ids), finish_reason="stop")


def _session(reply: str) -> tuple[EngineSession, ByteEngine]:
    engine = ByteEngine(reply)
    session = EngineSession("unused.ninfer", "scripted")
    session.engine = engine
    session.chat = TextSession(engine, template=ChatTemplate(TEMPLATE))
    session.info = ModelInfo("scripted", engine.max_context, "cpu", thinking=True)
    session.load = lambda progress=None: None
    return session, engine


def test_thinking_model_through_the_real_text_front_end(tmp_path):
    session, engine = _session("Let me think.</think>The answer is **4**.")

    async def body():
        app = make_app(tmp_path, session)
        async with app.run_test() as pilot:
            await send(pilot, "2+2?")
            answer = app.conversation.messages[-1]
            assert answer["content"] == "The answer is **4**."
            assert answer["reasoning"] == "Let me think."
            assert app.query_one(AssistantMessage).thinking.collapsed
            assert answer["stats"]["generation_tokens"] == len(engine.tokenizer.encode(engine.reply))
            assert engine.prompts[-1].endswith("<|im_start|>assistant\n<think>\n")
            assert engine.configs[-1].temperature == sampling_preset(engine.config, True)["temperature"]

            await pilot.press("ctrl+t")  # model default -> off
            app.settings.temperature = 0.1
            await send(pilot, "again")
            assert engine.prompts[-1].endswith("<think>\n\n</think>\n\n")
            assert engine.configs[-1].temperature == 0.1
            # The earlier reasoning goes back as reasoning_content, which this template leaves out.
            assert "Let me think." not in engine.prompts[-1]
            assert "The answer is **4**." in engine.prompts[-1]
    run(body())


def test_thinking_budget_and_max_tokens_reach_the_engine(tmp_path):
    session, engine = _session("a b c d e f g h i j k l m n o p</think>done")
    out = list(session.send([{"role": "user", "content": "q"}],
                            ChatSettings(thinking_budget=4, max_tokens=200), threading.Event()))
    final = out[-1]
    reasoning = "".join(c.reasoning for c in out)
    assert final.finish_reason == "stop" and len(engine.prompts) == 2  # forced close, then the answer
    assert reasoning.startswith("a b ") and "e f" not in reasoning  # 4 byte-tokens of thinking
    out = list(session.send([{"role": "user", "content": "q"}], ChatSettings(max_tokens=5), threading.Event()))
    assert out[-1].finish_reason == "length" and out[-1].generation_tokens == 5


def test_think_flag_applies_while_the_effort_is_the_model_default():
    session, engine = _session("plain answer")
    session.think = False
    list(session.send([{"role": "user", "content": "q"}], ChatSettings(), threading.Event()))
    assert engine.prompts[-1].endswith("<think>\n\n</think>\n\n")
    list(session.send([{"role": "user", "content": "q"}], ChatSettings(effort="high"), threading.Event()))
    assert engine.prompts[-1].endswith("<|im_start|>assistant\n<think>\n")


class SpecByteEngine(ByteEngine):
    """ByteEngine whose Responses carry `.spec` snapshots, as Engine.stream's do under config.spec."""

    def __init__(self, reply: str) -> None:
        super().__init__(reply)
        self.last_specs = []

    def stream(self, prompt_ids, config, *, cancel=None):
        from engine.speculative import SpecStats, parse_spec

        k = parse_spec(config.spec)[1]
        self.last_specs.append(None)
        for r in super().stream(prompt_ids, config, cancel=cancel):
            if k:
                n = r.generation_tokens
                r.spec = SpecStats(k, drafted=k * n, accepted=n, rounds=n, accepted_at=[n] + [0] * (k - 1))
                self.last_specs[-1] = r.spec
            yield r


def test_the_spec_setting_reaches_the_engine_and_the_rounds_of_every_stream_come_back():
    engine = SpecByteEngine("a b c d e f g h i j k l m n o p</think>done")
    session, _ = _session("")
    session.engine, session.chat = engine, TextSession(engine, template=ChatTemplate(TEMPLATE))
    out = list(session.send([{"role": "user", "content": "q"}],
                            ChatSettings(thinking_budget=4, max_tokens=200, spec="mtp:2"), threading.Event()))
    assert [c.spec for c in engine.configs] == ["mtp:2", "mtp:2"]  # the budget's forced close: a second stream
    want = engine.last_specs[0] + engine.last_specs[1]
    assert out[-1].spec == want.as_dict() and out[-1].spec["rounds"] > engine.last_specs[1].rounds
    out = list(session.send([{"role": "user", "content": "q"}], ChatSettings(spec="off"), threading.Event()))
    assert engine.configs[-1].spec == "off" and out[-1].spec is None
