import os

import numpy as np
import pytest

import qlinear

ISAS = qlinear.cpu_info()["available_isas"]


@pytest.fixture(params=ISAS)
def isa(request):
    """Runs a test once per ISA level this machine has (scalar included)."""
    previous = qlinear.cpu_info()["active_isa"]
    qlinear.set_isa(request.param)
    yield request.param
    qlinear.set_isa(previous)


@pytest.fixture(scope="session")
def transformers5():
    """(torch, transformers) with transformers 5.x (the 2026 families' classes: Qwen3.5, GPT-OSS, Gemma 4);
    skipped without it, failed so with QLINEAR_REQUIRE_TRANSFORMERS5=1 (CI's transformers-5
    environment sets it)."""
    try:
        import torch
        import transformers
    except ImportError:
        transformers = None
    if transformers is None or int(transformers.__version__.split(".")[0]) < 5:
        why = "needs transformers 5.x (Qwen3.5's, GPT-OSS's and Gemma 4's classes); CI runs it in its transformers-5 environment"
        if os.environ.get("QLINEAR_REQUIRE_TRANSFORMERS5"):
            pytest.fail(why)
        pytest.skip(why)
    return torch, transformers


@pytest.fixture
def rng():
    return np.random.default_rng(1234)


# -- skipped modules ---------------------------------------------------------------------------
# A module skipped at collection (pytest.importorskip / allow_module_level skips: a missing
# optional dependency) hides all of its tests. They are listed at the end of every run, and with
# QLINEAR_REQUIRE_ALL_MODULES=1 (CI's full run) any such skip fails the run.
STRICT_ENV = "QLINEAR_REQUIRE_ALL_MODULES"
_skipped_modules: dict = {}


def _skip_reason(report) -> str:
    longrepr = report.longrepr
    if isinstance(longrepr, tuple) and len(longrepr) == 3:
        return str(longrepr[2]).removeprefix("Skipped: ")
    return str(longrepr).strip().splitlines()[-1] if longrepr else "skipped"


def pytest_collectreport(report):
    if report.skipped and report.nodeid.endswith(".py"):
        _skipped_modules[report.nodeid] = _skip_reason(report)


def _strict() -> bool:
    import os
    return os.environ.get(STRICT_ENV, "") not in ("", "0")


def pytest_terminal_summary(terminalreporter):
    if not _skipped_modules:
        return
    strict = _strict()
    terminalreporter.section(f"{len(_skipped_modules)} test module(s) skipped entirely", sep="=",
                             red=strict, yellow=not strict)
    for nodeid, reason in sorted(_skipped_modules.items()):
        terminalreporter.line(f"{nodeid}: {reason}")
    if strict:
        terminalreporter.line(f"{STRICT_ENV} is set: a skipped module fails the run", red=True)
    else:
        terminalreporter.line('(`pip install ".[test]"` installs what they need; '
                              f"{STRICT_ENV}=1 makes such skips fail the run)")


def pytest_sessionfinish(session, exitstatus):
    if _skipped_modules and _strict() and exitstatus == pytest.ExitCode.OK:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_unconfigure(config):
    # After the final counts line: the one place nobody scrolls past.
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    if _skipped_modules and reporter is not None:
        names = ", ".join(sorted(n.rsplit("/", 1)[-1] for n in _skipped_modules))
        verdict = "the run FAILS" if _strict() else "see above"
        reporter.write_line(f"{len(_skipped_modules)} test module(s) skipped entirely ({names}): {verdict}",
                            red=_strict(), yellow=not _strict())
