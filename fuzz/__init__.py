"""Fuzzing linkguard's untrusted inputs: sysfs files, ibnetdiscover dumps, scenario files,
config files and environment, and every bus message.

Consumes: arbitrary bytes, from libFuzzer through atheris (``python -m fuzz.fuzz_<target>``),
from hypothesis (``tests/fuzz/``) or from :mod:`fuzz.run`'s random engine. Produces: nothing
when linkguard handled an input, an exception (a crash) when it did not.

- :mod:`fuzz.targets`: one target per input kind, ``target(data: bytes) -> None``, with a seed
  corpus built from the real captures in ``../shared/fixtures/real`` and the shipped scenarios;
- :mod:`fuzz.live`: a running topology service and two agents on an in-memory broker, for the
  ``bus`` target and the hypothesis tests of the message handlers;
- :mod:`fuzz.strategies`: hypothesis strategies (mutations of seeds, random JSON and YAML);
- :mod:`fuzz.harness`: the atheris entry point that the ``fuzz_<target>.py`` scripts call;
- :mod:`fuzz.run`: every target for a bounded time, the inputs tried and crashes per target
  (CI: ``python -m fuzz.run --seconds 75``).
"""
