"""atheris harness of the ``bus`` target (:mod:`fuzz.targets`):
``python -m fuzz.fuzz_bus -max_total_time=60 CORPUS_DIR`` (see :mod:`fuzz.harness`)."""

from fuzz.harness import main

if __name__ == "__main__":
    main("bus")
