"""atheris harness of the ``ibnetdiscover`` target (:mod:`fuzz.targets`):
``python -m fuzz.fuzz_ibnetdiscover -max_total_time=60 CORPUS_DIR`` (see :mod:`fuzz.harness`)."""

from fuzz.harness import main

if __name__ == "__main__":
    main("ibnetdiscover")
