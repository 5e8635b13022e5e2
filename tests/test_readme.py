"""The code blocks of README.md and of every page in docs/ run as written, so that the
documentation cannot drift from the code. The policy, block by block:

* ```python blocks are exec'd as written, each in a fresh namespace, in the page's temporary
  directory (the current directory while it runs).
* ```bash / ```sh blocks run for real: bash, ``set -e``, in the page's temporary directory, with a
  timeout, the test's Python first on PATH (``python``, ``pip``, ``qlinear-llm``). The blocks of
  one page run in order in one directory, as a reader would run them: a model made in one block
  is used by the next. Each command (each ``&&`` part of a line) is classified first
  (``classify``), and these kinds are checked instead of run:
  - install commands (``pip install ...``, Termux's ``pkg install``): the extras they name must
    exist in pyproject.toml and a torch they name must be the pinned 2.13.0
    (``test_install_commands_name_real_extras``); CI runs the README's install commands itself
    (``test_ci_runs_the_readme_install_commands``);
  - the test suite (``pytest tests``): it is the run doing this check;
  - long benchmarks and evaluations (``pytest bench/...``, ``python bench/...``,
    ``python -m qlinear.accuracy``): run with ``--help`` (pytest: on the same paths, so that
    bench/conftest.py's options count), to check that the files exist and that every option the
    command names is one they take.
* An HTML comment right before a block changes how it runs:
  - ``<!-- doc-test: server -->``: the block is one long-lived command (``qlinear-llm serve``):
    it is started on a free loopback port (its ``--port`` replaced), waited for on ``/health``
    (bounded in time), and killed after the ``<!-- doc-test: client -->`` blocks that follow it
    ran (bash or python, with ``localhost:PORT`` / ``127.0.0.1:PORT`` pointed at the real port);
  - ``<!-- doc-test: check-only: REASON -->``: every command of the block is checked like a
    benchmark (``--help``: the command and each option it names exist) and not run; the reason
    (what the test cannot make: a GB model, a file of another tool) is required.
* ```text blocks (tables, output samples) are not run, and must not hold commands
  (``test_text_blocks_hold_no_commands``); no other fence language is allowed.

A block whose modules are missing (the kernel-only test environments) is skipped, and so are the
later blocks of its page that need any module or command (they may use its files; blocks of
numpy and qlinear alone still run); bash blocks also need qlinear installed (its ``qlinear-llm``
command on PATH). The examples use tiny local models (``qlinear-llm make-test-model``,
``qlinear.llm.synthetic``): no download.

Beside the runs: README.md starts with its two install commands, stays within 250 lines and links
every page of docs/; every relative link, and every heading it points at, exists.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Optional

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
PAGES = [README] + sorted((ROOT / "docs").glob("*.md"))
LANGUAGES = {"python", "bash", "sh", "text"}
BLOCK_TIMEOUT = 300        # seconds a bash block may run
SERVER_TIMEOUT = 120       # seconds a server may take to answer /health
CHECK_TIMEOUT = 120        # seconds a --help check may take

FENCE = re.compile(r"^```([^\n`]*)\n(.*?)^```[ \t]*$", re.S | re.M)
MARKER = re.compile(r"<!--\s*doc-test:\s*([a-z-]+)\s*(?::\s*(.*?))?\s*-->\s*\Z", re.S)


@dataclass
class Block:
    page: Path
    line: int                      # 1-based line of the opening fence
    lang: str
    code: str
    marker: Optional[str] = None   # server / client / check-only
    reason: str = ""
    clients: list = field(default_factory=list)  # a server block's client blocks

    @property
    def where(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"


def parse(page: Path) -> list:
    text = page.read_text(encoding="utf-8")
    blocks = []
    for m in FENCE.finditer(text):
        before = text[:m.start()].rstrip()
        last = before[before.rfind("\n") + 1:] if before else ""
        marker = MARKER.search(last)
        blocks.append(Block(page, text.count("\n", 0, m.start()) + 1, m.group(1).strip(), m.group(2),
                            marker.group(1) if marker else None, (marker.group(2) or "") if marker else ""))
    return blocks


BLOCKS = {page: parse(page) for page in PAGES}
ALL_BLOCKS = [b for page in PAGES for b in BLOCKS[page]]


def units(page: Path) -> list:
    """The page's runnable blocks in order, a server block with its client blocks as one."""
    out = []
    for b in BLOCKS[page]:
        if b.lang == "text":
            continue
        if b.marker == "client":
            if out and out[-1].marker == "server":
                out[-1].clients.append(b)
            continue  # a client without a server: test_markers_are_valid fails
        out.append(b)
    return out


UNITS = [u for page in PAGES for u in units(page)]


# -- commands ----------------------------------------------------------------------------------

def logical_lines(code: str) -> list:
    """The block's lines with backslash continuations joined, blank and comment lines dropped."""
    lines, cur = [], ""
    for raw in code.splitlines():
        if raw.rstrip().endswith("\\"):
            cur += raw.rstrip()[:-1] + " "
            continue
        cur += raw
        if cur.strip() and not cur.strip().startswith("#"):
            lines.append(cur)
        cur = ""
    return lines


def split_and(line: str) -> list:
    """A line's commands: its parts between ``&&`` outside quotes."""
    parts, cur, quote, i = [], "", None, 0
    while i < len(line):
        c = line[i]
        if quote:
            quote = None if c == quote else quote
        elif c in "'\"":
            quote = c
        elif line.startswith("&&", i):
            parts.append(cur)
            cur, i = "", i + 2
            continue
        elif c == "#" and (not cur or cur[-1].isspace()):
            cur += line[i:]   # a comment: the rest of the line
            break
        cur += c
        i += 1
    parts.append(cur)
    return parts


def words(command: str) -> list:
    """The command's words, comments and leading VAR=value assignments dropped."""
    w = shlex.split(command, comments=True)
    while w and re.match(r"^[A-Za-z_][A-Za-z0-9_]*=", w[0]):
        w = w[1:]
    return w


def _pytest_paths(w: list) -> Optional[list]:
    if w[:1] == ["pytest"]:
        args = w[1:]
    elif w[:3] in (["python", "-m", "pytest"], ["python3", "-m", "pytest"]):
        args = w[3:]
    else:
        return None
    return [a for a in args if not a.startswith("-")]


def classify(command: str) -> str:
    """install / suite / benchmark / server / run (see the module docstring)."""
    w = words(command)
    if not w:
        return "run"
    if w[:2] in (["pip", "install"], ["pkg", "install"]) or w[1:4] == ["-m", "pip", "install"]:
        return "install"
    paths = _pytest_paths(w)
    if paths is not None:
        if paths and all(p.startswith("bench") for p in paths):
            return "benchmark"
        if paths and all(p.startswith("tests") for p in paths):
            return "suite"
        return "run"
    if w[0] in ("python", "python3") and len(w) > 1 and w[1].startswith("bench/"):
        return "benchmark"
    if w[0] in ("python", "python3") and w[1:3] == ["-m", "qlinear.accuracy"]:
        return "benchmark"
    if w[:2] == ["qlinear-llm", "serve"]:
        return "server"
    return "run"


def commands(block: Block) -> list:
    return [part for line in logical_lines(block.code) for part in split_and(line)]


# -- environment -------------------------------------------------------------------------------

def _env() -> dict:
    env = dict(os.environ)
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
    env.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", TOKENIZERS_PARALLELISM="false",
               PYTHONWARNINGS="ignore")
    return env


LLM_MODULES = ["tokenizers", "jinja2", "torch", "transformers"]


def needs(block: Block) -> list:
    """The modules (or commands, as ``cmd:NAME``) a block needs."""
    code = "\n".join([block.code] + [c.code for c in block.clients])
    mods = []
    if "qlinear.torch" in code or re.search(r"^import torch|^from torch", code, re.M):
        mods.append("torch")
    if "qlinear import llm" in code or "qlinear.llm" in code or "qlinear-llm" in code:
        mods += LLM_MODULES
    if "qlinear-llm serve" in code:
        mods += ["starlette", "uvicorn", "prometheus_client"]
    if "openai" in code:
        mods += ["openai", "httpx"]
    if "export_with_llmexport" in code or "--vs mnn" in code:
        mods += ["MNN", "llmexport"]
    if "bench/" in code:
        mods += ["pytest_benchmark", "threadpoolctl"] + LLM_MODULES
    if "qlinear.accuracy" in code:
        mods += ["torch", "transformers"]
    if block.lang in ("bash", "sh"):
        mods.append("dist:qlinear")
        if "qlinear-llm" in code:
            mods.append("cmd:qlinear-llm")
        if re.search(r"^\s*curl |\| *curl |&& *curl ", code, re.M):
            mods.append("cmd:curl")
    return list(dict.fromkeys(mods))


def missing(block: Block) -> Optional[str]:
    for need in needs(block):
        if need.startswith("cmd:"):
            path = os.pathsep.join([os.path.dirname(sys.executable), os.environ.get("PATH", "")])
            if shutil.which(need[4:], path=path) is None:
                return f"no {need[4:]} command"
        elif need.startswith("dist:"):
            try:
                importlib.metadata.version(need[5:])
            except importlib.metadata.PackageNotFoundError:
                return f"{need[5:]} is not installed (bash blocks run its installed commands)"
        elif importlib.util.find_spec(need) is None:
            return f"no module {need}"
    return None


# -- checks instead of runs --------------------------------------------------------------------

@lru_cache(maxsize=None)
def _pyproject_extras() -> frozenset:
    text = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    try:
        import tomllib
    except ModuleNotFoundError:  # Python < 3.11: the section's `name = [` lines
        section = text.split("[project.optional-dependencies]", 1)[1].split("\n[", 1)[0]
        return frozenset(re.findall(r"^([A-Za-z0-9_-]+)\s*=\s*\[", section, re.M))
    return frozenset(tomllib.loads(text)["project"]["optional-dependencies"])


def check_install(command: str) -> None:
    """An install line: the extras of ``.[...]`` exist; a torch it names is the pinned one."""
    w = words(command)
    if w[:2] == ["pkg", "install"]:
        return  # Termux's packages: nothing of ours to check
    for arg in w:
        m = re.match(r"^\.(?:\[(.*)\])?$", arg)
        if m and m.group(1):
            unknown = set(e.strip() for e in m.group(1).split(",")) - _pyproject_extras()
            assert not unknown, f"{command!r}: extras not in pyproject.toml: {sorted(unknown)}"
        if re.match(r"^torch\b", arg):
            assert arg == "torch==2.13.0", f"{command!r}: torch must be pinned as torch==2.13.0"


@lru_cache(maxsize=None)
def _help(argv: tuple) -> str:
    proc = subprocess.run(list(argv), cwd=ROOT, env=_env(), capture_output=True, text=True,
                          timeout=CHECK_TIMEOUT, stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, f"{' '.join(argv)} failed ({proc.returncode}):\n{proc.stderr[-2000:]}"
    return proc.stdout


def check_with_help(command: str) -> None:
    """Run the command's program with --help; each option it names must be in the help text."""
    w = words(command)
    options = {a.split("=", 1)[0] for a in w if a.startswith("--")}
    paths = _pytest_paths(w)
    if paths is not None:  # pytest: the paths exist, its options (conftest's too) are listed
        for p in paths:
            assert (ROOT / p.split("::")[0]).exists(), f"{command!r}: no {p} in the repository"
        argv = (sys.executable, "-m", "pytest", *paths, "-p", "no:cacheprovider", "--help")
    else:
        head = []
        for a in w:  # the program, its subcommand or positionals: the words before any option
            if a.startswith("-") and a != "-m":
                break
            head.append(a)
        if head[0] in ("python", "python3"):
            head[0] = sys.executable
            if len(head) > 1 and head[1] != "-m":
                script = ROOT / head[1]
                assert script.is_file(), f"{command!r}: no {head[1]} in the repository"
                assert "argparse" in script.read_text(encoding="utf-8"), \
                    f"{head[1]} parses no options: --help would run it"
        elif head[0] == "qlinear-llm":
            head = [sys.executable, "-m", "qlinear.llm", *head[1:]]
        else:
            pytest.fail(f"{command!r}: not a command that can be checked without running it")
        argv = (*head, "--help")
    text = _help(argv)
    absent = sorted(o for o in options if not re.search(re.escape(o) + r"(?![\w-])", text))
    assert not absent, f"{command!r}: options that {' '.join(argv[1:3])} --help does not list: {absent}"


# -- running -----------------------------------------------------------------------------------

def bash_script(block: Block) -> str:
    """The block as run: the commands checked instead of run are replaced by ``true``, each
    checked here first."""
    out = []
    for line in logical_lines(block.code):
        parts = []
        for part in split_and(line):
            kind = classify(part)
            if kind == "install":
                check_install(part)       # CI runs the install commands themselves
                parts.append(" true ")
            elif kind == "suite":
                parts.append(" true ")    # the test suite: this run
            elif kind == "benchmark":
                check_with_help(part)
                parts.append(" true ")
            elif kind == "server":
                pytest.fail(f"{block.where}: a server command outside a <!-- doc-test: server --> block")
            else:
                parts.append(part)
        out.append("&&".join(parts))
    return "set -e\n" + "\n".join(out) + "\n"


def run_bash(block: Block, cwd: Path, script: Optional[str] = None) -> None:
    script = bash_script(block) if script is None else script
    try:
        proc = subprocess.run(["bash", "-c", script], cwd=cwd, env=_env(), capture_output=True,
                              text=True, timeout=BLOCK_TIMEOUT, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        pytest.fail(f"{block.where}: the block ran over {BLOCK_TIMEOUT} s")
    assert proc.returncode == 0, (f"{block.where}: bash block failed ({proc.returncode})\n--- script\n"
                                  f"{script}--- stdout\n{proc.stdout[-3000:]}\n--- stderr\n{proc.stderr[-3000:]}")


def run_python(block: Block, cwd: Path, code: Optional[str] = None) -> None:
    import qlinear
    threads, isa = qlinear.get_num_threads(), qlinear.cpu_info()["active_isa"]
    previous = os.getcwd()
    os.chdir(cwd)
    try:
        exec(compile(block.code if code is None else code, f"{block.where} python block", "exec"),
             {"__name__": "doc"})
    finally:  # blocks may switch these
        os.chdir(previous)
        qlinear.set_num_threads(threads)
        qlinear.set_isa(isa)


def check_only(block: Block) -> None:
    for command in commands(block):
        if classify(command) == "install":
            check_install(command)
        else:
            check_with_help(command)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_server(block: Block, cwd: Path) -> None:
    """Start the block's server on a free loopback port, run its clients, stop it."""
    (command,) = commands(block)
    assert classify(command) == "server", f"{block.where}: a server block holds one server command"
    m = re.search(r"--port[ =](\d+)", command)
    assert m, f"{block.where}: the server command names its --port"
    old, port = m.group(1), _free_port()
    command = command[:m.start()] + f"--port {port}" + command[m.end():]
    log = open(cwd / f"server-{port}.log", "w+")
    proc = subprocess.Popen(["bash", "-c", "exec " + command], cwd=cwd, env=_env(), stdout=log,
                            stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.monotonic() + SERVER_TIMEOUT
        while True:
            if proc.poll() is not None:
                log.seek(0)
                pytest.fail(f"{block.where}: the server exited ({proc.returncode}):\n{log.read()[-3000:]}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            assert time.monotonic() < deadline, f"{block.where}: no answer on /health in {SERVER_TIMEOUT} s"
            time.sleep(0.2)
        for client in block.clients:
            code = re.sub(rf"\b(localhost|127\.0\.0\.1):{old}\b", rf"\g<1>:{port}", client.code)
            if client.lang == "python":
                run_python(client, cwd, code)
            else:
                run_bash(client, cwd, bash_script(Block(client.page, client.line, client.lang, code)))
    finally:
        _stop(proc)
        log.close()


def _stop(proc: subprocess.Popen) -> None:
    """SIGTERM to the server's own process group (start_new_session), SIGKILL after 15 s."""
    for sig, wait in ((signal.SIGTERM, 15), (signal.SIGKILL, None)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            pass
        try:
            proc.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue


def run_unit(block: Block, cwd: Path) -> None:
    if block.marker == "check-only":
        check_only(block)
    elif block.marker == "server":
        run_server(block, cwd)
    elif block.lang == "python":
        run_python(block, cwd)
    else:
        run_bash(block, cwd)


# -- the page runs -----------------------------------------------------------------------------

_STATE: dict = {}   # page -> {"dir": Path, "done": int, "skipped": str, "failed": str}


@pytest.fixture(scope="session")
def page_dirs(tmp_path_factory):
    """A page's directory; ``models`` in it is the repository's trained models, so that examples
    name ``models/stdlib-qwen2`` as a reader in the repository's root would."""
    def make(page: Path) -> Path:
        d = tmp_path_factory.mktemp(page.stem.lower())
        (d / "models").symlink_to(ROOT / "models", target_is_directory=True)
        return d
    return make


def _run_through(page: Path, index: int, page_dirs) -> None:
    """Runs the page's units up to ``index`` (the earlier ones first, once)."""
    state = _STATE.setdefault(page, {"dir": page_dirs(page), "done": 0, "skipped": "", "failed": ""})
    page_units = units(page)
    while state["done"] <= index:
        i = state["done"]
        unit = page_units[i]
        state["done"] += 1
        if (state["failed"] or state["skipped"]) and needs(unit):  # it may use the earlier one's files
            earlier = state["failed"] or state["skipped"]
            if i == index:
                (pytest.fail if state["failed"] else pytest.skip)(f"an earlier block of the page did not run: {earlier}")
            continue
        reason = missing(unit)
        if reason:
            state["skipped"] = f"{unit.where}: {reason}"
            if i == index:
                pytest.skip(reason)
            continue
        try:
            run_unit(unit, state["dir"])
        except (Exception, pytest.fail.Exception, pytest.skip.Exception) as e:
            if isinstance(e, pytest.skip.Exception):
                state["skipped"] = f"{unit.where}: {e}"
            else:
                state["failed"] = f"{unit.where}: {type(e).__name__}"
            if i == index:
                raise


@pytest.mark.parametrize("unit", UNITS, ids=lambda u: f"{u.where}-{u.marker or u.lang}")
def test_doc_block_runs(unit, page_dirs):
    _run_through(unit.page, units(unit.page).index(unit), page_dirs)


# -- static checks -----------------------------------------------------------------------------

def test_fences_have_known_languages():
    bad = [f"{b.where}: ```{b.lang}" for b in ALL_BLOCKS if b.lang not in LANGUAGES]
    assert not bad, f"code blocks need one of {sorted(LANGUAGES)}: {bad}"


def test_markers_are_valid():
    problems = []
    for page in PAGES:
        previous = None
        for b in BLOCKS[page]:
            if b.marker not in (None, "server", "client", "check-only"):
                problems.append(f"{b.where}: unknown marker {b.marker!r}")
            if b.marker == "check-only" and not b.reason:
                problems.append(f"{b.where}: check-only needs a reason")
            if b.marker in ("server", "check-only") and b.lang not in ("bash", "sh"):
                problems.append(f"{b.where}: a {b.marker} block is a bash block")
            if b.marker == "client" and (previous is None or previous.marker not in ("server", "client")):
                problems.append(f"{b.where}: a client block follows a server block (or its clients)")
            if b.marker == "client" and b.lang not in ("bash", "sh", "python"):
                problems.append(f"{b.where}: a client block is bash or python")
            previous = b
        text = page.read_text(encoding="utf-8")
        for m in re.finditer(r"^<!--\s*doc-test:", text, re.M):
            rest = text[m.start():]
            if not re.match(r"<!--[^\n]*-->\n```", rest):
                problems.append(f"{page.relative_to(ROOT)}: a doc-test marker not right before a code block")
    assert not problems, problems


COMMAND_WORDS = re.compile(r"^\s*(\$ |pip |pip3 |python |python3 |qlinear-llm |qlinear-demo|pytest |curl |bash )")


def test_text_blocks_hold_no_commands():
    bad = [f"{b.where}: {line.strip()}" for b in ALL_BLOCKS if b.lang == "text"
           for line in b.code.splitlines() if COMMAND_WORDS.match(line)]
    assert not bad, f"commands belong in ```bash blocks, which run: {bad}"


def test_install_commands_name_real_extras():
    installs = [c for b in ALL_BLOCKS if b.lang in ("bash", "sh") for c in commands(b)
                if classify(c) == "install"]
    assert installs
    for command in installs:
        check_install(command)


def test_readme_starts_with_the_install_commands():
    first = BLOCKS[README][0]
    assert first.lang == "bash" and first.marker is None
    lines = logical_lines(first.code)
    assert [line.split("#")[0].strip() for line in lines] == [
        "pip install . && python -m qlinear.demo",
        'pip install ".[test]" && python -m pytest tests',
    ]
    before = README.read_text(encoding="utf-8")[:README.read_text(encoding="utf-8").index("```")]
    assert "```" not in before


def test_ci_runs_the_readme_install_commands():
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    ci = ci.replace("python -m pip install -q ", "pip install ").replace("QLINEAR_REQUIRE_ALL_MODULES=1 ", "")
    for command in commands(BLOCKS[README][0]):
        command = command.split("#")[0].strip()
        assert command in ci, f"the README's {command!r} is not run by .ci/run"


def test_readme_is_the_front_door():
    lines = README.read_text(encoding="utf-8").splitlines()
    assert len(lines) <= 250, f"README.md has {len(lines)} lines: the reference belongs in docs/"
    text = "\n".join(lines)
    unlinked = [p.name for p in PAGES[1:] if f"docs/{p.name}" not in text]
    assert not unlinked, f"docs pages the README does not link: {unlinked}"


def _slug(heading: str) -> str:
    """GitHub's anchor of a heading."""
    text = re.sub(r"`|\*\*|\[|\]\([^)]*\)", "", heading.strip().lower())
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def _anchors(page: Path) -> set:
    text = FENCE.sub("", page.read_text(encoding="utf-8"))
    return {_slug(m.group(1)) for m in re.finditer(r"^#+\s+(.*)$", text, re.M)}


def test_links_resolve():
    broken = []
    for page in PAGES:
        text = FENCE.sub("", page.read_text(encoding="utf-8"))
        for m in re.finditer(r"\]\(([^)\s]+)\)", text):
            target = m.group(1)
            if re.match(r"^[a-z]+:", target):
                continue  # a URL
            path, _, anchor = target.partition("#")
            dest = (page.parent / path).resolve() if path else page
            if not dest.exists():
                broken.append(f"{page.relative_to(ROOT)}: {target} (no such file)")
            elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
                broken.append(f"{page.relative_to(ROOT)}: {target} (no such heading)")
    assert not broken, broken
