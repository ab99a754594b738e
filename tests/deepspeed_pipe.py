"""DeepSpeed's pipeline TrainSchedule simulated with rendezvous transfers, shared by the tests that check
llmplan's 1F1B pricing against it (test_deepspeed_schedule.py, test_pp_unbatched.py).

The instruction order is microsoft/DeepSpeed deepspeed/runtime/pipe/schedule.py TrainSchedule.steps (v0.5.0 ..
v0.6.0): 2(n + p - 1) steps, the forward of micro-batch j on stage s at step 2j + s and its backward at step
2j + 2p - 1 - s. A forward step first receives its activation from stage s - 1 (RecvActivation), then sends it the
gradient of the step before's backward (SendGrad); a backward step first sends the step before's activation to
stage s + 1 (SendActivation), then receives its gradient (RecvGrad). Each transfer is a blocking p2p.send /
p2p.recv (p2p.py): nothing moves until both stages have posted it."""

from __future__ import annotations


def deepspeed_programs(p: int, n: int) -> list[list[tuple]]:
    """Each stage's instruction list under TrainSchedule: ('F' | 'B', j) passes and ('send' | 'recv', peer,
    what, j) transfers, in the order the engine issues them."""
    programs = []
    for s in range(p):
        prog: list[tuple] = []
        prev = -1
        for k in range(2 * (n + p - 1)):
            forward = (k - s) % 2 == 0
            j = (k - s) // 2 if forward else (k - 2 * p + 1 + s) // 2
            valid = 0 <= j < n
            if forward and s > 0:
                prog += [("recv", s - 1, "act", j)] if valid else []
                prog += [("send", s - 1, "grad", prev)] if 0 <= prev < n else []
            if not forward and s < p - 1:
                prog += [("send", s + 1, "act", prev)] if 0 <= prev < n else []
                prog += [("recv", s + 1, "grad", j)] if valid else []
            prog += [("F" if forward else "B", j)] if valid else []
            prev = j
        programs.append(prog)
    return programs


def deepspeed_makespan(forward_s: list[float], backward_s: list[float], n: int, transfer_s: float = 0.0) -> float:
    """Seconds TrainSchedule takes with these per-stage pass times: a stage runs its instructions in order; a
    transfer starts when both ends have reached it (a blocking send or receive) and takes transfer_s."""
    p = len(forward_s)
    progs, pc, clock = deepspeed_programs(p, n), [0] * p, [0.0] * p
    moved = True
    while moved:
        moved = False
        for s in range(p):
            while pc[s] < len(progs[s]):
                op = progs[s][pc[s]]
                if op[0] in ("F", "B"):
                    clock[s] += forward_s[s] if op[0] == "F" else backward_s[s]
                    pc[s] += 1
                    moved = True
                    continue
                kind, peer, what, j = op
                other = progs[peer][pc[peer]] if pc[peer] < len(progs[peer]) else None
                if other != ("recv" if kind == "send" else "send", s, what, j):
                    break
                clock[s] = clock[peer] = max(clock[s], clock[peer]) + transfer_s
                pc[s] += 1
                pc[peer] += 1
                moved = True
    assert pc == [len(x) for x in progs], "the schedule deadlocked"
    return max(clock)
