// The simulated CUDA caching allocator: simalloc.h; the rules it follows are NOTE [ Simulated allocator ] in
// simdevice.py (the SimulatedDevice that drives it from Python). All state is under one mutex: the calls
// come from whichever thread allocates, with or without the GIL.
#include "simalloc.h"

#include <c10/util/Exception.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <map>
#include <mutex>
#include <tuple>
#include <unordered_map>
#include <vector>

namespace simalloc {
std::atomic<bool> g_on{false};

namespace {
constexpr int64_t kGranule = 512;  // rule 1
constexpr uintptr_t kDirect = uintptr_t(1) << 63;  // keys of blocks taken by `sim_alloc` (no memory of their own)

struct Block {
  int64_t addr, size;
  bool used;
};
struct Segment {
  int64_t size;
  bool small;
  std::vector<Block> blocks;  // address order
};
struct Entry {
  int64_t seg;  // the segment's address; -1: the expandable segment
  int64_t addr, size;
  bool adopted = false;  // `sim_adopt`: a block allocated before, freed by `sim_forget` (or its address reused)
};

std::mutex g_mu;
thread_local int t_uncounted = 0;  // `sim_uncounted`: this thread's blocks are not the device's (host copies)
int64_t g_capacity = -1, g_small = 1 << 20, g_small_seg = 2 << 20, g_mid_seg = 20 << 20, g_large = 10 << 20,
        g_page = 2 << 20;
bool g_expandable = false;
std::map<int64_t, Segment> g_segs;           // by address, which is also their order of creation
std::unordered_map<uintptr_t, Entry> g_live;  // a block's data pointer -> where it was carved
int64_t g_alloc = 0, g_peak = 0, g_reserved = 0, g_peak_reserved = 0, g_exp_alloc = 0, g_exp_reserved = 0,
        g_ooms = 0, g_next = int64_t(1) << 40;

int64_t up(int64_t n, int64_t m) { return (n + m - 1) / m * m; }

void empty_cache() {  // rule 3: every entirely free segment goes; the expandable segment's free pages too
  for (auto it = g_segs.begin(); it != g_segs.end();) {
    if (it->second.blocks.size() == 1 && !it->second.blocks[0].used) {
      g_reserved -= it->second.size;
      it = g_segs.erase(it);
    } else {
      ++it;
    }
  }
  const int64_t pages = up(g_exp_alloc, g_page);
  g_reserved -= g_exp_reserved - pages;
  g_exp_reserved = pages;
}

[[noreturn]] void oom(int64_t size) {
  ++g_ooms;
  auto fmt = [](double n, char* out, size_t len) {
    const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    int u = 0;
    while (n >= 1024 && u < 4) {
      n /= 1024;
      ++u;
    }
    if (u == 0) std::snprintf(out, len, "%.0f B", n);
    else std::snprintf(out, len, "%.2f %s", n, units[u]);
  };
  char a[32], c[32], al[32], r[32], what[400];
  fmt(double(size), a, sizeof a);
  fmt(double(std::max<int64_t>(g_capacity, 0)), c, sizeof c);
  fmt(double(g_alloc), al, sizeof al);
  fmt(double(g_reserved - g_alloc), r, sizeof r);
  std::snprintf(what, sizeof what,
                "Simulated device out of memory. Tried to allocate %s. The simulated device has a total capacity "
                "of %s, of which %s is allocated by PyTorch, and %s is reserved by PyTorch but unallocated.",
                a, c, al, r);
  TORCH_CHECK_WITH(OutOfMemoryError, false, what);
}

void fits(int64_t more, int64_t size) {  // `more` bytes more reserved must fit the capacity (rule 3)
  if (g_capacity < 0 || g_reserved + more <= g_capacity) return;
  empty_cache();
  if (g_reserved + more > g_capacity) oom(size);
}

Entry carve(int64_t nbytes) {  // rules 1-3 and 5
  int64_t size = std::max(kGranule, up(nbytes, kGranule));
  if (g_expandable) {
    const int64_t pages = up(g_exp_alloc + size, g_page);
    if (pages > g_exp_reserved) {
      fits(pages - g_exp_reserved, size);
      g_reserved += pages - g_exp_reserved;
      g_exp_reserved = pages;
      g_peak_reserved = std::max(g_peak_reserved, g_reserved);
    }
    g_exp_alloc += size;
    const int64_t addr = g_next;
    g_next += size;
    g_alloc += size;
    g_peak = std::max(g_peak, g_alloc);
    return Entry{-1, addr, size};
  }
  const bool small = size <= g_small;
  Segment* best_seg = nullptr;
  int64_t best_seg_addr = 0;
  size_t best_k = 0;
  for (auto& [saddr, seg] : g_segs) {  // best fit, the lowest address on a tie (rule 2)
    if (seg.small != small) continue;
    for (size_t k = 0; k < seg.blocks.size(); ++k) {
      const Block& b = seg.blocks[k];
      if (b.used || b.size < size) continue;
      if (!best_seg || b.size < best_seg->blocks[best_k].size ||
          (b.size == best_seg->blocks[best_k].size && b.addr < best_seg->blocks[best_k].addr)) {
        best_seg = &seg;
        best_seg_addr = saddr;
        best_k = k;
      }
    }
  }
  if (!best_seg) {  // a new segment (rule 3)
    const int64_t seg_size = small ? g_small_seg : size < g_large ? g_mid_seg : up(size, g_page);
    fits(seg_size, size);
    best_seg_addr = g_next;
    g_next += seg_size + g_page;
    best_seg = &g_segs[best_seg_addr];
    best_seg->size = seg_size;
    best_seg->small = small;
    best_seg->blocks.push_back(Block{best_seg_addr, seg_size, false});
    g_reserved += seg_size;
    g_peak_reserved = std::max(g_peak_reserved, g_reserved);
    best_k = 0;
  }
  auto& blocks = best_seg->blocks;
  const int64_t addr = blocks[best_k].addr, rest = blocks[best_k].size - size;
  if (best_seg->small ? rest >= kGranule : rest > g_small) {  // split (rule 2)
    blocks[best_k] = Block{addr, size, true};
    blocks.insert(blocks.begin() + static_cast<std::ptrdiff_t>(best_k) + 1, Block{addr + size, rest, false});
  } else {
    blocks[best_k].used = true;
    size = blocks[best_k].size;
  }
  g_alloc += size;
  g_peak = std::max(g_peak, g_alloc);
  return Entry{best_seg_addr, addr, size};
}

void release(const Entry& e) {  // rule 4
  g_alloc -= e.size;
  if (e.seg < 0) {
    g_exp_alloc -= e.size;
    return;
  }
  auto& blocks = g_segs.at(e.seg).blocks;
  auto it = std::lower_bound(blocks.begin(), blocks.end(), e.addr,
                             [](const Block& b, int64_t a) { return b.addr < a; });
  it->used = false;
  auto next = it + 1;
  if (next != blocks.end() && !next->used) {
    it->size += next->size;
    it = blocks.erase(next) - 1;
  }
  if (it != blocks.begin() && !(it - 1)->used) {
    (it - 1)->size += it->size;
    blocks.erase(it);
  }
}
}  // namespace

void take(const void* data, size_t n) {
  if (t_uncounted) return;
  std::lock_guard<std::mutex> g(g_mu);
  if (!g_on.load()) return;
  const Entry e = carve(static_cast<int64_t>(n));
  auto [it, fresh] = g_live.try_emplace(reinterpret_cast<uintptr_t>(data), e);
  if (!fresh) {  // an adopted block's address handed out again: that block is gone
    release(it->second);
    it->second = e;
  }
}

void give(const void* data) {
  std::lock_guard<std::mutex> g(g_mu);
  auto it = g_live.find(reinterpret_cast<uintptr_t>(data));
  if (it == g_live.end()) return;
  release(it->second);
  g_live.erase(it);
}

void bind(pybind11::module_& m) {
  namespace py = pybind11;
  // start counting, from nothing: the capacity (-1: none), expandable segments, and the sizes rules 1 and 3 use
  m.def("sim_start", [](int64_t capacity, bool expandable, int64_t small, int64_t small_seg, int64_t mid_seg,
                        int64_t large, int64_t page) {
    std::lock_guard<std::mutex> g(g_mu);
    TORCH_CHECK(!g_on.load(), "torch_dtr: a SimulatedDevice is already entered; one at a time (exit it first)");
    g_capacity = capacity;
    g_expandable = expandable;
    std::tie(g_small, g_small_seg, g_mid_seg, g_large, g_page) = std::tie(small, small_seg, mid_seg, large, page);
    g_segs.clear();
    g_live.clear();
    g_alloc = g_peak = g_reserved = g_peak_reserved = g_exp_alloc = g_exp_reserved = g_ooms = 0;
    g_on.store(true);
  });
  m.def("sim_stop", [] {
    std::lock_guard<std::mutex> g(g_mu);
    g_on.store(false);
    g_live.clear();
  });
  // (allocated, peak allocated, reserved, peak reserved, out-of-memory errors raised)
  m.def("sim_stats", [] {
    std::lock_guard<std::mutex> g(g_mu);
    return std::make_tuple(g_alloc, g_peak, g_reserved, g_peak_reserved, g_ooms);
  });
  m.def("sim_reset_peak", [] {
    std::lock_guard<std::mutex> g(g_mu);
    g_peak = g_alloc;
    g_peak_reserved = g_reserved;
  });
  m.def("sim_empty_cache", [] {
    std::lock_guard<std::mutex> g(g_mu);
    empty_cache();
  });
  m.def("sim_set_expandable", [](bool on) {
    std::lock_guard<std::mutex> g(g_mu);
    const bool was = g_expandable;
    g_expandable = on;
    return was;
  });
  m.def("sim_expandable", [] { return g_expandable; });
  // each segment's pool (small or not) and its blocks (address, bytes, allocated) in address order
  m.def("sim_segments", [] {
    std::lock_guard<std::mutex> g(g_mu);
    std::vector<std::pair<bool, std::vector<std::tuple<int64_t, int64_t, bool>>>> out;
    for (const auto& [addr, seg] : g_segs) {
      std::vector<std::tuple<int64_t, int64_t, bool>> blocks;
      for (const auto& b : seg.blocks) blocks.emplace_back(b.addr, b.size, b.used);
      out.emplace_back(seg.small, std::move(blocks));
    }
    return out;
  });
  m.def("sim_locate", [](uintptr_t data) -> int64_t {  // the simulated address of a block's data (0: not counted)
    std::lock_guard<std::mutex> g(g_mu);
    auto it = g_live.find(data);
    return it == g_live.end() ? 0 : it->second.addr;
  });
  // a block of the simulated allocator alone (no memory): (address, bytes counted); `sim_free(address)` frees it
  m.def("sim_alloc", [](int64_t n) {
    std::lock_guard<std::mutex> g(g_mu);
    TORCH_CHECK(g_on.load(), "torch_dtr: enter the SimulatedDevice first (with SimulatedDevice(...) as dev:)");
    const Entry e = carve(n);
    g_live[kDirect | static_cast<uintptr_t>(e.addr)] = e;
    return std::make_pair(e.addr, e.size);
  });
  m.def("sim_free", [](int64_t addr) { give(reinterpret_cast<const void*>(kDirect | static_cast<uintptr_t>(addr))); });
  m.def("sim_adopt", [](uintptr_t data, int64_t n) {  // count a block allocated before (false: counted already)
    std::lock_guard<std::mutex> g(g_mu);
    if (!g_on.load() || g_live.count(data)) return false;
    Entry e = carve(n);
    e.adopted = true;
    g_live[data] = e;
    return true;
  });
  m.def("sim_forget", [](uintptr_t data) {  // an adopted block's storage died
    std::lock_guard<std::mutex> g(g_mu);
    auto it = g_live.find(data);
    if (it == g_live.end() || !it->second.adopted) return;
    release(it->second);
    g_live.erase(it);
  });
  m.def("sim_uncounted", [](bool on) {  // this thread's blocks from now on are (not) counted; returns the old
    const bool was = t_uncounted > 0;
    t_uncounted = on ? 1 : 0;
    return was;
  });
}
}  // namespace simalloc
