"""The old half of cil_places_lt_synthetic's batches by source, as a run draws them (docs/fidelity.md row 44).

    OMP_NUM_THREADS=1 python ci/old_mix_composition.py [--seed 0] [--protocol cil_places_lt_synthetic]

For each batch mix (pooled, by_source) it replays the runner's draws for the protocol's updates per
session with the harness's own objects, in run_cl's order: the memory filled with S1 and then each
ended session, the harness's random stream of the seed, a Cycler over the session's samples, and the
memory's draw (``sample`` or ``sample_by_source``). No model is built or trained: what a batch holds
does not depend on the method. Prints the samples per batch by source, counted over each session.
"""

from __future__ import annotations

import argparse

import numpy as np

from bench_stability_gap.harness.data.old_mix import by_source_shares
from bench_stability_gap.harness.data.stream import Cycler, build_stream
from bench_stability_gap.harness.run.isolation import random_streams
from bench_stability_gap.harness.run.memory import Memory
from bench_stability_gap.harness.spec.protocol import load_protocol


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--protocol", default="cil_places_lt_synthetic")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    base = load_protocol(args.protocol)
    stream = build_stream(base, args.seed)
    boundary = int(stream.train.offsets[1])  # pre-training ids come first
    b, updates = base.training.batch, base.training.updates
    for mix in ("pooled", "by_source"):
        p = base.model_copy(update={"training": base.training.model_copy(update={"old_mix": mix})})
        rng = random_streams(args.seed).harness
        memory = Memory(p.memory, stream.train.labels, lambda gid: 0, rng)
        memory.add(stream.pretrain_ids, pretrain=True)
        print(f"{mix} ({args.protocol}, seed {args.seed}, {updates} batches per session):")
        for pos, session in enumerate(stream.sessions):
            arrivals = Cycler(session.train_ids, rng)
            shares = by_source_shares(p, pos, b.new, b.old)
            counts = np.zeros(3)
            for _ in range(updates):
                if shares is None:
                    new, old = arrivals.take(b.new), memory.sample(b.old, p.training.class_balanced)
                else:
                    new, old = arrivals.take(shares.new), memory.sample_by_source(
                        shares.pretrain, shares.earlier, boundary, p.training.class_balanced)
                counts += [len(new), np.sum(old < boundary), np.sum(old >= boundary)]
            n, pre, earlier = counts / updates
            print(f"  session {session.index}: {n:.2f} new + {pre:.2f} pre-training + {earlier:.2f} earlier "
                  f"sessions per batch ({int(counts[2])} earlier-session samples in {updates} batches)")
            memory.add(session.train_ids)


if __name__ == "__main__":
    main()
