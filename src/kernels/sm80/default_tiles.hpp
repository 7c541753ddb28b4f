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
  // Tile sweep of 2026-11-30 (bench/NOTES.md, b 4 s 4096 bf16): 64 x 64 on 4 warps leads at
  // d 32 and ties at d 160/192; 128 x 64 on 4 warps leads from d 64 to 128; 8 warps from d 224.
  if (head_dim_bucket <= 32) return {64, 64, 128};
  if (head_dim_bucket <= 128) return {128, 64, 128};
  if (head_dim_bucket <= 192) return {64, 64, 128};
  return {128, 64, 256};
}

}  // namespace flashcute::sm80
