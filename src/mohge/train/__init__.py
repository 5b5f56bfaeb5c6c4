"""Training: the loop, its optimizer step and schedule, checkpoints, and the parallel stack (``distributed/``).

Owns:
  `trainer`      ``train()`` and the CLI (``python -m mohge.train``, ``torchrun ... -m mohge.train``): checks, locks,
                 the choice of the layout, and the training loop, one for every layout
  `parallelism`  what the loop leaves to a layout (build and wrap, gradient sync, clipping, save and resume, the final
                 weights, extra log columns), and the layout of one process or DDP
  `step`         AdamW, the warmup + cosine schedule (``lr_at``), the loss with its aux terms, one optimizer step,
                 the log rows (docs/method.md §5.4, §6)
  `run_files`    the run's data folder and its checks, the final outputs beside the weights (FINAL_FILES, ``finish``)
  `heldout`      the held-out loss (``val_loss``), also what mohge.evaluate reports
  `runtime`      devices, process groups, DDP, determinism
  `checkpoint`   resumable checkpoints and the sealed model folder (manifest.json, sha256 of each file)
  `distributed`  FSDP2, expert parallelism, DCP checkpoints on a DeviceMesh (the sharded layout), the GPU check

May import: core, config, model, data and mohge.kernels; never evaluate, analysis or bench (evaluation imports
``heldout`` from here, not the other way).
"""
