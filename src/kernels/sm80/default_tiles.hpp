// The automatic tile choice of the SM80 family per head_dim bucket (fastest measured on an H200;
// see bench/NOTES.md: 128 query rows on 4 warps wins while its accumulators fit the register file
// without spilling; wider head dims need 8 warps). Shared by dispatch and by the minimal
// instantiation set.
#pragma once

namespace flashcute::sm80 {

struct DefaultTile {
  int m_block, n_block, num_threads;
};

constexpr DefaultTile default_tile(int head_dim_bucket) {
  if (head_dim_bucket <= 128) return {128, 64, 128};
  return {128, 64, 256};
}

}  // namespace flashcute::sm80
