"""Shared test helpers: running the real CLI and reading the published validation records."""

from __future__ import annotations

import contextlib
import copy
import io
import json
import os
import sys
from pathlib import Path

import pytest
from hypothesis import settings as hyp_settings

from llmplan.cli import main

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from runs import load_runs, runs_path  # noqa: E402  (benchmarks/runs.py: shipped copy or a newer one beside)

from refusal import one_line  # noqa: E402  (tests/refusal.py)

# deadline None: a property test checks an invariant, not a time; under load on a 2-core CI worker one
# example took 230 ms against hypothesis's default 200 ms deadline (test_recompute_modules) and failed
hyp_settings.register_profile("seeded", derandomize=True, deadline=None)
hyp_settings.load_profile("seeded")  # every property test draws the same examples on every run


def pytest_configure(config: pytest.Config) -> None:
    """Compile llmplan's modules once, in the controller before xdist starts its workers, where the environment
    sets PYTHONDONTWRITEBYTECODE (CI machines here do): otherwise each worker, and each of the several hundred
    `python -m llmplan` subprocesses the CLI tests launch, compiles about 160 modules from source (about 0.25 s
    of CPU a launch). The .pyc files go to llmplan/__pycache__ (git-ignored), as Python writes them by default."""
    if sys.dont_write_bytecode and not hasattr(config, "workerinput"):
        import compileall

        compileall.compile_dir(str(Path(__file__).resolve().parents[1] / "llmplan"), quiet=2)
    if not hasattr(config, "workerinput"):
        _rewrite_tests_once(config, max(len(getattr(config.option, "tx", None) or ()), 1))


def _rewrite_tests_once(config: pytest.Config, processes: int) -> None:
    """Rewrite the asserts of the test modules the command line names once, in the controller, into the files
    pytest's import hook reads back (tests/__pycache__/*-pytest-*.pyc, git-ignored). Under xdist each worker
    imports every test module to collect and rewrote all of them itself; with PYTHONDONTWRITEBYTECODE set pytest
    never wrote them, so every worker of every run paid it again (-n 2 collection of the whole suite: 23.1 CPU-s,
    18.1 with this, 7.0 on a rerun that finds the files; 2026-12-08). The hook checks each file's source hash, so
    a stale or missing file is only rewritten again. The controller forks as many children as there are workers,
    so the wall time stays about one worker's share. Uses pytest's own rewriting functions (the code a worker
    would make); on a pytest without them the workers rewrite as before."""
    try:
        from _pytest.assertion.rewrite import PYC_TAIL, _rewrite_test, _write_pyc, assertstate_key

        state = config.stash[assertstate_key]
    except (ImportError, KeyError):
        return
    cache = Path(__file__).resolve().parent / "__pycache__"

    def pyc(f: Path) -> Path:
        return cache / (f.name[:-3] + PYC_TAIL)

    def rewrite(files: list[Path]) -> None:
        for f in files:
            source_hash, code = _rewrite_test(f, config)
            _write_pyc(state, code, source_hash, pyc(f))

    named = set()  # the test files the command line names, itself or by a folder (testpaths when it names none)
    for arg in config.args or [str(config.rootpath / "tests")]:
        path = Path(str(arg).split("::")[0]).resolve()
        named.update(path.glob("test_*.py") if path.is_dir() else [path])
    todo = [f for f in sorted(cache.parent.glob("test_*.py")) if f in named and not _fresh_pyc(f, pyc(f))]
    if not todo:
        return
    try:
        cache.mkdir(exist_ok=True)
    except OSError:  # a read-only checkout: the workers rewrite as before
        return
    shares, children = min(processes, len(todo)) if hasattr(os, "fork") else 1, []
    for i in range(1, shares):
        pid = os.fork()
        if pid == 0:  # a child: its share, then out without the parent's exit handlers
            try:
                rewrite(todo[i::shares])
            finally:
                os._exit(0)  # a file it could not rewrite is rewritten (or reported) by the worker that imports it
        children.append(pid)
    try:
        rewrite(todo[0::shares])
    except Exception:  # noqa: BLE001 - a syntax error is reported where a worker collects the file
        pass
    finally:
        for pid in children:
            os.waitpid(pid, 0)


def _fresh_pyc(source: Path, pyc: Path) -> bool:
    """Whether pytest's rewritten pyc of `source` is there and was made from its current text (the hash-based
    header pytest writes: magic, flags, the first 8 bytes of importlib's source hash)."""
    import importlib.util

    try:
        with open(pyc, "rb") as f:
            head = f.read(16)
    except OSError:
        return False
    return len(head) == 16 and head[8:16] == importlib.util.source_hash(source.read_bytes())[:8]


class CliResult:
    def __init__(self, code: int, out: str, err: str) -> None:
        self.code, self.out, self.err = code, out, err

    def json(self) -> dict:
        return json.loads(self.out)

    def refusal(self, code: int = 2) -> str:
        """The one line a refused command printed; fails unless it exited `code` with one line, no traceback."""
        assert self.code == code, (self.code, self.err, self.out[:300])
        return one_line(self.err)


@pytest.fixture
def cli(capsys):
    """Run `llmplan ARGS...` in-process through the real entry point; returns exit code, stdout, stderr."""

    def run(*args: str) -> CliResult:
        code = 0
        try:
            main([str(a) for a in args])
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        captured = capsys.readouterr()
        return CliResult(code, captured.out, captured.err)

    return run


def run_cli(*args: str) -> CliResult:
    """`llmplan ARGS...` in-process through the real entry point, its output captured here (no capsys: for the
    session-scoped cli_once)."""
    out, err = io.StringIO(), io.StringIO()
    code = 0
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            main([str(a) for a in args])
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    return CliResult(code, out.getvalue(), err.getvalue())


@pytest.fixture(scope="session")
def cli_once():
    """As `cli`, but each distinct argument list runs once per test process and later calls get that result:
    for read-only commands (no --save, no file written or read that a test changes) that several tests check
    from different sides, such as one long search. CliResult.json() parses afresh, so no test sees another's
    edits."""
    done: dict[tuple[str, ...], CliResult] = {}

    def run(*args: str) -> CliResult:
        key = tuple(str(a) for a in args)
        if key not in done:
            done[key] = run_cli(*key)
        return done[key]

    return run


@contextlib.contextmanager
def one_train_search():
    """Within it, `search` (training, one system) runs each distinct search once: a later command line that
    differs only in --json renders the first one's result through the real command's report path. For tests
    that check a search's JSON and its text: the search is the slow part (tens of seconds for a large MoE
    model), and both outputs come from one result as they do from one search. The key is every argument of
    cli.search.train_search but --json (which sets only its progress bar)."""
    import llmplan.cli.search as cs

    real, done = cs.train_search, {}

    def once(c, pins, goal, s, split, memory, checkpoints, output, named=frozenset(), target=None):
        key = repr((c, pins, goal, s, split, memory, checkpoints, output.model_copy(update={"json_mode": False}),
                    sorted(n for n in named if "json" not in n), target))
        if key not in done:
            done[key] = real(c, pins, goal, s, split, memory, checkpoints, output, named, target)
        return done[key]

    cs.train_search = once
    try:
        yield
    finally:
        cs.train_search = real


@contextlib.contextmanager
def one_run_search():
    """Within it, each distinct search of one setting (cli.search.run_search: search.run.search on one cluster,
    space and workload) runs once, and a later call with the same arguments gets that result. For tests that run
    commands differing only after the searches (--top beyond the tie pool, a target's walk and its limit, --json):
    what they compare is computed afresh from the searches' results. The key is every argument's repr but the
    progress callback's and the shared memory-screen cache's (`screens`, which changes no result)."""
    import llmplan.cli.search as cs

    real, done = cs.run_search, {}

    def once(*args, **kwargs):
        key = repr((args, sorted((k, v) for k, v in kwargs.items() if k not in ("progress", "screens"))))
        if key not in done:
            done[key] = real(*args, **kwargs)
        return done[key]

    cs.run_search = once
    try:
        yield
    finally:
        cs.run_search = real


@pytest.fixture(scope="session")
def _published_list() -> list[dict]:
    """benchmarks/data's published runs, parsed once per test process: the file is about 1 MB, and
    yaml.safe_load of it took 3-15 s a test on a loaded 2-core machine (libyaml's loader here, the same values)."""
    return load_runs(runs_path())


@pytest.fixture
def published_records(_published_list) -> list[dict]:
    """The published runs as a list in file order (what yaml.safe_load of the file gives), a copy for this
    test alone."""
    return copy.deepcopy(_published_list)


@pytest.fixture(scope="session")
def published_runs(_published_list) -> dict[str, dict]:
    """The published runs (shipped in benchmarks/data, so the golden tests always run)."""
    return {r["id"]: r for r in _published_list}


@pytest.fixture(scope="session")
def acc():
    """benchmarks/accuracy.py as a module (benchmarks/ is on the path): its readers and predict, for the golden
    tests that score published rows as the validation report does."""
    import accuracy

    return accuracy


@pytest.fixture(scope="session")
def row_setup(published_runs, acc):
    """(model, cluster, plan) of a published row by id, as benchmarks/accuracy.py reads it (record_setup under
    the row's family); fails the test where the row is not scored."""

    def setup(rid: str):
        out = acc.record_setup(published_runs[rid], acc.family(rid))
        assert out is not None, rid
        return out[:3]

    return setup


@pytest.fixture(scope="session")
def row_plan(row_setup):
    """The plan of a published row by id, as benchmarks/accuracy.py prices it (row_setup's third part: plan_for
    under the row's family at its GPU count); fails the test where the row is not scored."""
    return lambda rid: row_setup(rid)[2]
