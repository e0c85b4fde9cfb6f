import json

from examples.sdpo_sciknoweval.data import (
    INSTRUCTION,
    LETTERS,
    DataConfig,
    MCQItem,
    build_dataset,
    load_sciknoweval_jsonl,
    score,
)


def test_dataset_is_deterministic_and_seeded():
    assert build_dataset() == build_dataset()
    assert build_dataset() != build_dataset(DataConfig(seed=1))


def test_split_is_disjoint_and_large_enough():
    train, eval_items = build_dataset()
    assert not {i.prompt for i in train} & {i.prompt for i in eval_items}
    assert len({i.question for i in train + eval_items}) >= 200
    assert len(eval_items) == round(0.05 * (len(train) + len(eval_items)))


def test_prompt_follows_the_recipe_layout():
    item = build_dataset()[0][0]
    lines = item.prompt.split("\n")
    assert lines[0] == item.question and lines[1] == ""
    assert [line[:3] for line in lines[2:6]] == [f"{letter}: " for letter in LETTERS]
    assert lines[6:] == ["", INSTRUCTION]
    assert item.answer in LETTERS and item.target == f"<answer>{item.answer}</answer>"
    assert len(set(item.choices)) == 4


def test_score_needs_the_tag_and_the_right_letter():
    assert score("<answer>B</answer>", "B") == 1.0
    assert score("I think... <answer> b </answer>", "B") == 1.0
    assert score("<answer>A</answer> no, <answer>B</answer>", "B") == 1.0
    assert score("<answer>C</answer>", "B") == 0.0
    assert score("B", "B") == 0.0
    assert score("<answer>B", "B") == 0.0
    assert score("", "B") == 0.0


def test_load_sciknoweval_jsonl_maps_recipe_rows(tmp_path):
    item = MCQItem(
        "Which organelle makes ATP?", ("ribosome", "mitochondrion", "vacuole", "nucleus"), "B"
    )
    rows = [
        {
            "prompt": item.prompt,
            "label": "B",
            "metadata": {"data_source": "sciknoweval", "domain": "Biology", "answer_key": "B"},
        },
        {"prompt": "System text.\n\n" + item.prompt, "label": "B", "metadata": {}},
        {"prompt": "Is the sky green?\n\nReason carefully.", "label": "False", "metadata": {}},
    ]
    path = tmp_path / "train.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    loaded = load_sciknoweval_jsonl(path)
    assert loaded[0] == item
    assert loaded[1].question == "System text.\n\n" + item.question
    assert loaded[1].prompt == rows[1]["prompt"]
    assert len(loaded) == 2
