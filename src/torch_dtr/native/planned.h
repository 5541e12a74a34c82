// Serving a traced iteration's allocations at planned offsets (NOTE [ Planned allocation ] 5 in core/arena.py): the
// part that does not depend on the allocator underneath. The simulated allocator (simalloc.cpp) uses it; the
// allocator owns the arena's memory and calls `offer`, `commit`, `release` and `boundary` under its own lock.
#pragma once
#include <cstdint>
#include <deque>
#include <map>
#include <tuple>
#include <utility>
#include <vector>

namespace planned {
struct Request {
  int64_t size, start, end;  // events (allocations and frees, counted since recording began); end -1: still live
};

class Follower {
 public:
  static constexpr size_t kMaxRecorded = size_t(1) << 21;  // requests kept between two steps at most (48 MiB)

  int64_t followed = 0, diverged = 0, served = 0;  // iterations followed throughout, plans left; requests served

  // the offset in the arena planned for the next request of `size` bytes, or -1: the allocator's own pools (a
  // request the plan leaves to them, no plan, or the program left it: other bytes than the plan's, or a planned
  // range that a live block of the arena still holds)
  int64_t offer(int64_t size) {
    if (!following_) return -1;
    const size_t j = pos_;
    if (sizes_[j] != size) return diverge();
    const int64_t o = offsets_[j];
    if (o < 0) return -1;
    auto it = alive_.lower_bound(o);  // the arena's live blocks, by offset: none may overlap [o, o + size)
    if (it != alive_.end() && it->first < o + size) return diverge();
    if (it != alive_.begin() && std::prev(it)->second > o) return diverge();
    return o;
  }
  // the request of `size` bytes was served (at `offset` in the arena, or -1: by the pools): returns its id
  int64_t commit(int64_t size, int64_t offset) {
    if (offset >= 0) {
      alive_[offset] = offset + size;
      ++served;
    }
    if (following_ && ++pos_ == sizes_.size()) pos_ = 0;  // the plan is a cycle: one iteration, from its cut
    if (rec_.size() >= kMaxRecorded) {  // no step ends (inference, no optimizer): start recording afresh
      base_ += int64_t(rec_.size());
      rec_.clear();
      marks_.clear();
    }
    rec_.push_back(Request{size, ev_++, -1});
    return base_ + int64_t(rec_.size()) - 1;
  }
  // the request `id` was freed; `offset`: its place in the current arena (else -1)
  void release(int64_t id, int64_t offset) {
    if (offset >= 0) alive_.erase(offset);
    if (id >= base_) rec_[static_cast<size_t>(id - base_)].end = ev_;
    ++ev_;
  }
  // an iteration ended: true while a plan is followed (it goes on; `followed` counts the iterations it was followed
  // throughout); the requests of the last iterations are kept for `recorded`, those before the last three forgotten
  bool boundary() {
    followed += following_ && whole_;
    const bool done = following_;
    whole_ = following_;
    marks_.emplace_back(base_ + int64_t(rec_.size()), ev_);
    if (marks_.size() > 3) marks_.erase(marks_.begin(), marks_.end() - 3);
    while (base_ < marks_.front().first && !rec_.empty()) {
      rec_.pop_front();
      ++base_;
    }
    return done;
  }
  // where the last (up to) three iterations began: (first request's id, event); and the requests since the first
  std::pair<std::vector<std::pair<int64_t, int64_t>>, std::vector<std::tuple<int64_t, int64_t, int64_t>>>
  recorded() const {
    std::vector<std::tuple<int64_t, int64_t, int64_t>> out;
    out.reserve(rec_.size());
    for (const Request& r : rec_) out.emplace_back(r.size, r.start, r.end);
    return {marks_, out};
  }
  // follow a plan: one iteration's requests in order from its cut (`sizes`, each one's `offsets` in a new arena, -1:
  // the pools), the next request being the plan's `pos`-th
  void follow(std::vector<int64_t> sizes, std::vector<int64_t> offsets, size_t pos) {
    sizes_ = std::move(sizes);
    offsets_ = std::move(offsets);
    alive_.clear();  // (blocks of the arena before live in theirs: the allocator keeps it until they are freed)
    pos_ = sizes_.empty() ? 0 : pos % sizes_.size();
    following_ = !sizes_.empty();
    whole_ = false;  // (the iteration it begins in was not followed from its start)
  }
  bool following() const { return following_; }

 private:
  int64_t diverge() {
    following_ = false;
    ++diverged;
    return -1;
  }
  std::deque<Request> rec_;  // requests since `base_` (ids base_, base_ + 1, ...)
  int64_t base_ = 0, ev_ = 0;
  std::vector<std::pair<int64_t, int64_t>> marks_;  // per boundary: the next request's id and the event
  std::vector<int64_t> sizes_, offsets_;
  std::map<int64_t, int64_t> alive_;  // offset -> end of the current arena's live blocks
  size_t pos_ = 0;
  bool following_ = false, whole_ = false;
};
}  // namespace planned
