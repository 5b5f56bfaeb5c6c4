# The context check of the capacity pilot (pilots 1 and 3): B of a trained model when every value is scored after
# four different contexts.  PYTHONPATH=src python results/capacity/pilot/context_check.py work/capacity-pilot/runs/RUN
import math
import sys

import numpy as np
import torch
from mohge.evaluate.capacity import fact_rows

from mohge.data.facts import bits_per_fact
from mohge.train.checkpoint import load_trained

torch.set_num_threads(1)
cfg, model = load_trained(sys.argv[1])
dc = cfg.data_config
rows = fact_rows(dc)  # [N,5] eot k k v v
N = len(rows)


def score(x, off):  # value positions start at off (index of v1 in x)
    ce = []
    with torch.no_grad():
        for b in range(0, N, 512):
            xb = x[b : b + 512]
            lg = model(xb[:, :-1]).logits.float()
            lp = torch.log_softmax(lg[:, off - 1 : off + 1], -1)
            t = xb[:, off : off + 2]
            ce.append(-lp.gather(2, t[..., None])[..., 0].sum(1) / math.log(2))
    ce = torch.cat(ce).double().numpy()
    return float(np.sum(bits_per_fact(dc) - ce))


print("eot k k -> v (eval):", score(rows, 3))
print("k k -> v (window start):", score(rows[:, 1:], 2))
prev = torch.roll(rows, 1, 0)
print("prev fact then eot k k -> v:", score(torch.cat([prev, rows], 1), 8))
prev2 = torch.roll(rows, 2, 0)
print("2 prev facts:", score(torch.cat([prev2, prev, rows], 1), 13))
