"""vLLM and SGLang serve commands for inference plans (flags: vLLM and SGLang engine-argument documentation)."""

from __future__ import annotations

import json
import math
import shlex
from typing import Any

from llmplan.cost.inference import admitted_tokens
from llmplan.cost.lengths import lengths_of, quantile
from llmplan.cost.serve_memory import sglang_chunk_total
from llmplan.cost.serve_step import captured_graph_sizes, sglang_default_list_empty
from llmplan.export.common import as_flags, hf_repo, need_mode, refuse, sh_header
from llmplan.export.serve_nodes import ROUTER_HINT, NodeLaunch, clear_port_env, node_script, sglang_nodes, vllm_nodes
from llmplan.export.serve_router import router_script
from llmplan.planfile import PlanFile
from llmplan.serving import ServeEstimate, admitted_run, estimate_serving
from llmplan.specs.check import batched_tokens_message
from llmplan.specs.serve import DEFAULT_BATCHED_TOKENS
from llmplan.units import GIB


def _model_var(pf: PlanFile) -> str:
    return f'MODEL=${{MODEL:-{hf_repo(pf.model.name)}}}'


def context_limit(pf: PlanFile) -> int:
    """The context limit the launch line sets: the planned input + output, or with length distributions the
    sum of their p99 lengths (longer requests would be refused), at most max_position_embeddings."""
    j = pf.serve_job
    if j.input_len_dist is None and j.output_len_dist is None:
        return j.context
    d_in, d_out = lengths_of(j)
    return min(math.ceil(quantile(d_in, 0.99) + quantile(d_out, 0.99)), pf.model.max_position_embeddings)


def context_note(pf: PlanFile, flag: str) -> str:
    """Where the context limit comes from, said in the file."""
    j, m = pf.serve_job, pf.model
    if context_limit(pf) != j.context:
        return (f"# {flag} {context_limit(pf)}: the p99 input + p99 output of the planned length distributions "
                f"(means {j.input_len} + {j.output_len}); {m.name} accepts up to {m.max_position_embeddings:,}\n")
    return (f"# {flag} {j.context}: the planned input ({j.input_len}) + output ({j.output_len}) tokens, for which the "
            f"KV capacity was predicted; {m.name} accepts up to {m.max_position_embeddings:,}: re-plan with longer "
            "--input-len / --output-len to serve longer requests\n")


PREEMPTS = {"vllm": "preempting them (recompute)", "sglang": "retracting them"}
"""What each engine does to running sequences when its KV cache runs out."""


def admission(pf: PlanFile, engine: str, flag: str) -> tuple[int, str, ServeEstimate]:
    """The admission cap `flag` sets per replica (serving.admission_cap of the plan as saved, priced again as
    `estimate --plan` prices it), a comment line when it is not the planned batch, and the engine's run at that
    cap (serving.admitted_run: memory_fraction converts its KV bytes, or writes its fraction); refuses a plan of
    which not one sequence fits. Derived: docs/formulas.md#infer.capacity"""
    j = pf.serve_job
    e = estimate_serving(pf.model, pf.cluster, pf.plan, j, pf.allowance)
    run = admitted_run(e, pf.allowance)
    if run is None:
        kv = e.memory.kv_available
        why = (f"weights, activations and runtime exceed the usable memory by {-kv / GIB:.2f} GiB per GPU, leaving "
               "no KV cache" if kv <= 0 else f"not one sequence of {admitted_tokens(j):,.0f} tokens fits the "
               f"{kv / GIB:.2f} GiB per GPU left for its KV cache")
        raise refuse(engine, why, "re-plan with a larger tp or pp, an fp8 KV cache or quantised weights "
                     "(llmplan search --mode infer)")
    cap = run.job.batch
    if cap == j.batch:
        return cap, "", run
    return cap, (f"# {flag}: {cap:,} sequences per replica, not the planned batch of {j.batch:,}: only {cap:,} fit "
                 f"the KV cache (llmplan estimate --plan: at_fitting_batch), so the engine queues the rest instead "
                 f"of admitting them and {PREEMPTS[engine]}; TTFT, TPOT and throughput as priced at {cap:,}\n"), run


def memory_fraction(pf: PlanFile, engine: str, run: ServeEstimate) -> tuple[float, str]:
    """The `engine`'s memory fraction that gives the KV cache the bytes the planned engine's rule gives it in
    `run`, the run at the admission cap (admission: for a plan that does not fit, the fitting batch's, whose
    activation peak is smaller), and a comment line when it differs from the planned engine's (whose fraction
    means something else): vLLM (weights + activations + other + KV) / HBM, SGLang (weights + KV) / (HBM -
    other), rounded down. The planned engine's own fraction is written as priced: the user's, or SGLang's
    default for this server (cost.serve_memory.sglang_mem_fraction_static), said in a comment line.
    Derived: docs/formulas.md#infer.capacity"""
    j, mem, planned = pf.serve_job, run.memory, run.job.gpu_memory_utilization
    if j.engine == engine:
        note = (f"# --mem-fraction-static {planned:g}: SGLang 0.5.23's own default for this GPU, --tp-size, "
                "--chunked-prefill-size and CUDA graphs, as llmplan priced it\n"
                if engine == "sglang" and run.job.memory_fraction_default else "")
        return planned, note
    hbm = pf.cluster.system.gpu.hbm_bytes
    used = mem.weights + mem.kv_available + (mem.activations + mem.other if engine == "vllm" else 0.0)
    fraction = math.floor(1000 * used / (hbm if engine == "vllm" else hbm - mem.other)) / 1000
    return fraction, (f"# memory fraction {fraction}: gives the KV cache the {mem.kv_available / GIB:.1f} GiB per "
                      f"GPU planned with {j.engine}'s rule (its fraction {planned:g})\n")


def recurrent_state_dtype(pf: PlanFile) -> str | None:
    """The recurrent-state dtype the serving memory was predicted with (bf16: cost.inference
    recurrent_state_per_seq_gpu) for a model with Mamba-2 / Gated DeltaNet layers, written out so that the
    engine's own default (SGLang: float32) does not double the state; None for a transformer."""
    m = pf.model
    return "bfloat16" if m.count_layers("mamba") or m.count_layers("linear_attention") else None


def draft_repo(pf: PlanFile) -> tuple[str | None, str]:
    """The draft checkpoint a launch line names (None for MTP and n-gram, which need none) and a comment
    line when it is a placeholder (an EAGLE head of the target's shape was planned, not a named draft)."""
    spec = pf.serve_job.speculative
    if spec is None or spec.method not in ("eagle", "eagle3"):
        return None, ""
    if spec.draft is not None:
        return hf_repo(spec.draft.name), ""
    repo = f"path/to/{pf.model.name}-{spec.method}-head"
    return repo, (f"# speculative {spec.method}: planned with a one-layer head of {pf.model.name}'s shape; replace "
                  f"{repo} with the EAGLE checkpoint trained for it\n")


def vllm_speculative(pf: PlanFile) -> tuple[list[tuple[str, Any]], str]:
    """vLLM's --speculative-config JSON (method, num_speculative_tokens, the draft model for eagle): vLLM docs,
    Speculative Decoding (MTP, EAGLE, N-Gram)."""
    spec = pf.serve_job.speculative
    if spec is None:
        return [], ""
    repo, note = draft_repo(pf)
    config = {"method": spec.method, **({"model": repo} if repo else {}),
              "num_speculative_tokens": spec.num_speculative_tokens}
    return [("--speculative-config", shlex.quote(json.dumps(config, separators=(",", ":"))))], note


def sglang_speculative(pf: PlanFile) -> tuple[list[tuple[str, Any]], str]:
    """SGLang's speculative flags for a chain draft (top-k 1): NEXTN (the model's MTP layers), EAGLE or EAGLE3
    with the draft's path, NGRAM; k draft steps and k + 1 tokens verified (the drafts and the target's own): SGLang
    server arguments and its Speculative Decoding docs."""
    spec = pf.serve_job.speculative
    if spec is None:
        return [], ""
    repo, note = draft_repo(pf)
    k = spec.num_speculative_tokens
    algorithm = {"mtp": "NEXTN", "eagle": "EAGLE", "eagle3": "EAGLE3", "ngram": "NGRAM"}[spec.method]
    chain = spec.method != "ngram"
    return [("--speculative-algorithm", algorithm), ("--speculative-num-steps", k if chain else None),
            ("--speculative-eagle-topk", 1 if chain else None), ("--speculative-num-draft-tokens", k + 1),
            ("--speculative-draft-model-path", repo)], note


def check_vllm(pf: PlanFile) -> None:
    """Refuse, with the reason, a plan vLLM cannot run as planned (render_vllm runs this first)."""
    need_mode(pf, "infer", "vllm")
    p = pf.plan
    dp = p.attn_dp if p.dp_attention else p.dp  # one server's (moe_notes: DP-attention servers)
    if p.ep > 1 and p.ep != p.tp * dp:
        raise refuse("vllm", f"ep {p.ep} (vLLM's --enable-expert-parallel makes EP = tp x dp = {p.tp * dp})",
                     f"re-plan with --ep {p.tp * dp} or --ep 1")
    vllm_nodes(pf)  # refuses DP ranks it cannot start over nodes


def check_sglang(pf: PlanFile) -> None:
    """Refuse, with the reason, a plan SGLang cannot run as planned (render_sglang runs this first)."""
    need_mode(pf, "infer", "sglang")
    sglang_nodes(pf)  # refuses servers it cannot start over nodes


def render_vllm(pf: PlanFile) -> dict[str, str]:
    """The vLLM serve script of an inference plan (and its router script where requests need one)."""
    check_vllm(pf)
    p, j = pf.plan, pf.serve_job
    cap, cap_note, run = admission(pf, "vllm", "--max-num-seqs")
    # The plan's budget; an SGLang plan priced at SGLang's own default chunk (not vLLM's) runs vLLM at llmplan's
    # default, as before that rule, and says so.
    sglang_default = j.engine == "sglang" and j.max_num_batched_tokens_default
    tokens = DEFAULT_BATCHED_TOKENS if sglang_default else j.max_num_batched_tokens
    if sglang_default:
        cap_note += (f"# --max-num-batched-tokens {tokens}: llmplan's default; the plan was priced at SGLang's own "
                     f"default chunk of {j.max_num_batched_tokens:,} tokens per replica\n")
    if cap > tokens:  # an SGLang plan run at llmplan's default budget (a vLLM plan: check_serve_plan refused it)
        raise refuse("vllm", batched_tokens_message(cap, tokens),
                     f"re-plan with --max-num-batched-tokens {cap} or more, or --batch {tokens}")
    fraction, fraction_note = memory_fraction(pf, "vllm", run)
    spec_flags, spec_note = vllm_speculative(pf)
    sizes, sizes_note = graph_sizes(pf, "vllm")
    flags = as_flags([
        ("--tensor-parallel-size", p.tp), ("--pipeline-parallel-size", p.pp),
        ("--data-parallel-size", p.attn_dp if p.dp_attention else p.dp),
        ("--enable-expert-parallel", p.ep > 1), *vllm_moe_flags(pf), ("--max-model-len", context_limit(pf)),
        ("--gpu-memory-utilization", fraction), ("--max-num-seqs", cap),
        ("--max-num-batched-tokens", tokens), ("--block-size", j.block_size),
        ("--kv-cache-dtype", "fp8" if p.kv_dtype == "fp8" else "auto"),
        ("--quantization", "fp8" if p.weight_dtype == "fp8" else None),
        ("--enable-prefix-caching", True), ("--enable-chunked-prefill", True),
        ("--mamba-ssm-cache-dtype", recurrent_state_dtype(pf)), ("--mamba-cache-dtype", recurrent_state_dtype(pf)),
        # --no-cuda-graphs: every kernel launched from the host, as priced (vLLM 0.33.0's ModelConfig.enforce_eager)
        ("--enforce-eager", not j.cuda_graphs), (GRAPH_SIZES_FLAG["vllm"], sizes),
    ] + spec_flags)
    note = ("# int4/int8 weights: point MODEL at a pre-quantised (AWQ/GPTQ) checkpoint; vLLM reads its "
            "quantisation from the checkpoint\n" if p.weight_dtype in ("int4", "int8") else "")
    if p.weight_dtype in ("mxfp8", "nvfp4"):
        note += (f"# {p.weight_dtype} weights: point MODEL at a pre-quantised {p.weight_dtype} checkpoint (e.g. "
                 "NVIDIA ModelOpt); vLLM reads its quantisation from the checkpoint\n")
    nodes = vllm_nodes(pf)
    note += moe_notes(pf, laid_out=nodes is not None)
    text = (sh_header(pf, "vLLM (vllm serve; flags checked against vLLM 0.33.0)") + "set -euo pipefail\n" + note
            + cap_note + fraction_note + spec_note + sizes_note + context_note(pf, "--max-model-len"))
    return _launch_script(pf, nodes, "vllm", 'vllm serve "$MODEL"', flags, text)


def render_sglang(pf: PlanFile) -> dict[str, str]:
    """The SGLang serve script of an inference plan (and its router script where requests need one)."""
    check_sglang(pf)
    p, j = pf.plan, pf.serve_job
    cap, cap_note, run = admission(pf, "sglang", "--max-running-requests")
    fraction, fraction_note = memory_fraction(pf, "sglang", run)
    spec_flags, spec_note = sglang_speculative(pf)
    chunk, chunk_note = sglang_chunk(pf, run)
    sizes, no_list, sizes_note = _sglang_graph_sizes(pf, cap, run)
    note = cap_note + fraction_note + chunk_note + sizes_note
    if p.weight_dtype in ("int4", "int8", "mxfp8", "nvfp4"):
        note += f"# {p.weight_dtype} weights: point MODEL at a pre-quantised checkpoint\n"
    nodes = sglang_nodes(pf)
    note += moe_notes(pf, laid_out=nodes is not None)
    # SGLang's --tp-size counts every GPU of the instance; with DP attention --attn-dp-size splits them into
    # attention ranks (attention TP = tp-size / attn-dp-size) while the experts spread over --ep-size; SGLang
    # 0.5.23 refuses --dp-size > 1 with --attn-dp-size > 1 (arg_groups/parallel_hook.py).
    flags = as_flags([
        ("--tp-size", p.tp * p.attn_dp if p.dp_attention else p.tp), ("--pp-size", p.pp),
        ("--dp-size", None if p.dp_attention else p.dp),
        ("--ep-size", p.ep if p.ep > 1 else None), *sglang_moe_flags(pf),
        ("--context-length", context_limit(pf)), ("--mem-fraction-static", fraction),
        # With DP attention SGLang counts running requests and chunked-prefill tokens over all attention ranks
        # (arg_groups/parallel_hook.py handle_data_parallelism and the pool configurator divide them by
        # --attn-dp-size), so the per-rank plan values are multiplied by dp (sglang_chunk).
        ("--max-running-requests", cap * p.attn_dp),
        ("--chunked-prefill-size", chunk),
        ("--page-size", j.block_size), ("--kv-cache-dtype", "fp8_e4m3" if p.kv_dtype == "fp8" else "auto"),
        ("--quantization", "fp8" if p.weight_dtype == "fp8" else None),
        ("--mamba-ssm-dtype", recurrent_state_dtype(pf)),
        # --no-cuda-graphs: both phases eager (0.5.23's spellings; its --disable-cuda-graph is deprecated)
        ("--disable-decode-cuda-graph", not j.cuda_graphs or no_list),
        ("--disable-prefill-cuda-graph", not j.cuda_graphs),
        (GRAPH_SIZES_FLAG["sglang"], sizes),
    ] + spec_flags)
    note += spec_note
    text = (sh_header(pf, "SGLang (python -m sglang.launch_server; flags checked against SGLang 0.5.23)")
            + "set -euo pipefail\n" + note + context_note(pf, "--context-length"))
    return _launch_script(pf, nodes, "sglang", 'python -m sglang.launch_server --model-path "$MODEL"', flags, text)


def _sglang_graph_sizes(pf: PlanFile, cap: int, run: ServeEstimate) -> tuple[str | None, bool, str]:
    """SGLang's capture list (graph_sizes), whether its default decode list is empty at `cap` running requests
    (SGLang would refuse to start: decode runs eager, as priced) and the comment lines that say so."""
    sizes, sizes_note = graph_sizes(pf, "sglang", cap)
    no_list = sglang_default_list_empty(run.job)  # SGLang would refuse to start: decode eager, as priced
    if no_list:
        sizes_note += (f"# --disable-decode-cuda-graph: SGLang's default decode capture list keeps no size for "
                       f"{cap:,} running requests per attention rank at this server's alignment, and SGLang "
                       "refuses to start with none (base_cuda_graph_runner.py get_batch_sizes_to_capture); decode "
                       "runs eager, as priced\n")
    return sizes, no_list, sizes_note


def _launch_script(pf: PlanFile, nodes: NodeLaunch | None, engine: str, command: str, flags: list[str],
                   text: str) -> dict[str, str]:
    """`text` (header and notes) followed by the launch: the model variable and `command` with its flags on one
    node, else the node layout's note and per-node commands (node_script); then the router (_with_router)."""
    if nodes is None:
        text += (_model_var(pf) + "\n" + clear_port_env(engine) + command + " \\\n"
                 + " \\\n".join(f"    {f}" for f in flags) + "\n")
    else:
        text += nodes.note + _model_var(pf) + "\n"
        text += node_script(nodes, command, flags)
    return _with_router(pf, nodes, engine, text)


def _with_router(pf: PlanFile, nodes: NodeLaunch | None, engine: str, text: str) -> dict[str, str]:
    """The serve script and, where requests need one, the router script (export.serve_router); the serve script's
    notes then name it in place of ROUTER_HINT, or in a line of their own."""
    router = router_script(pf, nodes, engine)
    if router is None:
        return {f"{engine}_serve.sh": text}
    name = f"{engine}_router.sh"
    if ROUTER_HINT in text:
        text = text.replace(ROUTER_HINT, f"({name}, written beside this script)")
    else:
        at = text.index("\nMODEL=") + 1 if "\nMODEL=" in text else 0
        text = text[:at] + f"# requests: through {name}, written beside this script\n" + text[at:]
    return {f"{engine}_serve.sh": text, name: router}


GRAPH_SIZES_FLAG = {"vllm": "--cudagraph-capture-sizes", "sglang": "--cuda-graph-bs-decode"}
"""The flag of each engine's explicit decode CUDA-graph capture list, its values space-separated (argparse
nargs='+'): vLLM --cudagraph-capture-sizes (CompilationConfig.cudagraph_capture_sizes, a list flag of 0.33.0's
parser; vllm-project/vllm @99d7eb5d, vllm/engine/arg_utils.py, EngineArgs.add_cli_args), SGLang 0.5.23
--cuda-graph-bs-decode (PyPI wheel, python/sglang/srt/arg_groups/fields/exec_.py: cuda_graph_bs_decode, List[int];
its decode max_bs becomes the largest listed size, arg_groups/memory_hook.py handle_gpu_memory_settings)."""


def graph_sizes(pf: PlanFile, engine: str, requests: int | None = None) -> tuple[str | None, str]:
    """The plan's own --cuda-graph-sizes as `engine`'s capture list (GRAPH_SIZES_FLAG), None where the engine
    derives its own list as llmplan priced it (ServeJob.cuda_graph_sizes_default) or runs eager, and a comment
    line when the plan was priced for another engine, whose sizes may count other units (tokens in vLLM, requests
    in SGLang and TensorRT-LLM: cost.serve_step.graph_sizes_count_tokens). The list is written as the user gave
    it; where SGLang's runner captures another of it for `requests` per attention rank (the admission cap; None:
    the planned batch) (cost.serve_step.captured_graph_sizes), a comment line says which, as priced."""
    j = pf.serve_job
    if not j.cuda_graphs or j.cuda_graph_sizes_default or not j.cuda_graph_batch_sizes:
        return None, ""
    sizes = " ".join(str(b) for b in j.cuda_graph_batch_sizes)
    note = "" if j.engine == engine else (f"# {GRAPH_SIZES_FLAG[engine]}: the plan's --cuda-graph-sizes, priced "
                                          f"with {j.engine}'s CUDA graphs\n")
    pool = j.batch if requests is None else requests
    captured = captured_graph_sizes(j.model_copy(update={"batch": pool}), pf.plan)
    if engine == j.engine == "sglang" and captured != j.decode_graph_sizes:
        # never empty: load_plan refuses a list the runner keeps none of at the planned batch
        # (check.sglang_graph_violations), and a pool of at most the batch keeps at least as much of it
        kept = " ".join(str(b) for b in captured or ())
        note += (f"# {GRAPH_SIZES_FLAG[engine]}: as given; SGLang's runner captures {kept} of it for "
                 f"{pool:,} running requests per attention rank (alignment and pool, "
                 "base_cuda_graph_runner.py get_batch_sizes_to_capture), as priced\n")
    if engine == j.engine == "vllm" and captured != j.decode_graph_sizes:
        kept = " ".join(str(b) for b in captured) if captured else "none (no decode graph)"
        note += (f"# {GRAPH_SIZES_FLAG[engine]}: as given; vLLM keeps {kept} of it (the sizes <= "
                 f"--max-num-batched-tokens {j.max_num_batched_tokens}, vllm/config/vllm.py _set_cudagraph_sizes), "
                 "as priced\n")
    return sizes, note


def sglang_chunk(pf: PlanFile, run: ServeEstimate) -> tuple[int, str]:
    """SGLang's --chunked-prefill-size for the plan as priced (cost.serve_memory.sglang_chunk_total: all
    attention ranks together) and, where it is SGLang's own default for the GPU (an SGLang plan made without
    --max-num-batched-tokens), a comment line saying so. Derived: docs/formulas.md#infer.sglang_chunk"""
    p, job, gpu = pf.plan, run.job, pf.cluster.system.gpu
    chunk = sglang_chunk_total(job, p, gpu.hbm_gib * GIB)
    if not (job.engine == "sglang" and job.max_num_batched_tokens_default):
        return chunk, ""
    ranks = (f"; DP attention gives each of the {p.attn_dp} attention ranks {job.max_num_batched_tokens:,}"
             if p.dp_attention else "")
    return chunk, (f"# --chunked-prefill-size {chunk}: SGLang 0.5.23's own default for {gpu.name}'s "
                   f"{gpu.hbm_gib:g} GiB{ranks}, as llmplan priced it (give --max-num-batched-tokens to plan "
                   "another)\n")


DEEPEP_MODE = {"prefill": "normal", "decode": "low_latency", "both": "auto"}
"""SGLang --deepep-mode per phase: normal kernels for prefill, low-latency for decode, auto (each batch picks)
when co-located."""


def sglang_moe_flags(pf: PlanFile) -> list[tuple[str, object]]:
    """SGLang server arguments of the phase and MoE deployment (SGLang expert-parallelism and PD
    disaggregation docs): --disaggregation-mode, DP attention (--attn-dp-size, 0.5.23's spelling of the deprecated
    --dp-size --enable-dp-attention) with the dense layers and LM head data-parallel too, --moe-a2a-backend deepep with
    its --deepep-mode, --enable-two-batch-overlap,
    --ep-num-redundant-experts."""
    p = pf.plan
    return [("--disaggregation-mode", p.phase if p.phase != "both" else None),
            ("--attn-dp-size", p.attn_dp if p.dp_attention else None),
            ("--moe-dense-tp-size", 1 if p.dp_attention else None),
            ("--enable-dp-lm-head", p.dp_attention),
            ("--moe-a2a-backend", "deepep" if p.moe_dispatcher == "deepep" else None),
            ("--deepep-mode", DEEPEP_MODE[p.phase] if p.moe_dispatcher == "deepep" else None),
            ("--enable-two-batch-overlap", p.two_batch_overlap),
            ("--ep-num-redundant-experts", p.redundant_experts or None)]


def vllm_moe_flags(pf: PlanFile) -> list[tuple[str, object]]:
    """vLLM engine arguments of the phase and MoE deployment (vLLM expert-parallel deployment and NixlConnector
    docs): DP attention is vLLM's data parallelism with --enable-expert-parallel; DeepEP's high-throughput
    kernels for prefill and co-located serving, its low-latency kernels for decode (--all2all-backend);
    dual-batch overlap (--enable-dbo); EPLB with its redundant experts; the NIXL KV connector for a pool of a
    disaggregated deployment."""
    p = pf.plan
    a2a = None if p.moe_dispatcher != "deepep" else \
        "deepep_low_latency" if p.phase == "decode" else "deepep_high_throughput"
    eplb = "'" + json.dumps({"num_redundant_experts": p.redundant_experts}) + "'" if p.redundant_experts else None
    kv = "'" + json.dumps({"kv_connector": "NixlConnector", "kv_role": "kv_both"}) + "'" if p.phase != "both" else None
    return [("--all2all-backend", a2a), ("--enable-dbo", p.two_batch_overlap),
            ("--enable-eplb", bool(p.redundant_experts)), ("--eplb-config", eplb), ("--kv-transfer-config", kv)]


def moe_notes(pf: PlanFile, laid_out: bool = False) -> str:
    """Comment lines for what the launch line cannot say: the other pool, the expert checkpoint, the DP-attention
    servers (left to the per-node script's notes where it lays them out: `laid_out`, export.serve_nodes)."""
    p = pf.plan
    out = ""
    if p.phase != "both":
        other = "decode" if p.phase == "prefill" else "prefill"
        out += (f"# {p.phase} pool of a disaggregated deployment: start the {other} pool and a router that sends "
                "each request to both (the KV cache moves between them)\n")
    if p.expert_dtype:
        out += f"# routed experts in {p.expert_dtype}: point MODEL at a checkpoint whose experts are {p.expert_dtype}\n"
    if p.dp_attention and p.copies > 1 and not laid_out:
        out += (f"# DP attention over {p.num_gpus} GPUs as {p.copies} independent servers of {p.ep} GPUs (dp {p.dp} / "
                f"ep {p.ep}), as priced: start this command on each group of {p.ep} GPUs and spread requests over "
                "the servers (e.g. a router)\n")
    return out
