from interlock.benchmarks.kernel_ab import _renamed

HEADER = """#pragma once
namespace interlock_cpu {
template <int NB> inline void rows(int x) { block<NB, 1>(x); step<1, 1, false>(x); }
inline void int8_linear_raw(int x) { rows<4>(x); blocks(x); }
}  // namespace interlock_cpu
"""


def test_renamed_moves_a_header_into_its_own_namespace_with_its_helpers() -> None:
    text = _renamed(HEADER, "lin_a", ("block", "rows", "step"))
    assert "#pragma once" not in text
    assert "namespace lin_a {\nusing namespace interlock_cpu;" in text
    assert "}  // namespace lin_a" in text and "// namespace interlock_cpu" not in text
    # The helpers that take the shared types are renamed (argument-dependent lookup would otherwise
    # find this checkout's overloads); other names, and names that only start alike, are not.
    assert "lin_a_block<NB, 1>(x)" in text and "lin_a_step<1, 1, false>(x)" in text
    assert "inline void lin_a_rows(int x)" in text and "lin_a_rows<4>(x)" in text
    assert "blocks(x)" in text and "lin_a_blocks" not in text
    assert "inline void int8_linear_raw(int x)" in text
