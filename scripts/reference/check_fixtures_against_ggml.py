#!/usr/bin/env python3
"""Checks tests/fixtures/quant against ggml's own C dequantizers (a second outside reference).

Needs llama-cpp-python built from source (see ../shared/PEERS.md): each type's `to_float`
is called from its libggml-base through ctypes and the bit mismatches with the fixtures
are counted. Exits non-zero on any mismatch.

Usage: python3 scripts/reference/check_fixtures_against_ggml.py
"""
import ctypes
import os
import sys

import llama_cpp
import numpy as np


class TypeTraits(ctypes.Structure):
    """ggml.h `struct ggml_type_traits` (ggml 0.25)."""
    _fields_ = [
        ("type_name", ctypes.c_char_p),
        ("blck_size", ctypes.c_int64),
        ("blck_size_interleave", ctypes.c_int64),
        ("type_size", ctypes.c_size_t),
        ("is_quantized", ctypes.c_bool),
        ("to_float", ctypes.c_void_p),
        ("from_float_ref", ctypes.c_void_p),
    ]


TO_FLOAT = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.POINTER(ctypes.c_float), ctypes.c_int64)
IDS = {
    "F16": 1, "Q4_0": 2, "Q4_1": 3, "Q5_0": 6, "Q5_1": 7, "Q8_0": 8, "Q2_K": 10, "Q3_K": 11,
    "Q4_K": 12, "Q5_K": 13, "Q6_K": 14, "IQ2_XXS": 16, "IQ2_XS": 17, "IQ3_XXS": 18,
    "IQ1_S": 19, "IQ4_NL": 20, "IQ3_S": 21, "IQ2_S": 22, "IQ4_XS": 23, "IQ1_M": 29, "BF16": 30,
}


def main():
    lib = ctypes.CDLL(os.path.join(os.path.dirname(llama_cpp.__file__), "lib", "libggml-base.so"))
    lib.ggml_get_type_traits.restype = ctypes.POINTER(TypeTraits)
    fixtures = os.path.join(os.path.dirname(__file__), "..", "..", "tests", "fixtures", "quant")
    bad = 0
    for name, type_id in IDS.items():
        traits = lib.ggml_get_type_traits(type_id).contents
        raw = np.fromfile(os.path.join(fixtures, f"{name}.blocks"), dtype=np.uint8)
        ref = np.fromfile(os.path.join(fixtures, f"{name}.f32"), dtype="<f4")
        out = np.zeros(ref.size, dtype=np.float32)
        TO_FLOAT(traits.to_float)(raw.ctypes.data, out.ctypes.data_as(ctypes.POINTER(ctypes.c_float)), ref.size)
        diff = int((out.view(np.uint32) != ref.view(np.uint32)).sum())
        print(f"{name:8} ggml {traits.type_name.decode():8} mismatches: {diff}")
        bad += diff
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
