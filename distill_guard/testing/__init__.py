"""Test and demo helpers: never needed by a guarded run.

- :mod:`.reference_server`: SGLang's native HTTP API over a torch teacher (not SGLang), split into
  the emulated engine, the HTTP app and the serving.
- :mod:`.servers`: reference servers in a thread or a child process, on loopback.
- :mod:`.tiny`: tiny seeded Qwen3 models on disk.
- :mod:`.histories`: synthetic metric histories shaped like the failed and the healthy run.
"""
