#pragma once
// Which SIMD code the kernels compile, decided once here from the compiler's target macros
// (-march=native). With INTERLOCK_NO_SIMD defined none of it is (kernels/native.py defines it for a
// process run with INTERLOCK_SIMD=0): the portable C++ that the SIMD paths are tested against, and
// the "before" of the benchmarks that time them.
#if !defined(INTERLOCK_NO_SIMD)
#if defined(__AVX512F__)
#define INTERLOCK_AVX512 1      // attention, elementwise, argmax: 16 fp32 lanes
#endif
#if defined(__AVX512VNNI__) && defined(__AVX512BW__)
#define INTERLOCK_VNNI 1        // int8_linear.h's dpbusd kernel (and AMX where the tiles exist)
#elif defined(__AVX2__) && defined(__FMA__)
#define INTERLOCK_AVX2 1        // int8_avx2.h: the same arithmetic from maddubs / madd
#endif
#if !defined(__AVX512F__) && defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#define INTERLOCK_AVX2_MATH 1   // avx2_math.h: 8 fp32 lanes where there are no 16
#endif
#endif

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif
