"""Every metric the leaderboard shows: symbol, direction, equation (trusted HTML written here), meaning."""

from __future__ import annotations

from dataclasses import dataclass

from markupsafe import Markup


@dataclass(frozen=True)
class Term:
    key: str
    symbol: Markup
    name: str
    direction: str  # "↓", "↑" or "" (a reference, not a score)
    equation: Markup
    meaning: str


def _m(html: str) -> Markup:
    return Markup(html)  # noqa: S704 - constant HTML written in this file, never user data


OMEGA_NOTE = _m(
    "Ω is averaged over a session's eval points i = 1..L (the point at update 0 is plotted but not "
    "averaged), each weighted by the updates since the previous point, w<sub>i</sub> = (u<sub>i</sub> − "
    "u<sub>i−1</sub>) / U<sub>j</sub>; with evenly spaced points this is the paper's plain mean 1/L."
)

TERMS: tuple[Term, ...] = (
    Term("params", _m("#P"), "trainable parameters", "↓",
         _m("#P = number of parameters that receive gradient updates (millions)"),
         "What the method may change: the whole body and head for vanilla rehearsal, the head for "
         "output-layer-only, LoRA adapters and the head for SGM."),
    Term("S_delta", _m("S<sub>Δ</sub>"), "stability gap", "↓",
         _m("S<sub>Δ</sub> = 1 − <sup>1</sup>⁄<sub>N−1</sub> Σ<sub>j=2..N</sub> Ω<sub>j</sub><sup>old</sup>, "
            "&nbsp; Ω<sub>j</sub><sup>old</sup> = Σ<sub>i</sub> w<sub>i</sub> · "
            "A<sub>i</sub>(E<sub>1:j−1</sub>) / A<sub>joint</sub>(E<sub>1:j−1</sub>)"),
         "How much accuracy on the previously learned classes is missing while a session is learned, "
         "relative to a joint model trained on everything seen so far. Negative values mean transfer."),
    Term("P_delta", _m("P<sub>Δ</sub>"), "plasticity gap", "↓",
         _m("P<sub>Δ</sub> = 1 − <sup>1</sup>⁄<sub>N−1</sub> Σ<sub>j=2..N</sub> Ω<sub>j</sub><sup>new</sup>, "
            "&nbsp; Ω<sub>j</sub><sup>new</sup> = Σ<sub>i</sub> w<sub>i</sub> · "
            "A<sub>i</sub>(E<sub>j</sub>) / A<sub>best</sub>(E<sub>j</sub>)"),
         "How slowly the new classes of each session are learned, relative to the best accuracy any "
         "continual run of the protocol reached on them. Recomputed at every build, so a new run can "
         "change the P_Δ of the others."),
    Term("CK_delta", _m("CK<sub>Δ</sub>"), "continual knowledge gap", "↓",
         _m("CK<sub>Δ</sub> = 1 − <sup>1</sup>⁄<sub>N−1</sub> Σ<sub>j=2..N</sub> Ω<sub>j</sub><sup>all</sup>, "
            "&nbsp; Ω<sub>j</sub><sup>all</sup> = Σ<sub>i</sub> w<sub>i</sub> · "
            "A<sub>i</sub>(E<sub>1:j</sub>) / A<sub>joint</sub>(E<sub>1:j</sub>)"),
         "The balance of old and new knowledge: accuracy on all classes seen so far, relative to the joint model."),
    Term("sigma", _m("σ"), "pre-training accuracy", "↑",
         _m("σ = A<sub>U<sub>N</sub></sub>(E<sub>1</sub>) &nbsp;(%)"),
         "Final accuracy on the classes of the deployed model (session 1): what must not be lost."),
    Term("mu", _m("μ"), "average accuracy", "↑",
         _m("μ = <sup>1</sup>⁄<sub>N−1</sub> Σ<sub>j=2..N</sub> A<sub>U<sub>j</sub></sub>(E<sub>1:j</sub>) &nbsp;(%)"),
         "Mean over learning sessions of the end-of-session accuracy on all classes seen so far."),
    Term("alpha", _m("α"), "final accuracy", "↑",
         _m("α = A<sub>U<sub>N</sub></sub>(E<sub>1:N</sub>) &nbsp;(%)"),
         "Accuracy on all classes at the end of the stream, the classic continual-learning number."),
    Term("updates", _m("updates"), "optimizer updates", "↓",
         _m("Σ<sub>j=2..N</sub> U<sub>j</sub>"),
         "Optimizer steps over all learning sessions; the protocol fixes U, so equal for every method."),
    Term("tflops", _m("train TFLOPs"), "training compute", "↓",
         _m("2 × MACs × samples, summed over the parts each sample passes through, / 10<sup>12</sup>"),
         "Counted by the harness (forward only through frozen parts, forward + backward where gradients "
         "flow). Shown as “–” until the run recorded FLOPs."),
    Term("wall", _m("wall time"), "wall-clock time", "↓",
         _m("seconds"),
         "Time the run took on its machine (continual learning only, without the joint reference). "
         "Only comparable between runs on the same hardware."),
    Term("A_joint", _m("A<sub>joint</sub>"), "joint reference", "",
         _m("A<sub>joint</sub>(E) = accuracy on E of a model trained jointly on S<sub>1</sub>..S<sub>j</sub>"),
         "The upper bound: the newest complete joint run with the same protocol hash and seed as the run scored."),
    Term("A_best", _m("A<sub>best</sub>"), "best new-class accuracy", "",
         _m("A<sub>best</sub>(E<sub>j</sub>) = max over CL runs r and eval points i of A<sub>i</sub><sup>r</sup>(E<sub>j</sub>)"),
         "Over every complete continual run of the protocol hash, ranked or not."),
    Term("min_acc", _m("min-ACC"), "worst-case old-task accuracy (De Lange et al.)", "↑",
         _m("min-ACC = <sup>1</sup>⁄<sub>N−1</sub> Σ<sub>k&lt;N</sub> min<sub>i after k was learned</sub> A<sub>i</sub>(E<sub>k</sub>)"),
         "Shown on each run's page."),
    Term("wc_acc", _m("WC-ACC"), "worst-case accuracy (De Lange et al.)", "↑",
         _m("WC-ACC = <sup>1</sup>⁄<sub>N</sub> A<sub>final</sub>(E<sub>N</sub>) + (1 − <sup>1</sup>⁄<sub>N</sub>) · min-ACC"),
         "Shown on each run's page."),
    Term("recovery", _m("recovery@p"), "updates to recover accuracy on the pre-training classes (paper Table 4)", "↓",
         _m("first eval point after the drop where A<sub>i</sub>(E<sub>1</sub>) ≥ p · A<sub>joint</sub>(E<sub>1</sub>), p ∈ {97, 98, 99, 100} %"),
         "0 means no stability gap at all; “–” means the run never recovered in that session."),
    Term("to_best", _m("to 99% best"), "updates to learn the new classes (paper Fig. 5)", "↓",
         _m("first eval point where A<sub>i</sub>(E<sub>j</sub>) ≥ 0.99 · max<sub>i</sub> A<sub>i</sub>(E<sub>j</sub>) of the same run"),
         "How fast a method learns each session's new classes, to its own best level."),
)
