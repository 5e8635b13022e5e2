"""bench/arm_kernels.py's loop extractor on a tiny assembled aarch64 function (needs the host's
aarch64 binutils; llvm-mca is not needed)."""

import importlib.util
import pathlib
import shutil
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
AS = "aarch64-linux-gnu-as"
LD = "aarch64-linux-gnu-ld"

pytestmark = pytest.mark.skipif(
    not all(shutil.which(t) for t in (AS, LD, "aarch64-linux-gnu-objdump", "aarch64-linux-gnu-nm")),
    reason="needs binutils-aarch64-linux-gnu")

# An outer loop over blocks around an inner loop of 8 SDOTs (128 multiply-adds), a forward exit
# branch inside the inner loop, and a call to a helper that has a loop of its own.
SAMPLE = """
    .text
    .globl kernel
    .type kernel, %function
kernel:
    mov x3, #0
outer:
    mov x4, #0
    bl helper
inner:
    ldp q4, q5, [x1], #32
    and v16.16b, v4.16b, v7.16b
    ushr v17.16b, v4.16b, #4
    ldr q0, [x2, x4]
    sdot v1.4s, v16.16b, v0.4b[0]
    sdot v2.4s, v17.16b, v0.4b[1]
    sdot v1.4s, v16.16b, v0.4b[2]
    sdot v2.4s, v17.16b, v0.4b[3]
    sdot v3.4s, v16.16b, v0.4b[0]
    sdot v6.4s, v17.16b, v0.4b[1]
    sdot v3.4s, v16.16b, v0.4b[2]
    cbz x5, done
    sdot v6.4s, v17.16b, v0.4b[3]
    add x4, x4, #16
    cmp x4, x0
    b.lt inner
    scvtf v1.4s, v1.4s
    add x3, x3, #1
    cmp x3, x6
    b.ne outer
done:
    ret
    .size kernel, .-kernel
    .type helper, %function
helper:
    fmla v20.4s, v21.4s, v22.s[0]
    subs x7, x7, #1
    b.ne helper
    ret
    .size helper, .-helper
"""


@pytest.fixture(scope="module")
def tool():
    spec = importlib.util.spec_from_file_location("arm_kernels", ROOT / "bench" / "arm_kernels.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # its dataclasses look their module up
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def binary(tool, tmp_path_factory):
    d = tmp_path_factory.mktemp("asm")
    (d / "k.s").write_text(SAMPLE)
    subprocess.run([AS, "-march=armv8.2-a+dotprod", "-o", str(d / "k.o"), str(d / "k.s")], check=True)
    subprocess.run([LD, "-shared", "-o", str(d / "k.so"), str(d / "k.o")], check=True)
    return tool.Binary(str(d / "k.so"))


def test_loops_found_by_backward_branch(tool, binary):
    loops = binary.loops("kernel")  # follows the call into helper
    assert sorted((l.function, len(l.insns)) for l in loops) == [("helper", 3), ("kernel", 16), ("kernel", 22)]
    inner = tool.innermost(loops)
    assert sorted(len(l.insns) for l in inner) == [3, 16]
    sdot_loop = max(inner, key=lambda l: sum(tool.macs(i) for i in l.insns))
    assert sdot_loop.insns[0].text.startswith("ldp q4, q5")
    assert sdot_loop.insns[-1].mnemonic == "b.lt"
    assert sum(tool.macs(i) for i in sdot_loop.insns) == 8 * 16
    assert tool.key_class(sdot_loop) == "sdot"


def test_loop_rewritten_for_llvm_mca(tool, binary):
    loop = max(tool.innermost(binary.loops("kernel")), key=lambda l: len(l.insns))
    asm = tool.asm_for_mca(loop.insns).splitlines()
    assert asm[0] == "top:"
    # every branch, the forward exit too, goes back to the loop's top; no objdump <symbol> comments
    assert "cbz x5, top" in asm and asm[-1] == "b.lt top"
    assert not any("<" in line for line in asm)


def test_pick_loops_takes_the_multiply_loop(tool, binary):
    import re
    loops, rows = tool.pick_loops(binary, re.compile("^kernel$"), float_path=False, rows=1)
    assert rows == 1 and len(loops) == 1 and loops[0].count("sdot") == 8
