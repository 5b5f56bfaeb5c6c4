"""Evaluation of a trained model: lm-eval tasks, held-out loss, routing traces, and the Hugging Face export.

Owns:
  `suite`                the local lm-eval tasks from held-out data, the evaluation run and its CLI
                         (``python -m mohge.evaluate``)
  `harness`              lm-eval's own command line with our model registered (``mohge lm-eval``)
  `lm_eval_adapter`      the adapter: our trained folder as an lm-eval model (``--model mohge``)
  `traces`               routing traces of a trained model on held-out data, and synthetic ones
                         (``mohge traces``)
  `route_override`       serving a trained model with fewer groups or experts per token, or the widest barred
  `serving`              the export's experts re-read per width group, as fused-MoE engines take them
  `token_width`          the token-level Q3 record of a trace: each token's routed width against its loss
  `hf_export`            a trained folder as a Hugging Face model folder (``mohge export``)
  `modeling_mohge`, `configuration_mohge`   the model code copied into every exported folder (``auto_map``
                         names them); they import nothing of mohge

May import: core, config, model, data, train and mohge.kernels; never analysis or bench.
"""
