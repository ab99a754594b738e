"""Command-line values -> specs: every option that builds a spec goes through `build`, so bad input is one
clear line (exit 2)."""

from __future__ import annotations

from typing import Any, Optional, get_args

from pydantic import BaseModel, ValidationError

from llmplan.cli.options import SERVING_INSTEAD, SERVING_ONLY
from llmplan.errors import LlmplanError
from llmplan.fileio import excerpt
from llmplan.specs.check import accounted_split
from llmplan.specs.layout import balanced_layout, parse_layout
from llmplan.specs.plan import (ATTENTION_KERNELS, MOE_DISPATCHERS, MOE_ROUTINGS, PRECISIONS, RECOMPUTE_MODULES,
                                TP_IMPLS, ClusterSpec, MemoryAllowance)
from llmplan.specs.registry import build, resolve_system
from llmplan.specs.resilience import CheckpointPolicy
from llmplan.specs.serve import ServeJob, WeightDtype
from llmplan.topology.graph import validate


def pipeline_split(m, pp: int, first: int, last: int, layers: Optional[str], embedding: bool,
                   loss: bool, layout: Optional[str] = None, vpp: int = 1) -> dict:
    """The plan's stage layout from the pipeline options (one way at a time)."""
    ways = [name for name, on in (("--pp-layers", layers is not None), ("--pp-first-layers/--pp-last-layers",
                                  bool(first or last)), ("--account-for-*-in-pipeline-split", embedding or loss),
                                  ("--pp-layout", layout is not None)) if on]
    if len(ways) > 1:
        raise LlmplanError(f"{' and '.join(ways)} each set the pipeline split; give one of them")
    if layout is not None:
        return layout_split(m, layout, pp, vpp)
    if layers is not None:
        try:
            counts = tuple(int(x) for x in layers.replace(" ", "").split(",") if x != "")
        except ValueError:
            raise LlmplanError(f"--pp-layers {layers!r}: give one whole number of layers per stage, comma-separated "
                               f"(e.g. --pp-layers 7,8,8,7)") from None
        if len(counts) != pp:
            raise LlmplanError(f"--pp-layers lists {len(counts)} stage(s) but --pp is {pp}; give one layer count per "
                               f"stage (e.g. --pp {len(counts)})")
        return {"pp_layers": counts}
    if embedding or loss:
        first, last = accounted_split(m, pp, embedding, loss)
    return {"pp_first": first, "pp_last": last}


def layout_split(m, text: str, pp: int, vpp: int) -> dict:
    """pp_layout from Megatron's --pipeline-model-parallel-layout string ('balanced': specs.layout.
    balanced_layout of pp x vpp chunks), and vpp = chunks / pp as Megatron infers it when --vpp is left at 1
    (a --vpp that disagrees is check_plan's rule pp_layout)."""
    if text.strip() == "balanced":
        return {"pp_layout": balanced_layout(m.num_hidden_layers, pp, vpp, m.num_nextn_predict_layers), "vpp": vpp}
    chunks = parse_layout(text)
    inferred = len(chunks) // pp if len(chunks) % pp == 0 else vpp
    return {"pp_layout": chunks, "vpp": inferred if vpp == 1 else vpp}


def refuse_other_mode(ctx: Any, mode: str, serving_reads: frozenset[str]) -> None:
    """A flag the user gave that the mode does not read is an error, not silently ignored: in --mode infer every
    option outside `serving_reads` (training's precision, ZeRO, recompute, batch...), in training mode the
    serving options (options.SERVING_ONLY). 'Given' is what the command line (or the environment) set,
    whatever its value, so that --zero 0 is refused as --zero 3 is (ctx: the command's typer.Context)."""
    given = [p for p in ctx.command.params if p.name and getattr(ctx.get_parameter_source(p.name), "name", None) in
             ("COMMANDLINE", "ENVIRONMENT")]
    wrong = [p for p in given if (p.name not in serving_reads if mode == "infer" else p.name in SERVING_ONLY)]
    if not wrong:
        return
    flags = ", ".join(_flag(p, ctx.params.get(p.name)) for p in wrong)
    verb = "apply" if len(wrong) > 1 else "applies"
    if mode == "infer":
        hints = list(dict.fromkeys(SERVING_INSTEAD[p.name] for p in wrong if p.name in SERVING_INSTEAD))
        precision = ctx.params.get("precision")
        if precision in PRECISIONS and any(p.name == "precision" for p in wrong):
            weights = precision if precision in get_args(WeightDtype) else PRECISIONS[precision][0]
            hints = [f"use --dtype {weights} for {precision} serving weights" if h == SERVING_INSTEAD["precision"]
                     else h for h in hints]
        raise LlmplanError(f"{flags} {verb} to training, not to --mode infer; drop {'them' if len(wrong) > 1 else 'it'}"
                           + (f" ({'; '.join(hints)})" if hints else ""))
    raise LlmplanError(f"{flags} {verb} to serving (--mode infer), not to training; add --mode infer or drop "
                       f"{'them' if len(wrong) > 1 else 'it'}")


def _flag(param: Any, value: object) -> str:
    """The option as the user would write it: --zero 3, --no-sp."""
    opts = getattr(param, "opts", []) or [param.name]
    if getattr(param, "is_flag", False):
        secondary = getattr(param, "secondary_opts", [])
        return opts[0] if value or not secondary else secondary[0]
    return f"{opts[0]} {excerpt(str(value), 20)}"


def checked_pins(cls: type[BaseModel], pins: dict) -> dict:
    """The axes `search` pins, checked against the bounds of the plan they will become (cls: ParallelPlan or
    ServePlan, whose Field bounds `estimate` applies too), so that a pinned --tp 70000 is the same clear error
    in both commands; None (free) axes are not checked."""
    build(cls, {k: v for k, v in pins.items() if v is not None and k in cls.model_fields}, "pinned axes")
    return pins


def switches(dtype: str, grad_dtype: str, fp8_params: bool, flash_attention: bool, overlap_grad_reduce: bool,
             overlap_param_gather: bool, tp_comm_overlap: bool, ep_comm_overlap: bool = False,
             precision: str | None = None, moe_capacity_factor: float | None = None,
             pp_schedule: str = "1f1b", attention_kernel: str = "native",
             recompute_layers: int | None = None, fused_loss: bool = True, tp_impl: str = "megatron",
             fp32_param_shards: bool = False, moe_dispatcher: str = "alltoall",
             moe_routing: str = "random", recompute_modules: str | None = None) -> dict:
    """The training switches estimate and search share (ParallelPlan / Workload field names); --precision
    names the dtype and its recipe at once (PRECISIONS)."""
    recipe = "tensorwise"
    if precision is not None:
        if precision not in PRECISIONS:
            raise LlmplanError(f"--precision {precision} is not a recipe; use one of {', '.join(PRECISIONS)}")
        implied, recipe = PRECISIONS[precision]
        if dtype not in ("bf16", implied):
            raise LlmplanError(f"--dtype {dtype} contradicts --precision {precision} (dtype {implied}); give one")
        dtype = implied
    elif dtype == "fp4":
        recipe = "nvfp4"
    if attention_kernel not in ATTENTION_KERNELS:
        raise LlmplanError(f"--attention-kernel {attention_kernel} is not a kernel; use one of "
                           f"{', '.join(ATTENTION_KERNELS)}")
    if tp_impl not in TP_IMPLS:
        raise LlmplanError(f"--tp-impl {tp_impl} is not a TP implementation; use one of {', '.join(TP_IMPLS)}")
    if moe_dispatcher not in MOE_DISPATCHERS:
        raise LlmplanError(f"--moe-dispatcher {moe_dispatcher} is not an MoE dispatcher; use one of "
                           f"{', '.join(MOE_DISPATCHERS)}")
    if moe_routing not in MOE_ROUTINGS:
        raise LlmplanError(f"--moe-routing {moe_routing} is not a routing; use one of {', '.join(MOE_ROUTINGS)}")
    return {"dtype": dtype, "recipe": recipe, "grad_dtype": grad_dtype, "fp8_params": fp8_params,
            "flash_attention": flash_attention, "overlap_grad_reduce": overlap_grad_reduce,
            "overlap_param_gather": overlap_param_gather, "tp_comm_overlap": tp_comm_overlap,
            "ep_comm_overlap": ep_comm_overlap, "moe_capacity_factor": moe_capacity_factor,
            "pp_schedule": pp_schedule, "attention_kernel": attention_kernel, "recompute_layers": recompute_layers,
            "fused_loss": fused_loss, "tp_impl": tp_impl, "fp32_param_shards": fp32_param_shards,
            "moe_dispatcher": moe_dispatcher, "moe_routing": moe_routing,
            "recompute_modules": parse_recompute_modules(recompute_modules)}


def parse_recompute_modules(text: str | None) -> tuple[str, ...]:
    """--recompute-modules "layernorm,moe_act" -> ("layernorm", "moe_act"); an unknown name is an error."""
    names = tuple(x.strip() for x in (text or "").replace(" ", ",").split(",") if x.strip())
    unknown = [x for x in names if x not in RECOMPUTE_MODULES]
    if unknown:
        raise LlmplanError(f"--recompute-modules {', '.join(unknown)}: not a Megatron recompute module llmplan "
                           f"prices; use a comma-separated list of {', '.join(RECOMPUTE_MODULES)}")
    return names



def with_hardware_options(o: dict) -> dict[str, dict[str, float]]:
    """The plan-file key recording the --power-limit / --domain-gpus a plan was made with (empty without
    them), so that `check` applies them to the hardware spec as it is now."""
    opts = {k: o[k] for k in ("power_limit", "domain_gpus") if o.get(k) is not None}
    return {"hardware_options": opts} if opts else {}


def make_allowance(overhead_gib: float, fragmentation: float) -> MemoryAllowance:
    return build(MemoryAllowance, {"fixed_gib": overhead_gib, "fragmentation": fragmentation},
                 "memory allowance options")


CHECKPOINT_FLAGS = {"mode": "--checkpoint", "interval_s": "--checkpoint-interval",
                    "failures_per_gpu_hour": "--failure-rate"}


def make_checkpoint(mode: str, interval_s: float | None, failure_rate: float | None) -> CheckpointPolicy:
    """--checkpoint, --checkpoint-interval and --failure-rate as a CheckpointPolicy (its Field bounds are the
    rule); a bad value is one line naming the flag."""
    try:
        return CheckpointPolicy(mode=mode, interval_s=interval_s, failures_per_gpu_hour=failure_rate)  # type: ignore[arg-type]
    except ValidationError as e:
        err = e.errors()[0]
        flag = CHECKPOINT_FLAGS.get(str(err["loc"][0]), str(err["loc"][0]))
        raise LlmplanError(f"{flag} {err['input']}: {err['msg'].removeprefix('Value error, ')}") from None


def make_job(input_len, output_len, batch, prefix_hit_rate, ttft_slo, tpot_slo, util, block_size, max_tokens,
             engine="vllm", cuda_graphs=True, request_rate=None):
    return build(ServeJob, {"input_len": input_len, "output_len": output_len, "batch": batch,
                            "prefix_hit_rate": prefix_hit_rate, "ttft_slo_s": ttft_slo, "tpot_slo_s": tpot_slo,
                            "gpu_memory_utilization": util, "block_size": block_size,
                            "max_num_batched_tokens": max_tokens, "engine": engine, "cuda_graphs": cuda_graphs,
                            "request_rate": request_rate},
                 "inference workload options")


def make_cluster(hardware: str, nodes: int, gpus_per_node: int | None, power_limit: float | None = None,
                 domain_gpus: int | None = None):
    """Resolve --hardware (capped at --power-limit watts; --domain-gpus of each NVLink domain used, e.g. 64 of
    a 72-GPU rack so that power-of-two groups stay inside one), build the cluster and check that its graph
    connects every GPU."""
    system = resolve_system(hardware)
    if power_limit is None:  # the fleet's default cap, where the system profile states one
        power_limit = system.default_power_limit_w
    for flag, value, kwargs in (("--domain-gpus", domain_gpus, {"domain_gpus": domain_gpus}),
                                ("--power-limit", power_limit, {"power_limit": power_limit})):
        if value is not None:
            try:
                system = system.with_options(**kwargs)
            except ValueError as e:
                raise LlmplanError(f"{flag} {value:g}: {e}") from None
    cluster = build(ClusterSpec, {"system": system, "num_nodes": nodes, "gpus_per_node": gpus_per_node},
                    "cluster options")
    validate(system, nodes)
    return cluster
