"""Shell lines shared by the serving scripts (export.serve_nodes) and their router scripts (export.serve_router):
a check that stops the script with one line on stderr and status 2, the check that a port variable is a port
number, the shell word of a port above a port variable, and the list of a node's GPUs the servers take their
slices of."""

from __future__ import annotations

PORT_RE = "^[1-9][0-9]{0,4}$"
"""A port number as the scripts accept it: 1 to 5 digits, no leading 0. bash reads a number with a leading 0 in
(( )) and $(( )) as octal (020300 is 8384; 08000 is an error) and wraps values past 2^63 (bash manual, 6.5 Shell
Arithmetic), so the checks after this one would judge another port than the launcher binds."""


def stop(test: str, message: str, prelude: str = "") -> str:
    """Shell lines that end the script with `message` on stderr and status 2 unless the shell `test` holds;
    `prelude` (lines) runs first where the message needs values computed (port_advice). The message goes to echo
    as several quoted words (echo joins them with spaces), so that the 80-column fitting can break the line
    between them (shell_lines.fit_shell)."""
    chunks: list[str] = []
    for word in message.split(" "):
        if chunks and len(chunks[-1]) + len(word) < 56:
            chunks[-1] += " " + word
        else:
            chunks.append(word)
    words = " ".join(f'"{c}"' for c in chunks)
    body = "".join(f"    {line}\n" for line in prelude.splitlines())
    return f"if ! {test}; then\n{body}    echo {words} >&2\n    exit 2\nfi\n"


def port_check(var: str) -> str:
    """The lines that stop the script when the port variable `var` is not a port number (PORT_RE)."""
    return stop(f'[[ "${var}" =~ {PORT_RE} ]]',
                f"{var}=${var} is not a port number (1 to 5 digits, no leading 0)")


def port_var(var: str, default: int, test: str, message: str, prelude: str = "") -> tuple[str, str]:
    """The line that sets the port variable `var` (the user's value, else `default`) and the lines that check
    it: a port number (port_check), then the shell arithmetic `test`, else stop with `message` (stop, after
    `prelude`)."""
    return f"{var}=${{{var}:-{default}}}\n", port_check(var) + stop(f"(( {test} ))", message, prelude)


def joined(parts: list[tuple[str, str]]) -> tuple[str, str]:
    """The port_var parts as one block of variable lines and one of checks, each in the parts' order."""
    return "".join(line for line, _ in parts), "".join(check for _, check in parts)


def port_word(var: str, offset: int) -> str:
    """A shell word for the port `offset` above the port variable `var`."""
    return f'"${var}"' if offset == 0 else f'"$(({var}+{offset}))"'


def port_advice(width: int, lo: str, hi: str) -> str:
    """Shell lines setting FIX to where `width` ports starting at a port variable fit around the span lo .. hi
    (shell arithmetic over PORT) within 1024 .. 65535: below it, above it, or both, only the sides that exist."""
    return (f'FIX=""\n(( {lo} - {width} >= 1024 )) && FIX="from 1024 to $(({lo} - {width}))"\n'
            f'(( {hi} + {width} <= 65535 )) && FIX="${{FIX:+$FIX or }}from $(({hi} + 1)) to $((65535 - {width - 1}))"\n'
            f'[[ -n "$FIX" ]] || FIX="after changing PORT (no room around {lo} to {hi})"\n')


def count_check(n: int, message: str) -> str:
    """The lines that stop the script unless the array ADDR holds n addresses; `message` (after "NODE_ADDRS names
    K address(es); ") says which to give. The count is the user's, so its noun is chosen at run time (1 address,
    2 addresses)."""
    return stop(f"(( ${{#ADDR[@]}} == {n} ))", "NODE_ADDRS names ${#ADDR[@]} $W; " + message,
                'W=address; (( ${#ADDR[@]} == 1 )) || W=addresses')


def visible_lines(per_node: int) -> str:
    """The lines that read a node's GPUs into VIS: the caller's CUDA_VISIBLE_DEVICES (a Slurm allocation or a
    shared node's share) or else 0 .. per_node - 1, and the function `gpus FIRST COUNT` that prints a slice of it
    comma-separated (visible_slice): each server's CUDA_VISIBLE_DEVICES counts within the caller's list, as
    SGLang's --base-gpu-id does."""
    default = ",".join(str(g) for g in range(per_node))
    return (f"# the node's GPUs: the caller's CUDA_VISIBLE_DEVICES (e.g. a Slurm allocation), else 0 to "
            f"{per_node - 1}; each server takes its slice of this list\n"
            f"GPUS=${{CUDA_VISIBLE_DEVICES:-{default}}}\nset -f\nVIS=(${{GPUS//,/ }})\nset +f\n"
            + stop(f"(( ${{#VIS[@]}} >= {per_node} ))",
                   f"CUDA_VISIBLE_DEVICES=$GPUS names ${{#VIS[@]}} GPUs; the plan places {per_node} on each node")
            + 'gpus() { local IFS=,; echo "${VIS[*]:$1:$2}"; }\n')


def visible_slice(first: int, count: int) -> str:
    """The shell word of GPUs first .. first + count - 1 of VIS (visible_lines), comma-separated."""
    return f'"$(gpus {first} {count})"'
