"""ibnetdiscover import on damaged real dumps (lines dropped, duplicated or swapped, bytes
flipped, the file cut short, numbers replaced) and on random text: FabricImportError or a
fabric that validates, nothing else."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fuzz.strategies import mutated
from fuzz.targets import ibnetdiscover, seeds
from linkguard.topology.ibnetdiscover import FabricImportError, import_ibnetdiscover
from tests.fuzz.profiles import FUZZ


@pytest.fixture(scope="module")
def dumps(real_fixtures) -> list[bytes]:
    """X5.topofile (a real 100-node QDR/DDR fabric), the ibsim nets, and a generated
    fabric's export."""
    return seeds("ibnetdiscover")


def test_mutated_real_dumps(dumps: list[bytes]) -> None:
    @FUZZ
    @given(st.sampled_from(dumps).flatmap(lambda d: mutated(d, max_ops=6)))
    def check(data: bytes) -> None:
        ibnetdiscover(data)  # FabricImportError, or a fabric that validates

    check()


def test_truncated_real_dump_at_every_line(dumps: list[bytes]) -> None:
    """The real dump cut after each of its 922 lines imports or fails with a file and line."""
    lines = dumps[0].splitlines(keepends=True)
    for n in range(1, len(lines), 7):
        ibnetdiscover(b"".join(lines[:n]))


@FUZZ
@given(
    st.lists(
        st.one_of(
            st.text(max_size=60),
            st.sampled_from(
                [
                    'Switch\t36 "S-0008f10500200b50"\t# "sw" enhanced port 0 lid 9 lmc 0',
                    '[1]\t"H-003048c749cd0000"[1](3048c749cd0001)\t# "h" lid 72 4xDDR',
                    'Ca\t1 "H-003048c749cd0000"\t# "node01 mlx5_0"',
                    '[1](3048c749cd0001)\t"S-0008f10500200b50"[1]\t# lid 72 lmc 0 "sw" lid 9 4xQDR',
                    "switchguid=0x8f10500200b50(8f10500200b50)",
                    "caguid=0x3048c749cd0000",
                    'Hca 2 "hca1"',
                    '[1] "Switch1"[1] w=4 s=4',
                ]
            ),
        ),
        max_size=12,
    ).map(lambda lines: "\n".join(lines).encode())
)
def test_random_line_soup(data: bytes) -> None:
    ibnetdiscover(data)


def test_regression_a_path_with_a_nul_byte_is_a_fabric_import_error() -> None:
    """Was a bare ValueError ("embedded null byte") out of Path.read_bytes()."""
    with pytest.raises(FabricImportError, match="cannot read topology file"):
        import_ibnetdiscover("dump\0.txt")


@pytest.mark.parametrize(
    "text",
    [
        "Switch " + "1" * 5000 + ' "S-0008f10500200b50"\n',
        'Switch 8 "Switch1"\n[' + "1" * 5000 + '] "Hca1"[1]\n',
        'Switch 8 "Switch1"\n[1] "Hca1"[' + "1" * 5000 + "]\n",
        'Switch 8 "Switch1"\n[1] "Hca1"[1] w=' + "4" * 5000 + "\n",
    ],
    ids=["port-count", "port", "remote-port", "width-mask"],
)
def test_regression_numbers_of_5000_digits_are_import_errors(text: str) -> None:
    """Were bare ValueErrors from int() (more than 4,300 digits), not FabricImportError."""
    with pytest.raises(FabricImportError, match=r"<text>:\d+: "):
        import_ibnetdiscover(text)


def test_regression_an_ibsim_mask_with_a_leading_zero_is_read() -> None:
    """``w=04`` was a bare ValueError: int(..., 0) refuses leading zeros."""
    result = import_ibnetdiscover(
        'Switch 8 "Switch1"\n[1] "Hca1"[1] w=04 s=02\n\nHca 1 "Hca1"\n[1] "Switch1"[1]\n'
    )
    (link,) = result.fabric.links
    assert link.rate_gbps == 40.0  # w=4: 8x (ibsim/sim.h), s=2: DDR, 5 Gb/s per lane
