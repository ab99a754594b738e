"""check_plan's pipeline rules: the layer split over pp, a pp_layout, the schedule's interleaving, pp multiple
and micro-batches, and virtual stages (vpp). Their predicates and messages are in specs/stages.py; RULES in
specs/check.py runs them, in this order, after the head rules."""

from __future__ import annotations

from llmplan.specs.rule import Rule, as_bool
from llmplan.specs.schedule import schedule_of
from llmplan.specs.stages import (
    interleaving_schedules, layout_problem, no_interleave_fix, pp_multiple_message, schedule_microbatches_message,
    schedule_microbatches_ok, split_message, split_ok, vpp_message, vpp_ok,
)

PIPELINE_RULES: tuple[Rule, ...] = (
    Rule("pp_layers", lambda m, p, c: split_ok(m, p), lambda m, p, c: split_message(m, p)),
    Rule("pp_layout", lambda m, p, c: layout_problem(m, p) is None, lambda m, p, c: layout_problem(m, p) or ""),
    Rule("schedule_no_interleave", lambda m, p, c: (p.vpp == 1) | schedule_of(p).interleaves,
         lambda m, p, c: f"the {p.pp_schedule} schedule runs one stage per rank (vpp {p.vpp} interleaves 1F1B); "
                         f"set vpp 1 or --pp-schedule {interleaving_schedules()}"),
    Rule("dualpipe_even_pp", lambda m, p, c: p.pp % schedule_of(p).pp_multiple == 0,
         lambda m, p, c: pp_multiple_message(p)),
    Rule("schedule_microbatches", lambda m, p, c: schedule_microbatches_ok(p),
         lambda m, p, c: schedule_microbatches_message(p)),
    Rule("vpp_needs_pp", lambda m, p, c: (p.vpp == 1) | (p.pp > 1),
         lambda m, p, c: f"vpp ({p.vpp}) needs pp > 1 (interleaving splits pipeline stages); set pp or vpp 1"),
    Rule("vpp_layers", lambda m, p, c: ~as_bool(split_ok(m, p)) | (p.pp == 1) | vpp_ok(m, p),
         lambda m, p, c: vpp_message(m, p)),
    # Megatron-Core's interleaved schedule runs micro-batches through the chunks in groups of pp
    # (microbatch_group_size_per_vp_stage, default pp) and raises when the last group is partial
    # (pipeline_parallel/schedules.py, forward_backward_pipelining_with_interleaving, at d98e8a6)
    Rule("vpp_microbatches", lambda m, p, c: (p.vpp == 1) | ((p.num_microbatches >= p.pp)
                                                             & (p.num_microbatches % p.pp == 0)),
         lambda m, p, c: f"interleaving (vpp {p.vpp}) needs a whole number of groups of pp ({p.pp}) micro-batches "
                         f"per step, and global_batch / (micro_batch x dp) = {p.global_batch} / ({p.micro_batch} x "
                         f"{p.dp}) gives {p.num_microbatches} (Megatron-Core's interleaved schedule refuses a partial "
                         f"last group); make it a multiple of {p.pp} with --global-batch or --micro-batch, or do not "
                         f"interleave: {no_interleave_fix(p)}"),
)
