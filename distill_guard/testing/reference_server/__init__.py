"""The reference server: a :class:`TorchTeacher` behind SGLang's native HTTP endpoints. It is not SGLang.

For offline runs and tests of everything that talks to a teacher over HTTP. Request, response
and error shapes follow ``docs/sglang-contract.md`` to the field, quirks included (entry 0 of
``input_token_logprobs`` is ``[null, id, null]``, ``input_top_logprobs[0]`` is ``null``,
``/flush_cache`` answers plain text, ``/health`` stays green with zeroed weights). It only scores
(``max_new_tokens`` must be 0), has no tokenizer, and serves one request at a time.

Emulated SGLang behaviour, and where it is a choice:

- A second release of a released tag kills SGLang's scheduler (torch_memory_saver ``exit(1)``).
  Here the release answers 500 and the server stays dead: every later request gets 503.
- Resume of a tag that is not released raises ``KeyError`` in SGLang: here 400 with that message.
- ``/generate`` while released is unconfirmed in SGLang; here it answers 400 and scores nothing.
- ``sampling_params.temperature`` is checked as SGLang checks it (a number, finite, >= 0) and
  otherwise ignored: input logprobs are at T = 1 whatever it says, as in every SGLang release.
- ``version`` picks the SGLang release emulated: tags, default tags, ``/server_info`` and ``/model_info``, the checksum.
"""

from distill_guard.testing.reference_server.engine import ReferenceServer
from distill_guard.testing.reference_server.serve import ServerThread, serve, serve_in_thread

__all__ = ["ReferenceServer", "ServerThread", "serve", "serve_in_thread"]
