"""Everything that calls a live teacher around sleep and wake.

- :mod:`.canary`: the canary measured before sleep and after wake.
- :mod:`.colocate`: the colocated teacher the guard sleeps, wakes, verifies and repairs.
- :mod:`.repair`: reload, flush and verify, with bounded retries.
- :mod:`.incidents`: repeats of one weight loss counted as one incident.
- :mod:`.module_canary`: the canary of an in-process teacher module, before each update.
- :mod:`.weights_fingerprint`: that module's weights fingerprint (the canary forward skipped
  while it is unchanged).
- :mod:`.preflight`: a teacher's configuration, read before training.
- :mod:`.launch_command`: SGLang's and Relax's launch command lines, read as server arguments.
- :mod:`.teacher_temperature`: whether the teacher scores at the run's temperature.
- :mod:`.probe`: preflight plus sleep/wake cycles with the canary (``distill-guard probe``).

The judgements themselves are pure and live in :mod:`distill_guard.checks`.
"""
