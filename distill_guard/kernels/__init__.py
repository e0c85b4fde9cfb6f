"""Triton kernels over full-vocabulary rows: :mod:`.signals` (the guard's entropy and JSD) and
:mod:`.fused_loss` (the fused loss of :mod:`distill_guard.losses`), on :mod:`.shared`'s online
softmax. Each needs the ``[gpu]`` extra; :mod:`distill_guard.triton_kernels` re-exports them."""
