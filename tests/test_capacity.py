"""The capacity a plan must fit in is CUDA's total global memory (docs/formulas.md#mem.capacity)."""
import pytest

from llmplan.specs.registry import builtin_gpus
from llmplan.units import GIB

# deviceQuery's "Total amount of global memory" in public logs (bytes):
# A100-SXM4-40GB: bottlerocket-os/bottlerocket PR 3873; A100-SXM4-80GB and H100 80GB HBM3: deviceQuery
# outputs quoted in public repositories (CUDA 12.2 and 12.4 drivers). Tolerance 0.01 GiB (drivers move it by
# a few tens of MiB).
DEVICE_QUERY_BYTES = {"a100-40gb": 42_298_834_944, "a100-80gb": 84_987_740_160, "h100-sxm": 85_045_477_376}


@pytest.mark.parametrize("name,total", sorted(DEVICE_QUERY_BYTES.items()))
def test_capacity_is_cudas_total_global_memory(name, total):
    assert builtin_gpus()[name].hbm_bytes == pytest.approx(total, abs=0.01 * GIB)


def test_nvidia_smi_total_is_not_the_capacity():
    # nvidia-smi reports 81,559 MiB on H100 80GB HBM3: 453 MiB the driver keeps for itself.
    assert builtin_gpus()["h100-sxm"].hbm_bytes < 81_559 * 2**20 - 400 * 2**20
