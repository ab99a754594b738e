"""The router script of a serving export: the launcher's documented router given every server's address and port
(and a prefill server's KV bootstrap port), written where requests must be spread over several servers or sent to
both pools of a disaggregated deployment. Only flags read in the router's source are written.

- SGLang: `python -m sglang_router.launch_router` (the sglang-router package) with `--host`, `--port` (its default
  30000 is the servers' own default, so the script sets ROUTER_PORT), `--worker-urls URL...` for co-located
  servers, and for a disaggregated deployment `--pd-disaggregation` with `--prefill URL BOOTSTRAP_PORT` a prefill
  server and `--decode URL` a decode server (sgl-project/sglang @094b723a, sgl-router/py_src/sglang_router/
  launch_router.py, RouterArgs.add_cli_args; the same flags @083d6013, sgl-router/py_src/sglang_router/
  router_args.py).
  The router also serves Prometheus metrics at `--prometheus-port`, 29000 unless given (`--prometheus-host`
  127.0.0.1; @083d6013 router_args.py add_cli_args): the script gives it as PROMETHEUS_PORT, checked against
  ROUTER_PORT and the servers' ports like ROUTER_PORT.
- vLLM: for a disaggregated deployment with NixlConnector, the proxy its NixlConnector guide documents,
  `tests/v1/kv_connector/nixl_integration/toy_proxy_server.py` of a vLLM source tree, with `--host`, `--port`,
  `--prefiller-hosts H... --prefiller-ports P...` and `--decoder-hosts H... --decoder-ports P...`, one host and port
  a server, only the head of a DP deployment over nodes (vllm-project/vllm @026c83f9,
  docs/features/nixl_connector_usage.md, "Proxy Server" and "Proxy for Multiple Instances"; its parse_args
  @030ea52e). vLLM documents no router for co-located servers (docs/serving/data_parallel_deployment.md,
  "External Load Balancing", leaves it to any HTTP load balancer): no script is written there.

One export holds one pool, so a pool's router script names its own servers and takes the other pool's words in
OTHER_POOL, which the other pool's router script prints when run with POOL_ARGS_ONLY=1."""

from __future__ import annotations

from llmplan.export.common import sh_header
from llmplan.export.serve_nodes import (BOOTSTRAP_PORT, GRPC_DELTA, PORT_ENV, SGLANG_PORT, VLLM_PORT, NodeLaunch,
                                        bound_block, sglang_span, shown_port)
from llmplan.export.serve_shell import count_check, port_var
from llmplan.planfile import PlanFile

ROUTER_PORT = 8080
"""The router's port unless ROUTER_PORT is given: SGLang's router defaults to 30000, its servers' own --port, and
vLLM's proxy to 8000, its servers' (launch_router.py RouterArgs.port; toy_proxy_server.py parse_args)."""

PROMETHEUS_PORT = 29000
"""SGLang's router's metrics port unless PROMETHEUS_PORT is given: its own default (sgl-project/sglang @083d6013,
sgl-router/py_src/sglang_router/router_args.py, add_cli_args "--prometheus-port", default=29000)."""

PROXY = "tests/v1/kv_connector/nixl_integration/toy_proxy_server.py"
"""vLLM's documented NixlConnector proxy, a script of its source tree (not installed with the wheel)."""


def _inner(word: str) -> str:
    """A port shell word ("$PORT", "$((PORT+1))" or a number) as it reads inside a double-quoted string."""
    return word.strip('"')


def _arith(word: str) -> str:
    """A port shell word as a shell arithmetic expression ("$((PORT+1))" -> PORT+1, "$PORT" -> PORT)."""
    inner = _inner(word)
    return inner[3:-2] if inner.startswith("$((") else inner.lstrip("$")


def _endpoints(pf: PlanFile, launch: NodeLaunch | None, engine: str) -> tuple[list[list[tuple[str, str]]], str]:
    """The servers per address and what one address is: the launch's (NodeLaunch.endpoints), or the one server of
    a one-command launch at the launcher's default ports (SGLANG_PORT, VLLM_PORT, BOOTSTRAP_PORT)."""
    if launch is None:
        port = str(SGLANG_PORT if engine == "sglang" else VLLM_PORT)
        boot = str(BOOTSTRAP_PORT) if engine == "sglang" and pf.plan.phase == "prefill" else ""
        return [[(port, boot)]], "the node the server runs on"
    if launch.per_server:
        return launch.endpoints, "node 0 of each server, its HEAD_ADDR, server by server"
    return launch.endpoints, "each node the serve script runs on, in NODE_RANK order"


def _pool_words(engine: str, phase: str, ends: list[list[tuple[str, str]]]) -> list[str]:
    """The router words naming every server of this pool (ADDR[k] the address of slot k)."""
    if engine == "sglang":
        if phase == "both":
            return ["--worker-urls", *(f'"http://${{ADDR[{k}]}}:{_inner(p)}"' for k, slot in enumerate(ends)
                                       for p, _ in slot)]
        if phase == "prefill":
            return [w for k, slot in enumerate(ends) for p, b in slot
                    for w in ("--prefill", f'"http://${{ADDR[{k}]}}:{_inner(p)}"', b)]
        return [w for k, slot in enumerate(ends) for p, _ in slot
                for w in ("--decode", f'"http://${{ADDR[{k}]}}:{_inner(p)}"')]
    role = "prefiller" if phase == "prefill" else "decoder"
    return [f"--{role}-hosts", *(f'"${{ADDR[{k}]}}"' for k, slot in enumerate(ends) for _ in slot),
            f"--{role}-ports", *(p for slot in ends for p, _ in slot)]


def _addresses(n: int, what: str, phase: str, engine: str) -> str:
    """The lines that read the servers' addresses (NODE_ADDRS) into ADDR and say what OTHER_POOL holds."""
    text = (f"# NODE_ADDRS: the {n} address{'es' * (n > 1)} of {what} (space-separated), reachable from the "
            "router; the port variables as given to the serve script\n")
    if phase != "both":
        other = "decode" if phase == "prefill" else "prefill"
        text += (f"# OTHER_POOL: the {other} pool's servers, as its export's router script prints them: "
                 f'OTHER_POOL="$(POOL_ARGS_ONLY=1 NODE_ADDRS=... bash {other}/{engine}_router.sh)"\n')
    text += "NODE_ADDRS=${NODE_ADDRS:?FILL IN the addresses of the servers, see above}\n"
    text += "set -f\nADDR=($NODE_ADDRS)\nset +f\n"
    return text + count_check(n, f"give the {n} addresses of {what}" if n > 1 else f"give the one address of {what}")


def _taken(pf: PlanFile, launch: NodeLaunch | None, engine: str,
           ends: list[list[tuple[str, str]]]) -> tuple[list[tuple[str, str]], str]:
    """The ports of a node's servers the router's own ports must avoid (the router may run on a server's node,
    node 0 of a server over nodes among them), as (lo, hi) shell arithmetic, and their words for a message: from
    the first server's --port to the last one's, for SGLang DP-attention servers through the last one's derived
    ports (--port + sglang_span(ranks) - 1, SGLANG_PORT); SGLang's gRPC ports, --port + GRPC_DELTA of the first
    to the last server, which the serve script keeps free for them (SGLANG_PORT); a prefill server's KV bootstrap
    ports (BOOTSTRAP_PORT onward, one a server); and the launch's other blocks (NodeLaunch.binds: node 0's
    DIST_PORT block of an SGLang server over nodes, vLLM's NIXL side-channel, DP handshake and rendezvous
    ports). Each block is whole from its first port to its last (conservative where servers are strided)."""
    most = max(ends, key=len)  # the address with the most servers: theirs are the --port values any node uses
    first, last = most[0][0], most[-1][0]
    extra = sglang_span(pf.plan.attn_dp) - 1 if engine == "sglang" and pf.plan.dp_attention else 0
    hi = f"{_arith(last)} + {extra}" if extra else _arith(last)
    ranges = [(_arith(first), hi)]
    words = [f"a server's port ({_inner(first)} to {shown_port(hi)} on a node)" if len(most) > 1 or extra else
             f"a server's port ({_inner(first)} on a node)"]
    blocks = list(launch.binds) if launch is not None else []
    if engine == "sglang":
        grpc = (f"{_arith(first)} + {GRPC_DELTA}", f"{_arith(last)} + {GRPC_DELTA}")
        blocks.insert(0, bound_block(*grpc, f"its gRPC port{'s' * (len(most) > 1)} at --port+{GRPC_DELTA}"))
    boots = [b for _, b in most if b]
    if boots:
        blocks.append(bound_block(_arith(boots[0]), _arith(boots[-1]), "a bootstrap port"))
    for lo, hi_, what in blocks:
        ranges.append((lo, hi_))
        words.append(what)
    return ranges, ", ".join(words[:-1]) + " and " + words[-1] if len(words) > 1 else words[0]


def _outside(var: str, ranges: list[tuple[str, str]]) -> str:
    """Shell arithmetic: var lies in none of the ranges."""
    return " && ".join(f"({var} < {lo} || {var} > {hi})" for lo, hi in ranges)


def _router_port(ranges: list[tuple[str, str]], words: str) -> str:
    """ROUTER_PORT and its checks: a port number, outside a node's servers' ports (_taken)."""
    return "".join(port_var(
        "ROUTER_PORT", ROUTER_PORT, f"ROUTER_PORT >= 1024 && ROUTER_PORT <= 65535 && {_outside('ROUTER_PORT', ranges)}",
        f"ROUTER_PORT=$ROUTER_PORT: the router must not take {words}; set ROUTER_PORT from 1024 to 65535 outside "
        "those"))


def _prometheus_port(ranges: list[tuple[str, str]], words: str) -> str:
    """PROMETHEUS_PORT and its checks: a port number, not ROUTER_PORT, outside a node's servers' ports (_taken):
    SGLang's router binds both (PROMETHEUS_PORT)."""
    return "".join(port_var(
        "PROMETHEUS_PORT", PROMETHEUS_PORT, "PROMETHEUS_PORT >= 1024 && PROMETHEUS_PORT <= 65535 && "
        f"PROMETHEUS_PORT != ROUTER_PORT && {_outside('PROMETHEUS_PORT', ranges)}",
        f"PROMETHEUS_PORT=$PROMETHEUS_PORT: the router's metrics port must differ from ROUTER_PORT=$ROUTER_PORT and "
        f"from {words}; set PROMETHEUS_PORT from 1024 to 65535 outside those"))


def _launch(engine: str, phase: str) -> str:
    """The pool's words (printed alone with POOL_ARGS_ONLY=1), the other pool's, and the router command."""
    text, rest = "", ""
    if phase != "both":
        text += 'if [[ "${POOL_ARGS_ONLY:-}" == 1 ]]; then\n    echo "${POOL[*]}"\n    exit 0\nfi\n'
        text += "OTHER_POOL=${OTHER_POOL:?FILL IN the servers of the other pool, see above}\n"
        text += "set -f\nOTHER=($OTHER_POOL)\nset +f\n"
        rest = ' "${OTHER[@]}"'
    if engine == "sglang":
        pd = " --pd-disaggregation" if phase != "both" else ""
        return text + (f'python -m sglang_router.launch_router --host 0.0.0.0 --port "$ROUTER_PORT" '
                       f'--prometheus-port "$PROMETHEUS_PORT"{pd} '
                       f'"${{POOL[@]}}"{rest}\n')
    text += f"# VLLM_SRC: a vLLM source tree, whose {PROXY} is the proxy\n"
    text += "VLLM_SRC=${VLLM_SRC:?FILL IN the path of a vLLM source tree}\n"
    return text + f'python "$VLLM_SRC/{PROXY}" --host 0.0.0.0 --port "$ROUTER_PORT" "${{POOL[@]}}"{rest}\n'


def router_script(pf: PlanFile, launch: NodeLaunch | None, engine: str) -> str | None:
    """The router script of the export (module docstring), or None: one co-located server, or co-located vLLM
    servers (no documented router)."""
    phase = pf.plan.phase
    ends, what = _endpoints(pf, launch, engine)
    if phase == "both" and (engine == "vllm" or sum(len(slot) for slot in ends) == 1):
        return None
    ports = "" if launch is None else launch.ports.split(f"unset {PORT_ENV[engine].split(':', 1)[0]}\n", 1)[-1]
    checks = "" if launch is None else launch.checks
    ranges, words = _taken(pf, launch, engine, ends)
    text = sh_header(pf, "SGLang router (python -m sglang_router.launch_router)" if engine == "sglang" else
                     "vLLM NixlConnector proxy (toy_proxy_server.py of a vLLM source tree)") + "set -euo pipefail\n"
    text += _addresses(len(ends), what, phase, engine) + ports + checks + _router_port(ranges, words)
    text += _prometheus_port(ranges, words) if engine == "sglang" else ""
    text += "POOL=(\n" + "".join(f"    {w}\n" for w in _pool_words(engine, phase, ends)) + ")\n"
    return text + _launch(engine, phase)
