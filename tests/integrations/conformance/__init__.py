"""The adapter conformance suite: the same scenarios on every adapter (``test_conformance.py``).

One driver per adapter (``adapters.py``), behind one protocol: run the adapter's own training
loop, in its host framework's order of events, with the teacher poisoned mid-run or not; resume
from the halt. Each run is judged by what the trainer consumed: an optimizer step that moved the
student while the teacher scores it used were the dead teacher's is a *poisoned update*.
"""
