"""atheris harness of the ``nccl_topo`` target (:mod:`fuzz.targets`):
``python -m fuzz.fuzz_nccl_topo -max_total_time=60 CORPUS_DIR`` (see :mod:`fuzz.harness`)."""

from fuzz.harness import main

if __name__ == "__main__":
    main("nccl_topo")
