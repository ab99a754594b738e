"""ServePlan (how a model is sharded for serving) and ServeJob (the traffic it serves)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, model_validator

from llmplan.specs.model import SPEC_CONFIG, ModelSpec, Spec
from llmplan.specs.plan import Degrees

WeightDtype = Literal["bf16", "fp16", "fp8", "mxfp8", "nvfp4", "int8", "int4"]
KvDtype = Literal["bf16", "fp16", "fp8"]
Engine = Literal["vllm", "trtllm", "sglang"]

DEFAULT_BATCHED_TOKENS = 8192
"""ServeJob.max_num_batched_tokens when none is given, as vLLM and TensorRT-LLM jobs are priced and exported;
an SGLang job takes SGLang's own default chunked-prefill size for its GPU instead
(cost.serve_memory.sglang_chunked_prefill_size)."""

DEFAULT_MEMORY_FRACTION: dict[str, float] = {
    # Source: vllm-project/vllm v0.20.0 (and @002f10e0, the v0.33.0 the exports are checked against),
    # vllm/config/cache.py, CacheConfig.gpu_memory_utilization default 0.92; 0.9 up to v0.19.1.
    "vllm": 0.92,
    # Source: TensorRT-LLM docs, KvCacheConfig.free_gpu_memory_fraction ("Default is 90%").
    "trtllm": 0.9,
    # A placeholder until the plan and GPU are known: SGLang 0.5.23 derives --mem-fraction-static from the GPU's
    # memory, TP x PP, the chunked prefill size and the CUDA graphs (sglang/srt/arg_groups/memory_hook.py,
    # handle_gpu_memory_settings), which serving.job_for_plan applies (cost.serve_memory.sglang_mem_fraction_static)
    # to a job whose fraction was not given (ServeJob.memory_fraction_default).
    "sglang": 0.9,
}
"""The engine's memory fraction when none is given (ServeJob.gpu_memory_utilization); SGLang's is derived per
plan and GPU (ServeJob.memory_fraction_default)."""
Phase = Literal["both", "prefill", "decode"]
ServeDispatcher = Literal["alltoall", "deepep"]

EP_IMBALANCE_DEFAULT = 1.5
"""Default max/mean expert load of the busiest EP rank under a trained router with EPLB. Published: SGLang's
DeepSeek-V3 prefill on 4 x 8 H100 (EP32, 4,096-token prompts, 16,384 tokens per GPU) ran 50,302 tokens/s per
node with its EPLB placement and 59,337 with routing made perfectly balanced, 1.18x (LMSYS blog 2025-05-05
"Deploying DeepSeek with PD Disaggregation and Large-scale Expert Parallelism on 96 H100 GPUs", Profile
Results, Overall Throughput table). Derived: the load ratio at which llmplan's own prefill price of that pool
slows by the same 1.18x (1.5; 1.18 at 1.0 per rank would slow it 1.06x, since only the expert GEMMs and the
dispatch wait on the busiest rank). docs/formulas.md#serve.moe"""


class ServePlan(Spec):
    """One serving deployment: tensor/pipeline parallel replicas, expert parallelism and dtypes."""

    model_config = SPEC_CONFIG

    tp: int = Field(default=1, ge=1, le=65_536)
    """Tensor-parallel degree inside a replica."""
    pp: int = Field(default=1, ge=1, le=4_096)
    """Pipeline stages inside a replica."""
    dp: int = Field(default=1, ge=1, le=10_000_000)
    """Replicas (data parallel)."""
    ep: int = Field(default=1, ge=1, le=65_536)
    """Expert-parallel degree for MoE layers (vLLM --enable-expert-parallel makes it tp x dp); 1: experts
    are split by TP instead. Above tp the experts see the tokens of ep / tp replicas (vLLM only without
    dp_attention)."""
    weight_dtype: WeightDtype = "bf16"
    """Dtype of the linear-layer weights (embeddings and norms stay 16-bit): fp8 (per-tensor or 128x128 block
    scales), mxfp8 (E8M0 scale per 32) and nvfp4 (E4M3 scale per 16) run on the GPU's tensor cores of that
    format where it has them; int8 / int4 are weight-only."""
    kv_dtype: KvDtype = "bf16"
    """Dtype of the KV cache."""
    quant_group_size: int = Field(default=128, ge=1, le=1 << 20)
    """Weights per scale (and zero point) in int4/int8 group quantisation."""
    mla_latent_cache: bool = True
    """MLA models: cache the compressed latent, which needs an MLA attention kernel; False caches the expanded
    per-head K and V, as engines without one do (vLLM served DeepSeek-V2 this way before its MLA backend)."""
    fused_attention: bool = True
    """Fused (flash) attention; False writes and reads the attention scores through memory, as engines do on
    GPUs without a flash-attention kernel."""
    phase: Phase = "both"
    """Which phases the deployment serves: both (prefill and decode co-located), or one pool of a disaggregated
    deployment: prefill (prompts only; the KV cache leaves for the decode pool) or decode (KV received)."""
    dp_attention: bool = False
    """Data-parallel attention for MoE models: every GPU runs attention, the dense layers and the LM head on its
    own sequences (tp x pp = 1 per attention rank, dp ranks), and the routed experts are sharded over the ep GPUs
    of one server (its attention ranks); the experts of every MoE layer see the tokens of its ep ranks. dp a
    multiple of ep runs dp / ep independent servers of ep GPUs (copies)."""
    moe_dispatcher: ServeDispatcher = "alltoall"
    """How tokens reach their experts' ranks: alltoall (every routed copy in 16 bits) or deepep (DeepEP: fp8
    dispatch, 16-bit combine; prefill steps use the normal kernels, one copy per destination node over the
    network, bandwidth-bound; decode steps the low-latency kernels, each routed copy sent directly)."""
    two_batch_overlap: bool = False
    """Split each step into two micro-batches so that one's dispatch / combine runs while the other computes
    (DeepSeek's dual micro-batch overlap; SGLang two-batch overlap)."""
    redundant_experts: int = Field(default=0, ge=0, le=65_536)
    """Extra expert replicas (EPLB) over the EP ranks: each rank holds (experts + redundant) / ep experts."""
    ep_imbalance: float = Field(default=EP_IMBALANCE_DEFAULT, ge=1.0, le=64.0)
    """Expert load of the busiest EP rank over the mean under the trained router (with EPLB when redundant
    experts are set): the expert GEMMs and the dispatch / combine wait on that rank. Applies when the EP group
    spans replicas (dp_attention, or ep > tp: vLLM's DP + EP)."""
    expert_dtype: WeightDtype | None = None
    """Dtype of the routed experts' weights when it differs from weight_dtype (fp8 attention with NVFP4 experts);
    None: weight_dtype."""

    @property
    def expert_dtype_resolved(self) -> str:
        """The routed experts' weight dtype."""
        return self.expert_dtype or self.weight_dtype

    @property
    def gpus_per_replica(self) -> int:
        return self.tp * self.pp

    @property
    def num_gpus(self) -> int:
        return self.tp * self.pp * self.dp

    @property
    def attn_dp(self) -> int:
        """Attention data-parallel ranks of one server: its EP group (ep) under DP attention, else 1."""
        return self.ep if self.dp_attention else 1

    @property
    def copies(self) -> int:
        """Independent copies of the layout the plan runs: the replicas (dp), or under DP attention its servers
        of ep GPUs each (dp / ep)."""
        return self.dp // self.ep if self.dp_attention else self.dp

    @property
    def gpus_per_copy(self) -> int:
        """GPUs of one copy: tp x pp, or under DP attention one server's ep GPUs."""
        return self.ep if self.dp_attention else self.tp * self.pp

    @property
    def etp_resolved(self) -> int:
        """Expert tensor-parallel degree: with EP each rank holds whole experts (1); without it the experts
        are split by TP as the other linear layers (vLLM's FusedMoE: TP unless --enable-expert-parallel)."""
        return 1 if self.ep > 1 else self.tp

    # The pipeline split the cost functions read of any plan (specs.plan.PlanLike): serving engines give every
    # stage an equal share of the layers (check_serve_plan requires pp to divide them), one chunk per rank.
    @property
    def vpp(self) -> int:
        return 1

    @property
    def pp_first(self) -> int:
        return 0

    @property
    def pp_last(self) -> int:
        return 0

    @property
    def degrees(self) -> Degrees:
        """Where the replicas' groups sit."""
        return Degrees(self.tp, self.pp, self.dp, 1, self.ep, self.etp_resolved)

    def describe(self) -> str:
        """The plan in one line (the serving view, its HTML report and export headers)."""
        moe = "".join((f", {self.phase} pool" if self.phase != "both" else "",
                       ", DP attention" if self.dp_attention else "",
                       f", {self.moe_dispatcher}" if self.moe_dispatcher != "alltoall" else "",
                       ", two-batch overlap" if self.two_batch_overlap else "",
                       f", {self.redundant_experts} redundant experts" if self.redundant_experts else "",
                       f", experts {self.expert_dtype}" if self.expert_dtype else ""))
        return (f"tp {self.tp} pp {self.pp} replicas {self.dp} ep {self.ep}, weights {self.weight_dtype}, "
                f"KV {self.kv_dtype}" + moe)


SpeculativeMethod = Literal["mtp", "eagle", "eagle3", "ngram"]

ACCEPTANCE: dict[str, float] = {
    # Source: DeepSeek-V3 Technical Report (arXiv 2412.19437) §5.4.3: "the acceptance rate of the second token
    # prediction ranges between 85% and 90%" (the lower end taken).
    "mtp": 0.85,
    # Source: Li et al. 2024, EAGLE (ICML 2024, arXiv 2401.15077) §5: acceptance rates n-alpha of chain drafts
    # on MT-bench of about 0.7-0.8 (Vicuna 7B), the middle taken.
    "eagle": 0.75,
}
"""Published acceptance rate per speculative method, used when the job gives none. n-gram has none: its
acceptance is how much of the output repeats the prompt (vLLM docs, N-Gram speculation), so it must be given;
EAGLE-3's paper reports acceptance lengths of its tree drafts, not a per-token rate for chains, so it too."""


class SpeculativeSpec(Spec):
    """Speculative decoding: a cheap proposer drafts k tokens per sequence, the target verifies them in one
    step of k + 1 tokens and keeps the accepted prefix plus one token of its own."""

    model_config = SPEC_CONFIG

    method: SpeculativeMethod
    """mtp: the model's own multi-token-prediction layers (num_nextn_predict_layers, DeepSeek-V3) draft, run
    k times; eagle: an EAGLE head (one decoder layer on the target's hidden states, sharing its embedding and
    output head) or the named draft model; eagle3: the same with EAGLE-3's fusion of three layers' features
    (a 3h -> h input projection); ngram: prompt lookup on the host (no GPU work, no weights)."""
    num_speculative_tokens: int = Field(ge=1, le=64)
    """Draft tokens per sequence per step (k; vLLM num_speculative_tokens, SGLang --speculative-num-steps)."""
    acceptance_rate: float | None = Field(default=None, ge=0, le=1)
    """Probability that a draft token is accepted given the ones before it were (alpha); None: the method's
    published default (cost.speculative.ACCEPTANCE)."""
    draft_model: str | None = Field(default=None, min_length=1, max_length=4096)
    """The draft model as the user named it (a built-in name or a config path), for the launch line; None:
    the model's own MTP layers (mtp) or an EAGLE head of the target's shape (eagle)."""
    draft: ModelSpec | None = None
    """The draft model's spec (resolved from draft_model by the CLI); None with draft_model None."""

    @model_validator(mode="after")
    def _draft_given_whole(self) -> "SpeculativeSpec":
        if (self.draft is None) != (self.draft_model is None):
            raise ValueError("draft_model and draft are given together (the name and its resolved spec)")
        if self.draft is not None and self.method not in ("eagle", "eagle3"):
            raise ValueError(f"a draft model is used by methods eagle and eagle3, not {self.method}")
        return self


class LengthDistribution(Spec):
    """Request lengths (tokens) as a distribution instead of one value: a lognormal of the given mean and
    log-space sigma, or a histogram of (length, weight) points. Named public trace shapes are lognormals of
    their published mean (cost.lengths.TRACE_SHAPES)."""

    model_config = SPEC_CONFIG

    kind: Literal["lognormal", "histogram"]
    """lognormal (mean, sigma) or histogram (lengths, weights)."""
    mean: float | None = Field(default=None, ge=1, le=1 << 30)
    """lognormal: mean length in tokens."""
    sigma: float | None = Field(default=None, ge=0, le=4)
    """lognormal: standard deviation of log(length); 0 is one fixed length."""
    lengths: tuple[int, ...] = Field(default=(), max_length=100_000)
    """histogram: the lengths (tokens, >= 1)."""
    weights: tuple[float, ...] = Field(default=(), max_length=100_000)
    """histogram: each length's weight (>= 0, not all 0; normalised)."""
    name: str | None = Field(default=None, max_length=4096)
    """Where it came from (a trace shape's name or a histogram file), for the report."""

    @model_validator(mode="after")
    def _complete(self) -> "LengthDistribution":
        if self.kind == "lognormal" and (self.mean is None or self.sigma is None):
            raise ValueError("a lognormal distribution needs mean and sigma")
        if self.kind == "histogram":
            if not self.lengths or len(self.lengths) != len(self.weights):
                raise ValueError(f"a histogram needs as many weights as lengths (got {len(self.lengths)} "
                                 f"lengths, {len(self.weights)} weights, at least one)")
            if min(self.lengths) < 1 or min(self.weights) < 0 or sum(self.weights) <= 0:
                raise ValueError("histogram lengths must be >= 1 and weights >= 0, not all 0")
        return self


class ServeJob(Spec):
    """The traffic: request shape, concurrency, SLOs, prefix reuse and the server's memory settings."""

    model_config = SPEC_CONFIG

    input_len: int = Field(default=1024, ge=1, le=1 << 30)
    """Prompt tokens per request."""
    output_len: int = Field(default=256, ge=1, le=1 << 30)
    """Generated tokens per request."""
    batch: int = Field(default=64, ge=1, le=1 << 24)
    """Concurrent sequences per replica (the offered traffic). The engine's admission cap the exports write (vLLM
    --max-num-seqs, SGLang --max-running-requests) is this batch when it fits the KV cache, else the most that fit
    (serving.admission_cap)."""
    prefix_hit_rate: float = Field(default=0.0, ge=0, le=1)
    """Fraction of each prompt found in the prefix cache (multi-turn / agent traffic): not prefilled again."""
    ttft_slo_s: float | None = Field(default=None, gt=0, le=86_400)
    """Time-to-first-token objective, seconds."""
    tpot_slo_s: float | None = Field(default=None, gt=0, le=3_600)
    """Time-per-output-token objective, seconds."""
    engine: Engine = "vllm"
    """The serving engine, whose rules size the KV cache and admit sequences (cost.inference.ENGINES): vLLM
    (--gpu-memory-utilization of the whole GPU; blocks allocated as sequences grow), TensorRT-LLM
    (free_gpu_memory_fraction of what the weights and activations leave; GUARANTEED_NO_EVICT reserves each
    request's whole context), SGLang (--mem-fraction-static holds weights and KV pool)."""
    gpu_memory_utilization: float = Field(default=DEFAULT_MEMORY_FRACTION["vllm"], gt=0, le=1)
    """The engine's memory fraction: vLLM --gpu-memory-utilization, TensorRT-LLM
    kv_cache_config.free_gpu_memory_fraction, SGLang --mem-fraction-static; when not given (or None), the
    engine's default (DEFAULT_MEMORY_FRACTION: vLLM 0.92, TensorRT-LLM 0.9; SGLang's derived for each plan on
    its GPU, memory_fraction_default)."""
    memory_fraction_default: bool = False
    """Whether gpu_memory_utilization is the engine's default, not given: SGLang's is then derived again for each
    plan and GPU (serving.job_for_plan, cost.serve_memory.sglang_mem_fraction_static); False: the fraction is
    the user's (or a plan file's saved before the rule), kept as given."""

    @model_validator(mode="before")
    @classmethod
    def _engine_default_fraction(cls, data: Any) -> Any:
        # Not given, or a saved default (derived again: SGLang's may be <= 0 where its reserve exceeds the GPU).
        if isinstance(data, dict) and (data.get("gpu_memory_utilization") is None
                                       or data.get("memory_fraction_default") is True):
            engine = data.get("engine", "vllm")
            # an unknown engine (or a list / mapping, which no dict lookup takes) is refused by its field
            fraction = DEFAULT_MEMORY_FRACTION.get(engine if isinstance(engine, str) else "vllm",
                                                   DEFAULT_MEMORY_FRACTION["vllm"])
            return {**data, "gpu_memory_utilization": fraction, "memory_fraction_default": True}
        return data
    block_size: int = Field(default=16, ge=1, le=1 << 20)
    """Tokens per KV-cache block (vLLM --block-size)."""
    cuda_graphs: bool = True
    """Decode steps replay CUDA graphs (the engines' default); False launches every kernel from the host
    (vLLM --enforce-eager), which adds a launch per kernel to each step."""
    max_num_batched_tokens: int = Field(default=DEFAULT_BATCHED_TOKENS, ge=1, le=1 << 30)
    """Tokens one engine step may process (chunked prefill + decodes), per replica (attention rank under DP
    attention); when not given (or None), DEFAULT_BATCHED_TOKENS, which SGLang replaces with its own default
    for the plan's GPU (max_num_batched_tokens_default)."""
    max_num_batched_tokens_default: bool = False
    """Whether max_num_batched_tokens is not given: an SGLang job then takes SGLang's default chunked-prefill
    size for each plan's GPU (serving.job_for_plan, cost.serve_memory.batched_tokens_for_plan); vLLM and
    TensorRT-LLM keep DEFAULT_BATCHED_TOKENS. False: the budget is the user's (or a plan file's saved before
    the rule), kept as given."""

    @model_validator(mode="before")
    @classmethod
    def _engine_default_batched_tokens(cls, data: Any) -> Any:
        # Not given (a plan file saved before the rule holds 8,192 without the flag: kept as given).
        if isinstance(data, dict) and data.get("max_num_batched_tokens") is None:
            return {**data, "max_num_batched_tokens": DEFAULT_BATCHED_TOKENS, "max_num_batched_tokens_default": True}
        return data
    cuda_graph_batch_sizes: tuple[Annotated[int, Field(ge=1, le=1 << 24)], ...] | None = Field(
        default=None, min_length=1, max_length=1024)
    """Batch sizes the engine keeps decode CUDA graphs for, with padding on (TensorRT-LLM cuda_graph_config
    batch_sizes + enable_padding, after the engine drops those above min(max_batch_size, max_num_tokens)): a
    decode step of B sequences replays the graph of the smallest kept size >= B, dummy one-token sequences
    filling it, so its element-wise operators and all-reduces carry that many rows
    (cost.serve_step.graph_padded_rows, docs/formulas.md#infer.graph_padding); None: B rows (no padding).
    vLLM's list counts tokens (1 + k per request under speculative decoding, cost.serve_step.graph_ceiling).
    At most 1,024 sizes: vLLM's default at its 1,024 ceiling (compute capability 10.x, GPT-OSS) holds 83."""
    cuda_graph_sizes_default: bool = False
    """Whether cuda_graph_batch_sizes is the engine's default list as llmplan derives it (the CLI without
    --cuda-graph-sizes): then it is derived again for the TP of each plan and the batch it is priced at
    (cost.serve_step.graph_sizes_at); False: the sizes are the user's, kept as given."""
    request_rate: float | None = Field(default=None, gt=0, le=1e9)
    """Requests per second the deployment must sustain (search --objective min-gpus); None: no rate. Positive
    and finite (NaN compared false with every rate and passed every plan), at most 10^9 requests/s."""
    speculative: SpeculativeSpec | None = None
    """Speculative decoding (cost.speculative); None: one token per sequence per decode step."""
    input_len_dist: LengthDistribution | None = None
    """Prompt lengths as a distribution (cost.lengths); input_len is then its mean, rounded."""
    output_len_dist: LengthDistribution | None = None
    """Output lengths as a distribution (cost.lengths); output_len is then its mean, rounded."""

    @property
    def decode_graph_sizes(self) -> tuple[int, ...] | None:
        """The captured sizes a decode step pads to: cuda_graph_batch_sizes under CUDA graphs, else None."""
        return self.cuda_graph_batch_sizes if self.cuda_graphs else None

    @property
    def context(self) -> int:
        """Tokens a sequence holds in the KV cache at its end."""
        return self.input_len + self.output_len

    @property
    def uncached_input(self) -> float:
        return self.input_len * (1.0 - self.prefix_hit_rate)
