#include "api/dispatch.hpp"

#include <string>

namespace flashcute {
namespace {

bool same_tile(const fc_tile_config& a, const fc_tile_config& b) {
  return a.m_block == b.m_block && a.n_block == b.n_block && a.num_threads == b.num_threads;
}

std::string describe(const fc_tile_config& t) {
  return "(m_block " + std::to_string(t.m_block) + ", n_block " + std::to_string(t.n_block) +
         ", num_threads " + std::to_string(t.num_threads) + ")";
}

// Whether a does more work per CTA than b (m_block * n_block), then has more threads, then more
// rows: a strict order on distinct tiles, so the choice never depends on the table's order.
bool larger_tile(const fc_tile_config& a, const fc_tile_config& b) {
  const int area_a = a.m_block * a.n_block, area_b = b.m_block * b.n_block;
  if (area_a != area_b) return area_a > area_b;
  if (a.num_threads != b.num_threads) return a.num_threads > b.num_threads;
  return a.m_block > b.m_block;
}

}  // namespace

std::vector<const KernelEntry*> entries_for(fc_kernel_family family, fc_dtype dtype, int head_dim) {
  // The smallest bucket of this family that holds head_dim.
  int bucket = 0;
  for (const KernelEntry& e : kernel_table()) {
    if (e.family == family && e.dtype == dtype && e.head_dim >= head_dim &&
        (bucket == 0 || e.head_dim < bucket)) {
      bucket = e.head_dim;
    }
  }
  std::vector<const KernelEntry*> out;
  for (const KernelEntry& e : kernel_table()) {
    if (e.family == family && e.dtype == dtype && e.head_dim == bucket) out.push_back(&e);
  }
  return out;
}

bool default_tile_for(fc_kernel_family family, fc_dtype dtype, int head_dim, fc_tile_config& tile) {
  const auto entries = entries_for(family, dtype, head_dim);
  if (entries.empty()) return false;
  for (const KernelEntry* e : entries) {
    if (e->automatic) {
      tile = e->tile;
      return true;
    }
  }
  tile = entries.front()->tile;  // a pruned build without the family's automatic tile
  return true;
}

Status require_sm80(const DeviceLimits& device) {
  if (device.compute_capability >= 80) return {};
  return {FC_ERROR_UNSUPPORTED, "the device has compute capability " +
                                    std::to_string(device.compute_capability / 10) + "." +
                                    std::to_string(device.compute_capability % 10) +
                                    "; flashcute needs sm_80 or newer"};
}

const KernelEntry* choose_automatic_entry(const std::vector<const KernelEntry*>& entries,
                                          const DeviceLimits& device) {
  const KernelEntry* best = nullptr;
  for (const KernelEntry* e : entries) {
    if (e->smem_bytes > device.max_smem_per_block) continue;
    if (e->automatic) return e;
    if (best == nullptr || larger_tile(e->tile, best->tile)) best = e;
  }
  return best;
}

const char* family_name(fc_kernel_family f) { return f == FC_FAMILY_SM90 ? "sm90" : "sm80"; }

Status candidate_families(int requested, const DeviceLimits& device,
                          std::vector<fc_kernel_family>& families) {
  families.clear();
  if (requested == FC_FAMILY_SM90 && device.compute_capability != 90) {
    return {FC_ERROR_UNSUPPORTED, "family: sm90 kernels need a compute capability 9.0 device"};
  }
  if (requested == FC_FAMILY_AUTO) {
    if (device.compute_capability == 90) families.push_back(FC_FAMILY_SM90);
    families.push_back(FC_FAMILY_SM80);
  } else {
    families.push_back(static_cast<fc_kernel_family>(requested));
  }
  return {};
}

Status select_kernel(const ForwardArgs& args, const AttentionParams& params,
                     const DeviceLimits& device, const KernelEntry*& selected) {
  selected = nullptr;
  if (Status s = require_sm80(device); !s.ok()) return s;
  const auto dtype = static_cast<fc_dtype>(args.dtype);
  std::vector<fc_kernel_family> families;
  if (Status s = candidate_families(args.family, device, families); !s.ok()) return s;
  const bool auto_tile = args.tile.m_block == 0;

  std::string why;
  const auto too_large = [&](const fc_tile_config& tile, size_t smem, const std::string& extra) {
    why += std::string(why.empty() ? "" : "; ") + "tile: " + describe(tile) + " needs " +
           std::to_string(smem) + " bytes of shared memory" + extra + "; the device allows " +
           std::to_string(device.max_smem_per_block);
  };
  for (fc_kernel_family family : families) {
    const auto entries = entries_for(family, dtype, params.head_dim);
    if (entries.empty()) {
      why += std::string(why.empty() ? "" : "; ") + family_name(family) +
             ": no kernel compiled for this dtype and head_dim";
      continue;
    }
    const KernelEntry* match = nullptr;
    if (auto_tile) {
      match = choose_automatic_entry(entries, device);
      if (match == nullptr) {
        // Name the tile the automatic choice would have taken.
        const KernelEntry* automatic = entries.front();
        for (const KernelEntry* e : entries) {
          if (e->automatic) automatic = e;
        }
        too_large(automatic->tile, automatic->smem_bytes,
                  " and no other tile compiled for the " + std::string(family_name(family)) +
                      " family at head_dim " + std::to_string(automatic->head_dim) + " fits");
        continue;
      }
    } else {
      for (const KernelEntry* e : entries) {
        if (same_tile(e->tile, args.tile)) match = e;
      }
      if (match == nullptr) {
        std::string list;
        for (const KernelEntry* e : entries) list += (list.empty() ? "" : ", ") + describe(e->tile);
        why += std::string(why.empty() ? "" : "; ") + "tile: " + describe(args.tile) +
               " is not compiled for the " + family_name(family) + " family at head_dim " +
               std::to_string(entries.front()->head_dim) + "; compiled: " + list;
        continue;
      }
    }
    if (match->supports != nullptr && !match->supports(params)) {
      why += std::string(why.empty() ? "" : "; ") + family_name(family) +
             ": this combination of features is not supported by the family";
      continue;
    }
    if (match->smem_bytes > device.max_smem_per_block) {
      too_large(match->tile, match->smem_bytes, "");
      continue;
    }
    selected = match;
    return {};
  }
  return {FC_ERROR_UNSUPPORTED, why};
}

}  // namespace flashcute
