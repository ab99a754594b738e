"""Unit constants. Code works in bytes, seconds and FLOP; conversions happen once, at the spec boundary."""

KIB = 1024
MIB = 1024**2
GIB = 1024**3
GB = 1e9  # decimal gigabyte, as vendors print bandwidths
TERA = 1e12
DAY = 86_400.0  # seconds

MXFP8_BYTES = 1.0 + 1 / 32
"""Bytes per element of an MXFP8 tensor: one fp8 byte and an E8M0 scale per 32 (OCP Microscaling spec v1.0)."""
NVFP4_BYTES = 0.5 + 1 / 16
"""Bytes per element of an NVFP4 tensor: a 4-bit E2M1 value and an E4M3 scale per 16 (the FP32 per-tensor scale
is one number) (NVIDIA, "Introducing NVFP4 for Efficient and Accurate Low-Precision Inference", 2025)."""

MAX_SIZE = 1e18  # bytes or tokens: a quintillion is past any buffer, batch or training budget
_SIZE_UNITS = {"": 1, "b": 1, "k": 1e3, "kb": 1e3, "kib": KIB, "m": 1e6, "mb": 1e6, "mib": MIB, "g": 1e9,
               "gb": 1e9, "gib": GIB, "t": 1e12, "tb": 1e12, "tib": 1024**4}


def parse_size(text: str, option: str = "size") -> float:
    """'1GiB' -> 1073741824, '256MB' -> 2.56e8, '4e9' -> 4e9. Raises LlmplanError naming `option` (the flag that
    gave it) on anything else."""
    import re

    from llmplan.errors import LlmplanError

    match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([a-zA-Z]*)\s*", text)
    unit = match.group(2).lower() if match else None
    if not match or unit not in _SIZE_UNITS or float(match.group(1)) <= 0:
        raise LlmplanError(f"{option} '{text[:40]}' is not a positive size; write e.g. 1GiB, 256MiB, 64KB or 4e9 "
                           "(bytes)")
    value = float(match.group(1)) * _SIZE_UNITS[unit]
    if not value < MAX_SIZE:
        raise LlmplanError(f"{option} '{text[:40]}' is beyond anything llmplan plans for (below {MAX_SIZE:.0e} "
                           "bytes); give a smaller size, e.g. 1TiB")
    return value


_COUNT_UNITS = {"": 1, "k": 1e3, "m": 1e6, "b": 1e9, "g": 1e9, "t": 1e12}


def parse_count(text: str, option: str) -> float:
    """A token count: '4M' -> 4e6, '1T' -> 1e12, '4194304', '4e6' (decimal k, M, B or G, T). Byte units are
    refused: a count of tokens has none. Raises LlmplanError naming `option` on anything else."""
    import re

    from llmplan.errors import LlmplanError

    match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([a-zA-Z]*)\s*", text)
    unit = match.group(2).lower() if match else None
    if not match or unit not in _COUNT_UNITS or float(match.group(1)) <= 0:
        raise LlmplanError(f"{option} '{text[:40]}' is not a token count; write a number of tokens, e.g. 4M, "
                           "4194304 or 4e6 (suffixes k, M, B, T: thousands to trillions)")
    value = float(match.group(1)) * _COUNT_UNITS[unit]
    if not value < MAX_SIZE:
        raise LlmplanError(f"{option} '{text[:40]}' is beyond anything llmplan plans for (below {MAX_SIZE:.0e} "
                           "tokens); give a smaller count")
    return value
