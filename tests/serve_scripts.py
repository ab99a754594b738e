"""Serving launch scripts as the serve-export tests run them: a plan estimated and exported with the real CLI, then
the script run under bash with stand-in launcher commands on PATH that record each launch in RECORDS."""

from __future__ import annotations

import subprocess
from pathlib import Path

H100 = ("--hardware", "dgx-h100")


def export_serving(cli, tmp_path: Path, name: str, target: str, *args: str) -> Path:
    """The folder `export --to target` writes for the serving plan `estimate --mode infer --engine target` saves."""
    plan, out = tmp_path / f"{name}.json", tmp_path / name
    r = cli("estimate", "--mode", "infer", *H100, *args, "--engine", target, "--save", plan)
    assert r.code == 0, r.err
    r = cli("export", plan, "--to", target, "-o", out)
    assert r.code == 0, r.err
    return out


def run_with_stand_ins(script: Path, tmp_path: Path, stand_in: str, env: dict[str, str],
                       tag: str = "") -> tuple[subprocess.CompletedProcess, Path]:
    """Run `script` with `stand_in` as vllm and python on PATH and `env` (PATH and RECORDS added); its result and
    the fresh folder its launches were recorded in."""
    bin_dir, records = tmp_path / "bin", tmp_path / f"records{tag}{len(list(tmp_path.glob('records*')))}"
    bin_dir.mkdir(exist_ok=True)
    records.mkdir()
    for name in ("vllm", "python"):
        (bin_dir / name).write_text(stand_in)
        (bin_dir / name).chmod(0o755)
    r = subprocess.run(["bash", str(script)], capture_output=True, text=True, timeout=60,
                       env={"PATH": f"{bin_dir}:/usr/bin:/bin", "RECORDS": str(records), **env})
    return r, records
