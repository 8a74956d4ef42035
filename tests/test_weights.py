"""Weights by content: a file replaced at the same path rebuilds every cache keyed on it; no hub
access without --allow-download, failing fast (no retries) when the weights are not cached."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import yaml

from bench_stability_gap.harness.model.backbone import create_network, weights_digest
from bench_stability_gap.harness.errors import BenchError
from bench_stability_gap.harness.spec.protocol import Backbone, Protocol, load_protocol
from bench_stability_gap.harness.run.pipeline import joint_reference
from bench_stability_gap.harness.run.workbench import prepare
from bench_stability_gap.harness.run.options import RunOptions
from support import reduced_tiny


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # closed again once the socket is: connecting is refused


@pytest.fixture()
def weights_file(tmp_path) -> Path:
    spec = load_protocol("tiny_cil").backbone
    path = tmp_path / "w.pth"
    torch.save(create_network(spec).state_dict(), path)
    return path


def _protocol(path: Path) -> Protocol:
    spec = reduced_tiny()
    spec["name"] = "weights_by_content"
    spec["sessions"] = 2
    spec["backbone"]["weights"] = f"file:{path}"
    return Protocol.model_validate(spec)


def test_replacing_a_weights_file_at_the_same_path_rebuilds_the_caches(weights_file, tmp_path, monkeypatch):
    # a cache of its own: the session's is shared with other workers, whose trunk caches come and go meanwhile
    bench_cache = tmp_path / "cache"
    monkeypatch.setenv("BENCH_CACHE_DIR", str(bench_cache))
    protocol = _protocol(weights_file)
    opts = RunOptions(results_dir=tmp_path / "results", progress=False, log=False)
    first = prepare(protocol, 0, opts)
    ref, _ = joint_reference(protocol, 0, opts, first)
    assert ref.options["weights"] == first.weights == weights_digest(protocol.backbone)
    assert first.weights.startswith("sha256:") and ref.options["data_path"]["test"]["mode"].startswith("trunk")
    assert joint_reference(protocol, 0, opts, first)[0].run_id == ref.run_id  # same weights: reused

    def trunk_caches() -> set[str]:
        return {p.name for p in (bench_cache / "trunk").iterdir() if p.name.endswith(".v2")}

    before = trunk_caches()
    state = torch.load(weights_file, weights_only=True)
    torch.save({k: v * 1.5 if v.is_floating_point() else v for k, v in state.items()}, weights_file)
    second = prepare(protocol, 0, opts)
    assert second.weights != first.weights and second.weights == weights_digest(protocol.backbone)
    assert len(trunk_caches() - before) == 2  # eval and train features recomputed for the new file
    ids = first.test_inputs.row_of >= 0
    x_old = first.test_inputs.get(ids.nonzero()[0][:8])
    x_new = second.test_inputs.get(ids.nonzero()[0][:8])
    assert not torch.allclose(x_old, x_new)  # new trunk features, not the old file's
    deployed = sorted((bench_cache / "deployed").glob("weights_by_content-*.pt"))
    assert len(deployed) == 2  # the deployed model was retrained for the new file
    again, _ = joint_reference(protocol, 0, opts, second)
    assert again.run_id != ref.run_id and again.options["weights"] == second.weights


def test_no_hub_access_without_allow_download_fails_fast(tmp_path, monkeypatch):
    """In-process, huggingface_hub is already imported (its env flag read): the module flag holds."""
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{_closed_port()}")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    import huggingface_hub.constants as hub

    monkeypatch.setattr(hub, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(hub, "HF_HUB_CACHE", str(tmp_path / "hf" / "hub"))
    connects = []
    real = socket.socket.connect
    monkeypatch.setattr(socket.socket, "connect", lambda self, addr: (connects.append(addr), real(self, addr))[1])
    spec = Backbone.model_validate({**load_protocol("tiny_cil").backbone.model_dump(),
                                    "weights": "timm:efficientnet_lite0.ra_in1k"})
    t0 = time.perf_counter()
    with pytest.raises(BenchError, match="--allow-download"):
        create_network(spec, allow_download=False)
    assert time.perf_counter() - t0 < 10 and connects == []
    assert hub.HF_HUB_OFFLINE is False  # restored: the guard is scoped to the load
    assert weights_digest(spec) == "unresolved:timm:efficientnet_lite0.ra_in1k"


def test_cli_sets_the_offline_flag_before_the_hub_is_imported(tmp_path):
    """A fresh process: `bench run` on a protocol with uncached hub weights exits 2 within seconds,
    the hub pointed at a closed port (a download attempt would spend ~60 s in retries)."""
    spec = reduced_tiny()
    spec["backbone"]["weights"] = "timm:efficientnet_lite0.ra_in1k"
    path = tmp_path / "hub.yaml"
    path.write_text(yaml.safe_dump(spec))
    env = {**os.environ, "HF_ENDPOINT": f"http://127.0.0.1:{_closed_port()}", "HF_HOME": str(tmp_path / "hf"),
           "BENCH_CACHE_DIR": str(tmp_path / "cache")}
    env.pop("HF_HUB_OFFLINE", None)
    bench = Path(sys.executable).with_name("bench")
    t0 = time.perf_counter()
    out = subprocess.run([str(bench), "run", "-p", str(path), "--no-mlflow", "--no-progress",
                          "--results-dir", str(tmp_path / "r")], env=env, capture_output=True, text=True, timeout=120)
    took = time.perf_counter() - t0
    assert out.returncode == 2 and "--allow-download" in out.stderr and "Traceback" not in out.stderr
    assert "device: cpu (auto:" in out.stderr
    assert took < 45, f"{took:.0f} s: the hub was retried"


@pytest.mark.parametrize("flag, offline", [((), "True"), (("--allow-download",), "False")])
def test_cli_module_sets_hf_hub_offline_before_any_hub_import(flag, offline):
    code = ("import sys; sys.argv = ['bench', 'run', *sys.argv[1:]]; import bench_stability_gap.harness.cli; "
            "import huggingface_hub.constants as c; print(c.HF_HUB_OFFLINE)")
    env = {k: v for k, v in os.environ.items() if k not in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")}
    out = subprocess.run([sys.executable, "-c", code, *flag], env=env, capture_output=True, text=True, timeout=120)
    assert out.stdout.strip().splitlines()[-1] == offline
