// fc_compiled_tile_configs and fc_default_tile_config agree with each other for every family,
// dtype and head_dim, and describe launchable tiles.
#include <gtest/gtest.h>

#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "flashcute/flashcute.h"

namespace flashcute {
namespace {

std::vector<fc_tile_config> compiled(int family, int dtype, int head_dim) {
  const int32_t n = fc_compiled_tile_configs(family, dtype, head_dim, nullptr, 0);
  std::vector<fc_tile_config> tiles(n);
  EXPECT_EQ(fc_compiled_tile_configs(family, dtype, head_dim, tiles.data(), n), n);
  return tiles;
}

TEST(TileConfigs, CompiledAndDefaultAgree) {
  int total = 0;
  for (int family : {FC_FAMILY_SM80, FC_FAMILY_SM90})
    for (int dtype : {FC_FLOAT16, FC_BFLOAT16})
      for (int head_dim = 8; head_dim <= 256; head_dim += 8) {
        const auto tiles = compiled(family, dtype, head_dim);
        total += int(tiles.size());
        std::set<std::tuple<int, int, int>> distinct;
        for (const fc_tile_config& t : tiles) {
          EXPECT_GT(t.m_block, 0);
          EXPECT_GT(t.n_block, 0);
          EXPECT_GT(t.num_threads, 0);
          EXPECT_EQ(t.num_threads % 32, 0);
          distinct.insert({t.m_block, t.n_block, t.num_threads});
        }
        EXPECT_EQ(distinct.size(), tiles.size()) << "duplicate tiles";
        fc_tile_config def{-1, -1, -1};
        const fc_status status = fc_default_tile_config(family, dtype, head_dim, &def);
        if (tiles.empty()) {
          EXPECT_EQ(status, FC_ERROR_UNSUPPORTED);
          EXPECT_STRNE(fc_last_error(), "");
        } else {
          ASSERT_EQ(status, FC_OK) << fc_last_error();
          EXPECT_EQ(distinct.count({def.m_block, def.n_block, def.num_threads}), 1u)
              << "the default tile of family " << family << " head_dim " << head_dim
              << " is not among the compiled ones";
        }
      }
  EXPECT_GT(total, 0) << "no kernel compiled at all";
}

TEST(TileConfigs, CapacityIsRespected) {
  for (int dtype : {FC_FLOAT16, FC_BFLOAT16}) {
    const int32_t n = fc_compiled_tile_configs(FC_FAMILY_SM80, dtype, 64, nullptr, 0);
    if (n == 0) continue;
    std::vector<fc_tile_config> out(n + 1, fc_tile_config{-7, -7, -7});
    EXPECT_EQ(fc_compiled_tile_configs(FC_FAMILY_SM80, dtype, 64, out.data(), n - 1), n);
    for (int i = n - 1; i <= n; ++i) EXPECT_EQ(out[i].m_block, -7) << "wrote past capacity";
  }
}

TEST(TileConfigs, NothingBeyondTheLimits) {
  for (int family : {FC_FAMILY_SM80, FC_FAMILY_SM90}) {
    EXPECT_EQ(fc_compiled_tile_configs(family, FC_FLOAT16, 264, nullptr, 0), 0);
    EXPECT_EQ(fc_compiled_tile_configs(family, 5, 64, nullptr, 0), 0);
  }
  fc_tile_config t;
  EXPECT_EQ(fc_default_tile_config(FC_FAMILY_SM80, FC_BFLOAT16, 512, &t), FC_ERROR_UNSUPPORTED);
  EXPECT_EQ(fc_default_tile_config(FC_FAMILY_SM80, FC_BFLOAT16, 64, nullptr),
            FC_ERROR_INVALID_ARGUMENT);
}

}  // namespace
}  // namespace flashcute
