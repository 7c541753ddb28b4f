// The pieces every SM80-family kernel builds its tiles from: the m16n8k16 MMA of an element type,
// the bank-conflict-free shared-memory layout of a row-major tile, its transposed view, and the
// ldmatrix copy atoms that read them.
#pragma once

#include <cutlass/numeric_types.h>
#include <cute/tensor.hpp>

#include <type_traits>

namespace flashcute::sm80 {

template <class Element>
using Mma16816 =
    std::conditional_t<std::is_same_v<Element, cutlass::half_t>, cute::SM80_16x8x16_F32F16F16F32_TN,
                       cute::SM80_16x8x16_F32BF16BF16F32_TN>;

// A (rows x cols) row-major shared-memory layout whose 8-row slices ldmatrix reads without bank
// conflicts: 64-column atoms (128-byte rows, swizzle <3,3,3>) when cols allows, else 32 (64-byte
// rows, swizzle <2,3,3>): either way the 8 rows of one read hit 8 distinct bank groups.
template <int kRows, int kCols>
using SwizzledLayout = decltype(cute::tile_to_shape(
    cute::composition(cute::Swizzle < kCols % 64 == 0 ? 3 : 2, 3, 3 > {},
                      cute::Layout<cute::Shape<cute::_8, cute::Int<kCols % 64 == 0 ? 64 : 32>>,
                                   cute::Stride<cute::Int<kCols % 64 == 0 ? 64 : 32>, cute::_1>>{}),
    cute::Shape<cute::Int<kRows>, cute::Int<kCols>>{}));

// The (cols x rows) view of a (rows x cols) layout: the same bytes, as an MN-major operand (V read
// as the B operand of P.V, for example), read by ldmatrix.trans.
template <class Layout, int kRows, int kCols>
using TransposedLayout = decltype(cute::composition(
    Layout{},
    cute::make_layout(cute::Shape<cute::Int<kCols>, cute::Int<kRows>>{}, cute::GenRowMajor{})));

template <class Element>
using LdsmCopyAtom = cute::Copy_Atom<cute::SM75_U32x4_LDSM_N, Element>;
template <class Element>
using LdsmTransposedCopyAtom = cute::Copy_Atom<cute::SM75_U16x8_LDSM_T, Element>;

}  // namespace flashcute::sm80
