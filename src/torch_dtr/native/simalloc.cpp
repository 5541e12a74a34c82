// The simulated CUDA caching allocator: simalloc.h; the rules it follows are NOTE [ Simulated allocator ] in
// simdevice.py (the SimulatedDevice that drives it from Python). All state is under one mutex: the calls
// come from whichever thread allocates, with or without the GIL.
#include "simalloc.h"

#include "planned.h"

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
  int64_t seg;  // the segment's address; -1 / -2: the small / large pool's expandable segment; -3: an arena
  int64_t addr, size;
  bool adopted = false;  // `sim_adopt`: a block allocated before, freed by `sim_forget` (or its address reused)
  int64_t rec = -1, arena = -1;  // rule 10: its request's id in the follower, and its arena (seg -3)
};
// rule 5: an expandable segment is one virtual range per pool, mapped page by page; its blocks, in address order,
// are allocated, free (mapped, cached) or unmapped (the range's tail, and holes `empty_cache` left)
enum : int { kUnmapped = 0, kFree = 1, kUsed = 2 };
struct XBlock {
  int64_t addr, size;
  int state;
};
struct XSeg {
  int64_t base = 0, page = 0, mapped = 0;
  std::vector<XBlock> blocks;
};
constexpr int64_t kRange = int64_t(1) << 50;  // an expandable segment's virtual range (no real program reaches it)

std::mutex g_mu;
thread_local int t_uncounted = 0;  // `sim_uncounted`: this thread's blocks are not the device's (host copies)
int64_t g_capacity = -1, g_small = 1 << 20, g_small_seg = 2 << 20, g_mid_seg = 20 << 20, g_large = 10 << 20,
        g_page = 2 << 20;
bool g_expandable = false;
std::map<int64_t, Segment> g_segs;           // by address, which is also their order of creation
XSeg g_x[2];                                 // the small and the large pool's expandable segments (rule 5)
std::unordered_map<uintptr_t, Entry> g_live;  // a block's data pointer -> where it was carved
int64_t g_win = 0;  // the most allocated since `window` (simalloc.h)
int64_t g_alloc = 0, g_peak = 0, g_reserved = 0, g_peak_reserved = 0, g_exp_alloc = 0, g_exp_reserved = 0,
        g_ooms = 0, g_next = int64_t(1) << 40;

// rule 10: planned allocation. Arenas by id (the current one, and those replaced while blocks of theirs lived)
struct Arena {
  int64_t base, size, live;
};
bool g_planned = false;
planned::Follower g_follow;
std::map<int64_t, Arena> g_arenas;
int64_t g_arena = -1, g_arena_ids = 0, g_settle = 0;

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
  for (XSeg& x : g_x) {  // whole pages inside free blocks are unmapped; the pages at a free block's edges stay
    std::vector<XBlock> out;
    out.reserve(x.blocks.size() + 2);
    auto put = [&out](XBlock b) {
      if (b.size <= 0) return;
      if (!out.empty() && b.state == kUnmapped && out.back().state == kUnmapped) {
        out.back().size += b.size;
      } else {
        out.push_back(b);
      }
    };
    for (const XBlock& b : x.blocks) {
      if (b.state != kFree) {
        put(b);
        continue;
      }
      const int64_t lo = x.base + up(b.addr - x.base, x.page), hi = x.base + (b.addr + b.size - x.base) / x.page * x.page;
      if (hi <= lo) {
        put(b);
        continue;
      }
      put(XBlock{b.addr, lo - b.addr, kFree});
      put(XBlock{lo, hi - lo, kUnmapped});
      put(XBlock{hi, b.addr + b.size - hi, kFree});
      x.mapped -= hi - lo;
      g_reserved -= hi - lo;
      g_exp_reserved -= hi - lo;
    }
    x.blocks.swap(out);
  }
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

// best fit among the pool's free blocks (rule 2), with an expandable segment's preference (rule 5): from the best
// fit, a block of the expandable segment gives way to the next larger one while that one could grow less (its size
// plus the unmapped range after it). Returns false when no free block fits.
struct Fit {
  int64_t size, addr, grow;
  int64_t seg;  // a segment's address, or -1 / -2: an expandable segment
  size_t k;
};
bool best_free(int64_t size, bool small, Fit& out) {
  std::vector<Fit> fits;
  for (auto& [saddr, seg] : g_segs) {
    if (seg.small != small) continue;
    for (size_t k = 0; k < seg.blocks.size(); ++k) {
      const Block& b = seg.blocks[k];
      if (!b.used && b.size >= size) fits.push_back(Fit{b.size, b.addr, b.size, saddr, k});
    }
  }
  const XSeg& x = g_x[small ? 0 : 1];
  for (size_t k = 0; k < x.blocks.size(); ++k) {
    const XBlock& b = x.blocks[k];
    if (b.state != kFree || b.size < size) continue;
    const bool open = k + 1 < x.blocks.size() && x.blocks[k + 1].state == kUnmapped;
    fits.push_back(Fit{b.size, b.addr, b.size + (open ? x.blocks[k + 1].size : 0), small ? -1 : -2, k});
  }
  if (fits.empty()) return false;
  std::sort(fits.begin(), fits.end(),
            [](const Fit& a, const Fit& b) { return a.size != b.size ? a.size < b.size : a.addr < b.addr; });
  size_t i = 0;
  while (fits[i].seg < 0 && i + 1 < fits.size() && fits[i + 1].grow < fits[i].grow) ++i;
  out = fits[i];
  return true;
}

Entry take_free(const Fit& f, int64_t size) {  // hand out (part of) a free block found by `best_free`
  if (f.seg < 0) {
    auto& blocks = g_x[f.seg == -1 ? 0 : 1].blocks;
    const int64_t rest = blocks[f.k].size - size;
    blocks[f.k] = XBlock{f.addr, size, kUsed};
    if (rest > 0) blocks.insert(blocks.begin() + static_cast<std::ptrdiff_t>(f.k) + 1, XBlock{f.addr + size, rest, kFree});
    g_exp_alloc += size;
    return Entry{f.seg, f.addr, size};
  }
  Segment& seg = g_segs.at(f.seg);
  auto& blocks = seg.blocks;
  const int64_t rest = blocks[f.k].size - size;
  // split (rule 2; with expandable segments on, as soon as 512 B remain, in either pool)
  if (g_expandable || seg.small ? rest >= kGranule : rest > g_small) {
    blocks[f.k] = Block{f.addr, size, true};
    blocks.insert(blocks.begin() + static_cast<std::ptrdiff_t>(f.k) + 1, Block{f.addr + size, rest, false});
  } else {
    blocks[f.k].used = true;
    size = blocks[f.k].size;
  }
  return Entry{f.seg, f.addr, size};
}

// map pages of the pool's expandable segment for `size` bytes (rule 5): the lowest run of free and unmapped blocks
// that holds it, starting at an unmapped block or at the free block just before one; only the pages the request
// reaches are mapped. Returns false when the capacity cannot hold them (after `empty_cache`).
bool map_pages(XSeg& x, int64_t size, bool retried, Entry& out, int64_t seg) {
  auto& bl = x.blocks;
  for (size_t k = 0; k < bl.size(); ++k) {
    if (bl[k].state != kUnmapped) continue;
    const size_t s = k > 0 && bl[k - 1].state == kFree ? k - 1 : k;
    const int64_t start = bl[s].addr, end = start + size;
    int64_t more = 0;
    size_t e = s;
    for (; e < bl.size() && bl[e].state != kUsed; ++e) {
      if (bl[e].state == kUnmapped) more += std::min(bl[e].size, up(end - bl[e].addr, x.page));
      if (bl[e].addr + bl[e].size >= end) break;
    }
    if (e == bl.size() || bl[e].state == kUsed) continue;  // this run is too short
    if (g_capacity >= 0 && g_reserved + more > g_capacity) {
      if (retried) return false;
      empty_cache();
      return map_pages(x, size, true, out, seg);
    }
    // map: the unmapped blocks of the run become free up to the pages the request reaches
    std::vector<XBlock> run;
    for (size_t i = s; i <= e; ++i) {
      XBlock b = bl[i];
      if (b.state == kUnmapped) {
        const int64_t m = std::min(b.size, up(end - b.addr, x.page));
        run.push_back(XBlock{b.addr, m, kFree});
        if (m < b.size) run.push_back(XBlock{b.addr + m, b.size - m, kUnmapped});
      } else {
        run.push_back(b);
      }
    }
    // merge the free blocks at the run's start (the request lies in them), then hand out its low part
    XBlock head = run[0];
    size_t j = 1;
    while (j < run.size() && run[j].state == kFree) head.size += run[j++].size;
    std::vector<XBlock> repl{XBlock{start, size, kUsed}};
    if (head.size > size) repl.push_back(XBlock{start + size, head.size - size, kFree});
    repl.insert(repl.end(), run.begin() + static_cast<std::ptrdiff_t>(j), run.end());
    bl.erase(bl.begin() + static_cast<std::ptrdiff_t>(s), bl.begin() + static_cast<std::ptrdiff_t>(e) + 1);
    bl.insert(bl.begin() + static_cast<std::ptrdiff_t>(s), repl.begin(), repl.end());
    const size_t last = s + repl.size() - 1;  // a free remainder merges with a free block after the run
    if (bl[last].state == kFree && last + 1 < bl.size() && bl[last + 1].state == kFree) {
      bl[last].size += bl[last + 1].size;
      bl.erase(bl.begin() + static_cast<std::ptrdiff_t>(last) + 1);
    }
    x.mapped += more;
    g_exp_reserved += more;
    g_reserved += more;
    g_peak_reserved = std::max(g_peak_reserved, g_reserved);
    g_exp_alloc += size;
    out = Entry{seg, start, size};
    return true;
  }
  return false;  // (the tail is unmapped and never ends: not reached)
}

Entry carve(int64_t nbytes) {  // rules 1-3 and 5
  int64_t size = std::max(kGranule, up(nbytes, kGranule));
  const bool small = size <= g_small;
  Fit f;
  Entry e;
  if (best_free(size, small, f)) {
    e = take_free(f, size);
  } else if (g_expandable) {
    if (!map_pages(g_x[small ? 0 : 1], size, false, e, small ? -1 : -2)) oom(size);
  } else {  // a new segment (rule 3)
    const int64_t seg_size = small ? g_small_seg : size < g_large ? g_mid_seg : up(size, g_page);
    fits(seg_size, size);
    const int64_t addr = g_next;
    g_next += seg_size + g_page;
    Segment& seg = g_segs[addr];
    seg.size = seg_size;
    seg.small = small;
    seg.blocks.push_back(Block{addr, seg_size, false});
    g_reserved += seg_size;
    g_peak_reserved = std::max(g_peak_reserved, g_reserved);
    e = take_free(Fit{seg_size, addr, seg_size, addr, 0}, size);
  }
  g_alloc += e.size;
  g_peak = std::max(g_peak, g_alloc);
  g_win = std::max(g_win, g_alloc);
  return e;
}

void release(const Entry& e) {  // rule 4
  g_alloc -= e.size;
  if (e.rec >= 0) g_follow.release(e.rec, e.seg == -3 && e.arena == g_arena ? e.addr - g_arenas.at(e.arena).base : -1);
  if (e.seg == -3) {  // rule 10: an arena's block; a replaced arena goes with its last block
    Arena& a = g_arenas.at(e.arena);
    if (--a.live == 0 && e.arena != g_arena) {
      g_reserved -= a.size;
      g_arenas.erase(e.arena);
    }
    return;
  }
  if (e.seg < 0) {  // rule 5: the block merges with free neighbours; its pages stay mapped
    g_exp_alloc -= e.size;
    auto& bl = g_x[e.seg == -1 ? 0 : 1].blocks;
    auto it = std::lower_bound(bl.begin(), bl.end(), e.addr, [](const XBlock& b, int64_t a) { return b.addr < a; });
    it->state = kFree;
    auto next = it + 1;
    if (next != bl.end() && next->state == kFree) {
      it->size += next->size;
      it = bl.erase(next) - 1;
    }
    if (it != bl.begin() && (it - 1)->state == kFree) {
      (it - 1)->size += it->size;
      bl.erase(it);
    }
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
Entry get(int64_t nbytes) {  // rule 10: a request of the iteration, at its planned offset where it has one
  if (!g_planned) return carve(nbytes);
  const int64_t size = std::max(kGranule, up(nbytes, kGranule));
  const int64_t off = g_follow.offer(size);
  Entry e;
  if (off >= 0) {
    Arena& a = g_arenas.at(g_arena);
    e = Entry{-3, a.base + off, size};
    e.arena = g_arena;
    ++a.live;
    g_alloc += size;
    g_peak = std::max(g_peak, g_alloc);
    g_win = std::max(g_win, g_alloc);
  } else {
    e = carve(nbytes);
  }
  e.rec = g_follow.commit(size, off);
  return e;
}
}  // namespace

void take(const void* data, size_t n) {
  if (t_uncounted) return;
  std::lock_guard<std::mutex> g(g_mu);
  if (!g_on.load()) return;
  const Entry e = get(static_cast<int64_t>(n));
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

HostBlocks::HostBlocks() { ++t_uncounted; }
HostBlocks::~HostBlocks() { --t_uncounted; }

int64_t window_peak() {
  std::lock_guard<std::mutex> g(g_mu);
  return g_win;
}

int64_t window() {
  std::lock_guard<std::mutex> g(g_mu);
  return g_win = g_alloc;
}

void bind(pybind11::module_& m) {
  namespace py = pybind11;
  // start counting, from nothing: the capacity (-1: none), expandable segments, and the sizes rules 1 and 3 use
  m.def("sim_start", [](int64_t capacity, bool expandable, int64_t small, int64_t small_seg, int64_t mid_seg,
                        int64_t large, int64_t page, bool planned) {
    std::lock_guard<std::mutex> g(g_mu);
    TORCH_CHECK(!g_on.load(), "torch_dtr: a SimulatedDevice is already entered; one at a time (exit it first)");
    g_capacity = capacity;
    g_expandable = expandable;
    std::tie(g_small, g_small_seg, g_mid_seg, g_large, g_page) = std::tie(small, small_seg, mid_seg, large, page);
    g_segs.clear();
    g_live.clear();
    for (int i = 0; i < 2; ++i) {  // rule 5: pages of 2 MiB in the small pool, 20 MiB in the large one
      XSeg& x = g_x[i];
      x.base = (int64_t(1) << 52) + i * (kRange + (int64_t(1) << 40));
      x.page = i == 0 ? small_seg : mid_seg;
      x.mapped = 0;
      x.blocks.assign(1, XBlock{x.base, kRange, kUnmapped});
    }
    g_alloc = g_peak = g_reserved = g_peak_reserved = g_exp_alloc = g_exp_reserved = g_ooms = 0;
    g_planned = planned;
    g_follow = planned::Follower();
    g_arenas.clear();
    g_arena = -1;
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
    for (int i = 0; i < 2; ++i) {  // each run of mapped pages of an expandable segment, as one segment
      std::vector<std::tuple<int64_t, int64_t, bool>> blocks;
      for (const XBlock& b : g_x[i].blocks) {
        if (b.state != kUnmapped) {
          blocks.emplace_back(b.addr, b.size, b.state == kUsed);
        } else if (!blocks.empty()) {
          out.emplace_back(i == 0, std::move(blocks));
          blocks.clear();
        }
      }
      if (!blocks.empty()) out.emplace_back(i == 0, std::move(blocks));
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
    const Entry e = get(n);
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
  // rule 10: an iteration ended. Returns whether a plan is followed, and unless so, where the last
  // (up to) three iterations began ((request id, event) each) with the requests (bytes, start, end) since the first
  m.def("sim_plan_boundary", [] {
    std::lock_guard<std::mutex> g(g_mu);
    const bool done = g_planned && g_follow.boundary();
    // the blocks that lived across the plan's start (in the pools) are gone by its second boundary: the pools' cache
    // is released again then, once
    if (done && g_settle > 0 && --g_settle == 0) empty_cache();
    if (!done && g_arena >= 0) {  // the program left the plan: its arena goes now, or with its last block
      Arena& a = g_arenas.at(g_arena);
      if (a.live == 0) {
        g_reserved -= a.size;
        g_arenas.erase(g_arena);
      }
      g_arena = -1;
    }
    if (done || !g_planned) return std::make_tuple(done, decltype(g_follow.recorded().first){},
                                                   decltype(g_follow.recorded().second){});
    auto [marks, reqs] = g_follow.recorded();
    return std::make_tuple(false, marks, reqs);
  });
  // follow a plan from now on: one iteration's requests from its cut, each one's bytes and offset (-1: the pools) in
  // a new arena of `arena` bytes, the next request being the `pos`-th; the arena is reserved now, after the pools'
  // free cache is released; false (no plan) where the capacity cannot hold it
  m.def("sim_plan_set", [](std::vector<int64_t> sizes, std::vector<int64_t> offsets, int64_t arena, int64_t pos) {
    std::lock_guard<std::mutex> g(g_mu);
    TORCH_CHECK(g_planned && sizes.size() == offsets.size(), "torch_dtr: sim_plan_set needs a planned device and "
                "one offset per request");
    if (g_arena >= 0) {  // the arena before goes now, or with its last block
      Arena& a = g_arenas.at(g_arena);
      if (a.live == 0) {
        g_reserved -= a.size;
        g_arenas.erase(g_arena);
      }
      g_arena = -1;
    }
    empty_cache();
    if (g_capacity >= 0 && g_reserved + arena > g_capacity) return false;
    g_arena = g_arena_ids++;
    g_arenas[g_arena] = Arena{g_next, arena, 0};
    g_next += up(arena, g_page) + g_page;
    g_reserved += arena;
    g_peak_reserved = std::max(g_peak_reserved, g_reserved);
    g_follow.follow(std::move(sizes), std::move(offsets), static_cast<size_t>(pos));
    g_settle = 2;
    return true;
  });
  // (iterations followed to the end, iterations that left their plan, requests served from an arena, arena bytes)
  m.def("sim_plan_stats", [] {
    std::lock_guard<std::mutex> g(g_mu);
    int64_t bytes = 0;
    for (const auto& [id, a] : g_arenas) bytes += a.size;
    return std::make_tuple(g_follow.followed, g_follow.diverged, g_follow.served, bytes);
  });
  m.def("sim_uncounted", [](bool on) {  // this thread's blocks from now on are (not) counted; returns the old
    const bool was = t_uncounted > 0;
    t_uncounted = on ? 1 : 0;
    return was;
  });
}
}  // namespace simalloc
