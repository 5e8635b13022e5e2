"""``qlinear-llm generate``: text from a prompt, streamed."""

from __future__ import annotations

from .common import add_load_args, add_sampling_args, add_speculative_args, load_model, print_reply, sampling, speculation


def add_parser(sub) -> None:
    g = sub.add_parser("generate", help="generate text from a prompt, streaming")
    add_load_args(g)
    g.add_argument("prompt")
    g.add_argument("--chat-template", action="store_true", help="wrap the prompt as a user message")
    add_sampling_args(g)
    add_speculative_args(g)
    g.set_defaults(run=run)


def run(args) -> None:
    model = load_model(args)
    prompt = [{"role": "user", "content": args.prompt}] if args.chat_template else args.prompt
    print_reply(model, model.stream(prompt, args.max_new_tokens, **sampling(args), **speculation(args, model)), args.max_new_tokens)
