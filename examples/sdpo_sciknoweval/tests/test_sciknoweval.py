import json
import random
import sys
from collections import Counter
from pathlib import Path
from types import SimpleNamespace

import pytest
from omegaconf import OmegaConf

from distill_guard.config import compose_guard_config
from examples.sdpo_sciknoweval.data import MCQItem, load_sciknoweval_jsonl, score
from examples.sdpo_sciknoweval.sciknoweval import load_sciknoweval, rows_to_items

REAL_SCALE = Path(__file__).resolve().parents[3] / "conf" / "sdpo_sciknoweval" / "real_scale.yaml"


def mcq(question, texts, answer, *, domain="Biology", level="L3", kind="mcq-4-choices"):
    """A row in the Hugging Face hicai-zju/SciKnowEval schema."""
    return {
        "question": question,
        "choices": {"text": list(texts), "label": [chr(65 + i) for i in range(len(texts))]},
        "answerKey": answer,
        "type": kind,
        "domain": domain,
        "details": {"level": level, "task": "t", "subtask": "s"},
        "answer": "",
    }


def free(question, answer, kind, *, domain="Biology", level="L3"):
    """A non-multiple-choice row: no choices, empty answerKey, the answer in ``answer``."""
    row = mcq(question, [], "", domain=domain, level=level, kind=kind)
    row["answer"] = answer
    return row


BIO_L3 = [
    mcq(f"  Biology question {i}?  ", [f"a{i}", f"b{i}", f"c{i}", f"d{i}"], "ABCD"[i % 4])
    for i in range(18)
]
OTHERS = [
    mcq("A chemistry question?", ["w", "x", "y", "z"], "A", domain="Chemistry"),
    mcq("A biology L1 question?", ["w", "x", "y", "z"], "B", level="L1"),
    free("Is the sky green?", "No", "true_or_false"),
    free("Describe mitosis.", "Cells divide.", "open-ended-qa"),
    mcq("Two choices?", ["yes", "no"], "B", kind="mcq-2-choices"),
]


def write_raw(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return f"raw:{path}"


def test_rows_to_items_keeps_domain_level_mcq_and_counts_skips():
    skipped = Counter()
    items = rows_to_items(BIO_L3[:2] + OTHERS, skipped=skipped)
    assert [i.question for i in items] == [
        "Biology question 0?",
        "Biology question 1?",
        "Two choices?",
    ]
    assert items[2] == MCQItem("Two choices?", ("yes", "no"), "B")
    assert skipped == Counter({"type=true_or_false": 1, "type=open-ended-qa": 1})
    # Domains match like Relax's _canonical_domain; levels case-insensitively.
    assert rows_to_items([mcq("Q?", "wxyz", "C", domain="material", level="l3")], "Materials")


def test_prompt_is_exactly_the_recipe_prompt():
    (item,) = rows_to_items(
        [mcq(" Which organelle makes ATP? ", ["ribosome", "mitochondrion"], "B")]
    )
    assert item.prompt == (
        "Which organelle makes ATP?\n\nA: ribosome\nB: mitochondrion\n\n"
        "Reason carefully and provide the final answer."
    )
    assert score(f"thinking... {item.target}", "B") == 1.0


def test_choices_beyond_d_are_skipped_and_counted():
    skipped = Counter()
    assert rows_to_items([mcq("Five?", "vwxyz", "E")], skipped=skipped) == []
    assert skipped == Counter({"choice labels other than A-D in order": 1})


def test_load_raw_splits_like_prepare_data(tmp_path):
    source = write_raw(tmp_path / "raw.jsonl", BIO_L3 + OTHERS)
    train, eval_items = load_sciknoweval(source, eval_ratio=0.1, seed=42)
    assert (train, eval_items) == load_sciknoweval(source, eval_ratio=0.1, seed=42)
    # prepare_data: the 21 Biology L3 rows (true/false and open-ended included) are split, then
    # the 2 non-MCQ rows are dropped from whichever side they fell on.
    in_scope = BIO_L3 + [OTHERS[2], OTHERS[3], OTHERS[4]]
    indices = list(range(len(in_scope)))
    random.Random(42).shuffle(indices)
    held_out = set(indices[:2])  # round(21 * 0.1)
    expected_eval = [r["question"].strip() for i, r in enumerate(in_scope) if i in held_out]
    expected_eval = [
        q for q in expected_eval if q not in ("Is the sky green?", "Describe mitosis.")
    ]
    assert [i.question for i in eval_items] == expected_eval
    assert len(train) + len(eval_items) == 19
    assert not {i.prompt for i in train} & {i.prompt for i in eval_items}
    other_seed = load_sciknoweval(source, eval_ratio=0.1, seed=0)[1]
    assert [i.question for i in other_seed] != [i.question for i in eval_items]


def test_max_rows_applies_before_the_split(tmp_path):
    source = write_raw(tmp_path / "raw.jsonl", BIO_L3)
    train, eval_items = load_sciknoweval(source, eval_ratio=0.2, max_rows=10)
    assert len(eval_items) == 2 and len(train) == 8
    assert {i.question for i in train + eval_items} == {f"Biology question {i}?" for i in range(10)}


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("{not json", "raw.jsonl:3: not valid JSON"),
        ('["a list"]', "raw.jsonl:3: expected a JSON object"),
        (
            json.dumps({k: v for k, v in BIO_L3[0].items() if k != "answerKey"}),
            "raw.jsonl:3: missing field 'answerKey'",
        ),
        (
            json.dumps({**BIO_L3[0], "details": {"task": "t"}}),
            "raw.jsonl:3: missing field 'details.level'",
        ),
        (
            json.dumps({**BIO_L3[0], "choices": {"text": ["a"], "label": ["A", "B"]}}),
            "raw.jsonl:3: 'choices.label' has 2 entries, 'choices.text' 1",
        ),
        (json.dumps({**BIO_L3[0], "answerKey": "F"}), "raw.jsonl:3: 'answerKey' 'F'"),
    ],
)
def test_malformed_rows_name_file_line_and_field(tmp_path, line, message):
    path = tmp_path / "raw.jsonl"
    path.write_text(json.dumps(BIO_L3[1]) + "\n\n" + line + "\n")
    with pytest.raises(ValueError, match=message):
        load_sciknoweval(f"raw:{path}", eval_ratio=0)


def test_empty_results_are_errors(tmp_path):
    with pytest.raises(ValueError, match="no rows with domain='Physics'"):
        load_sciknoweval(write_raw(tmp_path / "a.jsonl", BIO_L3), domain="Physics")
    only_free = write_raw(tmp_path / "b.jsonl", [OTHERS[2], OTHERS[3]] * 5)
    with pytest.raises(ValueError, match=r"0 train and 0 eval .*type=true_or_false"):
        load_sciknoweval(only_free)
    with pytest.raises(ValueError, match="holds out no row"):
        load_sciknoweval(write_raw(tmp_path / "c.jsonl", BIO_L3[:3]), eval_ratio=0.1)
    with pytest.raises(ValueError, match="expected hf:"):
        load_sciknoweval("s3:bucket/file.jsonl")


def test_relax_rows_load_and_split(tmp_path):
    items = rows_to_items(BIO_L3)
    path = tmp_path / "train.jsonl"
    rows = [
        {"prompt": i.prompt, "label": i.answer, "metadata": {"answer_key": i.answer}} for i in items
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert load_sciknoweval_jsonl(path) == items
    train, eval_items = load_sciknoweval(f"relax:{path}", eval_ratio=0.1, seed=42)
    assert sorted(train + eval_items, key=items.index) == items and len(eval_items) == 2
    assert load_sciknoweval(f"relax:{path}", eval_ratio=0) == (items, [])
    path.write_text('{"prompt": "Is it? Reason carefully.", "label": "Yes"}\n')
    with pytest.raises(ValueError, match="no multiple-choice rows"):
        load_sciknoweval(f"relax:{path}")
    path.write_text('{"label": "A"}\n')
    with pytest.raises(ValueError, match="train.jsonl:1: field 'prompt'"):
        load_sciknoweval(f"relax:{path}", eval_ratio=0)


def test_hf_source_reads_the_named_split(monkeypatch):
    calls = []

    def load_dataset(dataset_id, split):
        calls.append((dataset_id, split))
        return [*BIO_L3, {**BIO_L3[0], "answerKey": ""}]

    monkeypatch.setitem(sys.modules, "datasets", SimpleNamespace(load_dataset=load_dataset))
    train, eval_items = load_sciknoweval("hf:hicai-zju/SciKnowEval", max_rows=18)
    assert (
        len(train) == 16 and len(eval_items) == 2 and calls == [("hicai-zju/SciKnowEval", "test")]
    )
    with pytest.raises(ValueError, match=r"SciKnowEval\[train\] row 18: missing field 'answerKey'"):
        load_sciknoweval("hf:hicai-zju/SciKnowEval:train")
    assert calls[-1] == ("hicai-zju/SciKnowEval", "train")


def test_hf_source_without_datasets_names_the_package(monkeypatch):
    monkeypatch.setitem(sys.modules, "datasets", None)  # import datasets -> ImportError
    with pytest.raises(ImportError, match="'datasets' package"):
        load_sciknoweval("hf:hicai-zju/SciKnowEval")


def test_real_scale_config_has_the_recipe_numbers():
    cfg = OmegaConf.load(REAL_SCALE)
    assert cfg.student.path == cfg.teacher.path == "Qwen/Qwen3-8B"
    assert cfg.teacher.kind == "sglang_http" and cfg.teacher.enable_weights_cpu_backup is True
    assert cfg.data.source == "hf:hicai-zju/SciKnowEval"
    assert (cfg.data.domain, cfg.data.level, cfg.data.eval_ratio, cfg.data.seed) == (
        "Biology",
        "L3",
        0.1,
        42,
    )
    assert cfg.data.apply_chat_template is True
    assert (cfg.arm.batch_size, cfg.rollout.n_samples_per_prompt) == (32, 8)
    assert (cfg.arm.max_new_tokens, cfg.arm.temperature, cfg.arm.top_k) == (8192, 1.0, 16)
    assert (cfg.arm.beta, cfg.opd.norm_mode, cfg.arm.lr) == (0.5, "tail", 1e-6)
    assert (cfg.arm.eval_every, cfg.eval.n_samples_per_prompt) == (5, 16)
    assert cfg.guard.preset == "default" and cfg.guard.run.vocab_size == 151936
    # Every guard key is one the preset knows (compose raises on unknown keys).
    overrides = [f"run.{k}={v}" for k, v in cfg.guard.run.items()]
    assert compose_guard_config(cfg.guard.preset, overrides).run.vocab_size == 151936
