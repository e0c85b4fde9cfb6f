"""The names of the guard presets (``distill_guard/conf/guard/*.yaml``), importable without
Hydra or torch: the CLI builds its parser, and answers ``--version``, from these alone."""

PRESETS = ("default", "monitor_only", "strict")
