"""Benchmark behind ``model.cpu.CPU_FORWARD_CHUNK`` (the fewest rows ``cpu_forward_chunk`` gives, which wide
models such as ConvNeXt at 224 px get): per-image time of ConvNeXtV2-femto's frozen trunk and
of its body+head on the CPU, forwarded as one batch of 128 vs in chunks, interleaved in one process (the
ratio is what to compare on a shared machine). Usage: python ci/cpu_chunk_speed.py [repeats]"""

import statistics
import sys
import time

import timm
import torch

from bench_stability_gap.harness.model.cpu import CPU_FORWARD_CHUNK

m = timm.create_model("convnextv2_femto", pretrained=False).eval()
parts = {
    "trunk": (lambda x: m.stages[2].downsample(m.stages[1](m.stages[0](m.stem(x)))), (3, 224, 224)),
    "body+head": (lambda x: m.head(m.norm_pre(m.stages[3](m.stages[2].blocks(x)))), (192, 14, 14)),
}
repeats = int(sys.argv[1]) if len(sys.argv) > 1 else 3
with torch.no_grad():
    for name, (fn, shape) in parts.items():
        x = torch.randn(128, *shape)
        times = {128: [], CPU_FORWARD_CHUNK: []}
        for _ in range(repeats):
            for size in times:
                t0 = time.perf_counter()
                for part in x.split(size):
                    fn(part)
                times[size].append((time.perf_counter() - t0) / len(x))
        whole, chunked = statistics.median(times[128]), statistics.median(times[CPU_FORWARD_CHUNK])
        print(f"{name:<10} batch 128: {whole * 1e3:6.2f} ms/image, chunks of {CPU_FORWARD_CHUNK}: "
              f"{chunked * 1e3:6.2f} ms/image, ratio {whole / chunked:.2f}x (threads {torch.get_num_threads()})")
