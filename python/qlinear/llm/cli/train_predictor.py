"""``qlinear-llm train-predictor``: fit the per-layer activation predictor of a ReLU model on
local text (``sparsity``), for ``load(..., memory="flash", predictor=...)``."""

from __future__ import annotations


def add_parser(sub) -> None:
    t = sub.add_parser("train-predictor", help="fit the activation predictor of a ReLU model (memory=flash)")
    t.add_argument("model", help="the ReLU model (converted or checkpoint)")
    t.add_argument("out", help="predictor file to write")
    t.add_argument("--rank", type=int, default=32)
    t.add_argument("--recall", type=float, default=0.99, help="target recall on the calibration data")
    t.add_argument("--prompts", type=int, default=32, help="calibration sequences (local text)")
    t.add_argument("--held-out", type=int, default=8)
    t.add_argument("--tokens", type=int, default=64, help="tokens per sequence")
    t.set_defaults(run=run)


def run(args) -> None:
    from .. import load
    from ..flash import sparsity
    from ..synthetic import local_text

    model = load(args.model, progress=False)
    ids = model.tokenizer.encode("".join(local_text(4 * args.prompts * args.tokens)))
    seqs = [ids[i:i + args.tokens] for i in range(0, len(ids) - args.tokens, args.tokens)][:args.prompts + args.held_out]
    if len(seqs) < args.prompts + args.held_out:
        raise ValueError(f"only {len(seqs)} calibration sequences of {args.tokens} tokens")
    preds = sparsity.train(model, seqs[:args.prompts], rank=args.rank, recall=args.recall)
    sparsity.save(args.out, preds)
    held = sparsity.evaluate(preds, sparsity.collect(model, seqs[args.prompts:]))
    print(f"wrote {args.out}; held-out ({args.held_out} x {args.tokens} tokens): recall {held['recall']:.4f}, "
          f"precision {held['precision']:.4f}, neuron sparsity {held['sparsity']:.3f}, "
          f"predicted active {held['predicted_active']:.3f}")
