"""Training: the loop, its optimizer step and schedule, checkpoints, and the parallel stack (``distributed/``).

Owns:
  `trainer`      ``train()`` and the CLI (``python -m mohge.train``, ``torchrun ... -m mohge.train``): checks, locks,
                 the single-process / DDP loop, and the choice of the parallel loop
  `step`         AdamW, the warmup + cosine schedule (``lr_at``), the loss with its aux terms, one optimizer step,
                 the log rows (docs/method.md §5.4, §6)
  `setup`        what both loops share: the run's data folder and the final outputs (FINAL_FILES)
  `heldout`      the held-out loss (``val_loss``), also what mohge.evaluate reports
  `runtime`      devices, process groups, DDP, determinism
  `checkpoint`   resumable checkpoints and the sealed model folder (manifest.json, sha256 of each file)
  `distributed`  FSDP2, expert parallelism, DCP checkpoints on a DeviceMesh, the GPU check

May import: core, config, model, data and mohge.kernels; never evaluate, analysis or bench (evaluation imports
``heldout`` from here, not the other way).
"""
