// The automatic tile choice of the SM80 family per head_dim bucket (the fastest in an H200 tile
// sweep, bench/NOTES.md): 128 query rows on 4 warps while the accumulators fit the register file
// without spilling, 64 rows where they would not, 8 warps for the widest head dims. The family
// marks that tile's entry as the automatic one, and the minimal instantiation set builds only it.
#pragma once

namespace flashcute::sm80 {

struct DefaultTile {
  int m_block, n_block, num_threads;
};

constexpr DefaultTile default_tile(int head_dim_bucket) {
  if (head_dim_bucket <= 32) return {64, 64, 128};
  if (head_dim_bucket <= 128) return {128, 64, 128};
  if (head_dim_bucket <= 192) return {64, 64, 128};
  return {128, 64, 256};
}

}  // namespace flashcute::sm80
