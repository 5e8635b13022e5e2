"""qlinear-llm: the command line, one module per command.

    qlinear-llm generate MODEL_DIR "Once upon a time" -n 64
    qlinear-llm chat MODEL_DIR
    qlinear-llm bench MODEL_DIR --prompt-tokens 64 --decode-tokens 32 --threads 1
    qlinear-llm bench MODEL.gguf --vs llamacpp
    qlinear-llm convert SRC OUT_DIR --bits 4 --group-size 64 [--method gptq --calibration FILE]
    qlinear-llm perplexity MODEL_DIR FILE --window 512 --stride 256
    qlinear-llm serve MODEL_DIR --port 8000 --max-batch 8
    qlinear-llm make-test-model OUT_DIR --arch qwen2 --shape tiny --dtype bfloat16
    qlinear-llm train-predictor MODEL_DIR PREDICTOR_FILE
"""

from __future__ import annotations

import argparse

from . import bench, chat, convert, generate, make_test_model, perplexity, serve, train_predictor

COMMANDS = (generate, chat, bench, convert, perplexity, serve, make_test_model, train_predictor)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(prog="qlinear-llm", description="Run LLMs on qlinear's quantized kernels.")
    sub = p.add_subparsers(dest="command", required=True)
    for command in COMMANDS:
        command.add_parser(sub)
    args = p.parse_args(argv)
    try:
        args.run(args)
    except (ValueError, TypeError) as e:
        raise SystemExit(f"qlinear-llm: error: {e}") from None
    except KeyboardInterrupt:
        raise SystemExit(130) from None


if __name__ == "__main__":
    main()
