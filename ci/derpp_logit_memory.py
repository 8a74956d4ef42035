"""Benchmark behind DER++'s ``LogitStore`` layout: the memory its stored logits take at cil_places_lt's
sizes (1,343,667 training ids, 1365 classes), filled as a run fills it (per session, 20 updates storing the
logits of 128 new and 128 replayed pre-training samples, then the session's other samples on entry), with
a checkpoint written to disk at every session end. Prints, per session, the rows stored, the store's
bytes, the checkpoint's size and the process's RSS and peak RSS over where it started.
Usage: python ci/derpp_logit_memory.py [sessions]"""

import os
import resource
import sys
import tempfile

import numpy as np
import torch

from bench_stability_gap.methods.derpp import LogitStore

N_PRE, N_STREAM, WIDTH, UPDATES, BATCH = 1_281_167, 62_500, 1365, 20, 128


def rss_mib() -> float:
    with open("/proc/self/status") as fh:
        return next(int(line.split()[1]) for line in fh if line.startswith("VmRSS")) / 1024


def peak_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


sessions = int(sys.argv[1]) if len(sys.argv) > 1 else 5
rng = np.random.default_rng(0)
store = LogitStore(N_PRE + N_STREAM, WIDTH)
start = rss_mib()
with tempfile.TemporaryDirectory() as tmp:
    path = os.path.join(tmp, "checkpoint.pt")
    for s, ids in enumerate(np.array_split(np.arange(N_PRE, N_PRE + N_STREAM), sessions)):
        for _ in range(UPDATES):
            for drawn in (rng.choice(ids, BATCH, replace=False), rng.choice(N_PRE, BATCH)):
                fresh = store.missing(drawn)
                store.put(fresh, torch.randn(len(fresh), WIDTH))
        for i in range(0, len(ids), 256):
            fresh = store.missing(ids[i : i + 256])
            store.put(fresh, torch.randn(len(fresh), WIDTH))
        torch.save({"derpp_logits": store.state_dict()}, path)
        print(f"session {s}: {len(store):,} rows, store {store.nbytes / 2**20:.0f} MiB, checkpoint "
              f"{os.path.getsize(path) / 2**20:.0f} MiB, RSS +{rss_mib() - start:.0f} MiB, "
              f"peak RSS +{peak_mib() - start:.0f} MiB")
