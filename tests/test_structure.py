"""The package's shape: no import cycle inside python/qlinear, only the ops module reaches into
PackedWeight._h, qlinear.llm laid out by job (file formats, runtime, flash, server, commands) with
small modules, and the extension's bindings split by domain."""

import ast
import re
from pathlib import Path

PKG = Path(__file__).resolve().parents[1] / "python" / "qlinear"


def _modules() -> dict:
    """module name -> (path, is_package)"""
    out = {}
    for path in PKG.rglob("*.py"):
        rel = path.relative_to(PKG.parent).with_suffix("")
        parts = list(rel.parts)
        is_pkg = parts[-1] == "__init__"
        if is_pkg:
            parts = parts[:-1]
        out[".".join(parts)] = (path, is_pkg)
    return out


EXTENSIONS = {"qlinear._core"}  # compiled: imports nothing of the package


def import_graph() -> dict:
    """module -> the package's modules it imports (explicitly, at any depth of the file:
    function-level imports count too)."""
    mods = _modules()
    graph = {ext: set() for ext in EXTENSIONS}
    known = set(mods) | EXTENSIONS
    for name, (path, is_pkg) in mods.items():
        package = name if is_pkg else name.rpartition(".")[0]
        edges = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.split(".")
                    base = base[:len(base) - (node.level - 1)]
                    stem = ".".join(base + ([node.module] if node.module else []))
                else:
                    stem = node.module or ""
                targets = [f"{stem}.{a.name}" if f"{stem}.{a.name}" in known else stem for a in node.names]
            else:
                continue
            for t in targets:
                while t and t not in known:  # qlinear.x.y where y is a name: its module
                    t = t.rpartition(".")[0]
                if t and t != name:
                    edges.add(t)
        graph[name] = edges
    return graph


def find_cycle(graph: dict):
    state, stack = {}, []

    def visit(n):
        state[n] = 1
        stack.append(n)
        for m in sorted(graph.get(n, ())):
            if state.get(m) == 1:
                return stack[stack.index(m):] + [m]
            if m not in state:
                found = visit(m)
                if found:
                    return found
        stack.pop()
        state[n] = 2
        return None

    for n in sorted(graph):
        if n not in state:
            found = visit(n)
            if found:
                return found
    return None


def test_import_graph_has_no_cycle():
    graph = import_graph()
    assert "qlinear._ops" in graph["qlinear.llm.runtime.layers"]  # the graph sees relative imports
    cycle = find_cycle(graph)
    assert cycle is None, " -> ".join(cycle)


def test_find_cycle_finds_one():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]


def test_only_the_ops_module_reaches_into_the_handle():
    allowed = {PKG / "_ops.py", PKG / "_packed.py"}  # _packed: the class's own attribute
    users = [str(p.relative_to(PKG)) for p in PKG.rglob("*.py")
             if p not in allowed and re.search(r"\._h\b", p.read_text(encoding="utf-8"))]
    assert users == []


def test_llm_modules_are_small():
    big = {str(p.relative_to(PKG)): n for p in (PKG / "llm").rglob("*.py")
           if (n := len(p.read_text(encoding="utf-8").splitlines())) > 300}
    assert big == {}


LLM = "qlinear.llm"
FORMATS = ("hf", "gguf", "mnn", "converted")   # one subpackage per file format


def reachable(graph: dict, start: str) -> set:
    seen, todo = set(), [start]
    while todo:
        for m in graph.get(todo.pop(), ()):
            if m not in seen:
                seen.add(m)
                todo.append(m)
    return seen


def test_llm_top_level_is_a_map():
    """Besides its subpackages, qlinear.llm's top level holds a few modules: the public entry
    points and what every part shares."""
    top = sorted(p.stem for p in (PKG / "llm").glob("*.py") if p.stem not in ("__init__", "__main__"))
    assert len(top) <= 12, top
    packages = {p.name for p in (PKG / "llm").iterdir() if (p / "__init__.py").is_file()}
    assert {*FORMATS, "runtime", "flash", "serve", "archs", "cli", "peers"} <= packages


def test_format_readers_never_import_the_server_or_the_command_line():
    graph = import_graph()
    readers = [m for m in graph if any(m == f"{LLM}.{f}" or m.startswith(f"{LLM}.{f}.") for f in FORMATS)]
    assert len(readers) >= 4 * 2
    for m in readers:
        bad = sorted(r for r in reachable(graph, m) if r.startswith((f"{LLM}.serve", f"{LLM}.cli")))
        assert bad == [], f"{m} reaches {bad}"


def test_the_runtime_knows_no_file_format():
    """Running a token needs no reader of a format, flash, the server or the commands."""
    graph = import_graph()
    outside = (*FORMATS, "flash", "serve", "cli", "peers")
    for m in [m for m in graph if m.startswith(f"{LLM}.runtime")]:
        bad = sorted(r for r in reachable(graph, m) if r.startswith(tuple(f"{LLM}.{o}" for o in outside)))
        assert bad == [], f"{m} reaches {bad}"


def test_every_command_has_its_module():
    from qlinear.llm.cli import COMMANDS  # noqa: PLC0415
    names = {c.__name__.rpartition(".")[2] for c in COMMANDS}
    files = {p.stem for p in (PKG / "llm" / "cli").glob("*.py")} - {"__init__", "common"}
    assert names == files


def test_bindings_are_split_by_domain():
    """The extension's bindings: one file per domain (matmul, weights, decoder, the decode step,
    the runtime), each a size one reads in a sitting."""
    csrc = PKG.parents[1] / "csrc" / "bindings"
    files = {p.name: len(p.read_text(encoding="utf-8").splitlines()) for p in csrc.glob("*.cc")}
    assert {"module.cc", "matmul.cc", "weights.cc", "decoder.cc", "decode_step.cc", "runtime.cc"} <= set(files)
    assert {n: c for n, c in files.items() if c > 300} == {}
