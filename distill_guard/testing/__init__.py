"""Test and demo helpers: never needed by a guarded run.

- :mod:`.reference_server`: SGLang's native HTTP API over a torch teacher (not SGLang), split into
  the emulated engine, the HTTP app and the serving.
- :mod:`.servers`: reference servers in a thread or a child process, on loopback.
- :mod:`.tiny`: tiny seeded Qwen3 models on disk.
- :mod:`.standins`, :mod:`.lightning_standins`: the tiny random-init teacher, student, loader and
  LightningModule the docs' set-up blocks build (stand-ins for the user's own, never a teacher).
- :mod:`.histories`: synthetic metric histories shaped like the failed and the healthy run.
"""
