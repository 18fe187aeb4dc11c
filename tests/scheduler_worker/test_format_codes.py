"""The C++ kernels and the Python tables agree on the codes that cross the op boundary:
each weight form's `fmt` (quant/formats.py FMT_CODES) and each kernel path's `isa` index
(kernels.ISAS) against the enums and constants of kernels/csrc, and the forms the AMX path
runs on the tile unit (formats.AMX_FORMS) against the (format, ISA) table of
csrc/quant/qlinear.cpp, all read from the sources (no build needed). A format or ISA added
on one side only fails here, not as wrong numbers."""

from __future__ import annotations

import re
from pathlib import Path

from scheduler_worker.kernels import ISAS
from scheduler_worker.quant.formats import AMX_FORMS, FMT_CODES

CSRC = Path(__file__).resolve().parents[2] / "scheduler_worker" / "kernels" / "csrc"
# the C++ name of each Python form / ISA
CPP_FORM = {"q4": "Q4", "q8": "Q8", "q5": "Q5", "q4k": "Q4K", "q5k": "Q5K", "q50": "Q50"}
CPP_FORM["q6k"] = "Q6K"
CPP_ISA = {"scalar": "SCALAR", "avx2": "AVX2", "avx512": "AVX512", "amx": "AMX"}


def cpp_codes() -> dict[str, int]:
    """Every `NAME = N` of the csrc enums (Fmt, KFmt, Isa) and `constexpr int64_t NAME = N`."""
    codes: dict[str, int] = {}
    for path in CSRC.rglob("*.h"):
        text = path.read_text()
        for body in re.findall(r"enum\s+\w+\s*:\s*\w+\s*\{([^}]*)\}", text):
            for name, value in re.findall(r"(\w+)\s*=\s*(\d+)", body):
                codes[name] = int(value)
        for name, value in re.findall(r"constexpr\s+int64_t\s+(\w+)\s*=\s*(\d+)\s*;", text):
            codes[name] = int(value)
    return codes


def test_every_weight_form_has_the_kernels_code():
    codes = cpp_codes()
    assert set(FMT_CODES) == set(CPP_FORM), "a form without its C++ name here, or the reverse"
    for form, code in FMT_CODES.items():
        assert codes.get(CPP_FORM[form]) == code, (form, code, codes.get(CPP_FORM[form]))
    assert len(set(FMT_CODES.values())) == len(FMT_CODES)  # no two forms share a code


def test_every_kernel_path_has_the_kernels_index():
    codes = cpp_codes()
    assert list(CPP_ISA) == list(ISAS)
    for i, isa in enumerate(ISAS):
        assert codes.get(CPP_ISA[isa]) == i, (isa, i, codes.get(CPP_ISA[isa]))


def kernel_table() -> dict[str, list[str]]:
    """The rows of qlinear.cpp's (format, ISA) table: C++ format name -> its four entries."""
    text = (CSRC / "quant" / "qlinear.cpp").read_text()
    body = text[text.index("GROUPS[NFMT] = {") : text.index("};", text.index("GROUPS[NFMT] = {"))]
    rows = re.findall(r"\{(\w+), \{([^}]*)\}\}", body)
    return {name: [e.strip() for e in entries.split(",")] for name, entries in rows}


def test_the_kernel_table_has_a_row_per_format_naming_its_own_kernels():
    table = kernel_table()
    assert list(table) == sorted(table, key=lambda name: cpp_codes()[name])  # code order
    assert set(table) == set(CPP_FORM.values())
    for name, entries in table.items():
        assert len(entries) == len(ISAS), (name, entries)
        assert entries[0] == f"&generic::groups<{name}>"  # every format has the portable one
        for isa, entry in zip(ISAS, entries, strict=True):
            assert entry in (
                "nullptr",
                f"&{'generic' if isa == 'scalar' else isa}::groups<{name}>",
            ), (name, entry)


def test_the_forms_the_amx_path_runs_on_the_tile_unit_are_the_tables():
    amx = {
        name for name, entries in kernel_table().items() if entries[ISAS.index("amx")] != "nullptr"
    }
    assert {CPP_FORM[form] for form in AMX_FORMS} == amx
