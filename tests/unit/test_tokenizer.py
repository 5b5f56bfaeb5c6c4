"""Byte-level BPE: exact round trip, determinism, vocabulary size, EOT handling."""

import json
import random

import pytest

from mohge.config import EOT
from mohge.data.tokenizer import (
    EOT_ID,
    decode,
    encode,
    encode_batch,
    encode_with_offsets,
    load_tokenizer,
    train_tokenizer,
)

WORDS = "the cat dog sat on a mat and ran far away while birds sang in trees above quiet rivers".split()


def corpus(n_lines: int = 400, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 12))) + ".\n" for _ in range(n_lines)]


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    return train_tokenizer(corpus(), 300, tmp_path_factory.mktemp("tok") / "tokenizer.json")


AWKWARD = [
    "",
    " ",
    "  leading spaces",
    "trailing spaces   ",
    "\n",
    "\n\nblank lines\n\n\n",
    "tabs\tand\r\nCRLF\rCR",
    "the cat sat on the mat.",
    "unseen words: xylophone quokka",
    "accents: café naïve résumé Ångström",
    "CJK 漢字かなカナ 한국어, RTL שלום مرحبا",
    "emoji 😀👍🏽 👨‍👩‍👧 flags 🇫🇷",
    "combining e\u0301 and zero width\u200bjoiner\u200d",
    "NUL \x00 and DEL \x7f and \x1b[31m escapes",
    "literal " + EOT + " inside a text",
    EOT,
    "<|endoftext",
    "digits 1234567890 12+7=19 3.14159",
    "\U0010ffff \ue000 private use",
]


@pytest.mark.parametrize("text", AWKWARD)
def test_round_trip_awkward(tok, text):
    ids = encode(tok, text)
    assert decode(tok, ids) == text
    assert all(0 <= i < tok.get_vocab_size() for i in ids)


def test_round_trip_random_unicode(tok):
    rng = random.Random(1)
    pools = [(0x20, 0x7E), (0x0, 0x7F), (0xA0, 0x2FF), (0x4E00, 0x4FFF), (0x1F300, 0x1F6FF), (0xE000, 0xE0FF)]
    for _ in range(300):
        chars = []
        for _ in range(rng.randint(0, 40)):
            lo, hi = rng.choice(pools)
            chars.append(chr(rng.randint(lo, hi)))
        text = "".join(chars)
        assert decode(tok, encode(tok, text)) == text


def test_literal_eot_in_text_is_not_the_special_token(tok):
    ids = encode(tok, "a " + EOT + " b")
    assert EOT_ID not in ids
    assert decode(tok, ids + [EOT_ID] + ids) == "a " + EOT + " b" + EOT + "a " + EOT + " b"
    assert tok.token_to_id(EOT) == EOT_ID == 0


def test_batch_and_offsets_agree_with_encode(tok):
    texts = ["the cat sat.", " leading", "café 😀\nx", ""]
    assert encode_batch(tok, texts) == [encode(tok, t) for t in texts]
    for text in texts:
        ids, offsets = encode_with_offsets(tok, text)
        assert ids == encode(tok, text)
        assert len(offsets) == len(ids)
        assert all(0 <= s < e <= len(text) for s, e in offsets)
    ascii_text = "the quiet cat\n  sat 12+7=19."
    ids, offsets = encode_with_offsets(tok, ascii_text)
    # For ASCII every token covers whole characters, consecutively: the spans tile the text.
    assert "".join(ascii_text[s:e] for s, e in offsets) == ascii_text
    assert [decode(tok, [i]) for i in ids] == [ascii_text[s:e] for s, e in offsets]


def test_training_is_deterministic(tmp_path):
    texts = corpus(300, seed=5)
    a = train_tokenizer(texts, 320, tmp_path / "a.json")
    b = train_tokenizer(list(texts), 320, tmp_path / "b.json")
    assert (tmp_path / "a.json").read_bytes() == (tmp_path / "b.json").read_bytes()
    probe = "the birds sang above the mat while a dog ran"
    assert encode(a, probe) == encode(b, probe)
    # and encoding itself is repeatable
    assert encode(a, probe) == encode(a, probe)


def test_vocab_size_respected(tmp_path):
    rich = train_tokenizer(corpus(400), 300)
    assert rich.get_vocab_size() == 300
    small = train_tokenizer(["ab ab ab"], 5000)
    assert 257 <= small.get_vocab_size() < 5000  # runs out of pairs long before
    with pytest.raises(ValueError, match="vocab_size=256"):
        train_tokenizer(["abc"], 256)


def test_every_byte_is_in_the_vocabulary(tok):
    # 256 byte tokens + EOT: no character can ever be unknown, even one never seen in training.
    vocab = tok.get_vocab()
    assert len([t for t in vocab if len(t) == 1]) == 256
    assert decode(tok, encode(tok, "\x00\xff\u0100")) == "\x00\xff\u0100"


def test_save_and_load(tmp_path, tok):
    path = tmp_path / "sub" / "tokenizer.json"
    train_tokenizer(corpus(), 300, path)
    assert json.loads(path.read_text())["added_tokens"][0]["content"] == EOT
    assert [p.name for p in path.parent.iterdir()] == ["tokenizer.json"]  # no temporary left behind
    loaded = load_tokenizer(path)
    text = "the cat " + EOT + " sat\n"
    assert encode(loaded, text) == encode(tok, text)
    assert EOT_ID not in encode(loaded, text)


def test_check_refuses_a_tokenizer_without_the_eot_token_naming_the_key(tmp_path):
    from mohge.config import ConfigError
    from mohge.data.tokenizer import check_tokenizer, eot_id

    path = tmp_path / "t.json"
    train_tokenizer(corpus(50), 280, path)
    d = json.loads(path.read_text())
    d["added_tokens"][0]["content"] = "<pad>"
    d["model"]["vocab"]["<pad>"] = d["model"]["vocab"].pop(EOT)
    path.write_text(json.dumps(d))
    assert eot_id(check_tokenizer(path, "<pad>"), "<pad>") == 0  # the end token is the one data.eot_token names
    with pytest.raises(ConfigError, match=r"data.eot_token='<\|endoftext\|>': .*t.json has no such token"):
        check_tokenizer(path, EOT)


def test_trained_bpe_puts_the_configured_eot_token_at_zero(tmp_path):
    from mohge.data.tokenizer import eot_id

    tok = train_tokenizer(corpus(50), 280, tmp_path / "t.json", eot_token="</s>")
    assert eot_id(tok, "</s>") == EOT_ID == 0 and tok.token_to_id(EOT) is None


def test_check_tokenizer_round_trips_and_names_a_broken_file(tmp_path):
    from mohge.config import ConfigError
    from mohge.data.tokenizer import check_tokenizer, train_tokenizer

    path = tmp_path / "tokenizer.json"
    train_tokenizer(["the cat sat on the mat\n"] * 50, 300, path)
    assert check_tokenizer(path).token_to_id("<|endoftext|>") == 0
    spec = json.loads(path.read_text())
    spec["decoder"] = None  # parses, but decodes byte symbols as they are: no round trip
    path.write_text(json.dumps(spec))
    with pytest.raises(ConfigError, match="does not round-trip"):
        check_tokenizer(path)
    path.write_text("{not json")
    with pytest.raises(ConfigError, match=r"tokenizer\.json: not a usable tokenizer"):
        check_tokenizer(path)
