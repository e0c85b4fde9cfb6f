"""`make demo` (until the SDPO example lands): replay a healthy and a collapsed history."""

from __future__ import annotations

from pathlib import Path

from distill_guard.history import load_history
from distill_guard.replay import format_table, replay
from distill_guard.report import plot_replay
from distill_guard.synthetic import QWEN3_VOCAB, collapsed_history, healthy_history, write_jsonl

OUT = Path("outputs/demo")


def main() -> None:
    for name, rows in (("healthy", healthy_history()), ("collapsed", collapsed_history())):
        path = write_jsonl(rows, OUT / f"{name}.jsonl")
        result = replay(load_history(path), "default", [f"run.vocab_size={QWEN3_VOCAB}"])
        plot_replay(result, OUT / f"{name}.png")
        print(format_table(result))
        print(
            f"halt_step={result.halt_step}  exit code={result.exit_code()}  plot={OUT / f'{name}.png'}\n"
        )


if __name__ == "__main__":
    main()
