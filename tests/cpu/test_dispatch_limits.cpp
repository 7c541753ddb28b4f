// Dispatch against each device's shared memory, on the host: for sm_80, sm_86, sm_89 and sm_90
// (compute capability and opt-in shared memory per block), every dtype and head_dim compiled in
// this build gets a kernel that fits; the automatic entry runs wherever it fits, the Hopper family
// wherever it supports the problem on sm_90, and an explicit tile that does not fit still fails;
// the backward workspace holds dQ blocks of whichever kernel a family picks.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "api/dispatch.hpp"
#include "api/validate.hpp"
#include "kernels/sm80/default_tiles.hpp"

namespace flashcute {
namespace {

struct Device {
  const char* name;
  DeviceLimits limits;
};

const Device kDevices[] = {{"sm_80", {80, 166912}},
                           {"sm_86", {86, 101376}},
                           {"sm_89", {89, 101376}},
                           {"sm_90", {90, 232448}}};

std::string describe(const fc_tile_config& t) {
  return "(m_block " + std::to_string(t.m_block) + ", n_block " + std::to_string(t.n_block) +
         ", num_threads " + std::to_string(t.num_threads) + ")";
}

bool same_tile(const fc_tile_config& a, const fc_tile_config& b) {
  return a.m_block == b.m_block && a.n_block == b.n_block && a.num_threads == b.num_threads;
}

// The dtypes with at least one compiled kernel in this build.
std::vector<fc_dtype> compiled_dtypes() {
  std::vector<fc_dtype> out;
  for (fc_dtype dtype : {FC_FLOAT16, FC_BFLOAT16}) {
    for (const KernelEntry& e : kernel_table()) {
      if (e.dtype == dtype) {
        out.push_back(dtype);
        break;
      }
    }
  }
  return out;
}

const KernelEntry* automatic_entry(const std::vector<const KernelEntry*>& entries) {
  for (const KernelEntry* e : entries) {
    if (e->automatic) return e;
  }
  return nullptr;
}

// A dense (batch 2, seqlen 256, heads 4, head_dim) problem. Dispatch never reads the tensors, so
// they all point at one small, 16-byte aligned host buffer.
ForwardArgs problem(fc_dtype dtype, int head_dim, float softcap = 0.0f) {
  alignas(256) static char buffer[256];
  constexpr int64_t S = 256, H = 4;
  ForwardArgs args = default_forward_args();
  const fc_tensor t{buffer, S * H * head_dim, H * head_dim, head_dim};
  args.q = args.k = args.v = args.o = t;
  args.dtype = dtype;
  args.batch = 2;
  args.seqlen_q = args.seqlen_k = S;
  args.heads = args.heads_k = H;
  args.head_dim = head_dim;
  args.softmax_scale = 0.125f;
  args.softcap = softcap;
  return args;
}

Status select(const ForwardArgs& args, const DeviceLimits& device, const KernelEntry*& selected) {
  AttentionParams params;
  const Status valid = validate_arguments(args, params);
  EXPECT_TRUE(valid.ok()) << valid.message;
  if (!valid.ok()) return valid;
  return select_kernel(args, params, device, selected);
}

KernelEntry entry(int m_block, int n_block, int num_threads, size_t smem, bool automatic = false) {
  KernelEntry e{};
  e.family = FC_FAMILY_SM80;
  e.dtype = FC_BFLOAT16;
  e.head_dim = 256;
  e.tile = fc_tile_config{m_block, n_block, num_threads};
  e.smem_bytes = smem;
  e.automatic = automatic;
  return e;
}

TEST(DispatchLimits, AutomaticEntryFirstThenLargestThatFits) {
  const KernelEntry automatic = entry(128, 64, 256, 131072, true);
  const KernelEntry narrow = entry(64, 64, 128, 98304);
  const KernelEntry tall = entry(128, 32, 256, 98304);
  const KernelEntry small = entry(64, 32, 128, 65536);
  const KernelEntry huge = entry(128, 128, 256, 196608);
  std::vector<const KernelEntry*> entries{&huge, &small, &narrow, &automatic, &tall};
  EXPECT_EQ(choose_automatic_entry(entries, {80, 166912}), &automatic);
  // 64x64 and 128x32 do the same work per CTA: the one with more threads wins, in any order.
  EXPECT_EQ(choose_automatic_entry(entries, {86, 101376}), &tall);
  std::vector<const KernelEntry*> reversed(entries.rbegin(), entries.rend());
  EXPECT_EQ(choose_automatic_entry(reversed, {86, 101376}), &tall);
  EXPECT_EQ(choose_automatic_entry(entries, {86, 70000}), &small);
  EXPECT_EQ(choose_automatic_entry(entries, {86, 1024}), nullptr);
  // Without an automatic entry (a pruned build), the largest that fits.
  std::vector<const KernelEntry*> unmarked{&small, &huge, &narrow};
  EXPECT_EQ(choose_automatic_entry(unmarked, {90, 232448}), &huge);
  EXPECT_EQ(choose_automatic_entry({}, {90, 232448}), nullptr);
}

// Every head_dim runs on the SM80 family on every device, which needs every bucket compiled.
TEST(DispatchLimits, Sm80FamilyFitsEveryDevice) {
  const auto dtypes = compiled_dtypes();
  if (dtypes.empty()) GTEST_SKIP() << "no kernel compiled in this build";
  for (fc_dtype dtype : dtypes) {
    for (int head_dim = 8; head_dim <= 256; head_dim += 8) {
      if (entries_for(FC_FAMILY_SM80, dtype, head_dim).empty()) {
        GTEST_SKIP() << "this build pruned the SM80 head_dim buckets (nothing for dtype " << dtype
                     << ", head_dim " << head_dim << "); FLASHCUTE_SM80_HEAD_DIMS selects them";
      }
    }
  }
  for (const Device& device : kDevices) {
    for (fc_dtype dtype : dtypes) {
      for (int head_dim = 8; head_dim <= 256; head_dim += 8) {
        SCOPED_TRACE(std::string(device.name) + " dtype " + std::to_string(dtype) + " head_dim " +
                     std::to_string(head_dim));
        const auto entries = entries_for(FC_FAMILY_SM80, dtype, head_dim);
        const int bucket = entries.front()->head_dim;
        // The tile the smallest devices fall back to is compiled in every tile set.
        const sm80::DefaultTile small = sm80::small_smem_tile(bucket);
        bool has_small = false;
        for (const KernelEntry* e : entries) {
          has_small |= same_tile(e->tile, {small.m_block, small.n_block, small.num_threads});
        }
        EXPECT_TRUE(has_small) << "small_smem_tile is not compiled at head_dim " << bucket;

        ForwardArgs args = problem(dtype, head_dim);
        args.family = FC_FAMILY_SM80;
        const KernelEntry* selected = nullptr;
        const Status s = select(args, device.limits, selected);
        ASSERT_TRUE(s.ok()) << s.message;
        ASSERT_NE(selected, nullptr);
        EXPECT_EQ(selected->family, FC_FAMILY_SM80);
        EXPECT_EQ(selected->head_dim, bucket);
        EXPECT_LE(selected->smem_bytes, device.limits.max_smem_per_block);
        const KernelEntry* automatic = automatic_entry(entries);
        ASSERT_NE(automatic, nullptr) << "no automatic entry at head_dim " << bucket;
        if (automatic->smem_bytes <= device.limits.max_smem_per_block) {
          EXPECT_EQ(selected, automatic) << describe(selected->tile);
        }
      }
    }
  }
}

// The automatic family: Hopper on sm_90 wherever it supports the problem (softcap sends it to the
// SM80 family), else SM80; whichever runs, its automatic entry wherever that fits.
TEST(DispatchLimits, AutomaticFamilyOnEveryDevice) {
  int hopper_runs = 0;
  for (const Device& device : kDevices) {
    for (fc_dtype dtype : compiled_dtypes()) {
      for (int head_dim = 8; head_dim <= 256; head_dim += 8) {
        for (float softcap : {0.0f, 30.0f}) {
          SCOPED_TRACE(std::string(device.name) + " dtype " + std::to_string(dtype) + " head_dim " +
                       std::to_string(head_dim) + " softcap " + std::to_string(softcap));
          const ForwardArgs args = problem(dtype, head_dim, softcap);
          AttentionParams params;
          ASSERT_TRUE(validate_arguments(args, params).ok());
          const auto sm80 = entries_for(FC_FAMILY_SM80, dtype, head_dim);
          const auto sm90 = device.limits.compute_capability == 90
                                ? entries_for(FC_FAMILY_SM90, dtype, head_dim)
                                : std::vector<const KernelEntry*>{};
          const KernelEntry* hopper = automatic_entry(sm90);
          const bool hopper_runs_it =
              hopper != nullptr && (hopper->supports == nullptr || hopper->supports(params));

          const KernelEntry* selected = nullptr;
          const Status s = select_kernel(args, params, device.limits, selected);
          if (!hopper_runs_it && sm80.empty()) {
            EXPECT_FALSE(s.ok()) << "selected a kernel though none is compiled";
            continue;
          }
          ASSERT_TRUE(s.ok()) << s.message;
          ASSERT_NE(selected, nullptr);
          EXPECT_LE(selected->smem_bytes, device.limits.max_smem_per_block);
          const auto& family_entries = hopper_runs_it ? sm90 : sm80;
          EXPECT_EQ(selected->family, hopper_runs_it ? FC_FAMILY_SM90 : FC_FAMILY_SM80);
          const KernelEntry* automatic = automatic_entry(family_entries);
          if (automatic != nullptr && automatic->smem_bytes <= device.limits.max_smem_per_block) {
            EXPECT_EQ(selected, automatic) << describe(selected->tile);
          }
          hopper_runs += selected->family == FC_FAMILY_SM90;
        }
      }
    }
  }
  bool hopper_compiled = false;
  for (const KernelEntry& e : kernel_table()) hopper_compiled |= e.family == FC_FAMILY_SM90;
  if (hopper_compiled) EXPECT_GT(hopper_runs, 0) << "the Hopper family never ran on sm_90";
}

// An explicit tile runs exactly that tile where it fits, and fails naming the tile where not.
TEST(DispatchLimits, ExplicitTileIsKeptOrRefused) {
  int refused = 0;
  for (const Device& device : kDevices) {
    for (fc_dtype dtype : compiled_dtypes()) {
      for (int head_dim = 8; head_dim <= 256; head_dim += 8) {
        for (fc_kernel_family family : {FC_FAMILY_SM80, FC_FAMILY_SM90}) {
          if (family == FC_FAMILY_SM90 && device.limits.compute_capability != 90) continue;
          for (const KernelEntry* e : entries_for(family, dtype, head_dim)) {
            SCOPED_TRACE(std::string(device.name) + " head_dim " + std::to_string(head_dim) +
                         " tile " + describe(e->tile));
            ForwardArgs args = problem(dtype, head_dim);
            args.family = family;
            args.tile = e->tile;
            const KernelEntry* selected = nullptr;
            const Status s = select(args, device.limits, selected);
            if (e->smem_bytes <= device.limits.max_smem_per_block) {
              ASSERT_TRUE(s.ok()) << s.message;
              EXPECT_EQ(selected, e);
            } else {
              ++refused;
              EXPECT_EQ(s.code, FC_ERROR_UNSUPPORTED);
              EXPECT_EQ(selected, nullptr);
              EXPECT_NE(s.message.find("tile: " + describe(e->tile)), std::string::npos)
                  << s.message;
              EXPECT_NE(s.message.find(std::to_string(device.limits.max_smem_per_block)),
                        std::string::npos)
                  << s.message;
            }
          }
        }
      }
    }
  }
  if (refused == 0) GTEST_SKIP() << "no compiled tile exceeds any listed device's limit";
}

// When no compiled tile fits, the automatic choice fails naming its tile and the limit.
TEST(DispatchLimits, NothingFitsNamesTheTile) {
  for (fc_dtype dtype : compiled_dtypes()) {
    for (int head_dim = 8; head_dim <= 256; head_dim += 8) {
      const auto entries = entries_for(FC_FAMILY_SM80, dtype, head_dim);
      if (entries.empty()) continue;
      const KernelEntry* automatic = automatic_entry(entries);
      ASSERT_NE(automatic, nullptr);
      const KernelEntry* selected = nullptr;
      const Status s = select(problem(dtype, head_dim), {86, 1024}, selected);
      EXPECT_EQ(s.code, FC_ERROR_UNSUPPORTED);
      EXPECT_EQ(selected, nullptr);
      EXPECT_NE(s.message.find("tile: " + describe(automatic->tile)), std::string::npos)
          << s.message;
      EXPECT_NE(s.message.find("the device allows 1024"), std::string::npos) << s.message;
    }
  }
}

// dQ's accumulator in the backward's workspace is as wide as the widest head dim a family would
// run: a build that leaves a head dim out runs a smaller head_dim on a wider kernel, whose blocks
// must fit in the workspace the size query gave (past it they overwrite dQ's counts, and the
// post-pass waits for counts that never come).
TEST(BackwardWorkspace, AccumulatorAsWideAsAnyFamilysKernel) {
  auto const entry = [](fc_kernel_family family, fc_dtype dtype, int head_dim) {
    return BackwardKernelEntry{family, dtype, head_dim, 0, nullptr, nullptr};
  };
  BackwardKernelTable full;
  for (fc_kernel_family family : {FC_FAMILY_SM80, FC_FAMILY_SM90})
    for (fc_dtype dtype : {FC_FLOAT16, FC_BFLOAT16})
      for (int head_dim : {64, 128, 256}) full.push_back(entry(family, dtype, head_dim));
  for (auto [head_dim, width] : {std::pair{8, 64}, {64, 64}, {65, 128}, {128, 128}, {200, 256}}) {
    EXPECT_EQ(backward_accum_width(full, FC_BFLOAT16, head_dim), width) << "head_dim " << head_dim;
  }
  BackwardKernelTable const pruned = {entry(FC_FAMILY_SM80, FC_BFLOAT16, 64),
                                      entry(FC_FAMILY_SM80, FC_BFLOAT16, 128),
                                      entry(FC_FAMILY_SM90, FC_BFLOAT16, 128)};
  EXPECT_EQ(backward_accum_width(pruned, FC_BFLOAT16, 8), 128);
  EXPECT_EQ(backward_accum_width(pruned, FC_BFLOAT16, 100), 128);
  // No kernel holds it (the launch refuses): the bucket.
  EXPECT_EQ(backward_accum_width(pruned, FC_FLOAT16, 8), 64);
  EXPECT_EQ(backward_accum_width(pruned, FC_BFLOAT16, 200), 256);

  // This build's table: whatever kernel a family picks, its blocks fit.
  const BackwardKernelTable& table = backward_kernel_table();
  for (const BackwardKernelEntry& pick : table)
    for (int head_dim = 8; head_dim <= pick.head_dim; head_dim += 8) {
      bool const picked = std::none_of(table.begin(), table.end(), [&](const auto& e) {
        return e.family == pick.family && e.dtype == pick.dtype && e.head_dim >= head_dim &&
               e.head_dim < pick.head_dim;
      });
      if (picked) {
        EXPECT_GE(backward_accum_width(table, pick.dtype, head_dim), pick.head_dim)
            << "head_dim " << head_dim;
      }
    }
}

}  // namespace
}  // namespace flashcute
