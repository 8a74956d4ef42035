"""Helpers shared by the test modules (fixtures live in conftest.py): the reduced protocols, a CLI caller,
and a plugin's fake installation. One place each, so two modules never test against two copies."""

from __future__ import annotations

import tomllib
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import yaml

from bench_stability_gap.harness.tools.check_method import reduced_spec


def reduced_tiny(name: str = "tiny_cil", **training: Any) -> dict:
    """tiny_cil's structure on a budget a unit test can afford (the one ``bench check-method`` uses)."""
    return reduced_spec(name, **training)


def fake_training(updates: Any) -> SimpleNamespace:
    """What a method reads of a protocol's ``training`` section, for unit tests that fake the protocol."""
    online = updates == "per_sample"
    return SimpleNamespace(updates=updates, budget=None, online=online,
                           session_updates=lambda n: n if online else updates)


def invoke(*args: str, env: dict[str, str] | None = None) -> Any:
    """``bench ARGS`` in this process (click's runner); an exception propagates, so a crash shows its traceback."""
    from click.testing import CliRunner

    from bench_stability_gap.harness.cli import main

    return CliRunner().invoke(main, list(args), env=env, catch_exceptions=False)


def small_protocol(tmp_path: Path) -> Path:
    """A two-session protocol of 3 updates each, written to ``tmp_path``: whole runs (joint included) in
    seconds, for tests of what a plugin run does."""
    spec = reduced_tiny()
    spec["name"] = "plugin_reduced"
    spec["sessions"] = 2
    spec["pretrain"].update(updates=4)
    spec["training"].update(updates=3)
    spec["eval"] = {"every": 3, "batch_size": 256}
    spec["joint"].update(updates=3)
    for src in (spec["pretrain_data"], *spec["stream_data"]):
        src["test_per_class"] = 4
    path = tmp_path / "plugin_reduced.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def refused(out: Any, *needles: str, lines: int | None = None, chars: int | None = None) -> None:
    """A refusal as users must get it: exit code 2, no traceback, every needle in the message; at most
    ``lines`` lines and fewer than ``chars`` characters where a test bounds them (echoed values are cut)."""
    assert out.exit_code == 2, out.output
    assert "Traceback" not in out.output, out.output
    if lines is not None:
        assert len(out.output.strip().splitlines()) <= lines, out.output
    if chars is not None:
        assert len(out.output) < chars, (len(out.output), out.output)
    for needle in needles:
        assert needle in out.output, (needle, out.output)


def write_dist(site: Path, name: str, version: str, entry_points: dict[str, dict[str, str]]) -> Path:
    """A minimal installed distribution: what importlib.metadata reads to find entry points."""
    info = site / f"{name.replace('-', '_')}-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    lines: list[str] = []
    for group, eps in entry_points.items():
        lines += [f"[{group}]", *(f"{k} = {v}" for k, v in eps.items()), ""]
    (info / "entry_points.txt").write_text("\n".join(lines))
    return info


def install_folder(site: Path, folder: Path, monkeypatch: Any) -> dict:
    """A plugin project folder 'installed' into ``site`` (the ``site`` fixture): its code importable, its
    dist-info from its pyproject."""
    from bench_stability_gap.methods.registry import entries

    project = tomllib.loads((folder / "pyproject.toml").read_text())["project"]
    monkeypatch.syspath_prepend(str(folder))
    write_dist(site, project["name"], project["version"], project["entry-points"])
    entries.cache_clear()
    return project


def stop_at(monkeypatch: Any, phase: str, nth: int, raising: type[BaseException]) -> None:
    """Raise ``raising`` before the ``nth`` update of ``phase`` this process runs (after the checkpoint due
    there), where ``BENCH_KILL_AT`` would kill it: a stop at a known point without a second process."""
    from bench_stability_gap.harness.run import loop

    done = {"n": 0}

    def stop(at: str) -> None:
        if at == phase:
            done["n"] += 1
            if done["n"] == nth:
                raise raising()

    monkeypatch.setattr(loop, "maybe_die", stop)
