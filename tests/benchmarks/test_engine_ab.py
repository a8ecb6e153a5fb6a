from interlock.benchmarks.engine_ab import renamed_library

OPS = """TORCH_LIBRARY(interlock_cpu, m) {
  m.def("int8_kernel() -> str", &interlock_cpu::int8_kernel);
}
TORCH_LIBRARY_IMPL(interlock_cpu, CPU, m) { m.impl("int8_linear", &interlock_cpu::int8_linear); }
"""


def test_renamed_library_moves_only_the_registrations() -> None:
    text = renamed_library(OPS, "interlock_cpu_base")
    assert "TORCH_LIBRARY(interlock_cpu_base, m)" in text and "TORCH_LIBRARY_IMPL(interlock_cpu_base, CPU, m)" in text
    assert "TORCH_LIBRARY(interlock_cpu," not in text and "TORCH_LIBRARY_IMPL(interlock_cpu," not in text
    # The C++ namespace of the functions stays: each build is a library of its own.
    assert "&interlock_cpu::int8_kernel" in text and "&interlock_cpu::int8_linear" in text
