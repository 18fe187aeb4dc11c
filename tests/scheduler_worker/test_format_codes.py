"""The C++ kernels and the Python tables agree on what crosses the op boundary: each row
of quant/formats.py's FORMATS (its `fmt` code, bits, unit, stored m) against its row of
csrc/quant/formats.h (FORMAT_ROWS, named by the form in capitals), each kernel path's
`isa` index (kernels.ISAS) against the enums of kernels/csrc, and the forms the AMX path
runs on the tile unit (formats.AMX_FORMS) against the (format, ISA) table of
csrc/quant/qlinear.cpp, all read from the sources (no build needed). A format or ISA added
on one side only fails here, not as wrong numbers."""

from __future__ import annotations

import re
from pathlib import Path

from scheduler_worker.kernels import ISAS
from scheduler_worker.quant.formats import AMX_FORMS, FMT_CODES, ROWS

CSRC = Path(__file__).resolve().parents[2] / "scheduler_worker" / "kernels" / "csrc"
CPP_FORM = {form: form.upper() for form in FMT_CODES}  # the C++ name of each Python form
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
    assert codes["NFMT"] == len(FMT_CODES)


def cpp_rows() -> list[dict[str, str]]:
    """FORMAT_ROWS of csrc/quant/formats.h in order: each row's designated fields."""
    text = (CSRC / "quant" / "formats.h").read_text()
    body = text[text.index("FORMAT_ROWS[NFMT] = {") :]
    body = body[: body.index("\n};")]
    rows = re.findall(r"\{(\.name[^}]*)\}", body)
    return [dict(re.findall(r"\.(\w+) = ([^,]+)", row)) for row in rows]


def test_every_python_row_matches_its_cpp_row():
    rows = cpp_rows()
    assert len(rows) == len(ROWS)
    for f in ROWS:
        cpp = rows[f.code]
        assert int(cpp["bits"]) == f.bits, (f.form, cpp)
        assert {"QK_K": 256}.get(cpp.get("unit", "QK"), 32) == f.unit, (f.form, cpp)
        assert (cpp.get("min", "Min::NONE") != "Min::NONE") == f.stores_m, (f.form, cpp)
        assert cpp["name"] == f'"{"/".join(f.gguf)}"', (f.form, cpp)


def test_every_kernel_path_has_the_kernels_index():
    codes = cpp_codes()
    assert list(CPP_ISA) == list(ISAS)
    for i, isa in enumerate(ISAS):
        assert codes.get(CPP_ISA[isa]) == i, (isa, i, codes.get(CPP_ISA[isa]))


def kernel_table() -> dict[str, list[str]]:
    """The rows of qlinear.cpp's (format, ISA) table of tiles: C++ format name -> its
    AVX2, AVX512, AMX entries."""
    text = (CSRC / "quant" / "qlinear.cpp").read_text()
    start = text.index("TILES[] = {")
    body = text[start : text.index("};", start)]
    rows = re.findall(r"\{(\w+), \{([^}]*)\}\}", body)
    return {name: [e.strip() for e in entries.split(",")] for name, entries in rows}


def test_the_tile_table_names_each_formats_own_kernels():
    """A row per format with tiles, in code order, each entry that format's kernel of that
    ISA or null; a format without a row runs its portable kernel (generic::EVERY)."""
    table = kernel_table()
    codes = cpp_codes()
    assert list(table) == sorted(table, key=lambda name: codes[name])
    assert set(table) <= set(CPP_FORM.values())
    for name, entries in table.items():
        assert len(entries) == len(ISAS) - 1, (name, entries)
        for isa, entry in zip(ISAS[1:], entries, strict=True):
            assert entry in ("nullptr", f"&{isa}::groups<{name}>"), (name, entry)


def test_the_forms_the_amx_path_runs_on_the_tile_unit_are_the_tables():
    amx = {name for name, entries in kernel_table().items() if entries[-1] != "nullptr"}
    assert {CPP_FORM[form] for form in AMX_FORMS} == amx
