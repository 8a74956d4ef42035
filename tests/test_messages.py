"""Messages that say what is wrong, before anything is created: a corrupt result names its field, stored
metrics that cannot be true are refused, ``joint`` with a variant is refused at the method check, and
every echoed value is cut to one paragraph."""

from __future__ import annotations

import json
from functools import partial
from pathlib import Path

import pytest

from support import invoke as bench, refused

FIXTURES = Path(__file__).parent / "browser" / "fixtures"
HUGE = "9" * 5000

one_paragraph = partial(refused, chars=1500)


def stored(tmp_path: Path, change) -> Path:
    source = next(p for p in sorted(FIXTURES.glob("*.json")) if not p.name.startswith("joint"))
    data = json.loads(source.read_text())
    change(data)
    path = tmp_path / source.name
    path.write_text(json.dumps(data))
    return path


def test_a_corrupt_result_names_its_field(tmp_path):
    path = stored(tmp_path, lambda d: d.update(seed="zero"))
    one_paragraph(bench("validate", str(path)), "seed:", "'zero'", str(path))
    path = stored(tmp_path, lambda d: d.pop("method"))
    one_paragraph(bench("validate", str(path)), "method: Field required")


@pytest.mark.parametrize("key,value", [("S_delta", float("nan")), ("alpha", float("-inf")), ("min_acc", 1.5),
                                       ("CK_delta", 2.0)])
def test_stored_metrics_that_cannot_be_true_are_refused(tmp_path, key, value):
    path = stored(tmp_path, lambda d: d["metrics"].update({key: value}))
    one_paragraph(bench("validate", str(path)), f"metrics.{key}", "never mirrors it")


def test_stored_metrics_are_checked_against_their_recomputation(tmp_path):
    """A finite but edited number (CK_delta -1e300) is caught where the references lie beside the file."""
    from bench_stability_gap.harness.results import metrics as M
    from bench_stability_gap.harness.results.schema import save_result
    from results_factory import joint_run, two_session_run

    root = tmp_path / "results"
    joint, run = joint_run(), two_session_run()
    run.metrics = M.compute_metrics(run.curves, joint.reference, {2: 0.7, 3: 0.9})
    save_result(root, joint)
    target = save_result(root, run)
    assert bench("validate", str(target)).exit_code == 0, bench("validate", str(target)).output
    data = json.loads(target.read_text())
    data["metrics"]["CK_delta"] = -1e300
    target.write_text(json.dumps(data))
    one_paragraph(bench("validate", str(target)), "metrics.CK_delta is stored as -1e+300", "curves and references give")


def test_a_result_of_a_later_schema_is_refused(tmp_path):
    path = stored(tmp_path, lambda d: d.update(schema_version=999))
    one_paragraph(bench("validate", str(path)), "schema_version", "999")


def test_joint_with_a_variant_is_refused_before_anything_is_created(tmp_path):
    results = tmp_path / "r"
    out = bench("run", "-p", "tiny_cil", "-m", "joint+sgm", "--results-dir", str(results))  # MLflow on
    one_paragraph(out, "Method 'joint+sgm'", "takes no modifiers")
    assert not results.exists()
    out = bench("check-method", "joint")
    assert out.exit_code == 2 and "Did you mean: joint" not in out.output and "reference" in out.output, out.output


def test_usage_errors_cut_the_value_they_echo(tmp_path):
    out = bench("run", "-p", "tiny_cil", "-m", "vanilla", "--seed", HUGE, "--results-dir", str(tmp_path / "r"))
    one_paragraph(out, "--seed", "characters]")
    out = bench("run", "-p", "tiny_cil", "-m", f"van illa {'x' * 5000}", "--results-dir", str(tmp_path / "r"))
    one_paragraph(out, "whitespace")
    assert not (tmp_path / "r").exists()


def test_a_tuned_run_on_a_protocol_file_suggests_a_tune_that_resolves_it(tmp_path):
    import shlex

    import yaml
    from support import reduced_tiny

    protocol = tmp_path / "my protocol.yaml"
    protocol.write_text(yaml.safe_dump({**reduced_tiny(), "name": "mine", "validation": {"per_class": 5},
                                        "tuning": {"trials": 2, "objective": "CK_delta"}}))
    results = tmp_path / "r"
    out = bench("run", "-p", str(protocol), "-m", "vanilla", "--tuned", "--results-dir", str(results), "--no-mlflow")
    one_paragraph(out, "No tuned settings for vanilla on mine")
    command = out.output.split("`")[1]
    assert shlex.split(command)[:4] == ["bench", "tune", str(protocol), "vanilla"], command
    assert str(results) in command


def test_sigterm_of_a_dry_run_does_not_speak_of_resuming(tmp_path):
    import signal
    import subprocess
    import sys

    code = ("import signal, sys\n"  # the dry run pauses while planning, as a long one does
            "from bench_stability_gap.harness.sweep import plan\n"
            "def paused(*a, **k):\n"
            "    print('PLANNING', flush=True); signal.pause()\n"
            "plan.plan = paused\n"
            "from bench_stability_gap.harness.cli import main\n"
            "sys.exit(main(sys.argv[1:]))\n")
    proc = subprocess.Popen([sys.executable, "-c", code, "sweep", "table1_tiny_cil", "--dry-run", "--results-dir",
                             str(tmp_path / "r")], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "PLANNING", proc.stderr.read()
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 143, err
    assert "nothing to resume" in err and "resume from its last checkpoint" not in err, err


def test_a_web_server_that_is_not_mlflow_is_named_without_its_page(tmp_path):
    import threading
    from functools import partial
    from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer

    (tmp_path / "index.html").write_text("<html><body><h1>Some other site</h1></body></html>")
    handler = partial(SimpleHTTPRequestHandler, directory=str(tmp_path))
    handler.log_message = lambda *a: None
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    uri = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        for args in (["leaderboard", "table", "--tracking-uri", uri],
                     ["leaderboard", "build", "--tracking-uri", uri, "--out", str(tmp_path / "site")]):
            out = bench(*args)
            one_paragraph(out, uri, "not MLflow")
            assert "<" not in out.output, out.output
    finally:
        server.shutdown()
    assert not (tmp_path / "site").exists()
