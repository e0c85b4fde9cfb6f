"""A tiny deterministic word-level tokenizer for the miniature (no downloads).

Pieces are words with their leading space (as in GPT-2), punctuation, whitespace and the answer
tags; the vocabulary is every piece of the generator's corpus plus printable ASCII characters, so
an unknown word falls back to characters and any ASCII text round-trips exactly.
"""

from __future__ import annotations

import re
import string
from collections.abc import Iterable

from examples.sdpo_sciknoweval.data import corpus_texts

PAD, BOS, EOS, UNK = "<pad>", "<bos>", "<eos>", "<unk>"
_PIECE_RE = re.compile(r"</?answer>| ?\w+| ?[^\w\s]|\s")


class WordTokenizer:
    """Maps text to ids and back; ids 0-3 are PAD, BOS, EOS, UNK."""

    def __init__(self, texts: Iterable[str]):
        pieces = {p for text in texts for p in _PIECE_RE.findall(text)}
        chars = set(string.printable) - set("\t\r\x0b\x0c")
        self.id_to_piece = [PAD, BOS, EOS, UNK, *sorted(pieces | chars)]
        self.piece_to_id = {p: i for i, p in enumerate(self.id_to_piece)}
        self.pad_id, self.bos_id, self.eos_id, self.unk_id = 0, 1, 2, 3

    @property
    def vocab_size(self) -> int:
        return len(self.id_to_piece)

    def encode(self, text: str, add_bos: bool = False, add_eos: bool = False) -> list[int]:
        ids = [self.bos_id] if add_bos else []
        for piece in _PIECE_RE.findall(text):
            if piece in self.piece_to_id:
                ids.append(self.piece_to_id[piece])
            else:
                ids.extend(self.piece_to_id.get(c, self.unk_id) for c in piece)
        return ids + [self.eos_id] if add_eos else ids

    def decode(self, ids: Iterable[int], skip_special: bool = True) -> str:
        """Concatenate pieces; specials are dropped unless ``skip_special`` is False.

        Ids past the vocabulary (a model's padded logits) decode as UNK.
        """
        pieces = (self.id_to_piece[i] if i < self.vocab_size else UNK for i in ids)
        if skip_special:
            pieces = (p for p in pieces if p not in (PAD, BOS, EOS, UNK))
        return "".join(pieces)


def build_tokenizer() -> WordTokenizer:
    """The tokenizer over the synthetic SciKnowEval corpus; identical on every call."""
    return WordTokenizer(corpus_texts())
