"""models/gguf_file.py reads what gguf.GGUFReader reads: every metadata value and every tensor's
name, type, shape and bytes."""
from __future__ import annotations

import gguf
import numpy as np
import pytest
from gguf import quants

from interlock.models.gguf_file import GGUFFile


def test_the_same_fields_and_tensors_as_gguf_reader(tmp_path) -> None:
    rng = np.random.default_rng(0)
    path = tmp_path / "m.gguf"
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_uint32("a.u32", 7)
    w.add_int64("a.i64", -3)
    w.add_float32("a.f32", 0.25)
    w.add_bool("a.bool", True)
    w.add_string("a.text", "héllo")
    w.add_array("a.strings", ["x", "", "zz" * 40])
    w.add_array("a.ints", [1, 2, 3])
    w.add_array("a.floats", [0.5, -1.5])
    for kind in ("F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0"):
        t = gguf.GGMLQuantizationType[kind]
        x = rng.standard_normal((3, 64)).astype(np.float32)
        data = x if kind == "F32" else x.astype(np.float16) if kind == "F16" else quants.quantize(x, t)
        w.add_tensor(f"t.{kind}", data, raw_dtype=None if kind in ("F32", "F16") else t)
    w.add_tensor("t.vector", rng.standard_normal(64).astype(np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()

    ours, theirs = GGUFFile(path), gguf.GGUFReader(str(path))
    for key, field in theirs.fields.items():
        if not key.startswith("GGUF."):
            assert ours.fields[key].contents() == field.contents(), key
    assert len(ours.tensors) == len(theirs.tensors)
    for a, b in zip(ours.tensors, theirs.tensors, strict=True):
        assert (a.name, a.tensor_type, list(a.shape)) == (b.name, b.tensor_type, list(b.shape))
        assert a.data.shape == b.data.shape and a.data.dtype == b.data.dtype, a.name
        assert np.array_equal(np.asarray(a.data), np.asarray(b.data)), a.name


def test_a_truncated_file_is_a_value_error(tmp_path) -> None:
    path = tmp_path / "cut.gguf"
    path.write_bytes(b"GGUF" + (3).to_bytes(4, "little") + (1).to_bytes(8, "little") + (5).to_bytes(8, "little"))
    with pytest.raises(ValueError, match="truncated"):
        GGUFFile(path)
    (tmp_path / "other").write_bytes(b"not a gguf file at all" * 4)
    with pytest.raises(ValueError, match="magic"):
        GGUFFile(tmp_path / "other")
