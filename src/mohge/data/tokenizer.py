"""Byte-level BPE tokenizer (GPT-2 style), trained locally with HuggingFace `tokenizers`.

Why byte level: every Unicode string is a byte string first, and all 256 bytes are in the initial
alphabet, so no character is ever unknown and `decode(encode(s)) == s` holds exactly for any `s`
(newlines, leading spaces, tabs, emoji included). The GPT-2 pre-tokenizer regex splits text into
words, runs of digits, runs of punctuation and runs of whitespace before BPE merges within each piece.

Special token: the end-of-text token (`data.eot_token`, default `<|endoftext|>`); our BPE gives it id 0
(`EOT_ID`). A given tokenizer (a `tokenizer.json` or a hub tokenizer) keeps its own id for it (GPT-2: 50256):
the tokenizer job records the id in meta.json (`eot_id`), and every reader takes it from there or, for a
trained model folder, from its tokenizer.json and `data.eot_token` (`eot_id`), never from `EOT_ID`. It is
only ever produced by the data pipeline, which inserts it after every document: `encode` treats the literal
string "<|endoftext|>" (any special token) inside a text as ordinary text (`encode_special_tokens = True`), so
no document can forge a document boundary. `decode` keeps special tokens, so an id sequence containing the
end-of-text id decodes to the literal string.

Training is deterministic: the same texts and vocab size give a byte-identical `tokenizer.json`.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from mohge.config import EOT, MIN_VOCAB_SIZE, ConfigError, DataConfig
from mohge.core.atomic import atomic_path

EOT_ID = 0  # the id our trained BPE gives EOT; a prepared folder's own id is meta["eot_id"]

__all__ = [
    "EOT_ID",
    "decode",
    "encode",
    "encode_batch",
    "encode_with_offsets",
    "eot_id",
    "check_tokenizer",
    "load_tokenizer",
    "train_tokenizer",
]


def _new_tokenizer() -> Tokenizer:
    tok = Tokenizer(models.BPE())
    # add_prefix_space=False: a prefix space would not survive the round trip.
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    return tok


def train_tokenizer(
    texts: Iterable[str], vocab_size: int, out_path: str | os.PathLike | None = None, eot_token: str = EOT
) -> Tokenizer:
    """Train a byte-level BPE with at most `vocab_size` tokens (`eot_token` at id 0, bytes at 1..256, then merges).

    The vocabulary can come out smaller than `vocab_size` when the texts run out of pairs to merge.
    With `out_path`, the tokenizer is saved there as JSON (atomically).
    """
    if not isinstance(vocab_size, int) or vocab_size < MIN_VOCAB_SIZE:
        raise ConfigError(f"vocab_size={vocab_size!r} must be an int >= {MIN_VOCAB_SIZE} (256 bytes + EOT)")
    tok = _new_tokenizer()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=[eot_token],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    assert tok.token_to_id(eot_token) == EOT_ID
    tok.encode_special_tokens = True
    if out_path is not None:
        with atomic_path(out_path) as tmp:  # a killed run leaves no half-written tokenizer.json
            tok.save(str(tmp), pretty=True)
    return tok


def load_tokenizer(path: str | os.PathLike) -> Tokenizer:
    """Load a tokenizer.json (written by `train_tokenizer`, or a given one); its end-of-text id is `eot_id`."""
    tok = Tokenizer.from_file(str(path))
    # Not stored in tokenizer.json: the literal "<|endoftext|>" in a text is plain text.
    tok.encode_special_tokens = True
    return tok


def eot_id(tok: Tokenizer, eot_token: str = EOT, where: str | os.PathLike = "the tokenizer") -> int:
    """The id of the end-of-text token `eot_token` (data.eot_token) in `tok`; a ConfigError naming the key when
    the tokenizer has no such token (`where` names the tokenizer in the message)."""
    found = tok.token_to_id(eot_token)
    if found is None:
        raise ConfigError(
            f"data.eot_token={eot_token!r}: {where} has no such token; set data.eot_token to its end-of-text "
            f"token (e.g. '</s>', '<|end_of_text|>')"
        )
    return int(found)


def encode(tok: Tokenizer, text: str) -> list[int]:
    """Token ids of `text`; no special token is added or recognised."""
    return tok.encode(text, add_special_tokens=False).ids


def encode_batch(tok: Tokenizer, texts: Sequence[str]) -> list[list[int]]:
    """`encode` for many texts at once (in parallel inside `tokenizers`)."""
    return [e.ids for e in tok.encode_batch(list(texts), add_special_tokens=False)]


def encode_with_offsets(tok: Tokenizer, text: str) -> tuple[list[int], list[tuple[int, int]]]:
    """Token ids and, per token, the [start, end) span of Python-string (code point) indices it covers.

    A character that is split over several byte tokens (e.g. an emoji) gives each of them its span.
    """
    enc = tok.encode(text, add_special_tokens=False)
    return enc.ids, [tuple(o) for o in enc.offsets]


def decode(tok: Tokenizer, ids: Iterable[int]) -> str:
    """Inverse of `encode`; the end-of-text id decodes to its literal string (e.g. "<|endoftext|>")."""
    return tok.decode(list(ids), skip_special_tokens=False)


# Bytes of every kind a corpus holds: accents, an emoji, tabs and runs of spaces, digits, the EOT literal.
PROBE = "MoHGE probe: na\u00efve caf\u00e9 \U0001f642\n\tx  =  123+456 <|endoftext|> end"


def check_tokenizer(path: str | os.PathLike, eot_token: str | None = None, probe: str = PROBE) -> Tokenizer:
    """Load ``path`` and round-trip a probe string through it; a tokenizer that cannot be parsed or does not
    give back its input is a ConfigError naming the file (checked before training, never copied to outputs).
    With ``eot_token`` (data.eot_token), a tokenizer without that token is a ConfigError naming the key.
    ``probe``: any text for a byte-level tokenizer; a word-level one (the facts source) round-trips only its
    own words (tokenizer_probe)."""
    try:
        tok = load_tokenizer(path)
        back = decode(tok, encode(tok, probe))
    except Exception as err:  # tokenizers raises plain Exception for a malformed file
        raise ConfigError(
            f"{path}: not a usable tokenizer ({str(err).splitlines()[0] if str(err) else err!r})"
        ) from err
    if back != probe:
        raise ConfigError(f"{path}: the tokenizer does not round-trip text (encode then decode gave {back[:40]!r})")
    if eot_token is not None:
        eot_id(tok, eot_token, path)
    return tok


def tokenizer_probe(cfg: DataConfig) -> str:
    """The text a prepared tokenizer must round-trip (mohge.tokenizer.check_tokenizer): for the facts source the
    end-of-text word and the first and last symbol of each kind, for every other source the byte-level probe."""
    if cfg.source != "facts":
        return PROBE
    from .facts import key_word, value_word  # the facts source's own code, only for its runs

    return " ".join(
        [
            cfg.eot_token,
            key_word(0),
            key_word(cfg.facts_key_tokens - 1),
            value_word(0),
            value_word(cfg.facts_value_tokens - 1),
        ]
    )
