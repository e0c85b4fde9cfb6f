"""Biology multiple-choice items in the shape of the SDPO SciKnowEval recipe.

The miniature cannot download SciKnowEval, so ``build_dataset`` generates items from a small
built-in fact base. Prompts and the reward follow Relax's ``prepare_data.py`` and ``reward.py``:
the question, a blank line, ``A: ...`` choice lines, a blank line, then the fixed instruction; a
response scores 1.0 only if its last ``<answer>...</answer>`` names the right letter.
``load_sciknoweval_jsonl`` reads real rows prepared by the recipe into the same item type.
"""

from __future__ import annotations

import json
import random
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

INSTRUCTION = "Reason carefully and provide the final answer."
LETTERS = ("A", "B", "C", "D")


@dataclass(frozen=True)
class MCQItem:
    """One multiple-choice question; ``answer`` is the letter of the right choice."""

    question: str
    choices: tuple[str, ...]
    answer: str

    @property
    def prompt(self) -> str:
        return format_prompt(self.question, self.choices)

    @property
    def target(self) -> str:
        """The response a perfect student gives."""
        return f"<answer>{self.answer}</answer>"


def format_prompt(question: str, choices: tuple[str, ...] | list[str]) -> str:
    """The prompt exactly as Relax's ``prepare_data.py`` writes it."""
    lines = "\n".join(f"{letter}: {text}" for letter, text in zip(LETTERS, choices))
    return f"{question}\n\n{lines}\n\n{INSTRUCTION}"


_ANSWER_RE = re.compile(r"<answer>\s*(.*?)\s*</answer>", re.IGNORECASE | re.DOTALL)
_LETTER_RE = re.compile(r"\b([A-D])\b", re.IGNORECASE)


def score(response: str, answer_key: str) -> float:
    """1.0 if the last ``<answer>...</answer>`` in the response names ``answer_key``, else 0.0."""
    tagged = _ANSWER_RE.findall(response)
    if not tagged:
        return 0.0
    letter = _LETTER_RE.search(tagged[-1])
    return float(letter is not None and letter.group(1).upper() == answer_key.strip().upper())


# A relation maps keys to values. ``forward`` asks for the key given the value, ``reverse`` for
# the value given the key; distractors are drawn from entries with a different answer.
_RELATIONS: tuple[tuple[str, str, tuple[tuple[str, str], ...]], ...] = (
    (
        "Which organelle is responsible for {v}?",
        "What is the main function of the {k}?",
        (
            ("mitochondrion", "cellular respiration"),
            ("ribosome", "protein synthesis"),
            ("nucleus", "storing genetic material"),
            ("chloroplast", "photosynthesis"),
            ("lysosome", "intracellular digestion"),
            ("Golgi apparatus", "packaging and sorting proteins"),
            ("vacuole", "storing water and nutrients"),
            ("centrosome", "organizing microtubules"),
            ("peroxisome", "breaking down hydrogen peroxide"),
            ("nucleolus", "assembling ribosomal subunits"),
            ("cell membrane", "controlling what enters the cell"),
            ("smooth endoplasmic reticulum", "lipid synthesis"),
            ("cell wall", "giving plant cells rigidity"),
            ("flagellum", "cell locomotion"),
        ),
    ),
    (
        "Which molecule is mainly responsible for {v}?",
        "What is the main role of {k}?",
        (
            ("hemoglobin", "oxygen transport in blood"),
            ("insulin", "lowering blood glucose"),
            ("DNA", "storing hereditary information"),
            ("messenger RNA", "carrying the genetic code to ribosomes"),
            ("transfer RNA", "delivering amino acids to ribosomes"),
            ("ATP", "supplying energy for cellular work"),
            ("chlorophyll", "absorbing light energy"),
            ("collagen", "strengthening connective tissue"),
            ("keratin", "forming hair and nails"),
            ("myosin", "pulling actin filaments during contraction"),
            ("antibody", "binding specific antigens"),
            ("glycogen", "storing glucose in animals"),
            ("cellulose", "building plant cell walls"),
            ("rhodopsin", "detecting dim light in the retina"),
            ("myoglobin", "storing oxygen in muscle"),
            ("fibrinogen", "forming blood clots"),
        ),
    ),
    (
        "Which organism belongs to the kingdom {v}?",
        "To which kingdom does the {k} belong?",
        (
            ("lion", "animalia"),
            ("shark", "animalia"),
            ("frog", "animalia"),
            ("octopus", "animalia"),
            ("honeybee", "animalia"),
            ("earthworm", "animalia"),
            ("jellyfish", "animalia"),
            ("oak", "plantae"),
            ("fern", "plantae"),
            ("moss", "plantae"),
            ("sunflower", "plantae"),
            ("pine", "plantae"),
            ("cactus", "plantae"),
            ("mushroom", "fungi"),
            ("yeast", "fungi"),
            ("bread mold", "fungi"),
            ("truffle", "fungi"),
            ("amoeba", "protista"),
            ("paramecium", "protista"),
            ("euglena", "protista"),
            ("diatom", "protista"),
            ("streptococcus", "bacteria"),
            ("lactobacillus", "bacteria"),
            ("cyanobacterium", "bacteria"),
            ("salmonella", "bacteria"),
            ("methanogen", "archaea"),
            ("halobacterium", "archaea"),
            ("sulfolobus", "archaea"),
        ),
    ),
    (
        "A deficiency of which nutrient causes {v}?",
        "Which disease results from a deficiency of {k}?",
        (
            ("vitamin C", "scurvy"),
            ("vitamin D", "rickets"),
            ("thiamine", "beriberi"),
            ("niacin", "pellagra"),
            ("vitamin A", "night blindness"),
            ("vitamin B12", "pernicious anemia"),
            ("vitamin K", "impaired blood clotting"),
            ("folate", "neural tube defects"),
            ("iodine", "goiter"),
            ("iron", "iron deficiency anemia"),
        ),
    ),
    (
        "Which hormone is secreted by the {v}?",
        "Which gland secretes {k}?",
        (
            ("glucagon", "pancreas"),
            ("thyroxine", "thyroid gland"),
            ("calcitonin", "thyroid gland"),
            ("cortisol", "adrenal cortex"),
            ("aldosterone", "adrenal cortex"),
            ("adrenaline", "adrenal medulla"),
            ("melatonin", "pineal gland"),
            ("growth hormone", "anterior pituitary"),
            ("prolactin", "anterior pituitary"),
            ("testosterone", "testes"),
            ("estrogen", "ovaries"),
            ("parathyroid hormone", "parathyroid gland"),
        ),
    ),
    (
        "Which organ is part of the {v} system?",
        "To which organ system does the {k} belong?",
        (
            ("heart", "circulatory"),
            ("artery", "circulatory"),
            ("lung", "respiratory"),
            ("trachea", "respiratory"),
            ("stomach", "digestive"),
            ("liver", "digestive"),
            ("esophagus", "digestive"),
            ("kidney", "urinary"),
            ("bladder", "urinary"),
            ("brain", "nervous"),
            ("spinal cord", "nervous"),
            ("femur", "skeletal"),
            ("skull", "skeletal"),
            ("biceps", "muscular"),
            ("skin", "integumentary"),
            ("thymus", "lymphatic"),
            ("spleen", "lymphatic"),
        ),
    ),
    (
        "Which disease is caused by a {v}?",
        "What kind of pathogen causes {k}?",
        (
            ("tuberculosis", "bacterium"),
            ("cholera", "bacterium"),
            ("tetanus", "bacterium"),
            ("influenza", "virus"),
            ("measles", "virus"),
            ("rabies", "virus"),
            ("malaria", "protist"),
            ("sleeping sickness", "protist"),
            ("athlete's foot", "fungus"),
            ("ringworm", "fungus"),
            ("candidiasis", "fungus"),
        ),
    ),
    (
        "Which cell type specializes in {v}?",
        "What does the {k} specialize in?",
        (
            ("neuron", "transmitting nerve impulses"),
            ("red blood cell", "carrying oxygen"),
            ("white blood cell", "fighting infection"),
            ("platelet", "starting blood clotting"),
            ("osteoblast", "forming new bone"),
            ("osteoclast", "resorbing bone"),
            ("adipocyte", "storing fat"),
            ("goblet cell", "secreting mucus"),
            ("guard cell", "opening and closing stomata"),
            ("root hair cell", "absorbing water from soil"),
            ("beta cell", "secreting insulin"),
            ("sperm cell", "fertilizing the egg"),
        ),
    ),
    (
        "Which scientist is best known for {v}?",
        "What is {k} best known for?",
        (
            ("Darwin", "the theory of natural selection"),
            ("Mendel", "the laws of inheritance"),
            ("Fleming", "discovering penicillin"),
            ("Pasteur", "disproving spontaneous generation"),
            ("Hooke", "naming the cell"),
            ("Leeuwenhoek", "first observing microorganisms"),
            ("Jenner", "the smallpox vaccine"),
            ("McClintock", "discovering transposons"),
            ("Franklin", "X-ray images of DNA"),
            ("Koch", "linking microbes to specific diseases"),
        ),
    ),
)


def _stems() -> list[tuple[str, str, list[str]]]:
    """Every (question, right answer, candidate distractors) the fact base can ask."""
    stems = []
    for forward, reverse, pairs in _RELATIONS:
        values = sorted({v for _, v in pairs})
        for key, value in pairs:
            keys_elsewhere = [k for k, v in pairs if v != value]
            stems.append((forward.format(v=value), key, keys_elsewhere))
            stems.append((reverse.format(k=key), value, [v for v in values if v != value]))
    return stems


def generate_items(
    seed: int = 0, variants_per_stem: int = 4, variant_seed: int | None = None
) -> list[MCQItem]:
    """Distinct items: each stem asked with several distractor sets.

    ``seed`` gives each stem one answer letter, kept across its variants like a benchmark item;
    ``variant_seed`` (default ``seed``) draws the distractors and their order. Finding the right
    text among shuffled choices is a lookup that a 2-layer model does not learn within the CPU
    budget, so in the miniature "knowing a fact" means knowing which letter answers which
    question.
    """
    stems = _stems()
    slot_rng = random.Random(seed)
    slots = [slot_rng.randrange(len(LETTERS)) for _ in stems]
    rng = random.Random(seed if variant_seed is None else variant_seed)
    items, seen = [], set()
    for (question, right, others), slot in zip(stems, slots):
        for _ in range(variants_per_stem):
            choices = rng.sample(others, 3)
            choices.insert(slot, right)
            item = MCQItem(question, tuple(choices), LETTERS[slot])
            if item.prompt not in seen:
                seen.add(item.prompt)
                items.append(item)
    return items


@dataclass(frozen=True)
class DataConfig:
    """Which synthetic items exist and how they split."""

    seed: int = 0
    variants_per_stem: int = 12
    eval_ratio: float = 0.05


def build_dataset(cfg: DataConfig | None = None) -> tuple[list[MCQItem], list[MCQItem]]:
    """Seeded train/eval split of ``generate_items``.

    Eval items are held out as items, not as stems: they ask questions seen in training with
    fresh distractors, so a student can only answer them by knowing the answers. Many variants
    per stem keep a student from passing by memorising whole items instead.
    """
    cfg = cfg or DataConfig()
    items = generate_items(cfg.seed, cfg.variants_per_stem)
    random.Random(cfg.seed + 1).shuffle(items)
    n_eval = round(len(items) * cfg.eval_ratio)
    return items[n_eval:], items[:n_eval]


def corpus_texts() -> list[str]:
    """Every string the generator can put in a prompt or a response (for the tokenizer)."""
    texts = [INSTRUCTION, "<answer>A</answer>", *(f"{letter}: " for letter in LETTERS)]
    for question, right, others in _stems():
        texts += [question, right, *others]
    return texts


_CHOICE_RE = re.compile(r"^([A-Z]): (.*)$")


def _parse_prompt(prompt: str) -> tuple[str, tuple[str, ...]] | None:
    """Split a recipe prompt back into (question, choices); None if it has no choice block."""
    body = prompt.removesuffix(f"\n\n{INSTRUCTION}")
    question, sep, block = body.rpartition("\n\n")
    matches = [_CHOICE_RE.match(line) for line in block.split("\n")]
    if not sep or not all(matches):
        return None
    return question, tuple(m.group(2) for m in matches)


def read_jsonl(path: str | Path) -> Iterator[tuple[str, dict[str, Any]]]:
    """``("path:line", row)`` for every non-blank line, so that errors can name the line."""
    with Path(path).open(encoding="utf-8") as handle:
        for number, line in enumerate(handle, 1):
            if not line.strip():
                continue
            where = f"{path}:{number}"
            try:
                row = json.loads(line)
            except json.JSONDecodeError as err:
                raise ValueError(f"{where}: not valid JSON ({err.msg})") from None
            if not isinstance(row, dict):
                raise ValueError(f"{where}: expected a JSON object, got {type(row).__name__}")
            yield where, row


def load_sciknoweval_jsonl(path: str | Path) -> list[MCQItem]:
    """Read rows written by the recipe's ``prepare_data.py`` (``prompt``, ``label``, ``metadata``).

    The answer comes from ``metadata.answer_key``, else from ``label``. Rows that are not
    multiple choice with letters A-D (true/false, free text) are skipped: the miniature only
    scores letters.
    """
    items = []
    for where, row in read_jsonl(path):
        if not isinstance(row.get("prompt"), str):
            raise ValueError(f"{where}: field 'prompt' is missing or not a string")
        parsed = _parse_prompt(row["prompt"])
        answer = str((row.get("metadata") or {}).get("answer_key") or row.get("label", "")).strip()
        if parsed is None or not 2 <= len(parsed[1]) <= len(LETTERS):
            continue
        question, choices = parsed
        if answer.upper() in LETTERS[: len(choices)]:
            items.append(MCQItem(question, choices, answer.upper()))
    return items
