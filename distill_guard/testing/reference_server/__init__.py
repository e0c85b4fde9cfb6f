"""The reference server: a :class:`TorchTeacher` behind SGLang's native HTTP endpoints. It is not SGLang.

For offline runs and tests of everything that talks to a teacher over HTTP. Request, response
and error shapes follow ``docs/sglang-contract.md`` to the field, quirks included (entry 0 of
``input_token_logprobs`` is ``[null, id, null]``, ``input_top_logprobs[0]`` is ``null``,
``/flush_cache`` answers plain text, ``/health`` stays green with zeroed weights). It only scores
(``max_new_tokens`` must be 0) and has no tokenizer.

``version`` picks the SGLang release emulated, and everything that differs per version follows
the version table (``docs/sglang-contract.md`` §7.2, ``distill_guard.teachers.sglang_versions``):
the pause and its modes, what a release asserts and a flush requires, the checksum's shape, the
reload's fields. Where SGLang's process dies (a forward over released memory, a release its
version's assert refuses, a second release, a resume of a tag not released, a reload whose
asserted flush is refused), this one dies: the killing request gets a 500 saying so, and then
nothing answers. ``sampling_params.temperature`` is checked as SGLang checks it and otherwise
ignored: input logprobs are at T = 1 whatever it says, as in every SGLang release.
"""

from distill_guard.testing.reference_server.engine import ReferenceServer
from distill_guard.testing.reference_server.serve import ServerThread, serve, serve_in_thread

__all__ = ["ReferenceServer", "ServerThread", "serve", "serve_in_thread"]
