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
                              TileInfo const& tile, int head, int batch, int iteration) {
    int kv_head = head / p.heads_per_kv_head;

    Tensor mQ = p.tma_q.get_tma_tensor(p.shape_q)(_, _, head, batch);
    Tensor mK = p.tma_k.get_tma_tensor(p.shape_k)(_, _, kv_head, batch);
    Tensor mV = p.tma_v.get_tma_tensor(p.shape_k)(_, _, kv_head, batch);
    Tensor gQ = local_tile(mQ, Shape<Int<Traits::kBlockM>, Int<Traits::kHeadDim>>{},
                           make_coord(tile.m_block, _0{}));
    Tensor gK = local_tile(mK, Shape<Int<Traits::kBlockN>, Int<Traits::kHeadDim>>{},
                           make_coord(_, _0{}));  // (N, D, n_blocks)
    Tensor gV = local_tile(mV, Shape<Int<Traits::kBlockN>, Int<Traits::kHeadDim>>{},
                           make_coord(_, _0{}));
    Tensor sQ = make_tensor(make_smem_ptr(smem.q.data()), typename Traits::SmemLayoutQ{});
    Tensor sK = make_tensor(make_smem_ptr(smem.k.data()), typename Traits::SmemLayoutKV{});
    Tensor sV = make_tensor(make_smem_ptr(smem.v.data()), typename Traits::SmemLayoutKV{});

    auto tQ = tma_partition(p.tma_q, _0{}, Layout<_1>{}, group_modes<0, 2>(sQ),
                            group_modes<0, 2>(gQ));  // (global, shared); a lambda uses it below
    auto [tKg, tKs] = tma_partition(p.tma_k, _0{}, Layout<_1>{}, group_modes<0, 2>(sK),
                                    group_modes<0, 2>(gK));
    auto [tVg, tVs] = tma_partition(p.tma_v, _0{}, Layout<_1>{}, group_modes<0, 2>(sV),
                                    group_modes<0, 2>(gV));

    // Q is loaded for every tile, even one with no visible key, so that both sides count the
    // Q buffer's phases the same way. Its first K block goes out before the wait for Q's buffer.
    auto load_q = [&] {
      if (iteration > 0) smem.bar_q_free.wait((iteration - 1) & 1);
      smem.bar_q.arrive_and_expect_tx(Traits::kBytesQ);
      copy(p.tma_q.with(reinterpret_cast<uint64_t&>(smem.bar_q), 0), get<0>(tQ), get<1>(tQ));
    };
    if (tile.n_block_max <= 0) load_q();

    for (int n = tile.n_block_max - 1; n >= 0; --n) {
      pipe_k.producer_acquire(state);
      copy(p.tma_k.with(*pipe_k.producer_get_barrier(state), 0), tKg(_, n), tKs(_, state.index()));
      if (n == tile.n_block_max - 1) load_q();
      pipe_v.producer_acquire(state);
      copy(p.tma_v.with(*pipe_v.producer_get_barrier(state), 0), tVg(_, n), tVs(_, state.index()));
      ++state;
    }
  }
};

}  // namespace flashcute::sm90
