"""``qlinear-llm chat``: an interactive conversation, its history kept in the KV cache."""

from __future__ import annotations

import sys

from .common import add_load_args, add_sampling_args, add_speculative_args, load_model, print_reply, sampling, speculation


def add_parser(sub) -> None:
    c = sub.add_parser("chat", help="interactive chat with history")
    add_load_args(c)
    c.add_argument("--system", default=None, help="system prompt")
    add_sampling_args(c)
    add_speculative_args(c)
    c.set_defaults(run=run)


def run(args) -> None:
    model = load_model(args)
    spec = speculation(args, model)
    if args.system:
        model.history.append({"role": "system", "content": args.system})
    print("(empty line or Ctrl-D to quit; /reset forgets the conversation)", file=sys.stderr)
    while True:
        try:
            line = input("> ")
        except EOFError:
            break
        if not line.strip():
            break
        if line.strip() == "/reset":
            model.reset()
            continue
        print_reply(model, model.chat(line, args.max_new_tokens, stream=True, **sampling(args), **spec),
                    args.max_new_tokens)
