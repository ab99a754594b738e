"""Record the command-line flags of a launcher's real argument parser, for tests/test_export.py.

Megatron-LM does not install on a CPU machine (megatron-core wheels omit megatron/training), and vLLM and
SGLang pull GPU builds of torch and dozens of packages, so the tests check exports against the flags these
parsers define, recorded here by building each real parser on CPU:

    python tools/launcher_flags.py megatron --checkout /path/to/Megatron-LM > tests/data/launchers/megatron-lm.json
    python tools/launcher_flags.py vllm > tests/data/launchers/vllm.json      # vllm installed (--no-deps is enough
    python tools/launcher_flags.py sglang > tests/data/launchers/sglang.json  # plus what its imports ask for)
    python tools/launcher_flags.py torchtitan-toml --checkout /path/to/torchtitan@v0.2.2 \
        > tests/data/launchers/torchtitan-v0.2.2.json

torchtitan 0.3.x is checked with its own ConfigManager in the tests (it installs on CPU: the `launchers`
extra); v0.2.2, the last release that read TOML job configs, is recorded here instead: every section and
field of its JobConfig dataclass (torchtitan/config/job_config.py at tag v0.2.2) with its type.

vLLM's serve parser is `make_arg_parser` (vllm/entrypoints/common/cli_args.py), built with vLLM's CPU
platform; SGLang's is `ServerArgs.add_cli_args` (sglang/srt/server_args.py).

Three Megatron modules import triton at module level; on a CPU machine without triton they are replaced by
stand-ins (they define kernels, not flags). Python 3.11 lacks typing.override, which Megatron-LM imports.
Optionally pass exported argv files after the checkout: each is parsed by the real parser and the result
is printed to stderr.
"""

from __future__ import annotations

import argparse
import importlib
import json
import shlex
import subprocess
import sys
import traceback
import typing
from pathlib import Path
from unittest import mock


def megatron_parser(checkout: Path) -> argparse.ArgumentParser:
    typing.override = getattr(typing, "override", lambda f: f)  # type: ignore[attr-defined]
    sys.path.insert(0, str(checkout))
    for _ in range(30):
        try:
            arguments = importlib.import_module("megatron.training.arguments")
            break
        except ModuleNotFoundError as e:
            if e.name is None or not e.name.startswith("triton"):
                raise
            frame = next(f for f in reversed(traceback.extract_tb(e.__traceback__)) if "/megatron/" in f.filename)
            name = str(Path(frame.filename).relative_to(checkout).with_suffix("")).replace("/", ".")
            sys.modules[name.removesuffix(".__init__")] = mock.MagicMock()
            for k in [k for k in sys.modules if k.startswith("megatron") and not isinstance(sys.modules[k], mock.Mock)]:
                del sys.modules[k]
    parser = argparse.ArgumentParser(allow_abbrev=False)
    return arguments.add_megatron_arguments(parser)


def describe(parser: argparse.ArgumentParser) -> dict[str, dict]:
    """flag -> {"takes": "switch" | "value" | "list", "choices": [...]}"""
    out = {}
    for a in parser._actions:
        takes = "switch" if a.nargs == 0 else ("list" if a.nargs in ("+", "*") or isinstance(a.nargs, int) else "value")
        for flag in a.option_strings:
            out[flag] = {"takes": takes, **({"choices": [str(c) for c in a.choices]} if a.choices else {})}
    return dict(sorted(out.items()))


def vllm_parser() -> tuple[argparse.ArgumentParser, str]:
    import vllm
    import vllm.platforms as platforms
    from vllm.platforms.cpu import CpuPlatform

    platforms._current_platform = CpuPlatform()  # the GPU wheel cannot infer a device on a CPU machine
    from vllm.entrypoints.common.cli_args import make_arg_parser
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    return make_arg_parser(FlexibleArgumentParser()), vllm.__version__


def sglang_parser() -> tuple[argparse.ArgumentParser, str]:
    import sglang
    from sglang.srt.server_args import ServerArgs

    parser = argparse.ArgumentParser()
    ServerArgs.add_cli_args(parser)
    return parser, sglang.__version__


def torchtitan_toml_fields(checkout: Path) -> dict[str, dict[str, str]]:
    """{section: {field: type}} of torchtitan's JobConfig (the TOML schema of releases up to v0.2.2); its one
    torchtitan import (a logger) is stood in."""
    import dataclasses
    import importlib.util
    import types

    logging_stub = types.ModuleType("torchtitan.tools.logging")
    logging_stub.logger = mock.MagicMock()  # type: ignore[attr-defined]
    sys.modules.setdefault("torchtitan", types.ModuleType("torchtitan"))
    sys.modules.setdefault("torchtitan.tools", types.ModuleType("torchtitan.tools"))
    sys.modules["torchtitan.tools.logging"] = logging_stub
    spec = importlib.util.spec_from_file_location("job_config", checkout / "torchtitan/config/job_config.py")
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    sys.modules["job_config"] = module
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    name = lambda t: t.__name__ if isinstance(t, type) else str(t).replace("typing.", "")  # noqa: E731
    sections: dict[str, dict[str, str]] = {}

    def walk(cls: type, prefix: str) -> None:  # a nested dataclass is a TOML table of its own: [a.b.c]
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            if dataclasses.is_dataclass(hints[f.name]):
                sub = typing.get_type_hints(hints[f.name])
                sections[prefix + f.name] = {g.name: name(sub[g.name]) for g in dataclasses.fields(hints[f.name])}
                walk(hints[f.name], f"{prefix}{f.name}.")

    walk(module.JobConfig, "")
    return sections


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("launcher", choices=["megatron", "vllm", "sglang", "torchtitan-toml"])
    ap.add_argument("--checkout", type=Path, help="Megatron-LM (or torchtitan v0.2.2) source checkout")
    ap.add_argument("--commit", help="the checkout's commit, when it is a plain copy without .git")
    ap.add_argument("argv_files", nargs="*", type=Path, help="exported argv (one shell-quoted line) to parse")
    args = ap.parse_args()
    if args.launcher == "torchtitan-toml":
        commit = subprocess.run(["git", "-C", str(args.checkout), "rev-parse", "HEAD"], capture_output=True,
                                text=True).stdout.strip()
        json.dump({"launcher": "torchtitan", "version": "v0.2.2", "commit": commit or args.commit,
                   "source": "torchtitan/config/job_config.py (JobConfig)",
                   "sections": torchtitan_toml_fields(args.checkout.resolve())}, sys.stdout, indent=1)
        sys.stdout.write("\n")
        return
    if args.launcher == "megatron":
        parser = megatron_parser(args.checkout.resolve())
        commit = subprocess.run(["git", "-C", str(args.checkout), "rev-parse", "HEAD"], capture_output=True,
                                text=True).stdout.strip()
        meta = {"launcher": "Megatron-LM", "source": "megatron/training/arguments.py (add_megatron_arguments)",
                "repository": "https://github.com/NVIDIA/Megatron-LM", "commit": commit or None}
    else:
        parser, version = vllm_parser() if args.launcher == "vllm" else sglang_parser()
        meta = {"launcher": args.launcher, "version": version,
                "source": ("vllm/entrypoints/common/cli_args.py (make_arg_parser)" if args.launcher == "vllm"
                           else "sglang/srt/server_args.py (ServerArgs.add_cli_args)")}
    for f in args.argv_files:
        parser.parse_args(shlex.split(f.read_text()))
        print(f"{f}: parsed by the real {args.launcher} parser", file=sys.stderr)
    json.dump({**meta, "flags": describe(parser)}, sys.stdout, indent=1)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
