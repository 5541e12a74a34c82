// The simulated CUDA caching allocator (NOTE [ Simulated allocator ] in native/simdevice.py): while a
// SimulatedDevice is entered, every block the CPU allocator (front.cpp, `Blocks`) hands out is also carved from
// simulated segments as PyTorch's CUDA caching allocator would carve it, and an allocation that the simulated
// capacity cannot hold raises c10's OutOfMemoryError before the op runs, as on CUDA.
#pragma once
#include <pybind11/pybind11.h>
#include <atomic>
#include <cstddef>
#include <cstdint>

namespace simalloc {
extern std::atomic<bool> g_on;  // a simulated device is entered
inline bool on() { return g_on.load(std::memory_order_relaxed); }
// count the block at `data` of `n` bytes (this thread not inside `sim_uncounted`); throws c10::OutOfMemoryError
// when the simulated capacity cannot hold it (nothing counted then)
void take(const void* data, size_t n);
void give(const void* data);  // the block at `data` is freed (one the simulator did not count: nothing)
// NOTE [ Scratch memory ] in front.cpp: `window` starts a stretch and returns the bytes allocated now;
// `window_peak`, the most allocated since
int64_t window();
int64_t window_peak();
// blocks this thread allocates while one lives are host memory on a GPU (a generator's state), not the device's
struct HostBlocks {
  HostBlocks();
  ~HostBlocks();
};
void bind(pybind11::module_& m);  // the Python calls (`sim_*`)
}  // namespace simalloc
