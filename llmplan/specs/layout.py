"""The text form of ParallelPlan.pp_layout (llmplan's --pp-layout), which is Megatron-LM's pipeline layout
string (--pipeline-model-parallel-layout), and the balanced layout of a pipeline shape.

The grammar, as Megatron-LM's PipelineParallelLayerLayout.parse_str_to_list reads it (megatron/core/
transformer/pipeline_parallel_layer_layout.py at d98e8a6, and docs/user-guide/features/
pipeline_parallel_layout.md): commas are cosmetic and dropped; "(X)*n" repeats X n times (no nesting),
then "c*n" repeats the one symbol c; '|' separates virtual pipeline chunks; the symbols are E (embedding),
t (transformer decoder layer), m (MTP layer) and L (loss). Chunk k of the list runs on pipeline rank
k mod pp as that rank's virtual chunk k // pp (the list is in model order).
"""

from __future__ import annotations

import re

from llmplan.errors import LlmplanError

SYMBOLS = "EtmL"
"""The layer symbols Megatron-LM's layout string knows (its char2layer_type)."""
_GROUP = re.compile(r"\(([^)]+)\)\*(\d+)")
_SYMBOL = re.compile(r"(.)\*(\d+)")
MAX_CHUNKS = 65_536
"""Most chunks a layout may unroll to (ParallelPlan.pp_layout's bound): a larger repeat count is a typo."""


def parse_layout(text: str) -> tuple[str, ...]:
    """The chunks of a Megatron layout string, each a run of E/t/m/L symbols ('' for an empty chunk)."""
    flat = text.replace(",", "").replace(" ", "")
    try:
        for pattern in (_GROUP, _SYMBOL):
            flat = pattern.sub(lambda g: _repeat(g.group(1), int(g.group(2))), flat)
    except OverflowError:
        raise LlmplanError(f"--pp-layout {text!r}: its repeats unroll to more than {MAX_CHUNKS:,} chunks; "
                           f"check the *n counts") from None
    bad = sorted({c for c in flat if c not in SYMBOLS + "|"})
    if bad:
        raise LlmplanError(f"--pp-layout {text!r}: unknown symbol(s) {' '.join(bad)}; a layout uses E (embedding), "
                           f"t (layer), m (MTP layer), L (loss), '|' between chunks, (X)*n and c*n repeats, "
                           f"e.g. \"Et*3|(tt|)*29,m|L\"")
    chunks = tuple(flat.split("|"))
    if len(chunks) > MAX_CHUNKS:
        raise LlmplanError(f"--pp-layout {text!r}: {len(chunks):,} chunks, at most {MAX_CHUNKS:,}")
    return chunks


def _repeat(unit: str, n: int) -> str:
    if len(unit) * n > 16 * MAX_CHUNKS:
        raise OverflowError
    return unit * n


def _chunk_text(chunk: str) -> str:
    """One chunk with runs of 3 or more of a symbol written c*n."""
    out = []
    for run in re.finditer(r"(.)\1*", chunk):
        n = len(run.group(0))
        out.append(f"{run.group(1)}*{n}" if n >= 3 else run.group(0))
    return "".join(out)


def format_layout(chunks: tuple[str, ...] | list[str]) -> str:
    """The shortest-to-read Megatron layout string of `chunks`: repeated neighbouring chunks as (X|)*n,
    runs of a symbol as c*n, a comma after a repeat group (parse_layout(format_layout(c)) == c)."""
    groups: list[list] = []
    for c in chunks:
        if groups and groups[-1][0] == c:
            groups[-1][1] += 1
        else:
            groups.append([c, 1])
    parts = []
    for i, (c, n) in enumerate(groups):
        last = i == len(groups) - 1
        repeats = n - 1 if last else n  # the final chunk is written without its trailing '|'
        text = _chunk_text(c)
        if repeats > 1:
            parts.append(f"({text}|)*{repeats}," if text else f"(|)*{repeats},")
        elif repeats == 1:
            parts.append(f"{text}|")
        if last:
            parts.append(text)
    out = "".join(parts)
    return out[:-1] if out.endswith(",") else out


def balanced_layout(L: int, pp: int, vpp: int, mtp: int = 0) -> tuple[str, ...]:
    """A layout of L layers over pp x vpp chunks as even as a layout can be: the embedding and the loss each
    take one layer's slot (as Megatron's --account-for-embedding/loss-in-pipeline-split count them), the
    L + 2 slots split evenly with the remainder to the middle chunks, the MTP layers with the loss. For
    DeepSeek-V3 at PP8 VPP4 it is Megatron-Bridge's H100 layout "Et|(tt|)*30mL".
    Derived: docs/formulas.md#pipeline.layout"""
    n = pp * vpp
    if n == 1:
        return ("E" + "t" * L + "m" * mtp + "L",)
    base, extra = divmod(L + 2, n)
    slots = [base] * n
    for i in list(range(1, n - 1)) + [0, n - 1]:  # the remainder to the middle chunks first
        if extra == 0:
            break
        slots[i] += 1
        extra -= 1
    slots[0] -= 1
    slots[-1] -= 1
    deficit = -min(slots[0], 0) - min(slots[-1], 0)  # fewer slots than chunks: an end chunk had none to give
    slots[0], slots[-1] = max(slots[0], 0), max(slots[-1], 0)
    for i in range(n - 2, 0, -1):  # ... so the middle chunks give those layers back, from the last
        take = min(slots[i], deficit)
        slots[i] -= take
        deficit -= take
    chunks = ["t" * k for k in slots]
    chunks[0] = "E" + chunks[0]
    chunks[-1] = chunks[-1] + "m" * mtp + "L"
    return tuple(chunks)
