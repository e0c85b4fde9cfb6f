from examples.sdpo_sciknoweval.data import build_dataset
from examples.sdpo_sciknoweval.tokenizer import UNK, build_tokenizer


def test_round_trip_on_every_prompt_and_target():
    tok = build_tokenizer()
    train, eval_items = build_dataset()
    for item in train + eval_items:
        text = item.prompt + item.target
        ids = tok.encode(text, add_bos=True, add_eos=True)
        assert ids[0] == tok.bos_id and ids[-1] == tok.eos_id
        assert tok.unk_id not in ids
        assert tok.decode(ids) == text


def test_unknown_words_fall_back_to_characters():
    tok = build_tokenizer()
    text = "Zygomorphic flowers?! <answer>Q</answer>"
    assert tok.decode(tok.encode(text)) == text


def test_vocabulary_is_deterministic_with_specials_first():
    a, b = build_tokenizer(), build_tokenizer()
    assert a.id_to_piece == b.id_to_piece
    assert (a.pad_id, a.bos_id, a.eos_id, a.unk_id) == (0, 1, 2, 3)
    assert a.vocab_size == len(a.id_to_piece) < 1000
    assert a.decode([a.vocab_size + 5], skip_special=False) == UNK
