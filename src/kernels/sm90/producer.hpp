// The producer: one thread of the producer warpgroup issues every TMA load of a tile. Q arrives
// once per tile on its own barrier; K and V stream through their pipelines in the order the
// consumers use them (last key block first). The pipelines run on across tiles, so the next
// tile's first K/V blocks load while the consumers finish the current one.
#pragma once

#include "kernels/sm90/tile_info.hpp"
#include "kernels/sm90/traits.hpp"

namespace flashcute::sm90 {

template <class Traits, class Params>
struct Producer {
  using Pipeline = typename Traits::Pipeline;
  using PipelineState = typename Traits::PipelineState;

  CUTE_DEVICE static void run(Params const& p, typename Traits::SharedStorage& smem,
                              Pipeline& pipe_k, Pipeline& pipe_v, PipelineState& state,
                              TileInfo const& tile, int head, int iteration) {
    using TileQ = Shape<Int<Traits::kBlockM>, Int<Traits::kHeadDim>>;
    using TileKV = Shape<Int<Traits::kBlockN>, Int<Traits::kHeadDim>>;
    int kv_head = head / p.heads_per_kv_head;

    // Row 0 of these views is the sequence's first token (packed) or row (dense).
    Tensor mQ = domain_offset(make_coord(tile.q_start, _0{}),
                              p.tma_q.get_tma_tensor(p.shape_q)(_, _, head, tile.batch));
    Tensor mK = domain_offset(make_coord(tile.k_start, _0{}),
                              p.tma_k.get_tma_tensor(p.shape_k)(_, _, kv_head, tile.batch));
    Tensor mV = domain_offset(make_coord(tile.k_start, _0{}),
                              p.tma_v.get_tma_tensor(p.shape_k)(_, _, kv_head, tile.batch));
    Tensor gQ = local_tile(mQ, TileQ{}, make_coord(tile.m_block, _0{}));
    Tensor sQ = make_tensor(make_smem_ptr(smem.q.data()), typename Traits::SmemLayoutQ{});
    Tensor sK = make_tensor(make_smem_ptr(smem.k.data()), typename Traits::SmemLayoutKV{});
    Tensor sV = make_tensor(make_smem_ptr(smem.v.data()), typename Traits::SmemLayoutKV{});

    auto tQ = tma_partition(p.tma_q, _0{}, Layout<_1>{}, group_modes<0, 2>(sQ),
                            group_modes<0, 2>(gQ));  // (global, shared); a lambda uses it below
    // (global, shared) partitions of K and V blocks: block n starts at key n * kBlockN, except a
    // packed sequence's partial last block (tile.key0), which a second view shifted back by
    // less than a block provides.
    int const n_last = (tile.seqlen_k - 1) / Traits::kBlockN;
    int const shift = tile.key0<Traits>(p, n_last) - n_last * Traits::kBlockN;
    auto kv_blocks = [&](auto const& tma, auto const& mX, auto const& sX, int offset) {
      Tensor gX = local_tile(domain_offset(make_coord(offset, _0{}), mX), TileKV{},
                             make_coord(_, _0{}));  // (N, D, n_blocks)
      return tma_partition(tma, _0{}, Layout<_1>{}, group_modes<0, 2>(sX), group_modes<0, 2>(gX));
    };
    auto [tKg, tKs] = kv_blocks(p.tma_k, mK, sK, 0);
    auto [tVg, tVs] = kv_blocks(p.tma_v, mV, sV, 0);
    Tensor tKg_last = get<0>(kv_blocks(p.tma_k, mK, sK, shift));
    Tensor tVg_last = get<0>(kv_blocks(p.tma_v, mV, sV, shift));

    // Q is loaded for every tile, even one with no visible key, so that both sides count the
    // Q buffer's phases the same way. Its first K block goes out before the wait for Q's buffer.
    auto load_q = [&] {
      if (iteration > 0) smem.bar_q_free.wait((iteration - 1) & 1);
      smem.bar_q.arrive_and_expect_tx(Traits::kBytesQ);
      copy(p.tma_q.with(reinterpret_cast<uint64_t&>(smem.bar_q), 0), get<0>(tQ), get<1>(tQ));
    };
    if (tile.n_block_max <= tile.n_block_min) load_q();

    for (int n = tile.n_block_max - 1; n >= tile.n_block_min; --n) {
      bool const last = n == n_last;
      pipe_k.producer_acquire(state);
      copy(p.tma_k.with(*pipe_k.producer_get_barrier(state), 0), last ? tKg_last(_, n) : tKg(_, n),
           tKs(_, state.index()));
      if (n == tile.n_block_max - 1) load_q();
      pipe_v.producer_acquire(state);
      copy(p.tma_v.with(*pipe_v.producer_get_barrier(state), 0), last ? tVg_last(_, n) : tVg(_, n),
           tVs(_, state.index()));
      ++state;
    }
  }
};

}  // namespace flashcute::sm90
