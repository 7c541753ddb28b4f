// The automatic tile choice of the SM80 family per head_dim bucket (the fastest in an H200 tile
// sweep, bench/NOTES.md): 128 query rows on 4 warps while the accumulators fit the register file
// without spilling, 64 rows where they would not, 8 warps for the widest head dims. The family
// marks that tile's entry as the automatic one, and the minimal instantiation set builds it plus,
// where it needs more shared memory than the smallest devices allow, small_smem_tile.
#pragma once

namespace flashcute::sm80 {

struct DefaultTile {
  int m_block, n_block, num_threads;
};

constexpr bool same_tile(DefaultTile a, DefaultTile b) {
  return a.m_block == b.m_block && a.n_block == b.n_block && a.num_threads == b.num_threads;
}

constexpr DefaultTile default_tile(int head_dim_bucket) {
  if (head_dim_bucket <= 32) return {64, 64, 128};
  if (head_dim_bucket <= 128) return {128, 64, 128};
  if (head_dim_bucket <= 192) return {64, 64, 128};
  return {128, 64, 256};
}

// The smallest opt-in shared memory per block of the devices the family runs on: 99 KB on sm_86
// and sm_89 (sm_80 has 163 KB, sm_90 227 KB).
constexpr int kSmallestSmemPerBlock = 101376;

// Dynamic shared memory of a tile: the Q tile and two K/V tiles of 16-bit elements (the same sum
// as KernelTraits::kSmemBytes, which instantiate.cuh checks against it).
constexpr int tile_smem_bytes(DefaultTile tile, int head_dim_bucket) {
  return (tile.m_block + 2 * tile.n_block) * head_dim_bucket * 2;
}

// A tile of the bucket that fits the smallest devices: the automatic one where it fits, else
// 64x64 on 4 warps (what FlashAttention-2 runs there at head_dim 224 and 256). Dispatch falls
// back to it when the device cannot hold the automatic tile.
constexpr DefaultTile small_smem_tile(int head_dim_bucket) {
  const DefaultTile automatic = default_tile(head_dim_bucket);
  if (tile_smem_bytes(automatic, head_dim_bucket) <= kSmallestSmemPerBlock) return automatic;
  return {64, 64, 128};
}

constexpr bool small_smem_tiles_fit() {
  for (int bucket = 32; bucket <= 256; bucket += 32) {
    if (tile_smem_bytes(small_smem_tile(bucket), bucket) > kSmallestSmemPerBlock) return false;
  }
  return true;
}
static_assert(small_smem_tiles_fit(), "every bucket needs a tile that fits 99 KB");

}  // namespace flashcute::sm80
