"""How runs compute on the CPU (the intra-op thread count and the kernels), and the rule that keeps runs
made otherwise apart.

torch splits a CPU reduction (a convolution, a matmul, a sum) among its intra-op threads, and the
order in which the partial sums are added depends on how many there are: the same seed on the same
machine gives other weights under 1 thread than under 2, and every later stage inherits the
difference (the deployed model, the trunk features, the joint references, every score against them).
The default count is the machine's core count (or ``OMP_NUM_THREADS``), so left alone two people
running the same command would get two leaderboards.

So a run on the CPU trains and evaluates with ``CPU_THREADS`` intra-op threads whatever the machine
offers (``harness.run.threads`` sets it), the count is recorded on every result
(``options.torch_threads``), the caches a run reuses carry it in their keys, and stored CPU runs made
with another count are set apart here (never a reference, never ranked). One thread because, on the
small models the CPU protocols use, a second thread bought little and cost much on a shared machine:
a reduced tiny_cil pre-training took 11-15 s on one thread and 108 s on two, the machine's two cores
shared with other jobs. On the CPU, parallelism comes from running several runs at once (``bench sweep``).

On CUDA the numbers come from the GPU, so the CPU's thread count is left as it is (recorded all the same).

The kernels follow the same rule. ``CPU_KERNELS`` names the kernel set a CPU run's network and optimizer
compute with: the 1x1 convolutions as one matrix product, depthwise convolutions on the smallest maps as
a tap table and timm's 'same' convolutions cropped to the taps that touch real input
(``harness.model.fastconv``), and AdamW fused (``harness.model.fastoptim``). It is recorded on every CPU
result (``options.cpu_kernels``) and in the cache keys of the deployed model and the trunk features. A CPU run that records another
set (``pointwise-gemm``: the matrix products alone), or none (made before, with oneDNN's convolution for
those layers), differs in the last bits: it is set apart as a run made with another thread count is.
"""

from __future__ import annotations

from typing import Any

CPU_THREADS = 1
CPU_KERNELS = "gemm1x1+dw-small+adamw-fused"


def cpu_problem(options: dict[str, Any]) -> str | None:
    """Why a stored run is not comparable with a run made now, as far as the CPU's arithmetic goes: it
    ran on the CPU with another intra-op thread count, or with other kernels. Runs that did not record
    the thread count are kept (bench recorded it before it fixed it, so such a run's count is unknown,
    not known to differ); a CPU run without a kernel set was made with the kernels bench used before."""
    device, threads = str(options.get("device", "")), options.get("torch_threads")
    if not device.startswith("cpu"):
        return None
    if threads is not None and threads != CPU_THREADS:
        return (f"made on the CPU with {threads} intra-op threads (runs now compute with {CPU_THREADS}, "
                f"and the thread count changes float results)")
    kernels = options.get("cpu_kernels")
    if kernels != CPU_KERNELS:
        made = f"with CPU kernels {kernels!r}" if kernels else "with oneDNN's convolution for the body's 1x1 layers"
        return (f"made on the CPU {made} (runs now compute with {CPU_KERNELS!r}, whose float results differ "
                f"in the last bits)")
    return None
