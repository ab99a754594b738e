"""Record the command-line flags of a launcher's real argument parser, for tests/test_launchers.py.

Megatron-LM does not install on a CPU machine (megatron-core wheels omit megatron/training), so the tests
check exports against the flags its parser defines, read here from a source checkout by building that
parser (`add_megatron_arguments`) on CPU. Usage:

    python tools/launcher_flags.py megatron /path/to/Megatron-LM > tests/data/launchers/megatron-lm.json

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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("launcher", choices=["megatron"])
    ap.add_argument("checkout", type=Path)
    ap.add_argument("argv_files", nargs="*", type=Path, help="exported argv (one shell-quoted line) to parse")
    args = ap.parse_args()
    parser = megatron_parser(args.checkout.resolve())
    commit = subprocess.run(["git", "-C", str(args.checkout), "rev-parse", "HEAD"], capture_output=True,
                            text=True).stdout.strip()
    for f in args.argv_files:
        ns = parser.parse_args(shlex.split(f.read_text()))
        print(f"{f}: parsed; tp {ns.tensor_model_parallel_size} pp {ns.pipeline_model_parallel_size}", file=sys.stderr)
    json.dump({"launcher": "Megatron-LM", "source": "megatron/training/arguments.py (add_megatron_arguments)",
               "repository": "https://github.com/NVIDIA/Megatron-LM", "commit": commit or None,
               "flags": describe(parser)}, sys.stdout, indent=1)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
