"""Unit constants. Code works in bytes, seconds and FLOP; conversions happen once, at the spec boundary."""

KIB = 1024
MIB = 1024**2
GIB = 1024**3
GB = 1e9  # decimal gigabyte, as vendors print bandwidths
TERA = 1e12

# Bytes per element of each numeric format llmplan knows.
DTYPE_BYTES: dict[str, float] = {
    "fp32": 4.0,
    "tf32": 4.0,
    "bf16": 2.0,
    "fp16": 2.0,
    "fp8": 1.0,
    "int8": 1.0,
    "int4": 0.5,
}
