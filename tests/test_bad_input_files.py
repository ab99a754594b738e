"""Issue 34, the file and process boundaries: special files read without bound, racing writers, `check --base`
taken as a git option, export sets left half written, bench's options and temporary folders, signals and a
closed stdout. Each reproducer of the issue is a test here; the commands run for real: in a child process where
a hang, a signal, a pipe or a race between processes is the point (a regression then fails on the timeout instead
of hanging the suite), and where one test per kind of refusal checks what the interpreter itself prints and
exits with; the others run the same entry point in-process (the `cli` fixture: its exit code, its stderr, and an
uncaught exception fails the test as a traceback would), about 1 s of CPU less each, the imports' cost."""

from __future__ import annotations

import errno
import json
import os
import signal
import stat
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from conftest import run_cli
from refusal import one_line
from llmplan import fileio
from llmplan.errors import LlmplanError

ROOT = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "200"}
ENV.pop("LLMPLAN_DEBUG", None)
SEARCH = ["search", "--model", "deepseek-v3", "--hardware", "dgx-h100", "--nodes", "32", "--moe-dispatcher", "alltoall",
          "--no-ep-comm-overlap"]
"""A search that runs a few seconds after the imports (about 3 s of CPU on 2026-12-06; at 256 nodes it had grown
to about 6 s). The EP dispatch is pinned (one switch setting of the four the search tries, about half its CPU on
2026-12-07): the signal tests check how the process ends when a signal lands while the search is still running,
not which setting wins, and the search still runs seconds."""
SMALL_SEARCH = ["search", "--model", "llama-3.1-8b", "--hardware", "dgx-h100", "--nodes", "1", "--tp", "8"]
"""A search that finishes in about a second after the imports, for the closed-stdout and head tests: they run the
search to its end (three times) and check what happens when its report meets a stdout whose reader is gone or
stops after one line; that is the same printing path for any search (a table of ranked plans after a progress bar
on stderr), so the several-second search of the signal tests is not needed there."""


def llmplan(*args, cwd: Path | None = None, timeout: float = 60) -> subprocess.CompletedProcess:
    """The real command in a child process; a hang fails the test on the timeout."""
    return subprocess.run([sys.executable, "-m", "llmplan", *map(str, args)], cwd=cwd, env=ENV, capture_output=True,
                          text=True, timeout=timeout)


@pytest.fixture(scope="module")
def plan(tmp_path_factory) -> Path:
    """A saved training plan (llama-3.1-8b on one DGX H100) referring to its specs by name (saved in-process:
    the plan is the input of the tests, not what they check)."""
    folder = tmp_path_factory.mktemp("plan")
    r = run_cli("estimate", "--model", "llama-3.1-8b", "--hardware", "dgx-h100", "--save", folder / "p.json")
    assert r.code == 0, r.err
    return folder / "p.json"


# --- 1. special files: refused before they can block or stream ------------------------------------------------


def test_dev_zero_as_model_is_refused_at_once():
    r = llmplan("estimate", "--model", "/dev/zero", "--hardware", "dgx-h100", timeout=30)
    assert r.returncode == 2
    assert one_line(r.stderr) == ("error: /dev/zero is a device, not a regular file; give a spec, profile or plan "
                                  "file")


@pytest.mark.parametrize("where", ["model", "hardware", "plan", "check"])
def test_fifo_is_refused_without_blocking(tmp_path, plan, where):
    fifo = tmp_path / ("in.json" if where == "plan" else "in.yaml")
    os.mkfifo(fifo)
    args = {"model": ("estimate", "--model", fifo, "--hardware", "dgx-h100"),
            "hardware": ("estimate", "--model", "llama-3.1-8b", "--hardware", fifo),
            "plan": ("export", fifo, "--to", "megatron", "-o", tmp_path / "out"),
            "check": ("check", fifo)}[where]
    r = llmplan(*args, timeout=30)  # opening a FIFO for reading blocks until a writer comes: it never does
    assert "is a pipe (FIFO), not a regular file" in r.stderr + r.stdout
    if where == "check":
        assert r.returncode == 1  # check reports it as a failed check, as any unreadable file
    else:
        assert r.returncode == 2 and one_line(r.stderr)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("ref", ["/dev/zero", "fifo.yaml"])
def test_plan_whose_model_ref_is_special_fails_its_check(tmp_path, plan, ref):
    os.mkfifo(tmp_path / "fifo.yaml")
    doc = json.loads(plan.read_text())
    doc["model_ref"] = ref
    (tmp_path / "p.json").write_text(json.dumps(doc))
    r = llmplan("check", tmp_path / "p.json", "--format", "json", timeout=30)
    assert r.returncode == 1, r.stderr
    (finding,) = json.loads(r.stdout)["checks"]
    assert not finding["ok"] and "not a regular file" in finding["message"]


def test_a_fifo_swapped_in_after_the_stat_is_refused_on_the_descriptor(tmp_path, monkeypatch):
    # The race between the check and the open: the path passes os.stat as a regular file, then is a FIFO.
    fifo = tmp_path / "spec.yaml"
    os.mkfifo(fifo)
    regular = os.stat(__file__)
    real_stat = os.stat
    monkeypatch.setattr(fileio.os, "stat", lambda p, *a, **k: regular if str(p) == str(fifo) else real_stat(p, *a, **k))
    done = threading.Event()
    failure: list[BaseException] = []

    def read() -> None:
        try:
            fileio.read_bytes(fifo)
        except BaseException as e:  # noqa: BLE001 - handed to the test thread
            failure.append(e)
        done.set()

    threading.Thread(target=read, daemon=True).start()
    assert done.wait(10), "opening the FIFO blocked"
    assert isinstance(failure[0], LlmplanError) and "is a pipe (FIFO), not a regular file" in str(failure[0])


def test_never_more_than_the_cap_is_read():
    # /proc files are regular files whose size reads 0: only the bounded read stops them.
    assert os.stat("/proc/self/maps").st_size == 0
    with pytest.raises(LlmplanError, match="holds more than 10 bytes"):
        fileio.read_bytes(Path("/proc/self/maps"), limit=10)
    assert fileio.read_bytes(Path("/proc/self/maps"))  # under the real cap it reads


def test_oversized_regular_file_is_refused_by_its_size(tmp_path, cli):
    big = tmp_path / "big.yaml"
    with open(big, "wb") as f:
        f.truncate(fileio.MAX_INPUT_BYTES + 1)  # sparse: nothing to read, the size alone refuses it
    r = cli("estimate", "--model", big, "--hardware", "dgx-h100")  # no hang to guard: a regular file, 8 MiB
    assert r.code == 2 and "is 8.0 MiB; llmplan reads" in one_line(r.err)


def test_socket_is_refused(tmp_path, cli):
    import socket

    path = tmp_path / "s.yaml"
    s = socket.socket(socket.AF_UNIX)
    try:
        s.bind(str(path))
        # in-process: opening a socket file fails at once (ENXIO), it cannot block; the child-process run of the
        # special-file refusal is test_dev_zero_as_model_is_refused_at_once and the FIFO tests
        r = cli("estimate", "--model", path, "--hardware", "dgx-h100")
    finally:
        s.close()
    assert r.code == 2 and "is a socket, not a regular file" in one_line(r.err)


# --- 3 and the --save part of 9: one writer, never over a file another process created meanwhile --------------


def _no_temporaries(folder: Path) -> None:
    assert not [p.name for p in folder.iterdir() if p.name.startswith(fileio.TEMP_PREFIX)]


def test_concurrent_saves_one_wins_the_others_refused(tmp_path):
    args = [sys.executable, "-m", "llmplan", "estimate", "--model", "llama-3.1-8b", "--hardware", "dgx-h100",
            "--save", "same.json"]
    procs = [subprocess.Popen(args, cwd=tmp_path, env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                              text=True) for _ in range(4)]
    results = [(p.wait(timeout=120), p.stderr.read()) for p in procs]
    codes = sorted(code for code, _ in results)
    assert codes == [0, 2, 2, 2], results
    for code, err in results:
        if code:
            assert ("same.json already exists; pass --force" in err
                    or "same.json appeared while llmplan was writing it" in err), err
    assert json.loads((tmp_path / "same.json").read_text())["kind"] == "llmplan-plan"  # whole
    _no_temporaries(tmp_path)


def test_concurrent_reports_one_wins(tmp_path, plan):
    pytest.importorskip("matplotlib")
    args = [sys.executable, "-m", "llmplan", "report", str(plan), "-o", "same.html"]
    procs = [subprocess.Popen(args, cwd=tmp_path, env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                              text=True) for _ in range(3)]
    codes = sorted(p.wait(timeout=180) for p in procs)
    assert codes == [0, 2, 2]
    assert (tmp_path / "same.html").read_text().rstrip().endswith("</html>")
    _no_temporaries(tmp_path)


def test_racing_threads_exactly_one_publishes(tmp_path):
    target = tmp_path / "out.json"
    start = threading.Barrier(8)
    outcome: dict[int, str] = {}

    def writer(i: int) -> None:
        start.wait()
        try:
            fileio.write_atomic(target, f"writer {i}\n" * 1000)
            outcome[i] = "ok"
        except LlmplanError as e:
            outcome[i] = str(e)

    threads = [threading.Thread(target=writer, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    winners = [i for i, o in outcome.items() if o == "ok"]
    assert len(winners) == 1, outcome
    assert target.read_text() == f"writer {winners[0]}\n" * 1000
    _no_temporaries(tmp_path)


def test_a_file_that_appears_while_writing_is_left_alone(tmp_path, monkeypatch):
    # The check-then-rename race of the issue, made certain: the target appears after the check.
    target = tmp_path / "plan.json"
    stage = fileio._stage

    def stage_then_someone_else_writes(path, text, executable, temps):
        tmp = stage(path, text, executable, temps)
        target.write_text("the other writer's plan")
        return tmp

    monkeypatch.setattr(fileio, "_stage", stage_then_someone_else_writes)
    with pytest.raises(LlmplanError, match="plan.json appeared while llmplan was writing it .* pass --force"):
        fileio.write_atomic(target, "mine")
    assert target.read_text() == "the other writer's plan"
    _no_temporaries(tmp_path)


@pytest.mark.parametrize("force", [False, True])
def test_a_special_file_is_never_replaced(tmp_path, force):
    # --save /dev/null --force used to replace the device with a regular file (as root); a FIFO stands in here.
    fifo = tmp_path / "plan.json"
    os.mkfifo(fifo)
    r = llmplan("estimate", "--model", "llama-3.1-8b", "--hardware", "dgx-h100", "--save", fifo,
                *(["--force"] if force else []), timeout=60)
    assert r.returncode == 2
    assert "is a pipe (FIFO), not a regular file; llmplan replaces only regular files" in one_line(r.stderr)
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)
    _no_temporaries(tmp_path)


def test_force_replaces_a_symbolic_link_itself_not_its_target(tmp_path):
    target = tmp_path / "target.json"
    target.write_text("kept")
    (tmp_path / "link.json").symlink_to(target)
    fileio.write_atomic(tmp_path / "link.json", "new", force=True)
    assert target.read_text() == "kept" and not (tmp_path / "link.json").is_symlink()
    assert (tmp_path / "link.json").read_text() == "new"


@pytest.mark.parametrize("length", [250, 251, 255])
def test_long_valid_save_names_work(tmp_path, cli, monkeypatch, length):
    name = "p" * (length - 5) + ".json"
    monkeypatch.chdir(tmp_path)
    r = cli("estimate", "--model", "llama-3.1-8b", "--hardware", "dgx-h100", "--save", name)
    assert r.code == 0, r.err
    assert (tmp_path / name).is_file()
    _no_temporaries(tmp_path)


@pytest.mark.parametrize("cmd", ["save", "report", "export", "model", "plan"])
def test_names_too_long_for_the_file_system_are_one_line(tmp_path, plan, cli, monkeypatch, cmd):
    name = "p" * 300 + ".json"
    args = {"save": ("estimate", "--model", "llama-3.1-8b", "--hardware", "dgx-h100", "--save", name),
            "report": ("report", plan, "-o", name),
            "export": ("export", plan, "--to", "megatron", "-o", name),
            "model": ("estimate", "--model", name, "--hardware", "dgx-h100"),
            "plan": ("export", name, "--to", "megatron")}[cmd]
    if cmd == "save":  # one of them as a child process: its real exit status and what the interpreter prints
        r = llmplan(*args, cwd=tmp_path)
        code, err = r.returncode, r.stderr
    else:
        monkeypatch.chdir(tmp_path)
        c = cli(*args)
        code, err = c.code, c.err
    assert code == 2
    line = one_line(err)
    assert "internal error" not in line and ("too long" in line or "at most 255 bytes" in line), line
    assert len(line) < 300  # the name is shortened in the message


# --- 5. export: all of a set or nothing ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def export_names(plan, tmp_path_factory) -> list[str]:
    """The names of the files `export --to all` writes for `plan`, in its order (one in-process export for the
    module: the set's names are the tests' input, and each test exports anew into its own folder)."""
    r = run_cli("export", plan, "--to", "all", "-o", tmp_path_factory.mktemp("probe") / "probe", "--json")
    assert r.code == 0, r.err
    return [Path(f).name for f in json.loads(r.out)["files"]]


@pytest.mark.parametrize("force", [False, True])
def test_folder_in_the_way_of_the_third_file_writes_nothing(tmp_path, plan, export_names, cli, force):
    names = export_names
    out = tmp_path / "out"
    (out / names[2]).mkdir(parents=True)
    r = cli("export", plan, "--to", "all", "-o", out, *(["--force"] if force else []))
    assert r.code == 2
    assert f"{names[2]} is a folder" in one_line(r.err)
    assert sorted(p.name for p in out.iterdir()) == [names[2]]  # none of the files, no temporaries


def test_failure_while_publishing_rolls_the_set_back(tmp_path, plan, export_names, cli, monkeypatch):
    names = export_names
    out = tmp_path / "out"
    out.mkdir()
    (out / names[0]).write_text("mine, kept")  # --force replaces it; the failure must bring it back
    real_replace, calls = os.replace, []

    def replace_fails_third(src, dst, *a, **k):
        calls.append(dst)
        if len(calls) == 3:
            raise OSError(errno.EIO, "Input/output error")
        return real_replace(src, dst, *a, **k)

    monkeypatch.setattr(fileio.os, "replace", replace_fails_third)
    r = cli("export", plan, "--to", "all", "-o", out, "--force")
    monkeypatch.undo()
    assert r.code == 2 and "Input/output error; nothing was written" in r.err and "Traceback" not in r.err
    assert sorted(p.name for p in out.iterdir()) == [names[0]]
    assert (out / names[0]).read_text() == "mine, kept"


def test_full_disk_while_staging_writes_nothing(tmp_path, plan, cli, monkeypatch):
    out = tmp_path / "out"
    stage, staged = fileio._stage, []

    def disk_full_on_third(path, text, executable, temps):
        staged.append(path)
        if len(staged) == 3:
            raise fileio._WriteFailed(errno.ENOSPC, f"{path}: the disk is full")
        return stage(path, text, executable, temps)

    monkeypatch.setattr(fileio, "_stage", disk_full_on_third)
    r = cli("export", plan, "--to", "all", "-o", out)
    assert r.code == 2 and "the disk is full; nothing was written" in r.err
    assert list(out.iterdir()) == []


def test_existing_files_are_all_named_and_none_written(tmp_path, plan, export_names):
    names = export_names
    out = tmp_path / "out"
    out.mkdir()
    (out / names[1]).write_text("keep")
    r = llmplan("export", plan, "--to", "all", "-o", out)
    assert r.returncode == 2 and f"{names[1]} already exist(s); pass --force" in one_line(r.stderr)
    assert sorted(p.name for p in out.iterdir()) == [names[1]] and (out / names[1]).read_text() == "keep"


def test_force_replaces_the_whole_set(tmp_path, plan, export_names, cli):
    names = export_names
    out = tmp_path / "out"
    out.mkdir()
    (out / names[0]).write_text("old")
    r = cli("export", plan, "--to", "all", "-o", out, "--force")
    assert r.code == 0, r.err
    assert sorted(p.name for p in out.iterdir()) == sorted(names)
    assert (out / names[0]).read_text() != "old"
    assert os.access(out / names[0], os.X_OK) == names[0].endswith((".sh", ".sbatch"))


# --- 4. check --base: never a git option; what cannot be compared is said, not a traceback ---------------------


def _git(repo: Path, *args: str) -> None:
    subprocess.run(["git", "-c", "user.email=t@t", "-c", "user.name=t", *args], cwd=repo, check=True,
                   capture_output=True)


@pytest.fixture
def repo(tmp_path) -> Path:
    repo = tmp_path / "repo"
    (repo / "model_specs").mkdir(parents=True)
    text = (ROOT / "model_specs" / "llama-3.1-8b.yaml").read_text().replace("name: llama-3.1-8b", "name: team-8b")
    text = "\n".join(line for line in text.splitlines() if not line.startswith("declared_params"))  # free to edit
    (repo / "model_specs" / "team-8b.yaml").write_text(text)
    _git(repo, "init", "-q")
    _git(repo, "add", ".")
    _git(repo, "commit", "-qm", "specs")
    return repo


@pytest.mark.parametrize("base", ["--output=pwned", "-opwned", "--output", "-"])
def test_base_is_never_a_git_option(repo, base, cli, monkeypatch):
    if base == "--output=pwned":  # one as a child process: its real exit status and what the interpreter prints
        p = llmplan("check", "model_specs", f"--base={base}", cwd=repo)
        code, err = p.returncode, p.stderr
    else:
        monkeypatch.chdir(repo)
        r = cli("check", "model_specs", f"--base={base}")
        code, err = r.code, r.err
    assert code == 2
    assert "is not a git revision (it may not be empty or start with '-')" in one_line(err)
    assert not list(repo.rglob("pwned")) and not (repo / "model_specs" / "pwned").exists()


def test_base_that_git_would_read_as_a_path_or_range_is_not_a_commit(repo, cli, monkeypatch):
    monkeypatch.chdir(repo)
    for base in ("HEAD --output=pwned", "HEAD..HEAD", ":/specs"):
        r = cli("check", "model_specs", "--base", base)
        assert r.code in (0, 2), r.err  # ':/specs' names the commit whose message says "specs"
        assert "Traceback" not in r.err and not list(repo.rglob("pwned"))


def test_base_diff_still_works(repo, cli, monkeypatch):
    monkeypatch.chdir(repo)
    spec = repo / "model_specs" / "team-8b.yaml"
    spec.write_text(spec.read_text().replace("num_hidden_layers: 32", "num_hidden_layers: 40"))
    r = cli("check", "model_specs", "--base", "HEAD", "--format", "json")
    (d,) = r.json()["diff"]
    assert d["status"] == "changed" and d["fields"]["num_hidden_layers"] == [32, 40]


def test_spec_symlinked_from_outside_the_repository(repo, tmp_path, cli, monkeypatch):
    monkeypatch.chdir(repo)
    outside = tmp_path / "elsewhere.yaml"
    outside.write_text((repo / "model_specs" / "team-8b.yaml").read_text().replace("team-8b", "other-8b"))
    (repo / "model_specs" / "linked.yaml").symlink_to(outside)
    _git(repo, "add", ".")
    _git(repo, "commit", "-qm", "a link")
    outside.write_text(outside.read_text().replace("num_hidden_layers: 32", "num_hidden_layers: 40"))
    r = cli("check", "model_specs", "--base", "HEAD", "--format", "json")
    assert r.code == 0 and "Traceback" not in r.err, r.err
    (d,) = r.json()["diff"]
    assert d["status"] == "skipped" and d["file"].endswith("linked.yaml")
    assert "is a symbolic link to" in d["message"] and "outside the checkout" in d["message"]
    text = cli("check", "model_specs", "--base", "HEAD")
    assert text.code == 0 and "not compared with HEAD" in text.out


def test_spec_symlinked_inside_the_repository_is_followed(repo, cli, monkeypatch):
    monkeypatch.chdir(repo)
    (repo / "model_specs" / "current.yaml").symlink_to("team-8b.yaml")
    _git(repo, "add", ".")
    _git(repo, "commit", "-qm", "a link")
    spec = repo / "model_specs" / "team-8b.yaml"
    spec.write_text(spec.read_text().replace("num_hidden_layers: 32", "num_hidden_layers: 40"))
    r = cli("check", "model_specs", "--base", "HEAD", "--format", "json")
    diff = r.json()["diff"]
    assert [d["status"] for d in diff] == ["changed", "changed"]  # the link and its target, both read at HEAD


def test_spec_path_outside_the_checkout(repo, tmp_path, cli, monkeypatch):
    monkeypatch.chdir(repo)
    outside = tmp_path / "loose.yaml"
    outside.write_text((repo / "model_specs" / "team-8b.yaml").read_text())
    r = cli("check", outside, "model_specs", "--base", "HEAD")
    assert r.code == 2 and "--base needs a git checkout" in one_line(r.err)


def test_committed_invalid_spec(repo, cli, monkeypatch):
    monkeypatch.chdir(repo)
    spec = repo / "model_specs" / "team-8b.yaml"
    good = spec.read_text()
    spec.write_text(good.replace("num_attention_heads: 32", "num_attention_heads: 0"))
    _git(repo, "commit", "-qam", "broken")
    r = cli("check", "model_specs", "--base", "HEAD", "--format", "json")  # broken then and now
    assert r.code == 1 and "Traceback" not in r.err, r.err
    doc = r.json()
    assert not doc["checks"][0]["ok"] and "num_attention_heads" in doc["checks"][0]["message"]
    spec.write_text(good)  # fixed now: the diff says why it cannot compare
    r = cli("check", "model_specs", "--base", "HEAD", "--format", "json")
    assert r.code == 0, r.err
    (d,) = r.json()["diff"]
    assert d["status"] == "skipped" and "num_attention_heads" in d["message"]


def test_committed_unsupported_config_json(repo, cli, monkeypatch):
    monkeypatch.chdir(repo)
    cfg = repo / "model_specs" / "config.json"
    cfg.write_text(json.dumps({"model_type": "mamba", "hidden_size": 768, "num_hidden_layers": 2}))
    _git(repo, "add", ".")
    _git(repo, "commit", "-qm", "unsupported")
    cfg.write_text(json.dumps({"model_type": "mamba", "hidden_size": 1024, "num_hidden_layers": 2}))
    r = cli("check", "model_specs", "--base", "HEAD", "--format", "json")
    assert r.code == 1 and "Traceback" not in r.err, r.err
    assert "model_type 'mamba' is not supported" in json.dumps(r.json()["checks"])
    cfg.write_text((ROOT / "tests" / "data" / "hf" / "bloom-176b.config.json").read_text())  # supported now
    r = cli("check", "model_specs", "--base", "HEAD", "--format", "json")
    (d,) = [d for d in r.json()["diff"] if d["file"].endswith("config.json")]
    assert d["status"] == "skipped" and "not supported" in d["message"]


# --- 11. bench ------------------------------------------------------------------------------------------------------


def _torch():
    return pytest.importorskip("torch")


def test_bench_nccl_without_cuda_is_one_line(cli):
    if _torch().cuda.is_available():
        pytest.skip("this machine has CUDA")
    r = cli("bench", "--model", "llama-3.1-8b", "--nproc", "1", "--backend", "nccl", "--seq-len", "64")
    assert r.code == 2
    assert one_line(r.err).startswith("error: --backend nccl needs CUDA GPUs and a torch build with NCCL: torch ")
    assert "sees no CUDA GPU" in r.err and "--backend gloo" in r.err


@pytest.mark.parametrize("timeout", ["-1", "0", "nan", "inf", "1e9"])
def test_bench_timeout_must_be_positive_seconds(cli, timeout):
    _torch()
    r = cli("bench", "--model", "llama-3.1-8b", "--nproc", "1", "--timeout", timeout)
    assert r.code == 2 and f"--timeout {float(timeout):g}: give seconds above 0 and at most 604800" in one_line(r.err)


def test_bench_nproc_is_bounded(cli):
    _torch()
    r = cli("bench", "--model", "llama-3.1-8b", "--nproc", "100000")
    assert r.code == 2 and "--nproc 100000: bench runs on one node, 1 to 64 processes" in one_line(r.err)
    from llmplan.bench.run import _cpu_count

    over = max(_cpu_count(), 2) + 1
    if over > 64:
        pytest.skip("more cores than the bench's own bound")
    r = cli("bench", "--model", "llama-3.1-8b", "--tp", "1", "--nproc", str(over), "--seq-len", "64")
    assert r.code == 2 and f"--nproc {over}: gloo runs one process per CPU core" in one_line(r.err)


def test_bench_removes_its_temporary_folder(cli, tmp_path, monkeypatch):
    _torch()
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    # A small model: the folder's removal does not depend on it, and an 8B model's GEMMs took 15 s on CPU.
    tiny = tmp_path / "spec" / "tiny.yaml"
    tiny.parent.mkdir()
    tiny.write_text("name: tiny\nmodel_type: llama\nhidden_size: 256\nintermediate_size: 704\n"
                    "num_hidden_layers: 2\nnum_attention_heads: 8\nnum_key_value_heads: 4\nvocab_size: 1024\n"
                    "max_position_embeddings: 4096\n")
    r = cli("bench", "--model", tiny, "--nproc", "1", "--seq-len", "64", "--gemm-tokens", "64",
            "--components", "gemm", "--timeout", "120")
    assert r.code == 0, r.err
    assert not list(tmp_path.glob("llmplan-bench-*"))
    collectives = ("bench", "--model", "llama-3.1-8b", "--nproc", "1", "--seq-len", "64", "--components",
                   "collectives", "--sizes", "64KiB")
    monkeypatch.setenv("LLMPLAN_BENCH_FAIL_RANK", "0")  # a failed run too
    r = cli(*collectives, "--timeout", "120")
    assert r.code == 1 and "injected failure" in r.err
    assert not list(tmp_path.glob("llmplan-bench-*"))
    monkeypatch.delenv("LLMPLAN_BENCH_FAIL_RANK")
    monkeypatch.setenv("LLMPLAN_BENCH_HANG_RANK", "0")  # and one stopped by its timeout
    r = cli(*collectives, "--timeout", "5")
    assert r.code == 1 and "timeout" in r.err
    assert not list(tmp_path.glob("llmplan-bench-*"))


def test_ctrl_c_during_a_bench_stops_its_workers_and_removes_its_folder(tmp_path):
    _torch()
    env = {**ENV, "TMPDIR": str(tmp_path), "LLMPLAN_BENCH_HANG_RANK": "0"}
    p = subprocess.Popen([sys.executable, "-m", "llmplan", "bench", "--model", "llama-3.1-8b", "--nproc", "1",
                          "--seq-len", "64", "--components", "collectives", "--sizes", "64KiB", "--timeout", "300"],
                         env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = threading.Event()
    for _ in range(600):  # until the worker reports its first phase (torch takes seconds to import)
        if list(tmp_path.glob("llmplan-bench-*/progress-rank0.json")) or p.poll() is not None:
            break
        deadline.wait(0.1)
    assert p.poll() is None, p.communicate()
    p.send_signal(signal.SIGINT)
    out, err = p.communicate(timeout=60)
    assert p.returncode == 130 and err.endswith("llmplan: interrupted\n"), err
    assert not list(tmp_path.glob("llmplan-bench-*"))
    deadline.wait(0.5)
    alive = subprocess.run(["pgrep", "-f", f"llmplan.bench.worker {tmp_path}"], capture_output=True, text=True)
    assert not alive.stdout.split()


# --- 12. signals and a closed stdout --------------------------------------------------------------------------------


def _started(*args: str) -> subprocess.Popen:
    """The real entry point, saying 'ready' once its commands are imported (the signal then lands in the
    command, not in the imports)."""
    code = "import sys; from llmplan.cli import main; print('ready', flush=True); main(sys.argv[1:])"
    p = subprocess.Popen([sys.executable, "-c", code, *args], env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True)
    assert p.stdout.readline() == "ready\n"
    return p


@pytest.mark.parametrize("sig,code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_signal_says_interrupted(sig, code):
    p = _started(*SEARCH)
    threading.Event().wait(0.3)
    p.send_signal(sig)
    out, err = p.communicate(timeout=30)
    assert p.returncode == code
    assert err == "llmplan: interrupted\n" and out == ""


def test_signal_with_json_writes_the_error_document():
    p = _started(*SEARCH, "--json")
    threading.Event().wait(0.3)
    p.send_signal(signal.SIGTERM)
    out, err = p.communicate(timeout=30)
    assert p.returncode == 143 and err == "llmplan: interrupted\n"
    assert json.loads(out) == {"schema": 1, "error": {"code": 143, "message": "interrupted", "signal": "SIGTERM"}}


def test_signal_while_starting_says_interrupted():
    # The imports take about half a second; a Ctrl-C then gets the same answer (not a KeyboardInterrupt
    # traceback). The signal is sent from inside the imports, when llmplan.cli imports typer.
    probe = ("import os, signal, sys, builtins\n"
             "sys.argv = ['llmplan', 'search', '--json']\n"
             "real = builtins.__import__\n"
             "def imp(name, *a, **k):\n"
             "    if name == 'typer':\n"
             "        builtins.__import__ = real\n"
             "        os.kill(os.getpid(), signal.SIGINT)\n"
             "    return real(name, *a, **k)\n"
             "builtins.__import__ = imp\n"
             "import llmplan.cli\n"
             "print('unreachable')\n")
    r = subprocess.run([sys.executable, "-c", probe], env=ENV, capture_output=True, text=True, timeout=60)
    assert r.returncode == 130 and r.stderr == "llmplan: interrupted\n"
    assert json.loads(r.stdout)["error"]["code"] == 130


@pytest.mark.parametrize("args", [SMALL_SEARCH, [*SMALL_SEARCH, "--json"], ["models"], ["--help"],
                                  ["search", "--model", "nope", "--hardware", "dgx-h100", "--json"]])
def test_closed_stdout_is_a_normal_end(args):
    p = subprocess.Popen([sys.executable, "-m", "llmplan", *args], env=ENV, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    p.stdout.close()  # the reader is gone before the first line (`| head -0`)
    err = p.stderr.read()
    p.wait(timeout=60)
    assert "Traceback" not in err and "Exception ignored" not in err and "BrokenPipe" not in err, err
    assert p.returncode == (2 if "nope" in args else 0), err


def test_head_one_of_a_search():
    r = subprocess.run(f"{sys.executable} -m llmplan {' '.join(SMALL_SEARCH)} | head -1; exit ${{PIPESTATUS[0]}}",
                       shell=True, executable="/bin/bash", env=ENV, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stderr == "" and r.stdout.startswith("llama-3.1-8b on 1 x dgx-h100")


def test_a_plan_file_given_as_a_model_or_hardware_points_to_plan(cli, tmp_path):
    # `estimate --model plan.json` listed the spec's every missing and extra key (name, hidden_size, ...,
    # schema, kind, mode, ...: 21 problems) instead of saying that the file is a plan.
    plan = ROOT / "tests" / "data" / "plans" / "dense_train.json"
    for args, what in ((["--model", plan, "--hardware", "dgx-h100"], "not a model spec"),
                       (["--model", "llama-3.1-8b", "--hardware", plan], "not a system profile")):
        r = cli("estimate", *args)
        assert r.code == 2, r.err
        assert "is an llmplan plan file" in r.err and what in r.err and "estimate --plan" in r.err, r.err
        assert "Field required" not in r.err and len(r.err.splitlines()) == 1


def test_a_pool_file_given_to_estimate_names_both_searches_that_take_it(cli, tmp_path):
    # The refusal said "only `llmplan search` (training) plans a cluster of several pools", while
    # `search --mode infer` splits the request rate over the pools too (README "Serving takes the same file").
    f = tmp_path / "cluster.yaml"
    f.write_text("pools:\n  - {system: dgx-h100, nodes: 1}\n  - {system: dgx-a100, nodes: 1}\n"
                 "fabric: {gb_per_s: 50, latency_s: 1.0e-5}\n")
    r = cli("estimate", "--model", "llama-3.1-8b", "--hardware", f, "--tp", "8")
    assert r.code == 2 and "lists several pools" in r.err and "--mode infer" in r.err, r.err
    s = cli("search", "--mode", "infer", "--model", "llama-3.1-8b", "--hardware", f)
    assert s.code == 0, s.err


def test_an_oversized_text_is_refused_by_its_size_before_any_scan():
    """parse_document (a file's text, or a spec at a git revision for `check --base`): a text over the cap is refused
    by its length, not scanned for content first; before, 8 MiB of blanks read "is empty" after a full strip."""
    class Watched(str):
        def strip(self, *a):
            raise AssertionError("the oversized text was scanned")

    with pytest.raises(LlmplanError, match=r"big\.yaml at HEAD is over 8 MiB"):
        fileio.parse_document(Watched(" " * (fileio.MAX_INPUT_BYTES + 1)), "YAML", "big.yaml at HEAD")
    for blank in ("", " \n\t"):
        with pytest.raises(LlmplanError, match=r"small\.json at HEAD is empty: llmplan reads a JSON mapping"):
            fileio.parse_document(blank, "JSON", "small.json at HEAD")
