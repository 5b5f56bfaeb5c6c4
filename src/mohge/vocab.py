"""Vocabularies and constants that code below the config needs: plain values, no imports.

So :mod:`mohge.kernels` and the GPU checks start on a machine with only torch, triton and numpy installed:
the kernels' dispatch takes ``BACKENDS`` from here, and the data config (which the model config imports) takes
the tokenizer's constants from here rather than from :mod:`mohge.tokenizer`, which imports ``tokenizers``.
:mod:`mohge.config` and :mod:`mohge.tokenizer` re-export them: each value is defined once, here.
"""

BACKENDS = ("auto", "triton", "torch", "loop")  # model.ffn.backend: the expert compute of mohge.kernels

EOT = "<|endoftext|>"  # data.eot_token's default: the end-of-text token of our byte-level BPE
EOT_ID = 0  # the id our trained BPE gives EOT; a prepared folder's own id is meta["eot_id"]
MIN_VOCAB_SIZE = 257  # 256 byte tokens + EOT
