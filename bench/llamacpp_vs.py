"""qlinear.llm and llama.cpp side by side on the same GGUF file: prefill (64-token prompt) and
decode (32 tokens) tok/s at 1 and 2 threads, in interleaved rounds.

llama.cpp is built here from the `llama-cpp-python` source distribution on PyPI (it vendors
llama.cpp), CPU only, native flags, into a cache folder outside the repository
($QLINEAR_LLAMACPP_DIR, default ~/.cache/qlinear-llamacpp): the tools the benchmarks run
(`llama-bench`, `llama-quantize`, `llama-perplexity`, `llama-lookup`, `llama-speculative`; ~10 min on
2 cores, once). GGUF files are made from the synthetic Qwen2.5-0.5B-shaped
checkpoint of bench/test_llm.py with llama.cpp's own `convert_hf_to_gguf.py` (to BF16 and Q8_0;
the synthetic tokenizer's pre-tokenizer is not in the script's list of known ones and is taken as
qwen2's) and `llama-quantize` (Q4_0, Q4_K_M).

    python bench/llamacpp_vs.py --build                     # build llama.cpp's tools only
    python bench/llamacpp_vs.py [--quants Q4_0 Q8_0 Q4_K_M] [--threads 1 2] [--rounds 3]
    python bench/llamacpp_vs.py --logits [--arch qwen2 llama phi3] [--quants ...]   # needs llama-cpp-python
    python bench/llamacpp_vs.py --tokenizer [--arch qwen2 llama]               # needs llama-cpp-python
    python bench/llamacpp_vs.py --wall [--quants ...]    # decode's weight GB/s beside a streaming read

--logits compares teacher-forced logits over 160 positions of a random prompt: llama.cpp through
its Python bindings (`pip install llama_cpp_python-*.tar.gz` from the cache folder) against
qlinear.llm on the same file, per position cosine and top-1 agreement, the latter also with
near-ties set aside: positions where llama.cpp's two leading logits are closer than the two
engines' own difference on them (the order of such a pair is decided by rounding, not by the
weights). --tokenizer encodes strings with special tokens, unicode and emoji with llama.cpp's
tokenizer and with the one qlinear rebuilds from the same file. The speed table also gives each
engine's peak RSS, each in a process of its own (`qlinear-llm bench FILE --vs llamacpp`).
The Llama files come from a Llama-architecture checkpoint of the same shape (llama.cpp's
converter permutes its Q / K rows; qlinear puts them back). `--arch phi3`: a small Phi-3 with
LongRoPE (pretraining length 64), q / k / v and gate / up fused in the file; llama.cpp pads its
context to a multiple of 256 and so takes the long factors at any context, as qlinear does past 64.

llama.cpp's figures are `llama-bench -p 64 -n 32` (its prompt of random tokens, then generation
from it); qlinear's are the same token counts through `qlinear.llm.load(FILE.gguf)` (W4A8 for the
4-bit files, W8A8 for Q8_0: the file's codes moved, not re-rounded, where the formats agree).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tarfile
import time
from pathlib import Path
from typing import Optional

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

CACHE = Path(os.environ.get("QLINEAR_LLAMACPP_DIR", Path.home() / ".cache" / "qlinear-llamacpp"))
VERSION = "0.3.36"
SRC = CACHE / f"llama_cpp_python-{VERSION}" / "vendor" / "llama.cpp"
BUILD = CACHE / "build"
PROMPT, DECODE = 64, 32

_CONVERT_WRAPPER = '''
import sys
sys.path.insert(0, sys.argv.pop(1))
import convert_hf_to_gguf as c
from conversion import base
known = base.TextModel.get_vocab_base_pre
def pre(self, tokenizer):
    try:
        return known(self, tokenizer)
    except NotImplementedError:  # a synthetic tokenizer: take qwen2's pre-tokenizer
        return "qwen2"
base.TextModel.get_vocab_base_pre = pre
sys.argv[0] = "convert_hf_to_gguf.py"
c.main()
'''


def tool(name: str) -> Path:
    return BUILD / "bin" / name


# The llama.cpp tools the benchmarks run: speed, quantization, perplexity / KL divergence and
# its speculative decoders (the last two are examples in its tree: built as targets, not all).
TOOLS = ("llama-bench", "llama-quantize", "llama-perplexity", "llama-lookup", "llama-speculative")


# llama.cpp 0.3.36's AMX matmul (taken by -march=native where the CPU has AMX) dies on an illegal
# instruction (tileloadd without the kernel's AMX permission) on prompts of 512 tokens; built
# without it, llama.cpp runs its AVX-512 kernels and repacking there.
NO_AMX = [] if "amx_tile" not in Path("/proc/cpuinfo").read_text() else [
    f"-DCMAKE_{lang}_FLAGS=-mno-amx-tile -mno-amx-int8 -mno-amx-bf16" for lang in ("C", "CXX")]


def build() -> None:
    """Fetches the llama-cpp-python sdist and builds the llama.cpp tools the benchmarks use (once)."""
    if all(tool(name).exists() for name in TOOLS):
        return
    fetch_source()
    generator = ["-G", "Ninja"] if shutil.which("ninja") else []
    subprocess.run(["cmake", "-S", str(SRC), "-B", str(BUILD), *generator, "-DCMAKE_BUILD_TYPE=Release",
                    "-DGGML_NATIVE=ON", "-DLLAMA_CURL=OFF", "-DLLAMA_BUILD_TESTS=OFF",
                    "-DLLAMA_BUILD_EXAMPLES=ON", "-DLLAMA_BUILD_SERVER=OFF", *NO_AMX], check=True)
    subprocess.run(["cmake", "--build", str(BUILD), "-j", str(os.cpu_count() or 1), "-t", *TOOLS], check=True)


def fetch_source() -> None:
    """llama.cpp's source (its converter), from the llama-cpp-python sdist (once). pip reads the
    sdist's metadata with its build backend, scikit-build-core, which it installs into an isolated
    build environment of its own: the benchmarks' extras need not carry it."""
    CACHE.mkdir(parents=True, exist_ok=True)
    sdist = CACHE / f"llama_cpp_python-{VERSION}.tar.gz"
    if not sdist.exists():
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--no-binary",
                        "llama-cpp-python", f"llama-cpp-python=={VERSION}", "-d", str(CACHE)], check=True)
    if not SRC.exists():
        with tarfile.open(sdist) as t:
            t.extractall(CACHE, filter="data")


def checkpoint(arch: str) -> Path:
    """The synthetic Qwen2.5-0.5B-shaped checkpoint of bench/test_llm.py, or a Llama one of the
    same shape; "llama-spm": a small Llama with a SentencePiece tokenizer (tokenizer.model, BPE
    with byte fallback) trained here, for the tokenizer comparison."""
    from test_llm import ROOT, VOCAB, _checkpoint
    if arch == "qwen2":
        return _checkpoint()
    if arch == "llama-spm":
        return _spm_checkpoint(ROOT / "llama-small-spm")
    if arch == "phi3":
        return _phi3_checkpoint(ROOT / "phi3-small-longrope")
    if arch in SYNTHETIC:
        hf = ROOT / f"{arch}-v{VOCAB}"
        if not (hf / "model.safetensors").is_file():
            from qlinear.llm import synthetic
            synthetic.make_checkpoint(hf, SYNTHETIC[arch][0], vocab_size=VOCAB, tokenizer_vocab=min(VOCAB, 4096),
                                      norm_noise=0.1, force=True, **SYNTHETIC[arch][1])
        return hf
    hf = ROOT / f"llama-0.5b-v{VOCAB}"
    if not (hf / "model.safetensors").is_file():
        from qlinear.llm import synthetic
        synthetic.make_checkpoint(hf, arch="llama", shape="qwen2.5-0.5b", vocab_size=VOCAB, dtype="bfloat16",
                                  tokenizer_vocab=min(VOCAB, 4096), force=True)
    return hf


def _spm_checkpoint(hf: Path) -> Path:
    if (hf / "tokenizer.model").is_file():
        return hf
    import sentencepiece as spm
    from qlinear.llm import synthetic
    synthetic.make_checkpoint(hf, arch="llama", shape="small", vocab_size=2048, force=True)
    corpus = hf / "corpus.txt"
    corpus.write_text("\n".join(synthetic.local_text(2_000_000)) + "\n" + "\n".join(TOKENIZER_TEXTS) * 20)
    spm.SentencePieceTrainer.train(
        input=str(corpus), model_prefix=str(hf / "sp"), vocab_size=2048, model_type="bpe", byte_fallback=True,
        normalization_rule_name="identity", remove_extra_whitespaces=False, split_digits=True,
        character_coverage=0.9995, minloglevel=2)
    corpus.unlink()
    (hf / "sp.model").rename(hf / "tokenizer.model")
    for name in ("tokenizer.json", "sp.vocab"):
        (hf / name).unlink(missing_ok=True)
    return hf


def _phi3_checkpoint(hf: Path) -> Path:
    """A small Phi-3 with LongRoPE (pretraining length 64, random factors) and its byte-level BPE
    tokenizer declared as GPT-2's (llama.cpp's converter reads Phi-3 vocabularies as GPT-2 BPE
    or SentencePiece)."""
    if (hf / "model.safetensors").is_file():
        return hf
    from qlinear.llm import synthetic
    half = 256 // 8 // 2
    rng = np.random.default_rng(0)
    synthetic.make_checkpoint(hf, arch="phi3", shape="small", norm_noise=0.1, force=True,
                              max_position_embeddings=4096, original_max_position_embeddings=64,
                              rope_scaling={"type": "longrope", "short_factor": (1 + rng.random(half)).tolist(),
                                            "long_factor": (1 + 4 * rng.random(half)).tolist()})
    tc = json.loads((hf / "tokenizer_config.json").read_text())
    (hf / "tokenizer_config.json").write_text(json.dumps({**tc, "tokenizer_class": "GPT2Tokenizer"}))
    return hf


CONVERTER_TYPES = ("Q8_0", "BF16", "F32")  # written by the converter; others by llama-quantize

# Qwen3.5-shaped hybrids (random weights): the 2B's geometry (24 layers, every 4th attention,
# head size 256, Gated DeltaNet heads of 128), and the 35B-A3B's with 8 of its 40 layers and 64
# of its 256 experts (8 routed + the shared one per token, as the 35B runs) so that it fits here
HYBRIDS = {
    "qwen3.5-2b": ("qwen3_5", dict(hidden_size=2048, intermediate_size=6144, num_hidden_layers=24,
                                   num_attention_heads=8, num_key_value_heads=2, head_dim=256,
                                   linear_num_key_heads=16, linear_num_value_heads=16,
                                   linear_key_head_dim=128, linear_value_head_dim=128)),
    "qwen3.5-35b-a3b-l8-e64": ("qwen3_5_moe", dict(hidden_size=2048, intermediate_size=1024, num_hidden_layers=8,
                                                   num_attention_heads=16, num_key_value_heads=2, head_dim=256,
                                                   linear_num_key_heads=16, linear_num_value_heads=32,
                                                   linear_key_head_dim=128, linear_value_head_dim=128,
                                                   num_experts=64, num_experts_per_tok=8, moe_intermediate_size=512,
                                                   shared_expert_intermediate_size=512)),
}

# GPT-OSS-20B's geometry (head size 64, 64 query / 8 KV heads, 32 experts of 2880, 4 per token,
# every other layer a window of 128) with 5 of its 24 layers: the MXFP4 experts alone 2.1 GB
GPT_OSS = {"gpt-oss-20b-l5": ("gpt_oss", dict(hidden_size=2880, intermediate_size=2880, num_hidden_layers=5,
                                              num_attention_heads=64, num_key_value_heads=8, head_dim=64,
                                              num_local_experts=32, num_experts_per_tok=4, sliding_window=128))}
# Gemma-4-E2B's geometry: 35 layers (4 sliding : 1 full, the last 20 sharing KV with MLPs twice as
# wide: llama.cpp takes the shared KV from the last two layers before them, full then sliding), heads
# of 256 (sliding) / 512 (full) over one KV head, per-layer inputs of 256
_E2B_TYPES = ["sliding_attention" if (i + 1) % 5 else "full_attention" for i in range(35)]
GEMMA4 = {"gemma-4-e2b": ("gemma4", dict(hidden_size=1536, intermediate_size=6144, num_hidden_layers=35,
                                         num_attention_heads=8, num_key_value_heads=1, head_dim=256,
                                         global_head_dim=512, sliding_window=512, num_kv_shared_layers=20,
                                         hidden_size_per_layer_input=256, layer_types=_E2B_TYPES))}
SYNTHETIC = {**HYBRIDS, **GPT_OSS, **GEMMA4}  # written by synthetic.make_checkpoint in numpy


def gguf_file(quant: str, arch: str = "qwen2") -> Path:
    """The synthetic checkpoint as a GGUF file of the given type (made once)."""
    from test_llm import VOCAB
    name = {"qwen2": f"qwen2.5-0.5b-v{VOCAB}", "llama": f"llama-0.5b-v{VOCAB}", "llama-spm": "llama-small-spm",
            "phi3": "phi3-small-longrope", **{h: f"{h}-v{VOCAB}" for h in SYNTHETIC}}[arch]
    out = CACHE / f"{name}-{quant}.gguf"
    if out.exists():
        return out
    env = dict(os.environ, PYTHONPATH=str(SRC / "gguf-py"))
    wrapper = CACHE / "convert_wrapper.py"
    wrapper.write_text(_CONVERT_WRAPPER)
    if quant in CONVERTER_TYPES:
        mtp = ["--no-mtp"] if arch in HYBRIDS else []  # (no multi-token-prediction head in these)
        subprocess.run([sys.executable, str(wrapper), str(SRC), str(checkpoint(arch)), "--outtype", quant.lower(),
                        *mtp, "--outfile", str(out)], check=True, env=env)
    else:
        subprocess.run([str(tool("llama-quantize")), str(gguf_file("BF16", arch)), str(out), quant], check=True)
    return out


def checkpoint_gguf(hf: Path, quant: str, pre: str = "gpt-2") -> Path:
    """A checkpoint directory (the trained models/) as a GGUF file of llama.cpp's own making,
    cached: F32 / BF16 / Q8_0 by its converter (the tokenizer's pre-tokenizer given as ``pre``:
    the trained tokenizer splits text as GPT-2 does), the other types by llama-quantize from F32."""
    out = CACHE / f"{Path(hf).name}-{quant}.gguf"
    if out.exists():
        return out
    fetch_source()
    if quant in CONVERTER_TYPES:
        wrapper = CACHE / f"convert_wrapper_{pre}.py"
        wrapper.write_text(_CONVERT_WRAPPER.replace('return "qwen2"', f'return "{pre}"'))
        subprocess.run([sys.executable, str(wrapper), str(SRC), str(hf), "--outtype", quant.lower(),
                        "--outfile", str(out)], check=True, env=dict(os.environ, PYTHONPATH=str(SRC / "gguf-py")))
    else:
        subprocess.run([str(tool("llama-quantize")), str(checkpoint_gguf(hf, "F32", pre)), str(out), quant],
                       check=True, capture_output=True)
    return out


def llamacpp_speed(path: Path, threads: int, where: Optional[Path] = None, extra=()) -> dict:
    """llama-bench's prefill and decode tok/s (one repetition), its peak RSS and CPU path;
    ``where``: another build's bin folder (ik_llama.cpp's), ``extra``: its options (-rtr 1)."""
    from qlinear.llm.peers import llamacpp
    r = llamacpp.bench(path, PROMPT, DECODE, threads, 1, where=str(where or BUILD / "bin"), extra_args=extra)
    return {"prefill": r["prefill_tok_s"], "decode": r["decode_tok_s"], "rss": r["peak_rss_mb"],
            "backend": r["cpu_path"]}


def qlinear_rss(path: Path, threads: int) -> float:
    """qlinear's peak RSS on ``path`` in a process of its own (the CLI bench: load, prefill, decode)."""
    r = subprocess.run([sys.executable, "-m", "qlinear.llm", "bench", str(path), "--threads", str(threads),
                        "--prompt-tokens", str(PROMPT), "--decode-tokens", str(DECODE), "--json"],
                       check=True, capture_output=True, text=True)
    return float(json.loads(r.stdout)["peak_rss_mb"])


class Qlinear:
    """qlinear's prefill and decode tok/s on one model: ``prompt`` random tokens, then ``decode``
    greedy ones."""

    def __init__(self, path: Path, threads: int, prompt: int = PROMPT, decode: int = DECODE):
        import qlinear
        from qlinear import llm
        qlinear.set_num_threads(threads)
        self.threads, self.prompt, self.decode = threads, prompt, decode
        self.model = llm.load(path, max_context=prompt + decode + 8, progress=False)
        self.ids = [int(t) for t in np.random.default_rng(0).integers(0, 4096, prompt)]

    def speed(self) -> dict:
        import qlinear
        qlinear.set_num_threads(self.threads)
        m = self.model
        m.reset()
        t0 = time.perf_counter()
        token = int(np.argmax(m.prefill(self.ids)))
        t1 = time.perf_counter()
        for i in range(self.decode):
            token = int(np.argmax(m._forward([token], self.prompt + i)[0]))
        t2 = time.perf_counter()
        return {"prefill": self.prompt / (t1 - t0), "decode": self.decode / (t2 - t1)}


def weight_bytes(model) -> int:
    """The weight bytes a decode step reads: every block's matmul weights and the lm head."""
    from qlinear.llm.runtime.layers import Linear
    linears = [model.lm_head] + [m for b in model.blocks for m in (b.attention.qkv, b.attention.o, b.gate_up, b.down)]
    return sum(m.weight.nbytes for m in linears if isinstance(m, Linear))


def memory_wall(quants, threads, rounds: int) -> None:
    """qlinear's decode as weight bytes read per second (weight bytes per token x tok/s) beside
    the same run's streaming read of 1 GiB (``_core.stream_read``, the same thread pool), in
    interleaved rounds: how near each file's decode is to the memory's ceiling."""
    import qlinear
    from qlinear import _core
    buf = np.ones((1 << 30) // 8, np.uint64)
    cpu = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")), "?")
    print(f"{cpu}, qlinear level {qlinear.cpu_info()['active_isa']}; {DECODE} decoded tokens after 16; medians of "
          f"{rounds} interleaved rounds")
    print("| file | threads | weight MB / token | decode tok/s | weight GB/s | streaming read GB/s | of the read |")
    print("|---|---|---|---|---|---|---|")
    for quant in quants:
        path = gguf_file(quant)
        for t in threads:
            q = Qlinear(path, t, 16, DECODE)
            q.speed()
            wb = weight_bytes(q.model)
            dec, st = [], []
            for _ in range(rounds):
                dec.append(q.speed()["decode"])
                qlinear.set_num_threads(t)
                best = float("inf")
                for _ in range(3):
                    t0 = time.perf_counter()
                    _core.stream_read(buf)
                    best = min(best, time.perf_counter() - t0)
                st.append(buf.nbytes / best / 1e9)
            d, r = float(np.median(dec)), float(np.median(st))
            print(f"| {quant} | {t} | {wb / 1e6:.1f} | {d:.1f} | {wb * d / 1e9:.1f} | {r:.1f} | {wb * d / 1e9 / r:.0%} |",
                  flush=True)
            del q


def near_ties(ours: np.ndarray, theirs: np.ndarray) -> np.ndarray:
    """Positions where llama.cpp's two leading logits are closer than the engines' difference on
    those two tokens: which of them wins there is decided by rounding, not by the weights."""
    rows = np.arange(len(theirs))
    top2 = np.argsort(theirs, axis=1)[:, -2:]
    margin = theirs[rows, top2[:, 1]] - theirs[rows, top2[:, 0]]
    diff = np.abs(ours - theirs)
    noise = diff[rows, top2[:, 1]] + diff[rows, top2[:, 0]]
    return margin < noise


def compare_logits(quants, archs, positions: int = 160) -> None:
    from llama_cpp import Llama
    from qlinear import llm
    print(f"teacher-forced logits over {positions} positions, qlinear (W4A8 / W8A8; float weights and "
          f"activations for F32 / BF16 files) vs llama.cpp on the same file")
    print("| model | file | cosine mean | cosine min | top-1 agreement | near-ties set aside | top-1 on the rest |")
    print("|---|---|---|---|---|---|---|")
    for arch in archs:
        for quant in quants:
            path = gguf_file(quant, arch)
            exact = {"bits": None, "act": "float"} if quant in ("F32", "BF16") else {}
            model = llm.load(path, max_context=positions + 8, progress=False, **exact)
            ids = [int(t) for t in np.random.default_rng(1).integers(0, min(4096, model.config.vocab_size), positions)]
            ours = model.logits(ids).astype(np.float64)
            del model
            ref = Llama(model_path=str(path), n_ctx=positions + 8, logits_all=True, n_threads=2, verbose=False)
            ref.eval(ids)
            theirs = np.array(ref.scores[:positions], dtype=np.float64)
            del ref
            cos = (ours * theirs).sum(1) / (np.linalg.norm(ours, axis=1) * np.linalg.norm(theirs, axis=1))
            same = ours.argmax(1) == theirs.argmax(1)
            ties = near_ties(ours, theirs)
            print(f"| {arch} | {quant} | {cos.mean():.5f} | {cos.min():.5f} | {same.mean():.1%} | "
                  f"{ties.sum()} | {same[~ties].mean():.1%} |", flush=True)


TOKENIZER_TEXTS = [
    "Hello world", "def main():\n    return 0\n", "  leading spaces\tand tabs\n\n", "numbers 1234567 and 3.14159",
    "<|im_start|>user\nhi there<|im_end|>\n<|im_start|>assistant\n", "<|endoftext|>after<|im_end|>",
    "naïve café — déjà vu", "日本語のテキストと中文字符", "Привет, мир! Ελληνικά", "emoji 😀🎉👍🏽 and 👨‍👩‍👧 family",
    "mixed: tab\there, CRLF\r\nand ünïcödé ✓ ∑ ∞", "’quotes’ “double” «guillemets»", "a" * 50 + " " + "🙂" * 5,
    "<s>a sentence</s> and </s><s>", " a leading space", "ǅ rare ☃ bytes 𝄞",
]


def compare_tokenizers(archs) -> bool:
    """Token ids of llama.cpp's tokenizer and of qlinear's (rebuilt from the same file) on TOKENIZER_TEXTS."""
    from llama_cpp import Llama
    from qlinear import llm
    ok = True
    for arch in archs:
        path = gguf_file("Q8_0", arch)
        ref = Llama(model_path=str(path), vocab_only=True, verbose=False)
        tok = llm.load(path, progress=False).tokenizer
        same = 0
        for text in TOKENIZER_TEXTS:
            theirs = ref.tokenize(text.encode(), add_bos=False, special=True)
            ours = tok.encode(text)
            if ours == theirs:
                same += 1
            else:
                ok = False
                print(f"  {arch}: differs on {text!r}:\n    qlinear   {ours}\n    llama.cpp {theirs}")
        print(f"{arch} ({path.name}, {tok.hf.get_vocab_size()} tokens): {same} of {len(TOKENIZER_TEXTS)} strings "
              "encode to the same ids", flush=True)
    return ok


def main() -> None:
    global PROMPT, DECODE
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quants", nargs="+", default=["Q4_0", "Q8_0"])
    ap.add_argument("--threads", nargs="+", type=int, default=[1, 2])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--arch", nargs="+", default=["qwen2"], choices=["qwen2", "llama", "llama-spm", "phi3", *SYNTHETIC],
                    help="llama-spm: a small Llama with a SentencePiece tokenizer (for --tokenizer); "
                         "phi3: a small Phi-3 with LongRoPE; qwen3.5-*: Qwen3.5-shaped hybrids, gpt-oss-*: GPT-OSS-shaped "
                         "(MXFP4 experts; Q8_0 is the converter's MXFP4 file with Q8_0 beside; random weights), "
                         "gemma-4-e2b: Gemma-4-E2B-shaped (per-layer embeddings, shared KV)")
    ap.add_argument("--logits", action="store_true", help="compare logits instead of speed")
    ap.add_argument("--tokenizer", action="store_true", help="compare tokenizers instead of speed")
    ap.add_argument("--wall", action="store_true", help="qlinear's decode in weight GB/s beside a streaming read")
    ap.add_argument("--build", action="store_true", help="build llama.cpp's tools, then stop")
    ap.add_argument("--ik", type=Path, default=None,
                    help="ik_llama.cpp's bin folder (its llama-bench): run it too, with and without -rtr 1")
    ap.add_argument("--prompt", type=int, default=PROMPT, help="prompt tokens (prefill)")
    ap.add_argument("--decode", type=int, default=DECODE, help="decoded tokens")
    a = ap.parse_args()
    PROMPT, DECODE = a.prompt, a.decode
    if a.build or not (a.logits or a.tokenizer) or set(a.quants) - set(CONVERTER_TYPES):
        build()
    else:  # the converter's types through llama.cpp's Python bindings: no tools needed
        fetch_source()
    if a.build:
        print(f"llama.cpp tools in {BUILD / 'bin'}")
        return
    if a.tokenizer:
        sys.exit(0 if compare_tokenizers(a.arch) else 1)
    if a.logits:
        compare_logits(a.quants, a.arch)
        return
    if a.wall:
        memory_wall(a.quants, a.threads, a.rounds)
        return
    cpu = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")), "?")
    import qlinear
    peers = {"llama.cpp": (None, ())}
    if a.ik is not None:
        if not (a.ik / "llama-bench").is_file():
            sys.exit(f"--ik {a.ik}: no llama-bench there (build ik_llama.cpp: bench/README.md)")
        peers.update({"ik": (a.ik, ()), "ik -rtr": (a.ik, ("-rtr", "1"))})
    print(f"{cpu}, qlinear level {qlinear.cpu_info()['active_isa']}; {PROMPT}-token prompt, {DECODE} decoded tokens; "
          f"medians (best) of {a.rounds} interleaved rounds, tok/s")
    engines = ["qlinear", *peers]
    print("| model | file | phase | threads | " + " | ".join(engines) + " | " +
          " | ".join(f"qlinear / {e}" for e in peers) + (" | qlinear / best ik |" if a.ik else " |"))
    print("|---" * (4 + len(engines) + len(peers) + (1 if a.ik else 0)) + "|")
    paths, rss = {}, []
    for arch in a.arch:
        for quant in a.quants:
            path = gguf_file(quant, arch)
            for t in a.threads:
                q = Qlinear(path, t, PROMPT, DECODE)
                q.speed()  # warm-up: builds the decode step, maps the weights
                runs = {e: [] for e in engines}
                for _ in range(a.rounds):
                    runs["qlinear"].append(q.speed())
                    for name, (where, extra) in peers.items():
                        lc = llamacpp_speed(path, t, where, extra)
                        paths[name, arch, quant] = lc.pop("backend")
                        runs[name].append(lc)
                for phase in ("prefill", "decode"):
                    v = {e: [r[phase] for r in rs] for e, rs in runs.items()}
                    med = {e: float(np.median(x)) for e, x in v.items()}
                    cells = [f"{med[e]:.1f} ({max(v[e]):.1f})" for e in engines]
                    ratios = [f"{med['qlinear'] / med[e]:.2f}x" for e in peers]
                    if a.ik:
                        ratios.append(f"{med['qlinear'] / max(med['ik'], med['ik -rtr']):.2f}x")
                    print(f"| {arch} | {quant} | {phase} | {t} | " + " | ".join(cells + ratios) + " |", flush=True)
                rss.append((arch, quant, t, qlinear_rss(path, t), max(r["rss"] for r in runs["llama.cpp"])))
                del q
    print("\nCPU paths: " + "; ".join(f"{e} {a} {q}: {p}" for (e, a, q), p in paths.items()) + "\n")
    print("peak RSS, MB, each engine in a process of its own (qlinear: `qlinear-llm bench`; llama.cpp: llama-bench)")
    print("| model | file | threads | qlinear | llama.cpp | qlinear / llama.cpp |")
    print("|---|---|---|---|---|---|")
    for arch, quant, t, ours, theirs in rss:
        print(f"| {arch} | {quant} | {t} | {ours:.0f} | {theirs:.0f} | {ours / theirs:.2f}x |")


if __name__ == "__main__":
    main()
