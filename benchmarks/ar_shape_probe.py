"""Probe: why llmplan's multi-node all-reduce busbw on DGX H100 falls 387 -> 300 GB/s from 4 to 512 nodes.

Prints, per node count k (8 GPUs a node, one all-reduce over every GPU):
  * llmplan's pick and the busbw of each candidate of topology.collectives.collective_coeffs (ring, tree,
    hierarchical), with the share of the time that is latency (alpha) rather than bytes (beta);
  * the bytes per GPU each candidate puts on its NIC, per byte of buffer: llmplan's tree / hierarchical charge
    2(k-1)/k / g (the k-domain ring's bus factor on S/g), NCCL's ring 2(n-1)/n / g and NCCL's double binary
    tree 2 / g for k > 2 (each node is interior in one tree: it receives two halves and sends one up, then the
    reverse; NVIDIA/nccl v2.21.5-1 src/graph/tuning.cc, ncclTopoTuneModel: ring algbw = busBw nRanks/nsteps,
    tree algbw = busBw x 0.5, both busBw = nChannels x bwInter for nNodes > 2, i.e. no node-count term);
  * the busbw NCCL's own tuning model shape gives at llmplan's per-NIC rate (ring flat; tree x 0.92 (n-1)/n),
  * the NIC share each reading implies under llmplan's formula and under NCCL's.

Published: Fernandez et al. 2024 (arXiv 2411.13055), NCCL-tests all_reduce 16 GiB, DGX H100, ~355 GB/s at 4 nodes,
~345 at 512 (read off the plot, +-10; as reproduced in stas00/ml-engineering network/images/nccl-all-reduce-scan.png);
NVIDIA GTC 2025 S72583 slide 12: 370 GB/s at 32 GPUs (4 nodes) without SHARP; NVIDIA GTC 2024 S62129 slide 35
(as reproduced in ml-engineering network/images/nccl-all-reduce-scan-nvlstree.png): NVLSTree, 32 to 8,192 GPUs,
~365-380 GB/s at 16 GiB at every size of the group (read off the plot, +-5).

Usage: PYTHONPATH=. python benchmarks/ar_shape_probe.py [--system dgx-h100] [--size-gib 16]
"""

from __future__ import annotations

import argparse

from llmplan.specs.cluster import ClusterSpec
from llmplan.specs.registry import builtin_systems
from llmplan.topology.collectives import bus_factor, collective_coeffs, collective_time, group_links
from llmplan.topology.placement import span_of_ranks

GIB = 2**30
PUBLISHED = {4: ("NVIDIA S72583 slide 12", 370.0), 512: ("Fernandez et al. (read off)", 345.0),
             1024: ("NVIDIA S62129 NVLSTree (read off)", 370.0)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--system", default="dgx-h100")
    ap.add_argument("--size-gib", type=float, default=16.0)
    a = ap.parse_args()
    s = builtin_systems()[a.system]
    S = a.size_gib * GIB
    g = s.gpus_per_node
    print(f"{a.system}: all-reduce {a.size_gib:g} GiB, {g} GPUs a node, nic_efficiency {s.nic_efficiency}, "
          f"allreduce_nic_efficiency {s.allreduce_nic_efficiency}")
    print(f"{'nodes':>5} {'pick':>12} {'busbw':>6} | {'ring':>6} {'tree':>6} {'hier':>6} | {'alpha%':>6} | "
          f"NIC B/GPU per B: {'llmplan':>7} {'nccl-ring':>9} {'nccl-tree':>9} | nccl-model ring tree | share(llmplan, nccl)")
    for k in (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024):
        n = k * g
        cl = ClusterSpec(system=s, num_nodes=k, gpus_per_node=g)
        sp = span_of_ranks(list(range(n)), cl)
        ct = collective_time("all-reduce", S, sp, s)
        cands = {}  # each algorithm at its cheapest protocol at S (the ring has one candidate per NCCL protocol)
        for c in sorted(collective_coeffs("all-reduce", sp, s), key=lambda c: -c.seconds(S)):
            cands[c.algorithm] = c
        if k > 1:  # the hierarchical form is priced only when asked for
            cands["hierarchical"] = collective_coeffs("all-reduce", sp, s, "hierarchical")[0]
        f = bus_factor("all-reduce", n)

        def bb(name: str) -> str:
            c = cands.get(name)
            return f"{S / c.seconds(S) * f / 1e9:6.0f}" if c else "     -"
        best = cands.get(ct.algorithm)
        alpha = 100 * best.alpha / best.seconds(S) if best else 0.0
        L = group_links(s, sp)
        nic = L.ring_inter_bw  # per GPU, bytes/s, after the all-reduce NIC share
        ours = 2 * (k - 1) / k / g if k > 1 else 0.0
        nring = 2 * (n - 1) / n / g if k > 1 else 0.0
        ntree = (2.0 if k > 2 else 1.0) / g if k > 1 else 0.0
        model_ring = g * nic / 1e9 if k > 1 else 0.0
        model_tree = 0.92 * g * nic * (n - 1) / n / 1e9 if k > 2 else 0.0
        line = (f"{k:5d} {ct.algorithm:>12} {ct.busbw / 1e9:6.0f} | {bb('ring')} {bb('tree')} {bb('hierarchical')} | "
                f"{alpha:6.2f} | {'':16} {ours:7.4f} {nring:9.4f} {ntree:9.4f} | {model_ring:10.0f} {model_tree:4.0f}")
        if k in PUBLISHED:
            src, v = PUBLISHED[k]
            raw = g * nic / (s.allreduce_nic_efficiency or s.nic_efficiency)  # the node's NIC line rate
            # llmplan's tree / hierarchical inter term: busbw = g B share (n-1)/n k/(k-1); NCCL ring: g B share
            share_ours = v / (raw / 1e9 * (n - 1) / n * k / (k - 1))
            share_nccl = v / (raw / 1e9)
            line += f" | {src} {v:.0f}: {share_ours:.3f}, {share_nccl:.3f}"
        print(line)


if __name__ == "__main__":
    main()
