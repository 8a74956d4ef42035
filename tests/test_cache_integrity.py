"""Verified caches: a deployed model or trunk-feature shard that fails its hash is named, moved aside and
rebuilt (never loaded), concurrent builders of one cache entry build it once, and the cache's size is
counted while other runs write it."""

from __future__ import annotations

import shutil
import threading
from pathlib import Path

import torch

from bench_stability_gap.harness.data import features as FS
from bench_stability_gap.harness.paths import bytes_under
from bench_stability_gap.harness.run.continual import run_cl
from bench_stability_gap.harness.spec.protocol import load_protocol
from bench_stability_gap.methods.registry import build_method
from bench_stability_gap.harness.run.workbench import prepare
from bench_stability_gap.harness.run.options import RunOptions


def test_a_corrupt_deployed_model_or_feature_shard_is_moved_aside_and_rebuilt(tiny_protocol_file, tmp_path,
                                                                             monkeypatch, capsys):
    monkeypatch.setenv("BENCH_CACHE_DIR", str(tmp_path / "cache"))
    protocol = load_protocol(str(tiny_protocol_file))
    options = RunOptions(results_dir=tmp_path / "r", progress=False)
    first = prepare(protocol, 0, options)
    _, method = build_method("finetune", protocol.name)
    before, _, _ = run_cl(first, method, 0, options)

    (deployed,) = (tmp_path / "cache" / "deployed").glob("*.pt")
    deployed.write_bytes(deployed.read_bytes()[:-100])  # truncated: still a file, no longer the model
    shards = sorted((tmp_path / "cache" / "trunk").rglob("shard_00000.bin"))
    assert shards, "the reduced protocol keeps its trunk features in shard folders"
    data = bytearray(shards[0].read_bytes())
    data[len(data) // 2] ^= 0xFF  # one flipped byte in the middle of a feature row
    shards[0].write_bytes(bytes(data))
    capsys.readouterr()

    second = prepare(protocol, 0, options)
    said = capsys.readouterr()
    text = said.out + said.err
    assert f"Deployed-model cache {deployed} failed verification" in text
    assert f"Trunk feature cache {shards[0].parent} failed verification" in text and "sha256" in text
    assert list(deployed.parent.glob(deployed.name + ".corrupt-*"))
    assert list(shards[0].parent.parent.glob(shards[0].parent.name + ".corrupt-*"))
    _, method = build_method("finetune", protocol.name)
    after, _, _ = run_cl(second, method, 0, options)
    assert [c.model_dump() for c in after] == [c.model_dump() for c in before]  # rebuilt to the same numbers


def test_concurrent_builders_of_one_feature_cache_build_it_once(tmp_path):
    folder, passes = tmp_path / "key-abc.v2", []

    def batches():
        passes.append(threading.get_ident())
        return (torch.full((4, 3), float(i)) for i in range(5))

    opened: list[FS.FeatureShards] = []
    threads = [threading.Thread(target=lambda: opened.append(FS.open_verified(folder, 20, batches, print)))
               for _ in range(3)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(timeout=60)
    assert len(passes) == 1 and len(opened) == 3
    assert all(torch.equal(s.read([0, 19]), opened[0].read([0, 19])) for s in opened)
    assert FS.problem(folder) is None


def test_a_feature_folder_made_for_another_key_is_not_trusted(tmp_path):
    FS.write_shards(tmp_path / "a.v2", 6, [torch.zeros(6, 2)])
    (tmp_path / "a.v2").rename(tmp_path / "b.v2")
    assert "made for cache key 'a.v2'" in FS.problem(Path(tmp_path / "b.v2"))


def test_a_deployed_model_made_in_another_precision_is_not_loaded(tiny_protocol_file, tmp_path, monkeypatch, capsys):
    """The deployed model's sidecar records its precision; a file made in another one (or, before the
    precision was recorded, on CUDA, where bench trained in bf16) is set aside and rebuilt, never loaded."""
    import json

    monkeypatch.setenv("BENCH_CACHE_DIR", str(tmp_path / "cache"))
    protocol = load_protocol(str(tiny_protocol_file))
    options = RunOptions(results_dir=tmp_path / "r", progress=False)
    prepare(protocol, 0, options)
    (sidecar,) = (tmp_path / "cache" / "deployed").glob("*.pt.json")
    meta = json.loads(sidecar.read_text())
    assert meta["precision"] == "fp32"
    sidecar.write_text(json.dumps({**meta, "precision": "bf16"}))
    capsys.readouterr()
    prepare(protocol, 0, options)
    said = capsys.readouterr()
    assert "failed verification" in said.out + said.err and "precision" in said.out + said.err
    assert json.loads(sidecar.read_text())["precision"] == "fp32"  # rebuilt in this run's precision


def test_the_caches_size_is_counted_while_another_run_renames_its_temporaries(tmp_path):
    """The size the end of a run reports is counted while other runs sharing the cache write it: a run
    writes a feature folder as a ``.tmp`` folder and renames it into place, so an entry listed a moment ago
    may be gone when it is read. It is left out, never an error: the run's result is stored by then, and a
    traceback at its last line would read as a failed run."""
    still = tmp_path / "still"
    (still / "trunk").mkdir(parents=True)
    (still / "trunk" / "shard-0.pt").write_bytes(b"x" * 7)
    (still / "a.bin").write_bytes(b"x" * 3)
    (still / "link.bin").symlink_to(still / "a.bin")  # a link counts what it points to
    (still / "dangling.bin").symlink_to(still / "nowhere")  # a link to nothing counts nothing
    assert bytes_under(still) == 7 + 3 + 3

    root = tmp_path / "shared"
    for i in range(20):  # 20 settled entries of 10 bytes
        (root / "trunk" / f"key{i}.v2").mkdir(parents=True)
        (root / "trunk" / f"key{i}.v2" / "shard-0.pt").write_bytes(b"x" * 10)
    done = threading.Event()

    def another_run() -> None:  # writes 3 shards of 5 bytes into a temporary folder, then moves it away
        i = 0
        while not done.is_set():
            tmp = root / "trunk" / f"new.v2.tmp{i}"
            tmp.mkdir()
            for j in range(3):
                (tmp / f"shard-{j}.pt").write_bytes(b"y" * 5)
            shutil.move(tmp, tmp_path / f"gone{i}")
            i += 1

    writer = threading.Thread(target=another_run)
    writer.start()
    try:
        counts = [bytes_under(root) for _ in range(300)]
    finally:
        done.set()
        writer.join(timeout=60)
    assert all(200 <= c <= 200 + 15 for c in counts), sorted(set(counts))
