"""How fast this machine is right now, as the seconds a fixed piece of work takes.

The suite's wall time on a shared 2-core machine moves by more than 2x with the host's load, with the same code
and the same clone. A time taken beside this probe's reads as a ratio (suite seconds / probe seconds), which
two runs on different machines or hours can compare. The work is the suite's kind in miniature: a fresh
interpreter importing torch, torchvision and timm (each `bench` process a test starts pays it), Python-level
work, and a small convolutional network's training steps on one thread.

    python ci/speed_probe.py           # prints e.g. "speed probe: 9.8 s (imports 5.1 s, python 1.6 s, torch 3.1 s)"
"""

from __future__ import annotations

import subprocess
import sys
import time


def _imports() -> float:
    start = time.perf_counter()
    subprocess.run([sys.executable, "-c", "import torch, torchvision, timm"], check=True)
    return time.perf_counter() - start


def _python() -> float:
    start = time.perf_counter()
    table: dict[int, int] = {}
    for i in range(3_000_000):
        table[i % 1024] = table.get(i % 1024, 0) + i
    return time.perf_counter() - start


def _torch() -> float:
    import torch

    torch.set_num_threads(1)
    torch.manual_seed(0)
    net = torch.nn.Sequential(
        torch.nn.Conv2d(3, 16, 3, padding=1), torch.nn.BatchNorm2d(16), torch.nn.ReLU(),
        torch.nn.Conv2d(16, 32, 3, stride=2, padding=1), torch.nn.BatchNorm2d(32), torch.nn.ReLU(),
        torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(32, 10))
    opt = torch.optim.SGD(net.parameters(), lr=0.01, momentum=0.9)
    x, y = torch.randn(16, 3, 32, 32), torch.randint(0, 10, (16,))
    start = time.perf_counter()
    for _ in range(150):
        opt.zero_grad()
        torch.nn.functional.cross_entropy(net(x), y).backward()
        opt.step()
    return time.perf_counter() - start


def main() -> None:
    parts = {"imports": _imports(), "python": _python(), "torch": _torch()}
    detail = ", ".join(f"{name} {seconds:.1f} s" for name, seconds in parts.items())
    print(f"speed probe: {sum(parts.values()):.1f} s ({detail})")


if __name__ == "__main__":
    main()
