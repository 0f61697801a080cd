"""`ninfer run [MODEL] [PROMPT | -]`: answer one prompt. Answer on stdout; reasoning and stats on stderr."""
from __future__ import annotations

from typing import Annotated, Optional

import typer

from ninfer_cli.options import (
    ChoiceOpt,
    FormatOpt,
    GrammarOpt,
    JsonSchemaOpt,
    RegexOpt,
    SpecOpt,
    DeviceOpt,
    Effort,
    FrequencyPenalty,
    MaxTokens,
    MinP,
    ModelArg,
    PresencePenalty,
    Seed,
    Temperature,
    Think,
    ThinkingBudget,
    TopK,
    TopP,
    Ctx,
    Device,
    KvOpt,
    PrefillChunk,
    ProfileOpt,
    VramLimit,
)

PromptArg = Annotated[Optional[list[str]], typer.Argument(
    help="The prompt (its words are joined, quotes optional); `-` (or nothing, with a pipe) reads it from stdin.",
    metavar="PROMPT", show_default=False)]
System = Annotated[Optional[str], typer.Option("--system", "-s", help="System prompt (text, or @file).",
                                               show_default=False)]
ShowThinking = Annotated[bool, typer.Option("--show-thinking/--hide-thinking", rich_help_panel="Reasoning",
                                            help="Print the model's reasoning on stderr.")]
JsonFlag = Annotated[bool, typer.Option("--json", help="Print one JSON object: text, reasoning, tool calls, usage, "
                                                       "timings.")]
Quiet = Annotated[bool, typer.Option("--quiet", "-q", help="No stats line.")]
TemplateFile = Annotated[Optional[str], typer.Option("--chat-template", metavar="FILE", show_default=False,
                                                     help="Render prompts with this Jinja chat template instead of "
                                                          "the model's own.")]
Tools = Annotated[Optional[str], typer.Option("--tools", metavar="FILE",
                                              help="JSON file with a list of tool schemas (OpenAI form) to offer the "
                                                   "model; its calls are printed as JSON lines, never executed.",
                                              show_default=False)]


def run(model: ModelArg = None, prompt: PromptArg = None, system: System = None,
        temperature: Temperature = None, top_k: TopK = None, top_p: TopP = None, min_p: MinP = None,
        presence_penalty: PresencePenalty = None, frequency_penalty: FrequencyPenalty = None, seed: Seed = None,
        max_tokens: MaxTokens = None, think: Think = None, reasoning_effort: Effort = None,
        thinking_budget: ThinkingBudget = None, show_thinking: ShowThinking = True, ctx: Ctx = None,
        device: DeviceOpt = Device.auto, tools: Tools = None, chat_template: TemplateFile = None,
        json_out: JsonFlag = False,
        quiet: Quiet = False, profile: ProfileOpt = None, kv: KvOpt = None, vram_limit: VramLimit = None,
        prefill_chunk: PrefillChunk = None, format: FormatOpt = None, json_schema: JsonSchemaOpt = None,
        regex: RegexOpt = None, grammar: GrammarOpt = None, choice: ChoiceOpt = None, spec: SpecOpt = None,
        synthetic: Annotated[Optional[str], typer.Option(
            "--synthetic", metavar="GEOMETRY", rich_help_panel="Engine", show_default=False,
            help="Random weights of a benchmark geometry (qwen3.8-27b, qwen3.6-35b-a3b; GPU) instead of a model: "
                 "the real path and timings, meaningless text.")] = None) -> None:
    """Answer one prompt with a model (the default model, pulled on first use, when none is named).

    Examples: `ninfer run "What is the capital of France? Answer in one sentence."`, `echo hi | ninfer run smollm2-135m -`,
    `ninfer run qwen38-27b -r low "Prove that sqrt(2) is irrational"`,
    `ninfer run --json-schema person.json "Describe a person"`, `ninfer run --choice yes,no "Is it raining?"`.
    """
    import sys
    import threading
    import time

    from engine.errors import NinferError
    from ninfer_cli.model_session import (
        generation_config,
        is_model_ref,
        looks_like_model,
        open_session,
        read_stdin_prompt,
        reasoning_note,
    )
    from ninfer_cli.options import output_constraint, reasoning_choice, sampling_overrides

    t_start = time.perf_counter()
    constraint = output_constraint(format=format, json_schema=json_schema, regex=regex, grammar=grammar, choice=choice)
    words = list(prompt or [])
    if model is not None and not is_model_ref(model) and not (words and looks_like_model(model)):
        model, words = None, [model, *words]  # `ninfer run What is ...`: the first word is not a model
    prompt = " ".join(words) if words else None  # unquoted words join with spaces, as ollama's do
    if prompt == "-" or (prompt is None and not sys.stdin.isatty()):
        prompt = read_stdin_prompt()
    if not prompt or not prompt.strip():
        raise NinferError("no prompt given", 'pass one: ninfer run [MODEL] "your question"  (or `-` to read stdin)')
    system = _read_at_file(system)
    effort = reasoning_choice(reasoning_effort, think)
    _, session, name = open_session(model, device=device, ctx=ctx, system=system,
                                    think=think if effort is None else effort.value != "off",
                                    effort=None if effort is None else effort.value,
                                    thinking_budget=thinking_budget, quiet=json_out, profile=profile, kv=kv,
                                    vram_limit=vram_limit, prefill_chunk=prefill_chunk, synthetic=synthetic)
    session.tools = _read_tools(tools)
    use_template_file(session, chat_template)
    note = reasoning_note(session, session.think, session.effort)
    if note and not json_out:
        sys.stderr.write(f"note: {note}\n")
    overrides = sampling_overrides(temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p,
                                   presence_penalty=presence_penalty, frequency_penalty=frequency_penalty,
                                   seed=seed, max_tokens=max_tokens, spec=spec, constraint=constraint)
    config = generation_config(session, overrides)
    if spec:
        from engine.speculative import check_spec

        check_spec(session.engine, spec)
    cancel = threading.Event()
    final = None
    first_token_s = None
    from ninfer_cli.output import AnswerPrinter

    printer = AnswerPrinter(sys.stdout, sys.stderr, show_thinking)
    try:
        for delta in session.send(prompt, config, cancel):
            if first_token_s is None and (delta.reasoning or delta.content or delta.done):
                first_token_s = time.perf_counter() - t_start
            if delta.done:
                final = delta
                break
            if not json_out:
                printer.feed(delta)
    except KeyboardInterrupt:
        cancel.set()
        sys.stderr.write("\n[interrupted]\n")
        raise typer.Exit(130) from None
    stats = final.stats
    backend = _backend(session)
    if json_out:
        _print_json(name, final, stats, first_token_s, time.perf_counter() - t_start, backend)
        return
    if printer.thinking:
        sys.stderr.write("\n")
    if final.tool_calls:
        import json

        for call in final.tool_calls:
            sys.stdout.write("\n" + json.dumps(call, ensure_ascii=False))
    sys.stdout.write("\n")
    sys.stdout.flush()
    if not quiet:
        sys.stderr.write(f"{name} · {backend} · {stats.line()} · start to first token {first_token_s or 0:.2f} s\n")


def _backend(session) -> str:
    """Which engine ran: numpy, cuda-graph (the CUDA engine), or cupy-reference (the reference model on CuPy)."""
    info = getattr(getattr(session, "engine", None), "info", None)
    try:
        return str(info().get("backend", "?")) if info else "?"
    except Exception:  # noqa: BLE001 - a stats line never fails the answer it follows
        return "?"


def _read_at_file(value: str | None) -> str | None:
    if value and value.startswith("@"):
        from pathlib import Path

        from engine.errors import NinferError

        path = Path(value[1:]).expanduser()
        try:
            return path.read_text("utf-8")
        except OSError as exc:
            raise NinferError(f"cannot read system prompt file {path}: {exc.strerror}", "check the path") from None
    return value


def use_template_file(session, path: str | None) -> None:
    """`--chat-template FILE`: replace the session's template (checked now: it must compile)."""
    if not path:
        return
    from pathlib import Path

    from engine.errors import NinferError
    from engine.text.chat_template import ChatTemplate

    try:
        source = Path(path).expanduser().read_text("utf-8")
    except OSError as exc:
        raise NinferError(f"cannot read chat template {path}: {exc.strerror}", "check the path") from None
    tok = session.tokenizer
    session.template = ChatTemplate(source, bos_token=getattr(tok, "bos_token", None),
                                    eos_token=getattr(tok, "eos_token", None))


def _read_tools(path: str | None) -> list | None:
    if not path:
        return None
    import json
    from pathlib import Path

    from engine.errors import NinferError

    try:
        tools = json.loads(Path(path).expanduser().read_text("utf-8"))
    except (OSError, ValueError) as exc:
        raise NinferError(f"cannot read tools from {path}: {exc}", "give a JSON file with a list of tool schemas") from None
    if isinstance(tools, dict):
        tools = tools.get("tools", [tools])
    if not isinstance(tools, list) or not all(isinstance(t, dict) for t in tools):
        raise NinferError(f"{path} is not a list of tool schemas", 'use [{"type": "function", "function": {...}}]')
    return tools


def _print_json(name, final, stats, first_token_s, total_s, backend: str = "?") -> None:
    from ninfer_cli import output

    output.print_json({
        "model": name,
        "backend": backend,
        "text": final.answer,
        "reasoning": final.answer_reasoning,
        "tool_calls": final.tool_calls,
        "finish_reason": final.finish_reason,
        "usage": {"prompt_tokens": stats.prompt_tokens, "completion_tokens": stats.generation_tokens,
                  "reasoning_tokens": stats.reasoning_tokens,
                  "total_tokens": stats.prompt_tokens + stats.generation_tokens},
        "timings": {"start_to_first_token_s": round(first_token_s or 0.0, 4),
                    "time_to_first_token_s": round(stats.ttft_s, 4),
                    "prompt_tokens_per_s": round(stats.prompt_tps, 2),
                    "generation_tokens_per_s": round(stats.generation_tps, 2),
                    "total_s": round(total_s, 4)},
        **({"spec": stats.spec} if stats.spec is not None else {}),
    })
