"""`ninfer chat [MODEL]`: talk with a model: the Textual app in a terminal, the plain REPL with `--plain` or
whenever stdin or stdout is not a terminal."""
from __future__ import annotations

from typing import Annotated, Optional

import typer

from ninfer_cli.commands.run import TemplateFile
from ninfer_cli.options import (
    ChoiceOpt, Ctx, Device, DeviceOpt, Effort, FormatOpt, GrammarOpt, JsonSchemaOpt, KvOpt, ModelArg, PrefillChunk,
    ProfileOpt, RegexOpt, Seed, SpecOpt, Temperature, Think, ThinkingBudget, VramLimit,
)

Plain = Annotated[bool, typer.Option("--plain", help="Line-oriented REPL instead of the full-screen app.")]
System = Annotated[Optional[str], typer.Option("--system", "-s", help="System prompt (text, or @file).",
                                               show_default=False)]
Preserve = Annotated[Optional[bool], typer.Option("--preserve-thinking/--drop-thinking", rich_help_panel="Reasoning",
                                                  help="Keep earlier turns' reasoning in the prompt (templates that "
                                                       "support it). Default: the model's default.",
                                                  show_default=False)]
ShowThinking = Annotated[bool, typer.Option("--show-thinking/--hide-thinking", rich_help_panel="Reasoning",
                                            help="Print the model's reasoning.")]


def chat(model: ModelArg = None, plain: Plain = False, system: System = None, think: Think = None,
         reasoning_effort: Effort = None, thinking_budget: ThinkingBudget = None,
         preserve_thinking: Preserve = None, chat_template: TemplateFile = None, show_thinking: ShowThinking = True, temperature: Temperature = None, seed: Seed = None,
         ctx: Ctx = None, device: DeviceOpt = Device.auto,
         listing: Annotated[bool, typer.Option("--list", help="List saved conversations and exit.")] = False,
         resume: Annotated[Optional[str], typer.Option("--resume", metavar="ID|last",
                                                       help="Continue a saved conversation.")] = None,
         profile: ProfileOpt = None, kv: KvOpt = None, vram_limit: VramLimit = None,
         prefill_chunk: PrefillChunk = None, format: FormatOpt = None, json_schema: JsonSchemaOpt = None,
         regex: RegexOpt = None, grammar: GrammarOpt = None, choice: ChoiceOpt = None, spec: SpecOpt = None) -> None:
    """Chat with a model (the default model, pulled on first use, when none is named). The output-format
    flags hold for every answer; `/format` changes them, and `/spec` changes --spec."""
    import sys

    from ninfer_cli.commands.run import _read_at_file, use_template_file
    from ninfer_cli.model_session import generation_config, open_session, reasoning_note
    from ninfer_cli.options import format_arg, parse_format, reasoning_choice, sampling_overrides
    from ninfer_cli.repl import Repl

    fmt = format_arg(format=format, json_schema=json_schema, regex=regex, grammar=grammar, choice=choice)
    constraint = parse_format(fmt)  # checked before the model loads
    effort = reasoning_choice(reasoning_effort, think)
    interactive = sys.stdin.isatty() and sys.stdout.isatty()
    if listing or (interactive and not plain):  # the full-screen app (ninfer_cli/tui)
        from ninfer_cli.tui.launch import list_conversations, run_chat_tui

        if not listing:
            from ninfer_cli.profiles import prefit_context

            ctx = prefit_context(model, device=device, profile=profile, ctx=ctx, kv=kv, vram_limit=vram_limit,
                                 say=lambda text: sys.stderr.write(text + "\n"))

        return list_conversations() if listing else run_chat_tui(
            model, system=_read_at_file(system), effort=effort, thinking_budget=thinking_budget,
            sampling=sampling_overrides(temperature=temperature, seed=seed, format=fmt, spec=spec), ctx=ctx,
            device=device,
            resume=resume,
            think=think if effort is None else effort.value != "off", preserve_thinking=preserve_thinking,
            profile=profile, kv=kv, vram_limit=vram_limit, prefill_chunk=prefill_chunk)
    _, session, name = open_session(model, device=device, ctx=ctx, system=_read_at_file(system),
                                    think=think if effort is None else effort.value != "off",
                                    effort=None if effort is None else effort.value,
                                    thinking_budget=thinking_budget, preserve_thinking=preserve_thinking,
                                    profile=profile, kv=kv, vram_limit=vram_limit, prefill_chunk=prefill_chunk)
    use_template_file(session, chat_template)
    note = reasoning_note(session, session.think, session.effort)
    if note:
        sys.stderr.write(f"note: {note}\n")
    config = generation_config(session, sampling_overrides(temperature=temperature, seed=seed, constraint=constraint,
                                                           spec=spec))
    if spec:
        from engine.speculative import check_spec

        check_spec(session.engine, spec)
    Repl(session, config, name=name, interactive=interactive, show_thinking=show_thinking).run()
