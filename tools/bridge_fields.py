"""Record the ConfigContainer fields Megatron-Bridge's recipe scripts accept as KEY=VALUE overrides, for
tests/test_export_bridge.py (as tools/launcher_flags.py records Megatron-LM's flags).

Megatron-Bridge 0.6.x and the megatron-core it pins need Python 3.12 and GPU builds (Transformer Engine), so
the fields are read from the sources without importing them: every annotated field of each ConfigContainer
section's dataclass and of its base classes, followed through the `from X import Y as Z` lines of the modules
that define them. Its inputs are the released wheel unpacked and the Megatron-LM commit its release branch
pins as the 3rdparty/Megatron-LM submodule (megatron.core and megatron.training), plus the release branch's
scripts/training/run_recipe.py:

    pip download --no-deps --python-version 3.12 --only-binary=:all: megatron-bridge==0.6.2 && unzip the wheel
    python tools/bridge_fields.py --bridge WHEEL_DIR --megatron-lm MLM_CHECKOUT --scripts BRIDGE_CHECKOUT \\
        --version 0.6.2 --mlm-commit SHA --scripts-commit SHA > tests/data/launchers/megatron-bridge.json

The overrides are applied by Hydra's override parser to the ConfigContainer turned into an OmegaConf config in
struct mode (megatron/bridge/training/utils/omegaconf_utils.py, parse_hydra_overrides): a key that is not a
field there fails the run, which is what the recorded field list lets a test check without a GPU.
"""

from __future__ import annotations

import argparse
import ast
import json
import re
import sys
from pathlib import Path

SECTIONS = {  # ConfigContainer field -> (module, class) of the dataclass a text-model pretrain recipe puts there
    "model": ("megatron.bridge.models.gpt_provider", "GPTModelProvider"),
    "train": ("megatron.bridge.training.config", "TrainingConfig"),
    "optimizer": ("megatron.bridge.training.config", "OptimizerConfig"),
    "ddp": ("megatron.bridge.training.config", "DistributedDataParallelConfig"),
    "dataset": ("megatron.bridge.training.config", "GPTDatasetConfig"),
    "scheduler": ("megatron.bridge.training.config", "SchedulerConfig"),
    "checkpoint": ("megatron.bridge.training.config", "CheckpointConfig"),
    "logger": ("megatron.bridge.training.config", "LoggerConfig"),
    "dist": ("megatron.bridge.training.config", "DistributedInitConfig"),
    "comm_overlap": ("megatron.bridge.training.comm_overlap", "CommOverlapConfig"),
    "mixed_precision": ("megatron.bridge.training.mixed_precision", "MixedPrecisionConfig"),
    # the CUDA-graph overrides (export.bridge.cuda_graph_overrides) write these two as well
    "rng": ("megatron.bridge.training.config", "RNGConfig"),
    "rerun_state_machine": ("megatron.bridge.training.config", "RerunStateMachineConfig"),
}


class Sources:
    def __init__(self, roots: list[Path]) -> None:
        self.roots = roots
        self.trees: dict[str, ast.Module] = {}
        self.packages: set[str] = set()

    def module(self, name: str) -> ast.Module | None:
        if name not in self.trees:
            rel = Path(*name.split("."))
            for root in self.roots:
                for path in (root / rel.with_suffix(".py"), root / rel / "__init__.py"):
                    if path.is_file():
                        self.trees[name] = ast.parse(path.read_text())
                        if path.name == "__init__.py":
                            self.packages.add(name)
                        break
                if name in self.trees:
                    break
            else:
                return None
        return self.trees[name]

    def find_class(self, module: str, name: str, depth: int = 0) -> tuple[str, ast.ClassDef]:
        tree = self.module(module)
        if tree is None or depth > 10:
            raise LookupError(f"{module}.{name} not found")
        for node in tree.body:
            if isinstance(node, ast.ClassDef) and node.name == name:
                return module, node
        for node in tree.body:
            if isinstance(node, ast.ImportFrom):
                for alias in node.names:
                    if (alias.asname or alias.name) == name:
                        return self.find_class(self.absolute(module, node), alias.name, depth + 1)
        raise LookupError(f"{module}.{name} not found")

    def absolute(self, module: str, node: ast.ImportFrom) -> str:
        """The module an import names, relative imports resolved against `module`."""
        if not node.level:
            return node.module or ""
        parts = module.split(".")
        keep = len(parts) - node.level + (1 if module in self.packages else 0)
        return ".".join(parts[:keep] + ([node.module] if node.module else []))

    def fields(self, module: str, name: str) -> dict[str, str]:
        """{field: annotation} of a dataclass and its bases (bases first, as dataclasses order them)."""
        module, cls = self.find_class(module, name)
        out: dict[str, str] = {}
        for base in cls.bases:
            base_name = ast.unparse(base).split("[")[0]
            if base_name.split(".")[-1] in ("object", "Generic", "Protocol", "ABC"):
                continue
            try:
                out.update(self.fields(module, base_name.split(".")[-1]))
            except LookupError:
                pass  # a base outside the sources (typing, torch): holds no dataclass fields
        for node in cls.body:
            if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                note = ast.unparse(node.annotation)
                if not note.startswith(("ClassVar", "InitVar")):
                    out[node.target.id] = note
        return out


def mixed_precision_presets(sources: Sources) -> list[str]:
    tree = sources.module("megatron.bridge.training.mixed_precision")
    names = [n.name for n in tree.body if isinstance(n, ast.FunctionDef)
             and any(ast.unparse(d) == "register" for d in n.decorator_list)]
    return sorted(set(names) | {"bf16_mixed", "fp16_mixed"})  # the two base presets are looked up by name too


def recipe_names(bridge: Path) -> list[str]:
    names: set[str] = set()
    recipes = bridge / "megatron/bridge/recipes"
    for init in [*recipes.glob("*/__init__.py"), *recipes.glob("*/h100/__init__.py")]:  # run_recipe.py's search
        for node in ast.parse(init.read_text()).body:
            if isinstance(node, ast.Assign) and any(getattr(t, "id", "") == "__all__" for t in node.targets):
                names.update(ast.literal_eval(node.value))
    return sorted(n for n in names if n.endswith("_config"))


def run_recipe_flags(script: Path) -> list[str]:
    return sorted(set(re.findall(r'add_argument\(\s*(?:"-\w+",\s*)?"(--[\w-]+)"', script.read_text())))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bridge", type=Path, required=True, help="unpacked megatron-bridge wheel")
    ap.add_argument("--megatron-lm", type=Path, required=True, help="Megatron-LM checkout at the pinned commit")
    ap.add_argument("--scripts", type=Path, required=True, help="Megatron-Bridge checkout (release branch)")
    ap.add_argument("--version", required=True)
    ap.add_argument("--mlm-commit", required=True)
    ap.add_argument("--scripts-commit", required=True)
    args = ap.parse_args()
    sources = Sources([args.bridge, args.megatron_lm])
    sections = {}
    for section, (module, cls) in SECTIONS.items():
        sections[section] = {"class": cls, "fields": sources.fields(module, cls)}
    json.dump({
        "launcher": "Megatron-Bridge", "version": args.version,
        "repository": "https://github.com/NVIDIA-NeMo/Megatron-Bridge",
        "source": "megatron/bridge/training/config.py (ConfigContainer) and the dataclasses of its sections, "
                  "with their megatron.core / megatron.training bases",
        "megatron_lm_commit": args.mlm_commit, "scripts_commit": args.scripts_commit,
        "scripts_source": "scripts/training/run_recipe.py",
        "container": sources.fields("megatron.bridge.training.config", "ConfigContainer"),
        "sections": sections,
        "mixed_precision_presets": mixed_precision_presets(sources),
        "recipes": recipe_names(args.bridge),
        "run_recipe_flags": run_recipe_flags(args.scripts / "scripts/training/run_recipe.py"),
    }, sys.stdout, indent=1)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
