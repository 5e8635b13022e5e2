"""Throughput estimates of the ARM micro-kernels from a machine model (llvm-mca), beside MNN's.

No ARM machine is needed: the inner loop of every ARM micro-kernel descriptor (GEMV and GEMM, W4A8 /
W8A8 / float paths, each level) is cut out of the cross-built aarch64 extension by objdump (a loop is
found by its backward branch; the kernel's loop is the innermost one holding the most multiply
instructions among the functions the descriptor's entry point calls), and run through llvm-mca for
several core models. MNN 3.6.1's hand-written aarch64 kernels for the same work are found by symbol
in its wheel's engine library (its loops by their local labels, e.g. L8LoopSz_TILE_12) and measured
the same way, in the same table.

A GEMM that first stages its weight panels per call (the i8mm level's W4A8: stage_panels, its
own symbol) has its tile loop measured as the others, the staging loop priced too (cycles per 8 k of a
panel), and a further table gives the two together: multiply-adds per cycle at M rows per call,
the staging pass shared by the call's M / rows tiles. The loop its calls of fewer rows run
(operands unpacked in the loop, no staging) is a row of its own. The i8mm level's kernels for the
dotprod level's layouts (files converted on other ARM CPUs: KernelTable::also) are the dotprod
level's, but for its int4 GEMM on SMMLA (gemm_w4a8_nr8_kr4_12x8_i8mm), shown too.

Per kernel and core model it prints: cycles per loop iteration, multiply-adds per cycle, the share
of the core's issue rate of the kernel's multiply instruction (SDOT, SMMLA, FMLA, or for the plain
NEON level SMULL + SADALP) -- the peak itself measured by llvm-mca on a stream of independent such
instructions -- and, for the GEMVs, weight bytes per cycle, instructions per weight byte, and the
GB/s the loop could stream at a phone core's clock against an assumed per-core DRAM bandwidth.

These are estimates from a machine model, not measurements on a phone. They leave out memory
latency and bandwidth (every load hits L1), the per-block epilogue outside the inner loop (scales,
the float conversion; ~1 epilogue per 32..256 k), row and column tails, thread scheduling,
frequency and thermal limits, and the model's own errors (llvm-mca's description of a core is
simplified, and LLVM 19 has no scheduling model for some cores: see --cpus below).

Prerequisites (Debian bookworm x86-64, as root):
  apt-get install llvm-19 binutils-aarch64-linux-gnu   # llvm-mca-19, aarch64-linux-gnu-objdump/nm
  tools/test-aarch64.sh tests/test_ukernels.py -q      # cross-builds the extension into the cache
  pip download MNN==3.6.1 --only-binary=:all: --platform manylinux2014_aarch64 \
      --python-version 311 --no-deps -d DIR            # MNN's aarch64 wheel (only read, never run)

Usage:
  python bench/arm_kernels.py [--so PATH] [--mnn-wheel WHEEL | --mnn-lib SO] [--cpus ...]
      [--markdown FILE] [--json FILE] [--show-loops]

--so defaults to the _core*.so in $QLINEAR_AARCH64_CACHE/build (default ~/.cache/qlinear-aarch64);
the build strips it, so the script first links it again, unstripped, from the build tree's objects
(the build's own link command, LTO included) into _core.unstripped.so beside it (~1 min).
LLVM 19's scheduling models: cortex-a55 (its own), neoverse-n1 (N1 = the Cortex-A76 design),
neoverse-v1 (V1 = derived from Cortex-X1, 4 NEON pipes), neoverse-n2 (also used by LLVM for
cortex-a710 / cortex-x2; has i8mm); -mcpu=cortex-a76 and -mcpu=cortex-x1 are given the Cortex-A57
model by LLVM 19 (shown, flagged "A57 model"). i8mm kernels are modelled only on cores that have
i8mm (neoverse-v1, neoverse-n2).
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass, field

OBJDUMP = "aarch64-linux-gnu-objdump"
NM = "aarch64-linux-gnu-nm"

# Core models: (name shown, -mcpu, has i8mm, note, typical phone clock in GHz used for the GB/s column).
CPUS = {
    "cortex-a55": ("cortex-a55", False, "A55 model", 2.0),
    "cortex-a76": ("cortex-a76", False, "A57 model in LLVM 19", 2.8),
    "neoverse-n1": ("neoverse-n1", False, "N1 model (Cortex-A76 design)", 2.8),
    "cortex-x1": ("cortex-x1", False, "A57 model in LLVM 19", 3.0),
    "neoverse-v1": ("neoverse-v1", True, "V1 model (Cortex-X1 design, 4 NEON pipes)", 3.0),
    "neoverse-n2": ("neoverse-n2", True, "N2 model (LLVM's cortex-a710 / x2)", 2.8),
}
DEFAULT_CPUS = list(CPUS)
# The core models the tuning targets are stated for (dot-product issue rate >= 80%).
TARGET_CPUS = ("cortex-a76", "neoverse-n1")

BRANCH = re.compile(r"^(b|b\.\w+|cbn?z|tbn?z)$")
TARGET = re.compile(r"\b([0-9a-f]+) <")


# ---------------------------------------------------------------------------------------------
# Disassembly and loops
# ---------------------------------------------------------------------------------------------
@dataclass
class Insn:
    addr: int
    mnemonic: str
    operands: str

    @property
    def text(self) -> str:
        return f"{self.mnemonic} {self.operands}".strip()


@dataclass
class Loop:
    function: str
    start: int
    end: int  # address of the backward branch
    label: str
    insns: list[Insn] = field(default_factory=list)

    def count(self, *mnemonics: str) -> int:
        return sum(1 for i in self.insns if i.mnemonic in mnemonics)


def run(cmd: list[str]) -> str:
    return subprocess.run(cmd, check=True, capture_output=True, text=True).stdout


def parse_insns(text: str) -> list[Insn]:
    out = []
    for line in text.splitlines():
        m = re.match(r"\s*([0-9a-f]+):\s+(\S+)\s*(.*)$", line)
        if m and not m.group(2).startswith("."):
            ops = m.group(3).split("//")[0].strip()
            out.append(Insn(int(m.group(1), 16), m.group(2), ops))
    return out


def find_loops(insns: list[Insn], function: str = "", labels: dict[int, str] | None = None) -> list[Loop]:
    """Every loop of a function: a branch whose target is at or before it, within the function."""
    index = {i.addr: n for n, i in enumerate(insns)}
    loops = []
    for n, ins in enumerate(insns):
        if not BRANCH.match(ins.mnemonic):
            continue
        m = TARGET.search(ins.operands) or re.fullmatch(r"(?:.*,\s*)?(?:0x)?([0-9a-f]+)", ins.operands)
        if not m:
            continue
        target = int(m.group(1), 16)
        if target <= ins.addr and target in index:
            body = insns[index[target]:n + 1]
            loops.append(Loop(function, target, ins.addr, (labels or {}).get(target, ""), body))
    return loops


def innermost(loops: list[Loop]) -> list[Loop]:
    """Loops that contain no other loop."""
    return [a for a in loops
            if not any(b is not a and a.start <= b.start and b.end <= a.end and (b.start, b.end) != (a.start, a.end)
                       for b in loops)]


class Binary:
    """Symbols and disassembly of one aarch64 shared object."""

    def __init__(self, path: str):
        self.path = path
        self.syms: list[tuple[int, int | None, str, str]] = []  # addr, size, type, demangled name
        for line in run([NM, "-n", "-S", "-C", "--defined-only", path]).splitlines():
            m = re.match(r"([0-9a-f]+)(?: ([0-9a-f]+))? (\w) (.*)$", line)
            if m:
                self.syms.append((int(m.group(1), 16), int(m.group(2), 16) if m.group(2) else None,
                                  m.group(3), m.group(4)))
        self.labels = {a: n for a, _, _, n in self.syms}
        self._cache: dict[str, list[Insn]] = {}

    def lookup(self, name: str | re.Pattern) -> tuple[int, int | None, str]:
        hits = [s for s in self.syms if s[2] in "tTwW" and
                (s[3] == name if isinstance(name, str) else name.search(s[3]))]
        if not hits:
            raise KeyError(f"{os.path.basename(self.path)}: no function symbol {name!r}")
        if len({h[3] for h in hits}) > 1:
            raise KeyError(f"{name!r} is ambiguous: " + "; ".join(sorted({h[3] for h in hits})))
        a, size, _, n = hits[0]
        return a, size, n

    def function_end(self, start: int, size: int | None) -> int:
        if size:
            return start + size
        # Hand-written assembly has no sizes: up to the next symbol that is not a local label.
        later = [a for a, _, t, n in self.syms if a > start and t in "tTwW" and
                 (n.startswith(("MNN", "_Z", "kai_")) or "(" in n)]
        return min(later) if later else start + 0x10000

    def disassemble(self, name: str | re.Pattern) -> tuple[str, list[Insn]]:
        start, size, real = self.lookup(name)
        if real not in self._cache:
            text = run([OBJDUMP, "-d", "--no-show-raw-insn", "-C", f"--start-address={start:#x}",
                        f"--stop-address={self.function_end(start, size):#x}", self.path])
            self._cache[real] = parse_insns(text)
        return real, self._cache[real]

    def callees(self, name: str | re.Pattern, depth: int = 3) -> list[str]:
        """The function and the functions it calls directly (bl), transitively, within the binary."""
        seen, todo = [], [self.lookup(name)[2]]
        while todo and len(seen) < 64:
            fn = todo.pop(0)
            if fn in seen:
                continue
            seen.append(fn)
            if len(seen) > 1 + 8 * depth:
                break
            _, insns = self.disassemble(fn)
            for i in insns:
                if i.mnemonic == "bl":
                    m = re.search(r"<(.*)>$", i.operands)
                    if not m:
                        continue
                    callee = re.sub(r"\+0x[0-9a-f]+$", "", m.group(1)).removesuffix("@plt")
                    try:
                        self.lookup(callee)
                    except KeyError:
                        continue  # libc, libstdc++
                    if callee not in seen:
                        todo.append(callee)
        return seen

    def loops(self, name: str | re.Pattern, follow_calls: bool = True) -> list[Loop]:
        out = []
        for fn in (self.callees(name) if follow_calls else [self.lookup(name)[2]]):
            real, insns = self.disassemble(fn)
            out += find_loops(insns, real, self.labels)
        return out


# ---------------------------------------------------------------------------------------------
# Work per loop iteration
# ---------------------------------------------------------------------------------------------
def macs(ins: Insn) -> int:
    """Multiply-add slots of one instruction (products it computes)."""
    m, ops = ins.mnemonic, ins.operands
    if m in ("sdot", "udot", "usdot", "sudot"):
        return 16
    if m in ("smmla", "ummla", "usmmla"):
        return 32
    if m in ("fmla", "fmls", "mla", "smlal", "smlal2", "umlal", "umlal2", "smull", "smull2", "umull", "umull2"):
        lanes = re.match(r"v\d+\.(\d+)([bhsd])", ops)
        return int(lanes.group(1)) if lanes else 1
    return 0


KEY_CLASSES = {
    "sdot": ("sdot", "udot", "usdot", "sudot"),
    "smmla": ("smmla", "ummla", "usmmla"),
    "fmla": ("fmla",),
    "smull+sadalp": ("smull", "smull2", "smlal", "smlal2", "sadalp"),
}
# Multiply-adds per instruction of a class at its peak stream: the share column is the loop's
# multiply-adds per cycle against peak issue rate x this (SMULL + SADALP: 8 products per pair; a
# loop that adds a second SMLAL's products before its SADALP can reach 100% with fewer SADALPs).
PEAK_MACS = {"sdot": 16, "smmla": 32, "fmla.4s": 4, "fmla.8h": 8, "smull+sadalp": 4}


def key_class(loop: Loop) -> str:
    counts = {k: loop.count(*v) for k, v in KEY_CLASSES.items()}
    return max(counts, key=lambda k: (counts[k], k))


def store_bytes(ins: Insn) -> int:
    m, ops = ins.mnemonic, ins.operands
    regs = re.findall(r"\b([qdsh])\d+\b", ops.split("[")[0])
    if m in ("str", "stur") and regs:
        return {"q": 16, "d": 8, "s": 4, "h": 2}[regs[0]]
    if m == "stp" and regs:
        return 2 * {"q": 16, "d": 8, "s": 4, "h": 2}[regs[0]]
    if m.startswith("st1"):
        v = re.findall(r"v\d+\.(\d+)([bhsd])", ops)
        return sum(int(n) * {"b": 1, "h": 2, "s": 4, "d": 8}[t] for n, t in v)
    return 0


# ---------------------------------------------------------------------------------------------
# llvm-mca
# ---------------------------------------------------------------------------------------------
def llvm_mca_binary() -> str:
    for name in ("llvm-mca-19", "llvm-mca-18", "llvm-mca-17", "llvm-mca"):
        if shutil.which(name):
            return name
    sys.exit("llvm-mca not found: apt-get install llvm-19")


MATTR = "+neon,+dotprod,+fullfp16,+i8mm,+fp16fml"


def asm_for_mca(insns: list[Insn]) -> str:
    """The loop body as llvm-mc input: every branch retargeted to the loop's top label."""
    lines = ["top:"]
    for i in insns:
        if BRANCH.match(i.mnemonic):
            if i.mnemonic in ("cbz", "cbnz"):
                lines.append(f"{i.mnemonic} {i.operands.split(',')[0]}, top")
            elif i.mnemonic in ("tbz", "tbnz"):
                a = i.operands.split(",")
                lines.append(f"{i.mnemonic} {a[0]}, {a[1].strip()}, top")
            else:
                lines.append(f"{i.mnemonic} top")
        elif i.mnemonic in ("bl", "blr"):
            lines.append("bl top")
        elif i.mnemonic in ("adrp", "adr"):
            lines.append(f"{i.mnemonic} {i.operands.split(',')[0]}, top")
        else:
            ops = i.operands.split(" <")[0]  # objdump's <symbol+offset> comments
            lines.append(f"{i.mnemonic} {ops}".strip())
    return "\n".join(lines) + "\n"


_MCA_CACHE: dict = {}


def mca(asm: str, cpu: str, iterations: int = 300) -> dict:
    if (asm, cpu) in _MCA_CACHE:
        return _MCA_CACHE[(asm, cpu)]
    with tempfile.NamedTemporaryFile("w", suffix=".s", delete=False) as f:
        f.write(asm)
        path = f.name
    try:
        out = subprocess.run([llvm_mca_binary(), "-mtriple=aarch64", f"-mcpu={cpu}", f"-mattr={MATTR}",
                              f"-iterations={iterations}", "-resource-pressure=false", "-instruction-info=false",
                              path], capture_output=True, text=True)
    finally:
        os.unlink(path)
    if out.returncode != 0:
        raise RuntimeError(f"llvm-mca -mcpu={cpu} failed: {out.stderr.strip()[:400]}\n{asm}")
    total = int(re.search(r"Total Cycles:\s+(\d+)", out.stdout).group(1))
    rthru = float(re.search(r"Block RThroughput:\s+([\d.]+)", out.stdout).group(1))
    _MCA_CACHE[(asm, cpu)] = {"cycles": total / iterations, "rthroughput": rthru}
    return _MCA_CACHE[(asm, cpu)]


PEAK_STREAMS = {
    "sdot": "sdot v{n}.4s, v28.16b, v29.4b[0]",
    "smmla": "smmla v{n}.4s, v28.16b, v29.16b",
    "fmla.4s": "fmla v{n}.4s, v28.4s, v29.s[0]",
    "fmla.8h": "fmla v{n}.8h, v28.8h, v15.h[0]",
    "smull+sadalp": None,
}


def peak_rate(kind: str, cpu: str) -> float:
    """Instructions per cycle of a stream of independent instructions of one class (the issue rate)."""
    if kind == "smull+sadalp":
        body = "\n".join(f"smull v{16 + n}.8h, v28.8b, v29.8b\nsadalp v{n}.4s, v{24 + n % 4}.8h" for n in range(12))
        count = 24
    else:
        regs = [n for n in range(32) if n not in (15, 28, 29)][:24]
        body = "\n".join(PEAK_STREAMS[kind].format(n=n) for n in regs)
        count = 24
    return count / mca(body + "\n", cpu)["cycles"]


# ---------------------------------------------------------------------------------------------
# What is measured: the qlinear descriptors and MNN's kernels
# ---------------------------------------------------------------------------------------------
@dataclass
class Kernel:
    source: str          # "qlinear" or "MNN"
    name: str            # descriptor name / symbol (+ loop label)
    work: str            # e.g. "W4A8 GEMM"
    bits: int            # weight bits
    rows: int            # activation rows per register tile (1 for a GEMV)
    loops: list[Loop]    # [main multiply loop] or [unpack loop, multiply loop] (float path)
    needs_i8mm: bool = False
    note: str = ""
    stage: Loop | None = None  # the per-call staging pass of the weight panels (its loop), if any
    stage_min_rows: int = 0    # the fewest rows of a call that stages


def qlinear_descriptors() -> list[tuple[str, str, int, str, str]]:
    """(descriptor, work, bits, level, entry regex) for every ARM micro-kernel descriptor."""
    out = []
    cores = {"neon": "SmullBlockDot", "dotprod": "SdotBlockDot"}
    for level in ("neon", "dotprod", "i8mm"):
        ns = re.escape(f"qlinear::arm::{level}::")
        for bits in (4, 8):
            # Layouts: nr8_kr4 (int4) / nr8_kr4_s8 (int8) on the neon / dotprod levels, nr8_kr8 /
            # nr8_kr8_s8 on the i8mm level. The dot-product GEMV is its own function (sdot_gemv),
            # the neon level's is panel_tile's, the i8mm level's mmla_gemv.
            lay = ("nr8_kr8" if bits == 4 else "nr8_kr8_s8") if level == "i8mm" else ("nr8_kr4" if bits == 4 else "nr8_kr4_s8")
            entry = (rf"^(void )?qlinear::\(anonymous namespace\)::mmla_gemv<{bits}>\(" if level == "i8mm" else
                     rf"^void {ns}sdot_gemv<{bits}>\(" if level == "dotprod" else
                     rf"^void {ns}gemv<[^,]*\b{cores[level]}, {bits}>\(")
            out.append((f"gemv_w{bits}a8_{lay}_1x8_{level}", f"W{bits}A8 GEMV", bits, level, entry))
            # The i8mm GEMMs are their own functions (mmla_gemm_int4<kr> / _int8, i8mm.cc), the dotprod
            # level's too (sdot_gemm: 24-row tiles, then gemm's), the neon level's panel_tile's.
            gemm = (r"^(void )?qlinear::\(anonymous namespace\)::" + ("mmla_gemm_int4<8>\\(" if bits == 4 else "mmla_gemm_int8\\(")
                    if level == "i8mm" else
                    rf"^void {ns}(\(anonymous namespace\)::)?sdot_gemm<{bits}>\(" if level == "dotprod" else
                    rf"^void {ns}gemm<[^,]*\b{cores[level]}, {bits}, \d+>\(")
            out.append((f"gemm_w{bits}a8_{lay}_{{mr}}x8_{level}", f"W{bits}A8 GEMM", bits, level, gemm))
    # The i8mm level's GEMM for int4 of the dotprod level's layout (files converted elsewhere,
    # read by flash as they are: KernelTable::also); its other kernels there are the dotprod level's.
    out.append(("gemm_w4a8_nr8_kr4_{mr}x8_i8mm", "W4A8 GEMM", 4, "i8mm",
                r"^(void )?qlinear::\(anonymous namespace\)::mmla_gemm_int4<4>\("))
    for bits in (4, 8):
        lay = "nr8_kr4" if bits == 4 else "nr8_kr4_s8"   # (the i8mm level's copies: nr8_kr8 / nr8_kr8_s8)
        for kind in ("gemv", "gemm"):
            out.append((f"{kind}_w{bits}f32_{lay}_1x8_neon", f"W{bits} float32 {kind.upper()}", bits, "neon",
                        rf"^void qlinear::arm::neon::float_matmul<{bits}>\("))
            out.append((f"{kind}_w{bits}f16_{lay}_1x8_fp16",
                        f"W{bits} float16 {kind.upper()}", bits, "fp16",
                        rf"^void qlinear::\(anonymous namespace\)::half_matmul<{bits}, 4>\("))
    # The float kernels of the dotprod / i8mm levels are the neon level's float32 and fp16.cc's
    # float16 ones (make_table, with_fp16_float_path): one row each.
    return out


def is_conversion(ins: Insn) -> bool:
    """A vector int -> float conversion (the float path's dequantization)."""
    return ins.mnemonic in ("ucvtf", "scvtf") and ins.operands.startswith("v")


def mac_loops_all(loops: list[Loop]) -> list[Loop]:
    return [l for l in loops if sum(macs(i) for i in l.insns)]


def pick_loops(binary: Binary, entry: re.Pattern, float_path: bool, rows: int | None = None,
               panels: int = 1) -> tuple[list[Loop], int]:
    """The kernel's loops: the innermost loop with the most multiply slots (a GEMM: of its widest row
    tile); float path: the dequantization loop (innermost loop with int->float conversions) too."""
    loops = innermost(binary.loops(entry))
    mac_loops = [l for l in loops if sum(macs(i) for i in l.insns) and not any(is_conversion(i) for i in l.insns)]
    if not mac_loops:
        raise RuntimeError(f"{entry.pattern}: no multiply loop found")
    main = max(mac_loops, key=lambda l: (sum(macs(i) for i in l.insns), -len(l.insns)))
    if float_path and rows == 1:
        # The float kernels serve GEMV and GEMM with one function: the GEMV runs its one-row tile,
        # the multiply loop with the fewest multiply slots.
        # (Loops of fewer than 8 multiply instructions are set-up code, not a row tile.)
        tiles = [l for l in mac_loops if l.count(*KEY_CLASSES[key_class(l)]) >= 8] or mac_loops
        main = min(tiles, key=lambda l: (sum(macs(i) for i in l.insns), len(l.insns)))
    if not float_path and (rows or 1) == 1:
        # An integer GEMV whose loop is the whole storage block (inner steps unrolled, the block's
        # int -> float epilogue inside): its loop at block 64 (8 rows x 64 k of multiply slots per
        # panel, of `panels` panels (the i8mm GEMVs: two); on SMMLA twice that, a GEMV using
        # half of each tile), the asymmetric one (the longer), epilogue included.
        blocks = [l for l in mac_loops_all(loops) if any(is_conversion(i) for i in l.insns)
                  and sum(macs(i) for i in l.insns if i.mnemonic in KEY_CLASSES[key_class(l)])
                  == panels * 8 * 64 * (2 if key_class(l) == "smmla" else 1)]
        if blocks:
            return [max(blocks, key=lambda l: len(l.insns))], 1
    if not float_path:
        return [main], rows or 1
    unpack = [l for l in loops if any(is_conversion(i) for i in l.insns) and any(store_bytes(i) for i in l.insns)]
    if not unpack:
        raise RuntimeError(f"{entry.pattern}: no dequantization loop found")
    return [max(unpack, key=lambda l: (sum(is_conversion(i) for i in l.insns), -len(l.insns))), main], 1


def qlinear_kernels(binary: Binary) -> list[Kernel]:
    out = []
    rodata = open(binary.path, "rb").read()
    for desc, work, bits, level, entry in qlinear_descriptors():
        pattern = re.compile(entry)
        float_path = "float" in work
        gemm = "GEMM" in work
        rows = 1
        if "{mr}" in desc:  # the row tile is in the descriptor's name, as the binary holds it
            pat = re.escape(desc).replace(re.escape("{mr}"), r"(\d+)").encode() + b"\0"
            hits = {int(m.group(1)) for m in re.finditer(pat, rodata)}
            if len(hits) != 1:
                raise RuntimeError(f"descriptor {desc}: {len(hits)} matches in {binary.path}")
            rows = hits.pop()
            desc = desc.replace("{mr}", str(rows))
        if desc.encode() + b"\0" not in rodata:
            raise RuntimeError(f"descriptor {desc} is not in {binary.path}: the script's list is out of date")
        # the i8mm GEMVs run two panels per iteration (mmla_step64x2)
        panels = 2 if level == "i8mm" and not gemm and not float_path else 1
        loops, rows = pick_loops(binary, pattern, float_path, rows if not float_path else (1 if not gemm else 0), panels)
        note = ""
        if not float_path and any(is_conversion(i) for i in loops[-1].insns):
            note = ("one 64-k block" + (" of two panels" if panels == 2 else "") +
                    " per iteration, its int -> float epilogue included")
        k = Kernel("qlinear", desc, work, bits, rows, loops, needs_i8mm=level == "i8mm", note=note)
        if gemm and level == "i8mm" and bits == 4:
            # mmla_gemm_int4<kr> stages its panels when the call has enough rows (nr8_kr8: more
            # than 2 tiles, nr8_kr4: 1.5) and then runs mmla_rows<4, kr, 12, true>; calls of fewer
            # rows run the loop that unpacks the operands itself (mmla_rows<4, kr, 12, false>),
            # shown as its own row. (int8 weights are stored in operand order at this level: one
            # loop, no staging.)
            kr = 8 if "_kr8_" in desc else 4
            k.loops, _ = pick_loops(binary, re.compile(rf"mmla_rows<{bits}, {kr}, {rows}, true>\("), False, rows)
            stage = innermost(binary.loops(re.compile(rf"stage_panels<{kr}>\("), follow_calls=False))
            k.stage = max(stage, key=lambda l: sum(store_bytes(i) for i in l.insns))
            k.stage_min_rows = 2 * rows + 1 if kr == 8 else 3 * rows // 2 + 1
            k.note = f"staged panels: calls of >= {k.stage_min_rows} rows"
            inloop, _ = pick_loops(binary, re.compile(rf"mmla_rows<{bits}, {kr}, {rows}, false>\("), False, rows)
            how = "AND / USHR" if kr == 8 else "AND / USHR / ZIP"
            out.append(Kernel("qlinear", f"{desc}: mmla_rows<{bits}, {kr}, {rows}, false>", work, bits, rows, inloop,
                              needs_i8mm=True, note=f"calls of < {k.stage_min_rows} rows: operands unpacked in the loop ({how})"))
        out.append(k)
    return out


# MNN: (symbol, loop label regex, work, bits, rows, needs i8mm, note). The loops are found by their
# labels in MNN's assembly (backward branch to the label); rows from the label's TILE_<rows>.
MNN_KERNELS = [
    ("MNNGemmInt8AddBiasScale_ARMV82_w4_Unit", r"^L8LoopSz_TILE_12$", "W4A8 GEMM", 4, False, "12x8 SDOT tile"),
    ("MNNGemmInt8AddBiasScale_ARMV82_w4_Unit", r"^L8LoopSz_TILE_1_lu4$", "W4A8 GEMV", 4, False, "1x8, 16 k per iteration"),
    ("MNNGemmInt8AddBiasScale_ARMV82_w4_Unit_FP16", r"^L8LoopSz_TILE_1_lu8$", "W4A8 GEMV", 4, False,
     "fp16 output (MNN.llm at precision=low), 32 k per iteration"),
    ("MNNGemmInt8AddBiasScale_ARMV82_Unit", r"^L8LoopSz_TILE_12$", "W8A8 GEMM", 8, False, "12x8 SDOT tile"),
    ("MNNGemmInt8AddBiasScale_ARMV82_Unit", r"^L8LoopSz_TILE_1$", "W8A8 GEMV", 8, False, "1x8"),
    ("MNNGemmInt8AddBiasScale_ARMV86_w4_Unit", r"^LoopSz_TILE_10$", "W4A8 GEMM", 4, True, "10x8 SMMLA tile"),
    ("MNNGemmInt8AddBiasScale_ARMV86_w4_Unit", r"^LoopSz1_TILE_1_lu4$", "W4A8 GEMV", 4, True, "1x8 on SMMLA (half the products wasted)"),
    ("MNNGemmInt8AddBiasScale_ARMV86_Unit", r"^LoopSz_TILE_10$", "W8A8 GEMM", 8, True, "10x8 SMMLA tile"),
    ("MNNGemmInt8AddBiasScale_ARMV86_Unit", r"^LoopSz_TILE_1$", "W8A8 GEMV", 8, True, "1x8 on SMMLA"),
    ("MNNPackedMatMul", r"^LoopL2$", "float32 GEMM", 32, False, "dense fp32 weights (MNN has no int4-weight float kernel)"),
    ("MNNPackedMatMulFP16", r"^LoopL2$", "float16 GEMM", 16, False, "dense fp16 weights"),
]


def mnn_kernels(binary: Binary) -> list[Kernel]:
    out = []
    for sym, label, work, bits, i8mm, note in MNN_KERNELS:
        loops = [l for l in binary.loops(sym, follow_calls=False) if re.search(label, l.label)]
        if not loops:
            raise RuntimeError(f"MNN: no loop {label} in {sym}")
        loop = min(loops, key=lambda l: len(l.insns))
        rows = int(re.search(r"TILE_(\d+)", loop.label).group(1)) if "TILE_" in loop.label else 1
        out.append(Kernel("MNN", f"{sym} {loop.label}", work, bits, rows, [loop], needs_i8mm=i8mm, note=note))
    return out


def mnn_library(wheel: str | None, lib: str | None) -> str | None:
    if lib:
        return lib
    if not wheel:
        return None
    dest = os.path.join(tempfile.gettempdir(), "qlinear-mnn-" + os.path.basename(wheel).split("-")[1])
    so = glob.glob(os.path.join(dest, "_mnncengine*.so"))
    if not so:
        with zipfile.ZipFile(wheel) as z:
            names = [n for n in z.namelist() if os.path.basename(n).startswith("_mnncengine")]
            z.extract(names[0], dest)
        so = glob.glob(os.path.join(dest, "**", "_mnncengine*.so"), recursive=True)
    return so[0]


# ---------------------------------------------------------------------------------------------
# The table
# ---------------------------------------------------------------------------------------------
def evaluate(k: Kernel, cpu: str, peaks: dict) -> dict | None:
    mcpu, has_i8mm, _, ghz = CPUS[cpu]
    if k.needs_i8mm and not has_i8mm:
        return None
    main = k.loops[-1]
    r = mca(asm_for_mca(main.insns), mcpu)
    cls = key_class(main)
    # Multiply slots of the kernel's multiply class only (a GEMV block loop's epilogue FMLAs are not
    # weight products).
    slots = sum(macs(i) for i in main.insns if i.mnemonic in KEY_CLASSES[cls])
    peak_kind = cls
    if cls == "fmla":
        peak_kind = "fmla.8h" if any(".8h" in i.operands for i in main.insns if i.mnemonic == "fmla") else "fmla.4s"
    res = {"cycles": r["cycles"], "insns": len(main.insns), "macs": slots / r["cycles"], "class": cls,
           "issue": slots / r["cycles"] / (peaks[(peak_kind, cpu)] * PEAK_MACS[peak_kind])}
    if k.stage is not None:
        # The staging pass: cycles per staged byte (one byte per weight, 64 per 8 k of a panel),
        # charged once per call and shared by its row tiles: per tile iteration (slots / rows weights
        # of the panel), stage x weights x rows / M at M rows per call (M fractional: per row).
        rs = mca(asm_for_mca(k.stage.insns), mcpu)
        per_byte = rs["cycles"] / sum(store_bytes(i) for i in k.stage.insns)
        weights = slots / k.rows
        res["stage_cycles_8k"] = per_byte * 64
        res["stage_macs"] = {m: slots / (r["cycles"] + per_byte * weights * k.rows / m)
                             for m in (k.stage_min_rows, 64, 256)}
    if k.rows == 1 or "GEMV" in k.work:
        # Weight elements per iteration: multiply slots per activation row (an SMMLA computes 2 rows).
        per_row = 2 if cls == "smmla" else 1
        elems = slots / per_row
        cyc_per_elem = r["cycles"] / elems
        insn_per_elem = len(main.insns) / elems
        if len(k.loops) == 2:  # float path: + the dequantization loop, per weight element it writes
            u = k.loops[0]
            ru = mca(asm_for_mca(u.insns), mcpu)
            esize = 2 if "float16" in k.work else 4
            uelems = sum(store_bytes(i) for i in u.insns) / esize
            cyc_per_elem += ru["cycles"] / uelems
            insn_per_elem += len(u.insns) / uelems
        bytes_per_elem = k.bits / 8
        res["weight_bytes_per_cycle"] = bytes_per_elem / cyc_per_elem
        res["insns_per_weight_byte"] = insn_per_elem / bytes_per_elem
        res["gbs"] = res["weight_bytes_per_cycle"] * ghz
    return res


def has_symbols(path: str) -> bool:
    return bool(subprocess.run([NM, path], capture_output=True, text=True).stdout.strip())


def unstripped_core(build: str) -> str | None:
    """The cross-built module with its symbols. The build strips _core*.so (pybind11 does in a
    Release build), so it is linked once more, unstripped, from the build tree's objects with the
    build's own link command (as `ninja -t commands _core` gives it) into _core.unstripped.so."""
    found = sorted(glob.glob(os.path.join(build, "_core*.so")))
    found = [f for f in found if not f.endswith("_core.unstripped.so")]
    if not found:
        return None
    out = os.path.join(build, "_core.unstripped.so")
    if has_symbols(found[0]):
        return found[0]
    if os.path.exists(out) and os.path.getmtime(out) >= os.path.getmtime(found[0]):
        return out
    cmds = run(["ninja", "-C", build, "-t", "commands", "_core"]).splitlines()
    link = cmds[-1].removeprefix(": && ").split(" && ")[0]
    target = os.path.basename(found[0])
    if f"-o {target}" not in link:
        sys.exit(f"cannot read the link command of {target} in {build}: pass --so an unstripped build")
    print(f"linking {out} (unstripped) ...", file=sys.stderr)
    subprocess.run(link.replace(f"-o {target}", "-o _core.unstripped.so"), shell=True, cwd=build, check=True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    cache = os.environ.get("QLINEAR_AARCH64_CACHE", os.path.expanduser("~/.cache/qlinear-aarch64"))
    ap.add_argument("--so", default=None, help="the cross-built _core*.so (default: in the aarch64 cache)")
    ap.add_argument("--mnn-wheel", default=None, help="MNN's aarch64 wheel (mnn-3.6.1-cp311-...aarch64.whl)")
    ap.add_argument("--mnn-lib", default=None, help="or its _mnncengine*.so, unpacked")
    ap.add_argument("--cpus", nargs="+", default=DEFAULT_CPUS, choices=list(CPUS))
    ap.add_argument("--bandwidth", type=float, default=15.0,
                    help="assumed per-core DRAM bandwidth of a phone core, GB/s (default 15)")
    ap.add_argument("--markdown", default=None, help="also write the table here")
    ap.add_argument("--json", default=None, help="all numbers as JSON")
    ap.add_argument("--show-loops", action="store_true", help="print every measured loop's instructions")
    args = ap.parse_args()

    so = args.so or unstripped_core(os.path.join(cache, "build"))
    if not so:
        sys.exit(f"no _core*.so in {cache}/build: run tools/test-aarch64.sh first, or pass --so")
    for tool in (OBJDUMP, NM):
        if not shutil.which(tool):
            sys.exit(f"{tool} not found: apt-get install binutils-aarch64-linux-gnu")
    kernels = qlinear_kernels(Binary(so))
    lib = mnn_library(args.mnn_wheel, args.mnn_lib)
    if lib:
        kernels += mnn_kernels(Binary(lib))

    peaks = {}
    for cpu in args.cpus:
        for kind in PEAK_STREAMS:
            if kind == "smmla" and not CPUS[cpu][1]:
                continue
            peaks[(kind, cpu)] = peak_rate(kind, cpu)

    results = {}
    for k in kernels:
        for cpu in args.cpus:
            results[(k.name, cpu)] = evaluate(k, cpu, peaks)

    lines = render(kernels, results, peaks, args)
    text = "\n".join(lines)
    print(text)
    if args.show_loops:
        for k in kernels:
            for l in k.loops:
                print(f"\n## {k.source} {k.name}: {l.function} {l.start:#x}..{l.end:#x} {l.label}")
                print(asm_for_mca(l.insns))
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(text + "\n")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"kernels": [{"source": k.source, "name": k.name, "work": k.work, "rows": k.rows,
                                    "loops": [[l.function, l.start, l.end, l.label, len(l.insns)] for l in k.loops],
                                    "results": {c: results[(k.name, c)] for c in args.cpus}} for k in kernels],
                       "peaks": {f"{k}@{c}": v for (k, c), v in peaks.items()}}, f, indent=1)


def render(kernels: list[Kernel], results: dict, peaks: dict, args) -> list[str]:
    cpus = args.cpus
    out = ["Estimates from llvm-mca's machine models (LLVM 19), not measurements on a phone: every load",
           "hits L1, no memory latency or bandwidth limit, no thermal or frequency limits, inner loops only",
           "(tails and threading left out; the per-block epilogue too, except in the loops noted as one",
           "64-k block per iteration, which include it).", ""]
    out.append("Cores: " + "; ".join(f"{c} ({CPUS[c][2]})" for c in cpus) + ".")
    out.append("Peak issue rates (instructions/cycle, llvm-mca on independent streams): " + "; ".join(
        f"{c}: " + ", ".join(f"{k} {peaks[(k, c)]:.2f}" for k in PEAK_STREAMS if (k, c) in peaks) for c in cpus) + ".")
    out.append("")
    out.append("### GEMM and GEMV inner loops: cycles per iteration / multiply-adds per cycle / share of the "
               "core's peak multiply-add rate (issue rate of the multiply instruction x its multiply-adds)")
    out.append("")
    out.append("| kernel | work | rows | loop insns | " + " | ".join(cpus) + " |")
    out.append("|---|---|---|---|" + "---|" * len(cpus))
    order = sorted(kernels, key=lambda k: (k.work.split()[-1], k.work, k.source != "qlinear", k.name))
    for k in order:
        cells = []
        for c in cpus:
            r = results[(k.name, c)]
            cells.append("no i8mm" if r is None else f"{r['cycles']:.2f} / {r['macs']:.1f} / {100 * r['issue']:.0f}%")
        name = f"{k.source}: `{k.name}`" + (f" ({k.note})" if k.note else "")
        out.append(f"| {name} | {k.work} | {k.rows} | {len(k.loops[-1].insns)} | " + " | ".join(cells) + " |")
    staged = [k for k in order if k.stage is not None]
    if staged:
        out.append("")
        out.append("### GEMMs on staged panels, the staging pass included: staging cycles per 8 k of a panel / "
                   "multiply-adds per cycle at M rows per call (the pass's cost shared by M / rows tiles; "
                   "M per row, so fractional tiles)")
        out.append("")
        ms = list(results[(staged[0].name, next(c for c in cpus if results[(staged[0].name, c)]))]["stage_macs"])
        out.append("| kernel | work | " + " | ".join(cpus) + " |")
        out.append("|---|---|" + "---|" * len(cpus))
        for k in staged:
            cells = []
            for c in cpus:
                r = results[(k.name, c)]
                cells.append("no i8mm" if r is None else f"{r['stage_cycles_8k']:.2f} / " + " / ".join(
                    f"M={m}: {v:.1f}" for m, v in r["stage_macs"].items()))
            out.append(f"| qlinear: `{k.name}` | {k.work} | " + " | ".join(cells) + " |")
    out.append("")
    out.append(f"### GEMV weight streaming: weight bytes per cycle / instructions per weight byte / GB/s at the "
               f"clock given (a phone core's DRAM bandwidth is assumed ~{args.bandwidth:g} GB/s)")
    out.append("")
    out.append("| kernel | work | " + " | ".join(f"{c} @{CPUS[c][3]:g} GHz" for c in cpus) + " |")
    out.append("|---|---|" + "---|" * len(cpus))
    for k in order:
        if "GEMV" not in k.work:
            continue
        cells = []
        for c in cpus:
            r = results[(k.name, c)]
            cells.append("no i8mm" if r is None else
                         f"{r['weight_bytes_per_cycle']:.1f} / {r['insns_per_weight_byte']:.3f} / {r['gbs']:.0f}")
        out.append(f"| {k.source}: `{k.name}` | {k.work} | " + " | ".join(cells) + " |")
    return out


if __name__ == "__main__":
    main()
