// torch-dtr's compiled front end: the per-op mechanism of eager/front.py in C++, feeding the same core.
// NOTE [ Native front end ] in native/__init__.py says what it is, what it keeps in C++ and what it asks the
// Python core; this file is its mechanism only. No rule lives here: what to evict, when to free, what to bring
// back is decided by the core (torch_dtr.core.Runtime), called once or twice per managed op.
//
// 1. A managed tensor is an ordinary TensorImpl of its device whose key set also holds the PrivateUse1 backend
//    bit (a *handle*, class Handle): every op on one reaches `kernel` below autograd, which runs it on the real
//    backend and tags its outputs. While enabled, the calling thread's TLS includes the bit too, so that ops on
//    plain tensors reach `kernel` as well: an op whose inputs require grad (with grad mode on) is managed.
// 2. A core storage is a Slot: the StorageImpl that its handles share. Eviction nulls the StorageImpl's data
//    (the handles stay valid); recomputation moves the new data into the same StorageImpl, so every handle,
//    view and tensor saved by autograd sees it again. The core's payload for a storage is a Value (a Slot
//    reference); the core's Memory.free tells the slot to drop its data (core/feed.py, DroppingMemory).
// 3. The handles of one storage share a Buffer, which holds the core's Storage object; when the last handle
//    dies, the Buffer queues that object, and the next call into the core drops its reference (drop_ref).
// 4. Locking: the GIL, then g_mutex (released while waiting, so that a thread holding the GIL never waits for
//    one that needs it). Handle deaths only touch the queue (its own mutex). Nothing touches a Python object
//    without the GIL: the kernel runs with it released (PyTorch's bindings release it around every op), and
//    from Python 3.12 on even allocating a Python object without it crashes (per-interpreter allocator state).
//    A managed op whose modelled cost is known and at least kReleaseAbove runs with the GIL released (g_mutex
//    held), as plain PyTorch runs every op and as recipes run: other Python threads go on meanwhile. Shorter ops
//    keep it: its release and retaking would cost them more than they hide. An op of another library than aten
//    (c10d's collectives, custom ops) always runs without it: it may wait for a thread that needs the GIL (gloo's
//    worker, freeing a finished collective's tensors, takes the GIL while holding the lock that the next
//    collective's enqueue waits for: a tensor-parallel backward hung so in about one run in six).
// 5. The records that live as long as a value or a recipe are allocated from a heap of their own (`pool`).
// 6. A slot holds its StorageImpl only while no handle does: from its first handle to its buffer's death the
//    handles alone hold it (the slot keeps a weak reference), so a managed tensor that nothing else shares has a
//    storage use count of one, as a plain one has, and autograd's engine sums gradients into it in place
//    (InputBuffer accumulates in place only then). The last handle to let go of the StorageImpl (dying,
//    released, or given another storage by `t.data = other`) hands it back first (Handle::keep); a dying buffer
//    takes it back if a tensor still holds it. A written value's new slot lends the StorageImpl the same way.
// 7. An op that made no memory (a view, `detach`, `t`) and found nothing for the core to do first (no deaths, no
//    lock, no room to make) is queued, not told: the next call into the core (before, ran, or the session's own
//    entries through `take_views`) hands the queue over first, so the core sees the same events in the same order
//    (NOTE [ Native front end ] 10).
#include <torch/extension.h>
#include <torch/library.h>
#include <torch/csrc/jit/python/pybind_utils.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/Context.h>
#include <c10/core/CPUAllocator.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <c10/util/SmallVector.h>
#include <sys/mman.h>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <algorithm>
#include <atomic>
#include <list>
#include <mutex>
#include <new>
#include <thread>
#include <string>
#include <unordered_map>
#include <unordered_set>

#include "simalloc.h"

namespace {

// ------------------------------------------------------------------ the records' own heap (rule 5)
// Small records that live as long as a value or a recipe (slots, buffers, handles, recipes and their vectors)
// come from size-class free lists over mmapped slabs instead of the C heap: about 1 us less per managed op on
// the small-op chain, and they no longer sit between the heap's large tensor blocks (which alone did not stop
// the heap's growth: docs/native.md, Host memory on the CPU). Slabs are kept for reuse, never returned.
namespace pool {
constexpr size_t kQuantum = 16, kLargest = 512, kSlab = size_t{1} << 16;
struct Free {
  Free* next;
};
// a spin lock: the critical sections are a few instructions, taken about twenty times per managed op, where a
// pthread mutex's lock and unlock calls cost more than the work (handles may die on any thread, so one is needed)
struct Spin {
  std::atomic_flag flag = ATOMIC_FLAG_INIT;
  void lock() {
    while (flag.test_and_set(std::memory_order_acquire)) std::this_thread::yield();
  }
  void unlock() { flag.clear(std::memory_order_release); }
};
Spin g_lock;
Free* g_heads[kLargest / kQuantum + 1] = {};

inline size_t size_class(size_t n) { return (n + kQuantum - 1) / kQuantum; }

void* take(size_t n) {
  if (n > kLargest) return ::operator new(n);
  const size_t c = size_class(n ? n : 1);
  std::lock_guard<Spin> g(g_lock);
  Free*& head = g_heads[c];
  if (!head) {
    void* slab = mmap(nullptr, kSlab, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (slab == MAP_FAILED) throw std::bad_alloc();
    const size_t size = c * kQuantum;
    for (size_t off = kSlab / size * size; off >= size; off -= size) {
      auto* f = reinterpret_cast<Free*>(static_cast<char*>(slab) + off - size);
      f->next = head;
      head = f;
    }
  }
  Free* f = head;
  head = f->next;
  return f;
}

void give(void* p, size_t n) {
  if (!p) return;
  if (n > kLargest) {
    ::operator delete(p);
    return;
  }
  auto* f = static_cast<Free*>(p);
  std::lock_guard<Spin> g(g_lock);
  Free*& head = g_heads[size_class(n ? n : 1)];
  f->next = head;
  head = f;
}

template <class T>
struct Alloc {  // for the records' vectors
  using value_type = T;
  Alloc() = default;
  template <class U>
  Alloc(const Alloc<U>&) {}
  T* allocate(size_t n) { return static_cast<T*>(take(n * sizeof(T))); }
  void deallocate(T* p, size_t n) { give(p, n * sizeof(T)); }
  template <class U>
  bool operator==(const Alloc<U>&) const { return true; }
  template <class U>
  bool operator!=(const Alloc<U>&) const { return false; }
};
}  // namespace pool

template <class T>
using Vec = std::vector<T, pool::Alloc<T>>;

#define TORCH_DTR_POOLED                                                     \
  static void* operator new(size_t n) { return pool::take(n); }             \
  static void operator delete(void* p, size_t n) { pool::give(p, n); }

using c10::BackendComponent;
using c10::DispatchKeySet;
using c10::IValue;

thread_local int g_depth = 0;  // > 0: ops run by a kernel or a recipe, not the program's
std::recursive_mutex g_mutex;
pool::Spin g_dead_mutex;  // (taken by each buffer's death: a few instructions under it)
// core Storages whose last handle died (strong references), with their session's number
std::vector<std::pair<int64_t, PyObject*>> g_dead;
std::atomic<bool> g_dead_any{false};  // g_dead is not empty (read per op without the mutex)
// every session started in this process, by number (kept while handles made under it live: their deaths and
// recomputations are its core's business; then let go, once another session has started), and its live buffers
std::vector<py::object>* g_sessions = new std::vector<py::object>();
std::vector<int64_t>* g_buffers = new std::vector<int64_t>();  // (under g_mutex and the GIL)
bool g_lend = true;     // slots lend their StorageImpl to the handles (rule 6; off: the slot always holds it)
// tracing the core's input (NOTE [ Traces ] in sim/trace.py): every managed op predicts its bytes and calls `before`,
// and every write to a constant that a recipe read is told (whether or not one alive reads it: that depends on
// what the core keeps, which depends on the budget), so that the trace replays at any budget
bool g_trace = false;

// ------------------------------------------------------------------ constants (NOTE [ Native front end ] 4)
// The recipes alive that read one constant: each holds a reference (Input::reader), the constant's entry one more.
// A write to a constant that no live recipe reads is not told to the core (NOTE [ Native front end ] 12).
struct Readers : c10::intrusive_ptr_target {};

struct Seen {  // a constant storage, counted while a tensor seen on it lives (as eager/constants.py counts)
  c10::weak_intrusive_ptr<c10::StorageImpl> storage;
  int64_t nbytes;
  bool read = false;  // a recipe reads it: a write to it invalidates those recipes (Python keeps which)
  // a leaf on it that requires grad was handed to the session's `see`, which makes its gradients come back plain
  // (a constant read before `requires_grad_()` is handed over again then: its managed gradient's lineage read
  // it, so the leaf kept its own gradient alive through a recipe, out of the garbage collector's sight)
  bool hooked = false;
  c10::intrusive_ptr<Readers> readers;  // (null until a recipe reads it)
  // whether a recipe alive reads it (those that died have let go of `readers`; their ops' recipes are gone)
  bool read_live() const { return readers && (g_trace || readers.use_count() > 1); }
  c10::intrusive_ptr<Readers> reader() {
    if (!readers) readers = c10::make_intrusive<Readers>();
    return readers;
  }
  std::vector<c10::weak_intrusive_ptr<c10::TensorImpl>> tensors;  // the tensors seen on it
  bool alive() {
    if (storage.expired()) return false;
    tensors.erase(std::remove_if(tensors.begin(), tensors.end(), [](auto& w) { return w.expired(); }),
                  tensors.end());
    return !tensors.empty();
  }
  void saw(const at::Tensor& t) {
    for (auto& w : tensors)
      if (w._unsafe_get_target() == t.unsafeGetTensorImpl() && !w.expired()) return;
    tensors.emplace_back(t.getIntrusivePtr());
  }
};

// ------------------------------------------------------------------ sessions and tenants
// One session's state in the kernel (NOTE [ Native front end ] 5): the enabling session's, or a tenant's (NOTE [ Tenants ]: each tenant
// is a session of its own, with its core, constants and budget). A thread runs its managed ops on its tenant's
// (`t_py`, set by `use`) or else on the running session's (`g_main`). Never destroyed (no GIL at exit; a thread may
// still point at one): a session let go is cleared instead.
struct Py {
  py::object session, before, ran, cost, written;  // its callbacks
  py::list views;  // ops that made no memory, not yet told to the core (rule 7)
  bool active = false, closed = false;
  bool retry = false;  // a device allocator is followed: an op that runs out of its memory evicts and runs again
  int64_t budget = -1;
  int64_t epoch = -1;  // its number (g_sessions)
  // bytes free under the budget as the core counted them after its last call (-1: not known). An op whose
  // predicted bytes fit skips `before`: the core's reserve would not evict, and its inputs are resident
  int64_t room = -1;
  std::unordered_map<const c10::StorageImpl*, Seen> seen;  // the constants its ops read
  // Constants are swept whole ahead of every call to `before` (so every decision under a budget counts them as
  // eager/front.py would) and otherwise every (number of constants / 8) managed ops: a sweep reads memory that the
  // op evicted from the cache, 148 constants (a 12-layer GPT-2) cost 0.9 us per op when swept at every op. A death
  // is then told up to that many ops late; until then the core counts its bytes (less room, never more).
  size_t sweep_in = 0;
  std::vector<std::pair<intptr_t, int64_t>> gone;  // dead constants found by their address's reuse, not yet told
  void clear() {  // (with the GIL)
    active = closed = false;
    session = before = ran = cost = written = py::none();
    views = py::list();
    seen.clear();
    gone.clear();
    sweep_in = 0;
    budget = room = -1;
  }
};
Py* g_main = new Py();  // the running (or last) session's
thread_local Py* t_py = nullptr;  // this thread's tenant (inside `with torch_dtr.tenant(...)`), or none
std::vector<Py*>* g_ctx = new std::vector<Py*>();  // every session's, by number
std::vector<Py*>* g_family = new std::vector<Py*>();  // the running (or last) session's and its tenants'
std::atomic<bool> g_tenants{false};  // the running session has tenants (the plain path looks at all their constants)
inline Py& cur() {
  Py* p = t_py;
  return p ? *p : *g_main;
}
py::list* g_empty = nullptr;  // one shared empty list, for arguments that stay empty (no callee changes it)
// under a budget with a device (NOTE [ Device memory ] 2): plain ops' fresh outputs on it count as outside bytes
// until the core's next query; their bytes since the last call into the core (any thread adds, the GIL's holder
// takes). The device: 0 none, 1 CUDA (its allocator's 512-byte blocks), 2 the CPU (this front end's `Blocks`), 3
// a simulated device (CPU tensors in 512-byte blocks: simalloc.h).
int g_count_plain = 0;
std::atomic<int64_t> g_plain_bytes{0};
int64_t take_plain() { return g_count_plain ? g_plain_bytes.exchange(0) : 0; }
// inside an optimizer's step(), its updates stay plain (NOTE [ Managed vs constant ] 5): 0 no, 1 a step without a
// closure (the first managed op under grad mode ends it: the step raised), 2 one with a closure
std::atomic<int> g_stepping{0};
int64_t g_ops = 0, g_plain = 0, g_calls = 0, g_replays = 0, g_rng = 0, g_misses = 0, g_cost_misses = 0, g_queued = 0;
// writes to constants that recipes had read: told to the core (live readers), and not (none left alive)
int64_t g_writes_told = 0, g_writes_untold = 0;

// the queued ops that made no memory, for the next call into the core (rule 7); None when there are none
py::object take_views(Py& p) {
  if (p.views.empty()) return py::none();
  py::list out = p.views;
  p.views = py::list();
  return std::move(out);
}

// ------------------------------------------------------------------ records
struct Slot : c10::intrusive_ptr_target {  // one core storage (rules 2 and 6)
  TORCH_DTR_POOLED
  c10::StorageImpl* impl;  // its StorageImpl: alive while `owned` or a tensor holds it
  c10::weak_intrusive_ptr<c10::StorageImpl> weak;  // keeps `impl` addressable, says whether it lives
  c10::Storage owned;  // the slot's own reference, held while no handle holds the StorageImpl (rule 6)
  bool shared = false;  // its memory is also a plain tensor's (an unwrapped gradient): never nulled
  explicit Slot(c10::Storage s) : impl(s.unsafeGetStorageImpl()), weak(s.getWeakStorageImpl()), owned(std::move(s)) {}
  // its StorageImpl, as a reference of one's own (raises if it died behind the slot's back: rule 6)
  c10::Storage storage() const {
    auto p = weak.lock();
    TORCH_CHECK(p, "torch_dtr native: a managed value's memory was released while torch-dtr still needed it (a "
                "tensor's storage replaced where torch-dtr could not see it?)");
    return c10::Storage(std::move(p));
  }
  void own(c10::Storage s) {  // another StorageImpl, held by the slot alone
    impl = s.unsafeGetStorageImpl();
    weak = s.getWeakStorageImpl();
    owned = std::move(s);
  }
  void lend() {  // handles hold the StorageImpl now
    if (owned && g_lend) owned = c10::Storage();
  }
  void reclaim() {  // its last handle is dying (still holding the StorageImpl): the slot holds it again
    if (!owned) {
      auto p = weak.lock();
      if (p) owned = c10::Storage(std::move(p));
    }
  }
  // (a StorageImpl that died behind the slot's back has released its data, so it reads as evicted)
  bool resident() const { return impl->nbytes() == 0 || impl->data() != nullptr; }
  void drop() {
    if (!shared) impl->set_data_ptr_noswap(c10::DataPtr(nullptr, impl->device()));
  }
};
using SlotPtr = c10::intrusive_ptr<Slot>;

// ------------------------------------------------------------------ payloads and recipes as Python objects
// The two Python objects made per managed op, a storage's payload (a Value: its slot) and a recipe, are instances
// of two types defined here with CPython's API, not pybind11 classes: pybind11 registers every instance in a
// global map and looks up its type on each cast and deallocation, which `py-spy --native` put at a tenth of a
// small op's time (docs/native.md). Their rarer methods (a copy out or back, a recomputation) call functions
// bound with pybind11 (`_value_take`, `_value_fill`, `_recipe_call`), which translate C++ exceptions as usual.
struct ValueObject {
  PyObject_HEAD
  SlotPtr slot;
};
PyTypeObject g_value_type = {PyVarObject_HEAD_INIT(nullptr, 0)};  // completed at import (init_types)

py::object value_of(SlotPtr slot) {  // a new payload
  auto* o = PyObject_New(ValueObject, &g_value_type);
  if (!o) throw py::error_already_set();
  new (&o->slot) SlotPtr(std::move(slot));
  return py::reinterpret_steal<py::object>(reinterpret_cast<PyObject*>(o));
}

Slot* slot_of_value(py::handle v) {  // nullptr: not a payload
  return Py_TYPE(v.ptr()) == &g_value_type ? reinterpret_cast<ValueObject*>(v.ptr())->slot.get() : nullptr;
}

struct Buffer : c10::intrusive_ptr_target {  // the handles of one storage (rule 3)
  TORCH_DTR_POOLED
  SlotPtr slot;
  PyObject* storage;  // the core's Storage (a strong reference)
  int64_t epoch;      // the session whose core keeps it
  Buffer(SlotPtr s, PyObject* st, int64_t e) : slot(std::move(s)), storage(st), epoch(e) { ++(*g_buffers)[epoch]; }
  ~Buffer() override {
    slot->reclaim();  // (when a handle still holds the StorageImpl; the last holder among them did already)
    std::lock_guard<pool::Spin> lock(g_dead_mutex);
    g_dead.emplace_back(epoch, storage);
    g_dead_any.store(true, std::memory_order_release);
  }
};

struct Handle : c10::TensorImpl {
  TORCH_DTR_POOLED
  c10::intrusive_ptr<Buffer> buffer;
  Handle(c10::Storage s, DispatchKeySet ks, caffe2::TypeMeta dt, c10::intrusive_ptr<Buffer> b)
      : c10::TensorImpl(std::move(s), ks, dt), buffer(std::move(b)) {}
  // The last holder of its slot's StorageImpl among the handles hands it back to the slot before letting go
  // (rule 6): in the destructor (the storage goes after it), in release_resources, where TensorImpl lets go of
  // its storage when weak references keep the object (the destructor then comes later, or never soon), and
  // before its storage is replaced.
  void release_resources() override {
    let_go();
    c10::TensorImpl::release_resources();
  }
  ~Handle() override { let_go(); }
  void let_go() {
    if (!buffer) return;
    keep();
    buffer.reset();
  }
  void keep() const {  // this handle is about to let go of its storage: if it is the last holder, the slot takes it
    if (storage_.unsafeGetStorageImpl() == buffer->slot->impl && storage_.use_count() == 1) buffer->slot->reclaim();
  }
  // `t.data = other` replaces this handle's storage (autograd's set_data): the same hand-back first
  void shallow_copy_from(const c10::intrusive_ptr<c10::TensorImpl>& impl) override {
    if (buffer) keep();
    c10::TensorImpl::shallow_copy_from(impl);
  }
  template <typename VC>
  c10::intrusive_ptr<c10::TensorImpl> copy_(VC&& vc, bool allow) const {
    auto impl = c10::make_intrusive<Handle>(c10::Storage(storage()), key_set(), dtype(), buffer);
    copy_tensor_metadata(this, impl.get(), std::forward<VC>(vc), allow);
    impl->refresh_numel();
    impl->refresh_contiguous();
    return impl;
  }
  c10::intrusive_ptr<c10::TensorImpl> shallow_copy_and_detach(const c10::VariableVersion& vc, bool a) const override {
    return copy_(vc, a);
  }
  c10::intrusive_ptr<c10::TensorImpl> shallow_copy_and_detach(c10::VariableVersion&& vc, bool a) const override {
    return copy_(std::move(vc), a);
  }
};

Handle* handle_of(const at::Tensor& t) {
  if (!t.defined() || !t.key_set().has_backend(BackendComponent::PrivateUse1Bit)) return nullptr;
  c10::TensorImpl* impl = t.unsafeGetTensorImpl();  // (a type's identity, cheaper than a dynamic_cast: no subclasses)
  return typeid(*impl) == typeid(Handle) ? static_cast<Handle*>(impl) : nullptr;
}

at::Tensor make_handle(const at::Tensor& t, c10::intrusive_ptr<Buffer> b) {
  auto ks = t.key_set() | DispatchKeySet(BackendComponent::PrivateUse1Bit);
  Slot* slot = b->slot.get();
  auto impl = c10::make_intrusive<Handle>(c10::Storage(t.storage()), ks, t.dtype(), std::move(b));
  impl->set_sizes_and_strides(t.sizes(), t.strides(), t.storage_offset());
  if (slot->impl == t.storage().unsafeGetStorageImpl()) slot->lend();
  return at::Tensor(std::move(impl));
}

// ------------------------------------------------------------------ CPU blocks (NOTE [ Native front end ] 7)
// c10's CPU allocator asks the C library for 64-byte aligned blocks; a hole left in the heap by a freed block
// cannot take a new block of the same size (the alignment needs more than the hole has), so with this front
// end's order of frees the heap grew instead of reusing its holes. This allocator asks for 80 bytes more with
// plain malloc and aligns inside: a freed block's hole fits its successor of the same size exactly. It counts
// the bytes it has handed out (and their peak): a CPU process's allocator count, as CUDA's caching allocator
// keeps one (`cpu_blocks_usage`; tests bound it with a budget, NOTE [ Native front end ] 8).
// A capacity (tests: `cpu_blocks_capacity`) makes an allocation that would pass it raise c10's OutOfMemoryError,
// worded as CUDA's allocator words it, so that out-of-memory retries run on the CPU.
std::atomic<int64_t> g_blocks_now{0}, g_blocks_peak{0}, g_blocks_capacity{-1};
// the capacity binds only threads whose ops a session manages, and the ops it runs (the CPU device: NOTE [ The CPU
// as a device ] 7 in cpudevice.py): a thread not attached to the session allocates as without torch-dtr
std::atomic<bool> g_blocks_cap_session{false};
bool attached();
// a second peak, read and restarted by compiled regions' plans (`cpu_blocks_mark`), apart from the one users reset
std::atomic<int64_t> g_blocks_mark{0};

// Freed blocks of 4 KiB or more are kept for reuse by a block of the same size (a training step asks for the
// same sizes every step): the C library returned large freed blocks to the kernel (mmap, or trimming the heap's
// top), so the next step's blocks faulted their pages in afresh, about 1,100 page faults and 2 ms per step of
// the small GPT-2 (plain PyTorch's own order of frees: a few hundred). The blocks kept and those in use together
// never pass the most that was in use at once since the cache was last emptied (the oldest kept go back to the
// C library first): a process holds no more than it did at its peak, as with plain PyTorch. Emptied when the
// allocator is taken out and when the budget changes (`cpu_blocks_empty`).
namespace kept {
constexpr size_t kLeast = 4096;
struct Entry {
  size_t n;
  void* raw;
};
pool::Spin g_mutex;  // (taken twice per managed op that makes a block: no pthread mutex's calls)
// (never destroyed: a tensor may be freed after static destructors ran, at exit)
auto& g_order = *new std::list<Entry>();  // oldest first
auto& g_sized = *new std::unordered_map<size_t, std::vector<std::list<Entry>::iterator>>();
int64_t g_bytes = 0, g_high = 0, g_hits = 0, g_misses = 0;
bool g_on = false;

// a kept block of exactly n bytes; or null, the oldest kept having gone until in use (`now`) + n + kept fit the peak
void* take(size_t n, int64_t now) {
  std::lock_guard<pool::Spin> g(g_mutex);
  auto it = g_on ? g_sized.find(n) : g_sized.end();
  if (it != g_sized.end()) {  // (a size's entry goes with its last block: sizes that never repeat leave none)
    auto e = it->second.back();
    it->second.pop_back();
    if (it->second.empty()) g_sized.erase(it);
    void* raw = e->raw;
    g_order.erase(e);
    g_bytes -= static_cast<int64_t>(n);
    ++g_hits;
    return raw;
  }
  ++g_misses;
  const int64_t want = now + static_cast<int64_t>(n);
  g_high = std::max(g_high, want);
  while (g_bytes > 0 && want + g_bytes > g_high) {
    Entry e = g_order.front();
    auto at = g_sized.find(e.n);
    auto& v = at->second;
    v.erase(std::find(v.begin(), v.end(), g_order.begin()));
    if (v.empty()) g_sized.erase(at);
    g_order.pop_front();
    g_bytes -= static_cast<int64_t>(e.n);
    std::free(e.raw);
  }
  return nullptr;
}

bool keep(void* raw, size_t n) {
  std::lock_guard<pool::Spin> g(g_mutex);
  if (!g_on) return false;
  g_order.push_back(Entry{n, raw});
  g_sized[n].push_back(std::prev(g_order.end()));
  g_bytes += static_cast<int64_t>(n);
  return true;
}

void empty(bool on, int64_t now) {
  std::lock_guard<pool::Spin> g(g_mutex);
  for (auto& e : g_order) std::free(e.raw);
  g_order.clear();
  g_sized.clear();
  g_bytes = 0;
  g_high = now;
  g_on = on;
}
}  // namespace kept

struct Blocks final : c10::Allocator {
  static constexpr size_t kAlign = 64, kHead = 2 * sizeof(void*);
  // the block's start (whose first word is the size asked for) is kept just below the aligned data, so that
  // data and context are one pointer (the raw interface, which some kernels use for scratch memory, requires it)
  static void release(void* data) {
    if (!data) return;
    void* raw = static_cast<void**>(data)[-1];
    const size_t n = *static_cast<size_t*>(raw);
    if (simalloc::on()) simalloc::give(data);  // (before the address can be handed out again)
    g_blocks_now.fetch_sub(static_cast<int64_t>(n), std::memory_order_relaxed);
    if (n < kept::kLeast || !kept::keep(raw, n)) std::free(raw);
  }
  c10::DataPtr allocate(size_t n) override {
    const int64_t cap = g_blocks_capacity.load(std::memory_order_relaxed);
    if (cap >= 0 && g_blocks_now.load(std::memory_order_relaxed) + static_cast<int64_t>(n) > cap) {
      const bool session = g_blocks_cap_session.load(std::memory_order_relaxed);
      if (!session || g_depth > 0 || attached()) {
        char what[240];
        std::snprintf(what, sizeof what, "CPU blocks out of memory. Tried to allocate %.2f MiB (capacity %lld B%s)",
                      static_cast<double>(n) / (1 << 20), static_cast<long long>(cap),
                      session ? ": torch_dtr.enable(device='cpu')'s budget less the constants counted beside it" : "");
        TORCH_CHECK_WITH(OutOfMemoryError, false, what);
      }
    }
    void* raw = n >= kept::kLeast ? kept::take(n, g_blocks_now.load(std::memory_order_relaxed)) : nullptr;
    if (!raw) {
      raw = std::malloc(n + kAlign + kHead);
      if (!raw) {  // the kept blocks go back first
        kept::empty(kept::g_on, g_blocks_now.load());
        raw = std::malloc(n + kAlign + kHead);
      }
      if (!raw) throw std::bad_alloc();
    }
    *static_cast<size_t*>(raw) = n;
    const auto start = reinterpret_cast<uintptr_t>(raw) + kHead;
    void* data = reinterpret_cast<void*>((start + kAlign - 1) & ~(kAlign - 1));
    static_cast<void**>(data)[-1] = raw;
    if (simalloc::on()) {  // a simulated device carves the block too, and may be out of memory (simalloc.h)
      try {
        simalloc::take(data, n);
      } catch (...) {
        if (n < kept::kLeast || !kept::keep(raw, n)) std::free(raw);
        throw;
      }
    }
    const int64_t now = g_blocks_now.fetch_add(static_cast<int64_t>(n), std::memory_order_relaxed) + n;
    int64_t peak = g_blocks_peak.load(std::memory_order_relaxed);
    while (now > peak && !g_blocks_peak.compare_exchange_weak(peak, now, std::memory_order_relaxed)) {
    }
    int64_t mark = g_blocks_mark.load(std::memory_order_relaxed);
    while (now > mark && !g_blocks_mark.compare_exchange_weak(mark, now, std::memory_order_relaxed)) {
    }
    return {data, data, &release, c10::Device(c10::kCPU)};
  }
  c10::DeleterFnPtr raw_deleter() const override { return &release; }
  void copy_data(void* dest, const void* src, std::size_t count) const override { default_copy_data(dest, src, count); }
};
Blocks g_blocks;
c10::Allocator* g_cpu_was = nullptr;

bool cpu_blocks_on() { return c10::GetCPUAllocator() == &g_blocks; }

std::pair<int64_t, int64_t> cpu_blocks_usage() {  // bytes handed out now, and at most since the last reset
  return {g_blocks_now.load(), g_blocks_peak.load()};
}

// whether a tensor's data is a block of this allocator (counted in `cpu_blocks_usage`)
bool cpu_blocks_owns(const at::Tensor& t) {
  return t.has_storage() && t.storage().data_ptr().get_deleter() == &Blocks::release;
}

// the most bytes handed out at once since the last call (NOTE [ Compiled regions under a budget ] 4)
int64_t cpu_blocks_mark() { return g_blocks_mark.exchange(g_blocks_now.load()); }

void cpu_blocks_reset_peak() { g_blocks_peak.store(g_blocks_now.load()); }

void cpu_blocks_capacity(int64_t n, bool session_only) {  // -1: none
  g_blocks_cap_session.store(session_only);
  g_blocks_capacity.store(n);
}

// the kept blocks go back to the C library; the peak that bounds them starts again from what is in use
void cpu_blocks_empty() { kept::empty(cpu_blocks_on(), g_blocks_now.load()); }

// bytes kept, hits and misses of blocks kept, and the sizes that have blocks kept
std::tuple<int64_t, int64_t, int64_t, int64_t> cpu_blocks_kept() {
  std::lock_guard<pool::Spin> g(kept::g_mutex);
  return {kept::g_bytes, kept::g_hits, kept::g_misses, static_cast<int64_t>(kept::g_sized.size())};
}

// installed while a session (`cpu_blocks`) or a simulated device (`cpu_blocks_sim`) wants it
bool g_blocks_session = false, g_blocks_sim = false;
void blocks_install() {
  const bool on = g_blocks_session || g_blocks_sim;
  kept::empty(on, g_blocks_now.load());
  if (on && !g_cpu_was) {
    g_cpu_was = c10::GetCPUAllocator();
    c10::SetCPUAllocator(&g_blocks, 100);
  } else if (!on && g_cpu_was) {
    c10::SetCPUAllocator(g_cpu_was, 100);
    g_cpu_was = nullptr;
  }
}
void cpu_blocks(bool on) {
  g_blocks_session = on;
  blocks_install();
}
void cpu_blocks_sim(bool on) {
  g_blocks_sim = on;
  blocks_install();
}

// ------------------------------------------------------------------ running below
// The thread's dispatch state with the PrivateUse1 bit in or out (rule 1). c10's tls_set_dispatch_key_included
// cannot take it out again: removing a per-backend key from a key set removes its functionality (Dense), not
// its backend bit, which then keeps sending every op of the thread to `kernel` (and, where no kernel is
// registered, fails). Both are set and cleared here.
bool attached() {
  return c10::impl::tls_local_dispatch_key_set().included_.has_backend(BackendComponent::PrivateUse1Bit);
}

void attach(bool on) {
  auto local = c10::impl::tls_local_dispatch_key_set();
  if (on) local.included_ = local.included_ | DispatchKeySet(c10::DispatchKey::PrivateUse1);
  else local.included_ = local.included_.remove_backend(BackendComponent::PrivateUse1Bit) -
                         DispatchKeySet(c10::DispatchKey::Dense);
  c10::impl::_force_tls_local_dispatch_key_set(local);
}

struct Below {  // ops run inside are not the program's (exception-safe)
  bool was;
  Below() : was(attached()) {
    ++g_depth;
    if (was) attach(false);
  }
  ~Below() {
    --g_depth;
    if (was) attach(true);
  }
};

// A compiled region's kernels (NOTE [ Unmanaged regions ] 1): the aten ops they call through the dispatcher (extern
// kernels: convolutions, matmuls; their buffers' allocations) take the plain path, managed inputs or not: reserved
// ahead and retried on the device's out-of-memory as any plain op, never managed. Managed, their outputs were values
// the kernels hold by address (an eviction would free memory a kernel still reads) and whose deaths the core heard
// of late (a region's temporaries outlived it). Entered and left in pairs on one thread (a region's call; its
// backward's node, from its pre-hook to its hook); `region_leave` is false where none was entered.
thread_local int t_region = 0;

void region_enter() { ++t_region; }

bool region_leave() {
  if (t_region == 0) return false;
  --t_region;
  return true;
}

// benchmarks (native.passthrough): the fallback's floor, every op of this thread passed straight down by `kernel`
// (its `g_depth > 0` path: no facts, no scan, no GIL)
thread_local bool t_passthrough = false;

// managed tensors alive, of any session (buffers made, less those whose death is queued)
int64_t live_buffers();

void set_passthrough(bool on) {
  if (on == t_passthrough) return;
  TORCH_CHECK(!on || !attached(), "torch_dtr native: passthrough() while the front end manages this thread's ops");
  const int64_t live = on ? live_buffers() : 0;
  TORCH_CHECK(live == 0, "torch_dtr native: passthrough() while ", live, " storages of managed tensors are alive: ",
              "their ops need the front end (an evicted one would be read without its data); delete them first");
  t_passthrough = on;
  g_depth += on ? 1 : -1;
  attach(on);
}

DispatchKeySet below_of(DispatchKeySet ks) {
  return (ks & DispatchKeySet(DispatchKeySet::FULL_AFTER, c10::DispatchKey::Fake))
      .remove_backend(BackendComponent::PrivateUse1Bit);
}

struct Facts {  // per operator, read once from its schema
  std::vector<bool> written;
  std::vector<const c10::AliasInfo*> returns;
  bool random = false, writes = false, replayable = true, unannotated = false;
  bool cross_device = false;  // may copy to another device: replayable only where its outputs stay on the input's
  bool fresh = false;         // some output is a tensor of its own (NOTE [ Managed vs constant ] 5)
  bool nested = false;        // makes nested tensors: never managed
  bool foreign = false;       // not aten's or prims' (c10d's collectives, custom ops): may block (rule 4)
  // batch norm's running statistics (argument positions), written in training mode without the schema saying
  // so, and the position of its `training` flag (-1: none): NOTE [ In-place mutation ] 4 and 6
  std::vector<size_t> stats;
  int64_t training = -1;
  std::vector<bool> kwarg_only;  // per argument
  int cost_kind = 5;  // how the cost model counts its FLOPs (eager/costs.py cost_kind): 0-4 here, 5 in Python
  double weight_cpu = 1.0, weight_cuda = 1.0;  // its weights in the cost model (NOTE [ Modelled costs ] 5)
  // eager/sizes.py's rules for ops whose meta kernel is wrong or missing (NOTE [ Size prediction ] 3, 5, 8):
  // 0 none, 1 a rule that reads only shapes (run on the meta arguments, then the real size learned per call
  // signature), 2 a rule that reads the data (size_rule_kind)
  int size_rule = 0;
  py::object name;  // "aten.mul.Tensor": for the core's messages and the cost model
};

// The cost model's module (eager/costs.py) and its rates (NOTE [ Modelled costs ] 3 and 4), read once under the GIL
py::object cost_model() {
  static py::object* m = nullptr;
  if (!m) m = new py::object(py::module_::import("torch_dtr.eager.costs"));  // never destroyed: no GIL at exit
  return *m;
}
struct Rates {
  double cpu_flops, cpu_bytes, cuda_flops, cuda_bytes;
};
py::object size_rules() {  // eager/sizes.py (NOTE [ Size prediction ]), under the GIL
  static py::object* m = nullptr;
  if (!m) m = new py::object(py::module_::import("torch_dtr.eager.sizes"));  // never destroyed: no GIL at exit
  return *m;
}
Rates* g_rates = nullptr;  // set with the first facts (under the GIL)

// Facts are built once per operator, under the GIL (their name is a Python string) and a mutex (any thread's
// ops reach the kernel: autograd's device threads run backward ops on CUDA), and kept for good (never
// destroyed: no GIL at exit); each thread reads them through a map of its own, without locks.
std::mutex g_facts_mutex;
auto* g_facts = new std::unordered_map<const c10::FunctionSchema*, Facts>();

const Facts& build_facts(const c10::OperatorHandle& op) {
  py::gil_scoped_acquire gil;
  std::lock_guard<std::mutex> lock(g_facts_mutex);
  const auto& schema = op.schema();
  auto it = g_facts->find(&schema);
  if (it != g_facts->end()) return it->second;
  if (!g_rates) {
    py::dict r = cost_model().attr("RATES");
    auto cpu = r["cpu"].cast<std::pair<double, double>>(), cuda = r["cuda"].cast<std::pair<double, double>>();
    g_rates = new Rates{cpu.first, cpu.second, cuda.first, cuda.second};
  }
  Facts f;
  for (const auto& a : schema.arguments()) {
    bool w = a.alias_info() && a.alias_info()->isWrite();
    if (!w && (a.name() == "running_mean" || a.name() == "running_var")) f.stats.push_back(f.written.size());
    if (a.name() == "training") f.training = static_cast<int64_t>(f.written.size());
    f.kwarg_only.push_back(a.kwarg_only());
    f.written.push_back(w);
    f.writes |= w;
    if (a.type()->kind() == c10::TypeKind::OptionalType &&
        a.type()->castRaw<c10::OptionalType>()->getElementType()->kind() == c10::TypeKind::GeneratorType)
      f.random = true;
  }
  const std::string& full = schema.name();
  std::string base = full.substr(full.find("::") + 2);
  if (full.rfind("c10d::", 0) == 0 && !base.empty() && base.back() == '_' && !f.writes && !f.written.empty()) {
    // c10d's in-place collectives (allreduce_, broadcast_, allgather_, recv_, ...) write their first argument,
    // which their schemas leave unmarked (as eager/funcinfo.py): what they wrote is pinned, never recomputed
    f.written[0] = true;
    f.writes = true;
  }
  for (const auto& r : schema.returns()) {
    f.returns.push_back(r.alias_info());
    f.fresh |= !r.alias_info() && r.type()->kind() == c10::TypeKind::TensorType;
  }
  f.random |= op.hasTag(at::Tag::nondeterministic_seeded);
  // as eager/funcinfo.py: replaying these would repeat a side effect or give another value
  static const char* never[] = {"record_stream", "set_", "resize_", "resize_as_", "_local_scalar_dense", "linalg_lstsq"};
  for (const char* n : never) f.replayable &= base != n;
  f.foreign = full.rfind("aten::", 0) != 0 && full.rfind("prims::", 0) != 0;
  f.replayable &= !f.foreign;
  static const char* crossing[] = {"_to_copy", "to", "copy", "_copy_from", "_copy_from_and_resize"};
  for (const char* n : crossing) f.cross_device |= base == n;
  f.nested = full.find("_nested") != std::string::npos;
  static const char* aliasing[] = {"_unsafe_view", "_reshape_alias", "_unsafe_index_put", "unsafe_split",
                                   "unsafe_split_with_sizes", "unsafe_chunk"};
  for (const char* n : aliasing) f.unannotated |= base == n;
  f.name = py::str(full.substr(0, full.find("::")) + "." + base + "." +
                   (schema.overload_name().empty() ? "default" : schema.overload_name()));
  f.cost_kind = cost_model().attr("cost_kind")(f.name).cast<int>();
  std::tie(f.weight_cpu, f.weight_cuda) = cost_model().attr("weights")(f.name).cast<std::pair<double, double>>();
  if (full.rfind("aten::", 0) == 0) f.size_rule = size_rules().attr("rule_kind")(base).cast<int>();
  return g_facts->emplace(&schema, std::move(f)).first->second;
}

const Facts& facts(const c10::OperatorHandle& op) {
  thread_local std::unordered_map<const c10::FunctionSchema*, const Facts*> mine;
  const auto* schema = &op.schema();
  auto it = mine.find(schema);
  if (it != mine.end()) return *it->second;
  const Facts& f = build_facts(op);
  mine.emplace(schema, &f);
  return f;
}

template <typename F>
void each_tensor(const IValue& v, F&& fn) {  // the tensors of an argument: a tensor, a list, an optional list
  if (v.isTensor()) {
    if (v.toTensor().defined()) fn(v.toTensor());
  } else if (v.isTensorList()) {
    for (const at::Tensor& t : v.toTensorList()) fn(t);
  } else if (v.isList()) {
    for (const IValue& e : v.toListRef())
      if (e.isTensor() && e.toTensor().defined()) fn(e.toTensor());
  }
}

// ------------------------------------------------------------------ signatures: sizes and costs cached per call
struct Key {
  const c10::FunctionSchema* schema;
  std::vector<int64_t> words;
  bool operator==(const Key& o) const { return schema == o.schema && words == o.words; }
};
struct KeyHash {
  size_t operator()(const Key& k) const {
    size_t h = std::hash<const void*>()(k.schema);
    for (int64_t w : k.words) h = h * 1000003u ^ std::hash<int64_t>()(w);
    return h;
  }
};

int64_t bits_of(double d) {
  int64_t b;
  std::memcpy(&b, &d, sizeof b);
  return b;
}

bool describe(const IValue& v, std::vector<int64_t>& w) {  // false: not cacheable
  if (v.isTensor()) {
    const auto& t = v.toTensor();
    if (!t.defined()) {
      w.push_back(-1);
      return true;
    }
    if (t.layout() != c10::kStrided) return false;
    w.push_back(static_cast<int64_t>(t.scalar_type()) * 1000 + t.dim());
    w.push_back(static_cast<int64_t>(t.device().type()));
    for (auto x : t.sizes()) w.push_back(x);
    for (auto x : t.strides()) w.push_back(x);
    return true;
  }
  if (v.isNone()) w.push_back(-2);
  else if (v.isInt()) w.push_back(v.toInt());
  else if (v.isBool()) w.push_back(v.toBool() ? 7 : 8);
  else if (v.isDouble()) w.push_back(bits_of(v.toDouble()));
  else if (v.isIntList()) {
    for (auto x : v.toIntVector()) w.push_back(x);
    w.push_back(-3);
  } else if (v.isTensorList()) {
    for (const at::Tensor& t : v.toTensorList())
      if (!describe(IValue(t), w)) return false;
    w.push_back(-4);
  } else if (v.isScalar()) {
    auto sc = v.toScalar();
    if (!sc.isIntegral(false) && !sc.isFloatingPoint() && !sc.isBoolean()) return false;
    w.push_back(bits_of(sc.toDouble()));
  } else if (v.isDevice()) {
    w.push_back(static_cast<int64_t>(v.toDevice().type()) * 100 + v.toDevice().index());
  } else if (v.isBoolList()) {
    for (bool b : v.toBoolList()) w.push_back(b);
    w.push_back(-5);
  } else if (v.isDoubleList()) {
    for (double d : v.toDoubleVector()) w.push_back(bits_of(d));
    w.push_back(-6);
  } else if (v.isString()) {
    w.push_back(static_cast<int64_t>(std::hash<std::string_view>()(v.toStringView())));
  } else {
    return false;  // generators, optional tensor lists, ...: not cached
  }
  return true;
}

std::unordered_map<Key, int64_t, KeyHash> g_sizes;
// NOTE [ Scratch memory ]
// 1. A kernel may allocate more than its outputs while it runs (a copy of an input in another layout, a workspace)
//    and free it before it returns: bytes the allocator counts, that no meta kernel reports. Under a budget they pass
//    it unless reserved ahead.
// 2. On a device whose allocator can say the most it held during a stretch (the simulated one, simalloc.h), every
//    managed op under a budget is watched: the most allocated while it ran, less what it held before and its
//    outputs, is the op's scratch, kept per call signature (the most seen), and reserved with its outputs from the
//    next call of that signature on. The first call of a signature is not covered: its excess, if any, is what
//    NOTE [ Budget accounting ] 6 measures.
// 3. On CUDA nothing is watched yet (the caching allocator's peak is the user's, and resetting it per op would
//    change what `torch.cuda.max_memory_allocated` reports): there rule 6 alone covers scratch memory.
std::unordered_map<Key, int64_t, KeyHash> g_scratch;
std::unordered_map<Key, double, KeyHash> g_costs;
// Both caches are bounded, as eager/sizes.py's: a scalar that changes every call (a schedule's factor) makes a new
// signature every time, and the caches would grow for as long as the program runs; full, a cache starts again.
constexpr size_t kCacheMax = 20000;
template <typename Map>
Map& bounded(Map& m) {
  if (m.size() >= kCacheMax) m.clear();
  return m;
}

// The cost model of eager/costs.py (NOTE [ Modelled costs ] 4) for an op whose FLOPs need no formula of PyTorch's:
// (FLOPs / rate + bytes moved / bandwidth) x the op's weight (rule 5), the same float as model_cost gives. `args`:
// the op's arguments as called; `outs`: its returns. False where Python must answer (a non-strided output, a
// matmul's shapes not as expected).
int64_t bytes_of(const IValue& v) {  // costs.py _bytes: each tensor's numel x element size, lists summed
  if (v.isTensor()) {  // (a wrapped number, `x * 2.0`'s 2.0, reaches Python as a float: no bytes)
    const auto& t = v.toTensor();
    return t.defined() && !t.unsafeGetTensorImpl()->is_wrapped_number()
               ? t.numel() * static_cast<int64_t>(t.element_size()) : 0;
  }
  int64_t n = 0;
  if (v.isList())
    for (const IValue& e : v.toListRef()) n += bytes_of(e);
  else if (v.isTuple())
    for (const IValue& e : v.toTupleRef().elements()) n += bytes_of(e);
  return n;
}

bool cost_here(const Facts& f, const std::vector<IValue>& args, const IValue* outs, size_t nout, double& cost) {
  int64_t moved = 0;
  bool cuda = false;  // the rates of the device the op ran on: a positional tensor or an output on CUDA
  std::vector<const IValue*> pos;
  for (size_t i = 0; i < args.size(); ++i) {
    moved += bytes_of(args[i]);
    if (i < f.kwarg_only.size() && f.kwarg_only[i]) continue;
    pos.push_back(&args[i]);
    if (args[i].isTensor() && args[i].toTensor().defined()) cuda |= args[i].toTensor().is_cuda();
  }
  auto out = [&](const IValue& v) {
    if (!v.isTensor() || !v.toTensor().defined()) return true;
    const auto& t = v.toTensor();
    if (t.layout() != c10::kStrided || t.is_nested()) return false;  // Python counts their values its own way
    moved += t.numel() * static_cast<int64_t>(t.element_size());
    cuda |= t.is_cuda();
    return true;
  };
  for (size_t k = 0; k < nout; ++k) {
    if (outs[k].isList()) {
      for (const IValue& e : outs[k].toListRef())
        if (!out(e)) return false;
    } else if (!out(outs[k])) {
      return false;
    }
  }
  int64_t flops = 0;
  if (f.cost_kind > 0) {  // 2 x m x k x n of mm, bmm, addmm, baddbmm (the last two: their matrices come second)
    const size_t first = f.cost_kind >= 3 ? 1 : 0;
    const int64_t dims = f.cost_kind % 2 ? 2 : 3;
    if (pos.size() < first + 2 || !pos[first]->isTensor() || !pos[first + 1]->isTensor()) return false;
    const auto& a = pos[first]->toTensor();
    const auto& b = pos[first + 1]->toTensor();
    if (!a.defined() || !b.defined() || a.dim() != dims || b.dim() < 1) return false;
    flops = 2 * b.size(-1);
    for (int64_t d = 0; d < dims; ++d) flops *= a.size(d);
  }
  const Rates& r = *g_rates;
  cost = (static_cast<double>(flops) / (cuda ? r.cuda_flops : r.cpu_flops) +
          static_cast<double>(moved) / (cuda ? r.cuda_bytes : r.cpu_bytes)) *
         (cuda ? f.weight_cuda : f.weight_cpu);
  return true;
}
bool g_check_costs = false;  // tests: misses answered here are asked of Python too, and compared

int64_t g_cost_here = 0, g_cost_mismatches = 0, g_released = 0;  // managed ops run without the GIL
std::string g_cost_mismatch;  // the first

// An argument of the meta call: tensors as meta tensors of their geometry, a device as `meta` (`_to_copy(x,
// device=cpu)` on a meta input asks for a copy out of meta and fails, and the op went unsized: eager/sizes.py's
// rule 7), no generator (a meta kernel takes none of another device).
IValue to_meta(const IValue& v) {
  if (v.isDevice()) return IValue(c10::Device(c10::kMeta));
  if (v.isGenerator()) return IValue();
  if (v.isTensor() && v.toTensor().defined()) {
    const auto& t = v.toTensor();
    return at::empty_strided(t.sizes(), t.strides(), t.options().device(c10::kMeta));
  }
  if (v.isTensorList()) {
    c10::List<at::Tensor> l;
    for (const at::Tensor& t : v.toTensorList()) l.push_back(to_meta(IValue(t)).toTensor());
    return l;
  }
  return v;
}

// The bytes of the op's fresh outputs, from its meta kernel (0 where it has none or sizes depend on data:
// the core then makes room after the op, as for a prediction that fell short).
// Asks eager/sizes.py (NOTE [ Size prediction ]) for the bytes of the op's fresh outputs: `fn` is "rule_bytes" (its
// rule for this op) or "low_bytes" (its meta kernel with floating inputs as bfloat16: rule 2); the arguments as they
// are on `stack` from `start` (`meta`: as meta tensors). 0 where it has no answer. Rare: on a size-cache miss.
int64_t ask_sizes(const char* fn, const c10::OperatorHandle& op, const torch::jit::Stack& stack, size_t start,
                  const Facts& f, bool meta) {
  py::gil_scoped_acquire gil;
  Below b;  // a data rule's own ops on the inputs run plain
  py::list args;
  py::dict kwargs;
  try {
    for (size_t i = start; i < stack.size(); ++i) {
      py::object a = torch::jit::toPyObject(meta ? to_meta(stack[i]) : stack[i]);
      const auto& arg = op.schema().arguments()[i - start];
      if (arg.kwarg_only()) kwargs[py::str(arg.name())] = a;
      else args.append(a);
    }
  } catch (const c10::Error&) {  // an input no meta tensor can stand for (sparse CSR: no strides): as unsized
    return 0;
  }
  try {
    return size_rules().attr(fn)(f.name, py::tuple(args), kwargs).cast<int64_t>();
  } catch (const py::error_already_set&) {  // a rule that cannot read these arguments: as unsized
    return 0;
  }
}

// The bytes of the op's fresh outputs: its meta kernel, or eager/sizes.py's rule where the meta kernel is wrong or
// missing (Facts::size_rule); 0 where nothing sizes it (the core then makes room right after the op, counted).
int64_t predict(const c10::OperatorHandle& op, const torch::jit::Stack& stack, size_t start, const Facts& f,
                const Key* key, bool evicted) {
  if (f.size_rule == 2)  // the rule reads the data: on the inputs themselves (resident), never cached
    return evicted ? 0 : ask_sizes("rule_bytes", op, stack, start, f, false);
  if (key) {
    auto it = g_sizes.find(*key);
    if (it != g_sizes.end()) return it->second;
  }
  ++g_misses;
  int64_t bytes = 0;
  if (f.size_rule == 1) {  // a rule that reads shapes, on the meta arguments; the real size is learned after
    bytes = ask_sizes("rule_bytes", op, stack, start, f, true);
    if (key) bounded(g_sizes).emplace(*key, bytes);
    return bytes;
  }
  bool failed = false;
  try {
    Below b;
    torch::jit::Stack meta;
    for (size_t i = start; i < stack.size(); ++i) meta.push_back(to_meta(stack[i]));
    std::vector<const c10::StorageImpl*> ins;
    for (const auto& v : meta)
      if (v.isTensor() && v.toTensor().defined()) ins.push_back(v.toTensor().storage().unsafeGetStorageImpl());
    op.redispatchBoxed(DispatchKeySet(c10::DispatchKey::Meta), &meta);
    for (size_t k = 0; k < meta.size() && k < f.returns.size(); ++k) {
      if (f.returns[k]) continue;
      if (meta[k].isTensor() && meta[k].toTensor().defined() && meta[k].toTensor().has_storage() &&
          std::find(ins.begin(), ins.end(), meta[k].toTensor().storage().unsafeGetStorageImpl()) == ins.end())
        bytes += static_cast<int64_t>(meta[k].toTensor().storage().nbytes());
      else if (meta[k].isTensorList())
        for (const at::Tensor& t : meta[k].toTensorList()) bytes += static_cast<int64_t>(t.storage().nbytes());
    }
  } catch (const std::exception&) {
    failed = true;
  }
  // a meta kernel that rejects the dtype the real kernel takes (`_grouped_mm` in float32 on CPU: an MoE's experts)
  if (failed && f.size_rule == 0 && !f.foreign) bytes = ask_sizes("low_bytes", op, stack, start, f, true);
  if (key) bounded(g_sizes).emplace(*key, bytes);
  return bytes;
}

// An op whose fresh outputs outgrew its meta kernel's bytes (CPU `col2im`, `F.fold`, returns a view of a buffer
// as large as its input): the real bytes are reserved for the same call signature from now on, and a warning says
// so once per op, as eager/sizes.py's NOTE [ Size prediction ] 9 does: the budget was exceeded by up to the
// difference while the op returned, once per signature. An op that nothing could size (its meta kernel fails: sizes
// that depend on the data, `nonzero`) is counted and warned about too, but not cached (the data decides); the core
// evicts right after it either way. Called with the GIL held, after the core's `ran`.
int64_t g_short = 0, g_unsized = 0;
void fell_short(const Facts& f, const Key* key, int64_t predicted, int64_t made) {
  ++(predicted > 0 ? g_short : g_unsized);
  if (predicted > 0 && key) {
    auto it = g_sizes.find(*key);
    if (it != g_sizes.end()) it->second = made;
  }
  static std::unordered_set<std::string> warned;
  const std::string name = f.name.cast<std::string>();
  if (!warned.insert(name).second) return;
  const std::string msg =
      predicted > 0
          ? "torch_dtr: " + name + " made " + std::to_string(made) + " B of outputs where its shape rule said " +
                std::to_string(predicted) +
                " B, so the budget was exceeded by up to the difference while it returned; from now on the real "
                "size is reserved for the same argument shapes. Please report the op."
          : "torch_dtr: cannot predict the output size of " + name + " before it runs (no shape rule works for it: its size may depend on the data); " +
                "the budget was exceeded by up to its " + std::to_string(made) +
                " B of outputs while it returned, and values were evicted right after it (stats(): "
                "sizes_unpredicted). Please report the op.";
  if (PyErr_WarnEx(PyExc_RuntimeWarning, msg.c_str(), 1) < 0) throw py::error_already_set();
}

// ------------------------------------------------------------------ constants (NOTE [ Native front end ] 4)
// ------------------------------------------------------------------ recipes
struct Input {  // a recipe's tensor argument: a managed storage and the view of it that was read, or a plain tensor
  SlotPtr slot;
  at::Tensor plain;
  at::TensorOptions opts;
  Vec<int64_t> sizes, strides;
  int64_t offset = 0;
  int64_t version = -1;  // a plain tensor's version counter when recorded (-1: not checked)
  bool conj = false, neg = false;  // lazy conjugation and negation bits of the view read
  bool scratch = false;  // written by the op (running statistics in training mode): a replay writes a clone
  c10::intrusive_ptr<Readers> reader;  // a constant's: the recipe counts among its live readers (Seen::read_live)
};

struct Out {  // where a recipe's output goes: the return index, the list element (-1: none), its slot
  size_t ret;
  int64_t elem;
  SlotPtr slot;
};

c10::Storage empty_like_storage(const c10::Storage& s) {  // same size and allocator, no data (evicted)
  return c10::Storage(c10::make_intrusive<c10::StorageImpl>(c10::StorageImpl::use_byte_size_t(), s.nbytes(),
                                                            c10::DataPtr(nullptr, s.device()), s.allocator(), false));
}

c10::Storage copy_of(const c10::Storage& s) {  // a copy of a storage's bytes
  Below b;
  const auto n = static_cast<int64_t>(s.nbytes());
  auto opts = at::TensorOptions().dtype(at::kByte).device(s.device());
  auto copy = at::empty({n}, opts);
  copy.copy_(at::empty({0}, opts).set_(s, 0, {n}, {1}));
  return copy.storage();
}

struct Replay {  // RNG replay: the op draws what it drew the first time; the generator is left as it was
  at::Generator gen;
  at::Tensor saved;
  Replay(const at::Tensor& state, c10::Device device) {
    if (!state.defined()) return;
    gen = at::globalContext().defaultGenerator(device);
    std::lock_guard<std::mutex> lock(gen.mutex());
    simalloc::HostBlocks host;  // (a CPU tensor, also where the generator is CUDA's)
    saved = gen.get_state();
    gen.set_state(state);
  }
  ~Replay() {
    if (!saved.defined()) return;
    std::lock_guard<std::mutex> lock(gen.mutex());
    gen.set_state(saved);
  }
};

at::Tensor view_of(const c10::Storage& s, const Input& in) {
  auto t = at::empty({0}, in.opts);
  t.set_(s, in.offset, in.sizes, in.strides);
  if (in.conj) t._set_conj(true);
  if (in.neg) t._set_neg(true);
  return t;
}

constexpr size_t kNone = static_cast<size_t>(-1);  // an optional tensor list's None, in Recipe::slots

struct Recipe {
  TORCH_DTR_POOLED
  c10::OperatorHandle op;
  DispatchKeySet keys;
  Vec<IValue> args;         // non-tensor arguments; tensors filled from `inputs`
  Vec<Vec<size_t>> slots;   // per argument, the `inputs` it takes
  Vec<uint8_t> kinds;       // per argument: 0 as is, 1 tensor, 2 tensor list, 3 optional tensor list
  Vec<Input> inputs;
  Vec<Out> outs;
  int64_t written = -1;  // a write (NOTE [ Native front end ] 5): the input written; its new value is outs[0]
  at::Tensor rng;
  c10::Device rng_device = c10::Device(c10::kCPU);
  // grad mode when the op first ran: a replay runs in it (the CPU LSTM's mkldnn_rnn_layer returns its workspace
  // only with grad mode on), as eager/recipe.py replays
  bool grad = true;
  explicit Recipe(c10::OperatorHandle o) : op(std::move(o)), grad(at::GradMode::is_enabled()) {}

  // the recipe's arguments on `stack`, each tensor made by `input` (a view of its value's slot)
  template <typename F>
  void push_args(torch::jit::Stack& stack, F&& input) const {
    for (size_t i = 0; i < args.size(); ++i) {
      const auto& sl = slots[i];
      if (kinds[i] == 0) {
        stack.push_back(args[i]);
      } else if (kinds[i] == 1) {
        stack.emplace_back(input(sl[0]));
      } else if (kinds[i] == 2) {
        c10::List<at::Tensor> l;
        for (auto k : sl) l.push_back(input(k));
        stack.emplace_back(l);
      } else {
        c10::List<std::optional<at::Tensor>> l;
        for (auto k : sl) {
          if (k == kNone) l.push_back(std::nullopt);
          else l.push_back(input(k));
        }
        stack.emplace_back(l);
      }
    }
  }

  // Runs the op again (the core calls this only with every input resident) and moves each missing output's
  // data into its slot; one Value per output, in order. A write replays on a copy of the value written over,
  // or on that value itself when the core lends it (``lend``: nothing else needs it).
  py::list call(const py::args& lend) {
    torch::jit::Stack stack;
    c10::Storage target;
    if (written >= 0) {
      const SlotPtr& old = inputs[written].slot;
      TORCH_INTERNAL_ASSERT(old->resident(), "torch_dtr native: a write replayed over an evicted value");
      bool lent = false;
      for (const auto& l : lend)
        for (const auto& st : l.cast<py::list>()) {
          py::object p = st.attr("payload");
          if (!p.is_none() && slot_of_value(p) == old.get()) lent = true;
        }
      target = lent ? old->storage() : copy_of(old->storage());
    }
    auto input = [&](size_t k) -> at::Tensor {
      const Input& in = inputs[k];
      if (!in.slot) {
        if (in.scratch) return in.plain.clone();
        // NOTE [ In-place mutation ] 5: a constant changed since (a write the front end did not see)
        TORCH_CHECK(in.version < 0 || in.plain.unsafeGetTensorImpl()->version_counter().current_version() ==
                                           static_cast<uint32_t>(in.version),
                    "torch_dtr native: ", op.schema().name(), " cannot be recomputed: a tensor it read was written "
                    "in place since (a write torch-dtr did not see, e.g. with dispatch disabled); recomputing would "
                    "give another value");
        return in.plain;
      }
      if (static_cast<int64_t>(k) == written) return view_of(target, in);
      TORCH_INTERNAL_ASSERT(in.slot->resident(), "torch_dtr native: a recipe ran with an evicted input");
      if (in.scratch) return view_of(copy_of(in.slot->storage()), in);  // managed statistics (rule 4)
      return view_of(in.slot->storage(), in);
    };
    // out of the device's memory (rule 8 of __init__.py): the current session's core evicts, the recipe runs again
    for (std::exception_ptr oom;; oom = nullptr) {
      std::string what;
      {
        py::gil_scoped_release nogil;
        Below below;
        // below autograd, as inside an op: a recomputation asked for from Python (unwrap, numpy()) would otherwise
        // send the kernel's own inner calls (`abs` calls `abs_out`) through autograd again
        at::AutoDispatchBelowADInplaceOrView below_autograd;
        at::AutoGradMode grad_mode(grad);
        stack.clear();
        push_args(stack, input);
        Replay replay(rng, rng_device);
        try {
          op.redispatchBoxed(keys, &stack);
        } catch (const c10::OutOfMemoryError& e) {
          if (!cur().retry) throw;
          oom = std::current_exception();
          what = e.what_without_backtrace();
        }
      }
      if (!oom) break;
      // (the core locked this recipe's inputs while it recomputes)
      if (!cur().session.attr("oom")(what, 0, py::list()).cast<bool>()) std::rethrow_exception(oom);
    }
    ++g_replays;
    py::list values;
    if (written >= 0) {
      const Out& o = outs[0];
      c10::StorageImpl* into = o.slot->impl;
      c10::StorageImpl* from = target.unsafeGetStorageImpl();
      if (!o.slot->resident() && from != into)
        into->set_data_ptr_noswap(from->set_data_ptr(c10::DataPtr(nullptr, from->device())));
      values.append(value_of(o.slot));
      return values;
    }
    for (const Out& o : outs) {
      const IValue& v = stack[o.ret];
      at::Tensor t = o.elem < 0 ? v.toTensor() : v.toTensorList().get(o.elem);
      c10::StorageImpl* into = o.slot->impl;
      if (!o.slot->resident()) {
        TORCH_CHECK(t.defined(), "torch_dtr native: ", op.schema().name(), " recomputed output ", o.ret,
                    " undefined where it was defined the first time (grad mode ", at::GradMode::is_enabled(), ")");
        c10::StorageImpl* fresh = t.storage().unsafeGetStorageImpl();
        TORCH_CHECK(fresh->nbytes() == into->nbytes(), "torch_dtr native: ", op.schema().name(), " recomputed ",
                    fresh->nbytes(), " bytes where it made ", into->nbytes(), " the first time");
        into->set_data_ptr_noswap(fresh->set_data_ptr(c10::DataPtr(nullptr, fresh->device())));
      }
      values.append(value_of(o.slot));
    }
    return values;
  }
};

struct RecipeObject {
  PyObject_HEAD
  Recipe* rec;  // owned
};
PyTypeObject g_recipe_type = {PyVarObject_HEAD_INIT(nullptr, 0)};  // completed at import (init_types)

py::object recipe_of(std::unique_ptr<Recipe> rec) {
  auto* o = PyObject_New(RecipeObject, &g_recipe_type);
  if (!o) throw py::error_already_set();
  o->rec = rec.release();
  return py::reinterpret_steal<py::object>(reinterpret_cast<PyObject*>(o));
}

py::object* g_value_take = nullptr;  // the pybind11-bound functions behind the types' rarer methods
py::object* g_value_fill = nullptr;
py::object* g_recipe_call = nullptr;

PyObject* value_drop(PyObject* self, PyObject*) {
  reinterpret_cast<ValueObject*>(self)->slot->drop();
  Py_RETURN_NONE;
}
PyObject* value_take(PyObject* self, PyObject*) {
  return PyObject_CallOneArg(g_value_take->ptr(), self);
}
PyObject* value_fill(PyObject* self, PyObject* t) {
  return PyObject_CallFunctionObjArgs(g_value_fill->ptr(), self, t, nullptr);
}
PyObject* value_data_ptr(PyObject* self, void*) {  // its address, 0 when evicted (an OOM's window)
  auto p = reinterpret_cast<ValueObject*>(self)->slot->weak.lock();
  return PyLong_FromVoidPtr(p ? const_cast<void*>(p->data()) : nullptr);
}
void value_dealloc(PyObject* self) {
  reinterpret_cast<ValueObject*>(self)->slot.~SlotPtr();
  Py_TYPE(self)->tp_free(self);
}
PyObject* recipe_call(PyObject* self, PyObject* args, PyObject* kwargs) {
  if (kwargs && PyDict_Size(kwargs)) {
    PyErr_SetString(PyExc_TypeError, "a torch_dtr native recipe takes no keyword arguments");
    return nullptr;
  }
  const Py_ssize_t n = PyTuple_GET_SIZE(args);
  PyObject* all = PyTuple_New(n + 1);
  if (!all) return nullptr;
  Py_INCREF(self);
  PyTuple_SET_ITEM(all, 0, self);
  for (Py_ssize_t i = 0; i < n; ++i) {
    PyObject* a = PyTuple_GET_ITEM(args, i);
    Py_INCREF(a);
    PyTuple_SET_ITEM(all, i + 1, a);
  }
  PyObject* out = PyObject_Call(g_recipe_call->ptr(), all, nullptr);
  Py_DECREF(all);
  return out;
}
void recipe_dealloc(PyObject* self) {
  delete reinterpret_cast<RecipeObject*>(self)->rec;
  Py_TYPE(self)->tp_free(self);
}

PyMethodDef g_value_methods[] = {
    {"drop", value_drop, METH_NOARGS, "drop the value's data (the runtime stopped counting it)"},
    {"take", value_take, METH_NOARGS, "the value's bytes, moved out into a tensor of their own (a copy out)"},
    {"fill", value_fill, METH_O, "move a copy's bytes back in (a copy back)"},
    {nullptr, nullptr, 0, nullptr}};
PyGetSetDef g_value_getset[] = {{"data_ptr", value_data_ptr, nullptr, "its address, 0 when evicted", nullptr},
                                {nullptr, nullptr, nullptr, nullptr, nullptr}};

void describe_type(PyTypeObject& t, const char* name, Py_ssize_t size, const char* doc, destructor dealloc) {
  t.tp_name = name;
  t.tp_basicsize = size;
  t.tp_flags = Py_TPFLAGS_DEFAULT;
  t.tp_doc = doc;
  t.tp_dealloc = dealloc;
}

void init_types(py::module_& m) {
  describe_type(g_value_type, "torch_dtr_native.Value", sizeof(ValueObject),
                "the runtime's payload of a managed storage (its slot)", value_dealloc);
  g_value_type.tp_methods = g_value_methods;
  g_value_type.tp_getset = g_value_getset;
  describe_type(g_recipe_type, "torch_dtr_native.Recipe", sizeof(RecipeObject),
                "how to run an op again: called with the storages the runtime lends to a write", recipe_dealloc);
  g_recipe_type.tp_call = recipe_call;
  if (PyType_Ready(&g_value_type) < 0 || PyType_Ready(&g_recipe_type) < 0) throw py::error_already_set();
  m.attr("Value") = py::handle(reinterpret_cast<PyObject*>(&g_value_type));
  m.attr("Recipe") = py::handle(reinterpret_cast<PyObject*>(&g_recipe_type));
}

// ------------------------------------------------------------------ locking (rule 4)
struct Lock {
  std::unique_lock<std::recursive_mutex> lock;
  Lock() : lock(g_mutex, std::try_to_lock) {
    if (!lock.owns_lock()) {
      py::gil_scoped_release nogil;
      lock.lock();
    }
  }
};

// Handles whose last tensor died: those of session `p` come back; another session's (an earlier one, another
// tenant) go to it at once. A session that is not running is let go with its last handle.
py::list take_dead(Py& p) {
  std::vector<std::pair<int64_t, PyObject*>> dead;
  {
    std::lock_guard<pool::Spin> lock(g_dead_mutex);
    dead.swap(g_dead);
    g_dead_any.store(false, std::memory_order_relaxed);
  }
  py::list out;
  for (auto& [e, o] : dead) {
    auto st = py::reinterpret_steal<py::object>(o);
    const bool last = --(*g_buffers)[e] == 0;
    if (e == p.epoch) {
      out.append(st);
      continue;
    }
    (*g_sessions)[e].attr("dropped")(py::make_tuple(st));
    Py* q = (*g_ctx)[e];
    if (last && !q->active && q != g_main) {  // its last handle died: nothing refers to that session any more
      (*g_sessions)[e] = py::none();
      q->clear();
    }
  }
  return out;
}

// Python's own entries into the core (set_budget, stats, disable, empty_cache) from any thread take the kernel's
// lock, waiting for it without the GIL (rule 4): a managed op in flight without the GIL has inputs that a budget
// moved by another thread must not evict under it
// The kernel's lock for the plain path, which may run with or without the GIL (an op called by code that holds
// it): it waits without the GIL either way (rule 4)
struct LockAny {
  std::unique_lock<std::recursive_mutex> lock;
  LockAny() : lock(g_mutex, std::try_to_lock) {
    if (lock.owns_lock()) return;
    if (PyGILState_Check()) {
      py::gil_scoped_release nogil;
      lock.lock();
    } else {
      lock.lock();
    }
  }
};

void lock_core() {
  if (g_mutex.try_lock()) return;
  py::gil_scoped_release nogil;
  g_mutex.lock();
}
void unlock_core() { g_mutex.unlock(); }

int64_t live_buffers() {
  Lock lock;
  int64_t n = 0;
  for (int64_t b : *g_buffers) n += b;
  std::lock_guard<pool::Spin> dead(g_dead_mutex);
  return n - static_cast<int64_t>(g_dead.size());
}

Py& ctx(int64_t epoch) {
  TORCH_CHECK(epoch >= 0 && epoch < static_cast<int64_t>(g_ctx->size()), "torch_dtr native: no session ", epoch);
  return *(*g_ctx)[epoch];
}

py::list take_dead_locked(int64_t epoch) {  // for a session's own entries (flush): the deaths since the last call
  Lock lock;
  return take_dead(ctx(epoch));
}

bool dead_pending() { return g_dead_any.load(std::memory_order_acquire); }

py::list swept_constants(Py& p) {  // session p's constants whose last tensor died since the last sweep: their bytes
  if (p.gone.empty()) {  // (most sweeps find none: no list made)
    bool any = false;
    for (auto& kv : p.seen) any |= !kv.second.alive();
    if (!any) return py::reinterpret_borrow<py::list>(*g_empty);
  }
  py::list gone;
  for (auto& g : p.gone) gone.append(py::make_tuple(g.first, g.second));
  p.gone.clear();
  for (auto it = p.seen.begin(); it != p.seen.end();) {
    if (!it->second.alive()) {
      gone.append(py::make_tuple(reinterpret_cast<intptr_t>(it->first), it->second.nbytes));
      it = p.seen.erase(it);
    } else {
      ++it;
    }
  }
  return gone;
}

void run_below(const c10::OperatorHandle& op, DispatchKeySet below, torch::jit::Stack* stack) {
  Below b;
  op.redispatchBoxed(below, stack);
}

// a plain op ran: its fresh outputs on the budgeted device, as eager/front.py's plain_outputs counts them (an
// output sharing another's storage counts twice: the count errs high until the next query corrects it)
void count_plain(const Facts& f, const torch::jit::Stack& stack) {
  const size_t nout = f.returns.size();
  if (stack.size() < nout) return;
  const size_t base = stack.size() - nout;
  int64_t n = 0;
  auto add = [&](const at::Tensor& t) {
    if (!t.defined() || !t.has_storage() || t.layout() != c10::kStrided) return;
    if (g_count_plain == 1 ? !t.is_cuda() : !t.is_cpu()) return;
    const auto b = static_cast<int64_t>(t.storage().nbytes());
    n += g_count_plain != 2 ? (b + 511) / 512 * 512 : b;
  };
  for (size_t k = 0; k < nout; ++k) {
    if (f.returns[k]) continue;  // an alias of an input
    const IValue& v = stack[base + k];
    if (v.isTensor()) add(v.toTensor());
    else if (v.isTensorList())
      for (const at::Tensor& t : v.toTensorList()) add(t);
  }
  if (n) g_plain_bytes.fetch_add(n, std::memory_order_relaxed);
}

// A plain op about to run under a budget on a device (an optimizer's update or state): where its fresh outputs land
// on that device, their bytes are predicted as a managed op's are, and where they do not fit the room the core last
// reported, the core is told first (Feed.plain): it counts what plain ops made since and evicts for them, or raises
// a BudgetError before the op allocates anything. (A factory without tensor arguments, `torch.zeros(n)`, never
// reaches this kernel: BackendSelect sends it to its device's; only its fill does. It is counted at the next
// query.) Called without the GIL.
void reserve_plain(const c10::OperatorHandle& op, const Facts& f, const torch::jit::Stack& stack, size_t start) {
  bool on = g_count_plain == 3;  // the simulated device: every CPU block is the device's
  if (g_count_plain == 1)
    for (size_t i = start; i < stack.size() && !on; ++i) {
      const IValue& v = stack[i];
      if (v.isDevice()) on = v.toDevice().is_cuda();
      else each_tensor(v, [&](const at::Tensor& t) { on |= t.is_cuda(); });
    }
  if (!on) return;
  py::gil_scoped_acquire gil;  // (predict may ask the size rules; the caches are the kernel's)
  Lock lock;
  Py& P = cur();
  if (!P.active || P.budget < 0) return;
  thread_local std::vector<int64_t> t_plain_words;
  Key key{&op.schema(), std::move(t_plain_words)};
  key.words.clear();
  bool cacheable = true;
  for (size_t i = start; i < stack.size() && cacheable; ++i) cacheable = describe(stack[i], key.words);
  int64_t need = predict(op, stack, start, f, cacheable ? &key : nullptr, false);
  t_plain_words = std::move(key.words);
  if (need <= 0) return;
  need += 512 * static_cast<int64_t>(f.returns.size());  // (both devices round each block up)
  if (P.room >= 0 && need + g_plain_bytes.load(std::memory_order_relaxed) <= P.room) return;
  P.room = P.session.attr("plain")(need, f.name, take_plain()).cast<int64_t>();
}

// An op that ran out of its device's memory (NOTE [ Native front end ] 8, NOTE [ Device memory ] 4): the core
// evicts (at least what the allocator was asked for; never the op's managed inputs `ins`, which it locks while
// it chooses), the op's arguments and random state are put back, and it runs again; re-raised when nothing was
// left to evict. Called with the GIL held.
// the op of a managed call, with the GIL released where it is long (rule 4)
constexpr double kReleaseAbove = 50e-6;  // modelled seconds
void run_managed_op(const c10::OperatorHandle& op, DispatchKeySet below, torch::jit::Stack* stack, bool release) {
  if (!release) return run_below(op, below, stack);
  py::gil_scoped_release nogil;
  run_below(op, below, stack);
}

void run_retrying(const c10::OperatorHandle& op, DispatchKeySet below, torch::jit::Stack* stack, size_t start,
                  const Recipe& rec, int64_t need, const py::list& ins, bool release) {
  // (the arguments, kept to run again: inline, no allocation for most ops; every managed op on CUDA copies them)
  const c10::SmallVector<IValue, 8> args(stack->begin() + static_cast<std::ptrdiff_t>(start), stack->end());
  for (;;) {
    try {
      run_managed_op(op, below, stack, release);
      return;
    } catch (const c10::OutOfMemoryError& e) {
      if (!cur().session.attr("oom")(std::string(e.what_without_backtrace()), need, ins).cast<bool>()) throw;
    }
    stack->resize(start);
    stack->insert(stack->end(), args.begin(), args.end());
    if (rec.rng.defined()) {
      auto gen = at::globalContext().defaultGenerator(rec.rng_device);
      std::lock_guard<std::mutex> lock(gen.mutex());
      Below b;
      gen.set_state(rec.rng);
    }
  }
}

// A plain op (an optimizer's update, a factory) that runs out of the device's memory: the core evicts and it runs
// again, as run_retrying; the GIL and the lock only then. Random plain ops are not retried (their generator
// moved, and no state was kept for them).
void run_plain_retrying(const c10::OperatorHandle& op, DispatchKeySet below, torch::jit::Stack* stack,
                        size_t start) {
  const c10::SmallVector<IValue, 8> args(stack->begin() + static_cast<std::ptrdiff_t>(start), stack->end());
  for (;;) {
    std::exception_ptr oom;
    std::string what;
    try {
      run_below(op, below, stack);
      return;
    } catch (const c10::OutOfMemoryError& e) {
      oom = std::current_exception();
      what = e.what_without_backtrace();
    }
    {
      py::gil_scoped_acquire gil;
      Lock lock;
      Py& p = cur();
      if (!p.active || !p.session.attr("oom")(what, 0, py::list()).cast<bool>())
        std::rethrow_exception(oom);
    }
    stack->resize(start);
    stack->insert(stack->end(), args.begin(), args.end());
  }
}

// A write to constants that live recipes read (`hit`), told to the core (NOTE [ Native front end ] 12). Handle
// deaths not yet told may end those recipes: where some are pending, they are told first (as the core's `written`
// would take them) and the constants looked at again. `p`: the session whose recipes read them. Called with the GIL
// and the kernel's lock held.
void tell_written(Py& p, c10::SmallVector<const c10::StorageImpl*, 4>& hit, const py::object& name) {
  if (dead_pending()) {
    p.session.attr("flush")();
    size_t n = 0;
    for (auto* si : hit) {
      auto it = p.seen.find(si);
      if (it != p.seen.end() && it->second.read_live()) hit[n++] = si;
      else ++g_writes_untold;
    }
    hit.resize(n);
  }
  if (hit.empty()) return;
  py::list keys;
  for (auto* si : hit) keys.append(reinterpret_cast<intptr_t>(si));
  ++g_writes_told;
  p.written(keys, name);
}

// the constants among `hit` that session p's live recipes read, each marked unread (a write is about to change them)
void reading(Py& p, const c10::StorageImpl* si, c10::SmallVector<const c10::StorageImpl*, 4>& hit) {
  auto it = p.seen.find(si);
  if (it != p.seen.end() && it->second.read) {
    it->second.read = false;
    if (it->second.read_live()) hit.push_back(si);
    else ++g_writes_untold;
  }
}

// Called with the kernel's lock held and without the GIL, which it takes only to tell the core of a write that live
// recipes read (an optimizer's update of a parameter read by a value the program still holds).
// Every running session's recipes are looked at (a tenant's parameters may be updated outside its scope).
void plain_writes(const c10::OperatorHandle& op, const Facts& f, torch::jit::Stack* stack, size_t start) {
  for (Py* p : *g_family) {
    if (!p->active || p->seen.empty()) continue;
    c10::SmallVector<const c10::StorageImpl*, 4> hit;
    for (size_t i = 0; i < f.written.size(); ++i) {
      if (!f.written[i]) continue;
      each_tensor((*stack)[start + i], [&](const at::Tensor& t) {
        if (t.has_storage()) reading(*p, t.storage().unsafeGetStorageImpl(), hit);
      });
    }
    if (hit.empty()) continue;
    py::gil_scoped_acquire gil;
    tell_written(*p, hit, f.name);
  }
}

// A handle made under an earlier session is a constant here: its value (brought back by that session's core
// and pinned there), as eager/front.py treats a tensor of an earlier enable().
// So is one of another tenant (NOTE [ Tenants ] 3), pinned in its own.
at::Tensor settle(const at::Tensor& t, int64_t epoch) {
  Handle* h = handle_of(t);
  if (!h || h->buffer->epoch == epoch) return t;
  return (*g_sessions)[h->buffer->epoch].attr("unwrap")(t).cast<at::Tensor>();
}

// `settled`: the handles replaced (the constant counts while one of them lives, not only its plain tensor of the op)
using Settled = c10::SmallVector<at::Tensor, 2>;
void settle_all(torch::jit::Stack* stack, size_t start, int64_t epoch, Settled& settled) {
  auto settle = [&](const at::Tensor& t, int64_t e) {
    at::Tensor r = ::settle(t, e);
    if (!r.is_same(t)) settled.push_back(t);
    return r;
  };
  for (size_t i = start; i < stack->size(); ++i) {
    IValue& v = (*stack)[i];
    if (v.isTensor()) {
      if (handle_of(v.toTensor())) v = settle(v.toTensor(), epoch);
    } else if (v.isTensorList()) {
      bool old = false;
      for (const at::Tensor& t : v.toTensorList()) {
        Handle* h = handle_of(t);
        old |= h && h->buffer->epoch != epoch;
      }
      if (old) {
        c10::List<at::Tensor> l;
        for (const at::Tensor& t : v.toTensorList()) l.push_back(settle(t, epoch));
        v = l;
      }
    }
  }
}

// a Python list made on its first item (most ops write nothing in place and read no new constant); empty, the
// one shared empty list (g_empty), which no callee changes
struct Lazy {
  py::object l;
  size_t size() const { return l ? static_cast<size_t>(PyList_GET_SIZE(l.ptr())) : 0; }
  bool empty() const { return !size(); }
  void append(py::handle h) {
    if (!l) l = py::list();
    if (PyList_Append(l.ptr(), h.ptr())) throw py::error_already_set();
  }
  py::object operator[](size_t i) const { return py::reinterpret_borrow<py::object>(PyList_GET_ITEM(l.ptr(), i)); }
  py::handle get() const { return l ? l : *g_empty; }
};

// a call into the core by position, without pybind11's argument tuple (twice per managed op at most). The
// arguments are borrowed: temporaries made in the call's braces live until the call returns
py::object vcall(const py::object& fn, std::initializer_list<PyObject*> args) {
  PyObject* res = PyObject_Vectorcall(fn.ptr(), args.begin(), args.size(), nullptr);
  if (!res) throw py::error_already_set();
  return py::reinterpret_steal<py::object>(res);
}

void managed(const c10::OperatorHandle& op, const Facts& f, DispatchKeySet below, torch::jit::Stack* stack,
             size_t start) {
  const size_t nin = f.written.size();
  Py& P = cur();
  Settled settled;
  if (g_sessions->size() > 1) settle_all(stack, start, P.epoch, settled);
  auto rec = std::make_unique<Recipe>(op);
  rec->keys = below;
  rec->args.reserve(nin);
  rec->inputs.reserve(nin);  // (at most one per argument, but for tensor lists: one allocation, not a growth)
  rec->slots.resize(nin);
  rec->kinds.resize(nin);
  py::list ins;
  Lazy writes, fresh_consts, stat_ins;
  // the managed inputs' buffers, held: the op consumes its stack, which may hold the only reference to an
  // input (a conjugate view materialized by the conjugate fallback for this call)
  c10::SmallVector<c10::intrusive_ptr<Buffer>, 4> handles;
  c10::SmallVector<std::pair<c10::intrusive_ptr<Buffer>, size_t>, 1> wrote;  // buffers written in place, input index
  c10::SmallVector<const c10::StorageImpl*, 4> reads;  // constants the recipe reads
  bool evicted = false, opaque = false;
  const bool training = f.training >= 0 && (*stack)[start + f.training].isBool() && (*stack)[start + f.training].toBool();
  auto note = [&](const at::Tensor& t, size_t i) {
    rec->slots[i].push_back(rec->inputs.size());
    Handle* h = handle_of(t);
    if (!h) {
      Input in{{}, t, {}, {}, {}, 0};
      const bool stat = std::find(f.stats.begin(), f.stats.end(), i) != f.stats.end();
      if (stat && training) in.scratch = true;  // rule 4: a replay must not update the statistics again
      else if (stat) {                          // rule 6: eval mode reads them: the recipe keeps its own copy
        Below b;
        in.plain = t.clone();
      }
      else if (!t.is_inference()) in.version = t.unsafeGetTensorImpl()->version_counter().current_version();
      rec->inputs.push_back(std::move(in));
      // (a wrapped number, `x * 0.5`'s scalar, is not a constant: a Python dispatch mode sees a number there)
      if (t.has_storage() && t.layout() == c10::kStrided && t.device().type() != c10::kMeta &&
          !t.unsafeGetTensorImpl()->is_wrapped_number()) {
        c10::StorageImpl* si = t.storage().unsafeGetStorageImpl();
        const auto n = static_cast<int64_t>(si->nbytes());
        if (n) {
          auto it = P.seen.find(si);
          if (it != P.seen.end() && it->second.storage.expired()) {  // the address of a dead one, reused
            P.gone.emplace_back(reinterpret_cast<intptr_t>(si), it->second.nbytes);
            P.seen.erase(it);
            it = P.seen.end();
          }
          const bool fresh = it == P.seen.end();
          if (fresh) {
            fresh_consts.append(py::make_tuple(t, reinterpret_cast<intptr_t>(si), n));
            it = P.seen.emplace(si, Seen{c10::weak_intrusive_ptr<c10::StorageImpl>(
                                             c10::intrusive_ptr<c10::StorageImpl>::reclaim_copy(si)), n}).first;
          }
          it->second.saw(t);
          for (const at::Tensor& o : settled)
            if (o.storage().unsafeGetStorageImpl() == si) it->second.saw(o);
          if (!it->second.hooked && t.requires_grad() && t.is_leaf()) {
            it->second.hooked = true;
            if (!fresh) fresh_consts.append(py::make_tuple(t, reinterpret_cast<intptr_t>(si), n));
          }
          reads.push_back(si);
          if (f.written[i] && it->second.read) {
            it->second.read = false;
            if (it->second.read_live()) {
              c10::SmallVector<const c10::StorageImpl*, 4> hit{si};
              tell_written(P, hit, f.name);
              it = P.seen.find(si);  // (the core ran: found again)
            } else {
              ++g_writes_untold;
            }
          }
          if (f.written[i] && g_tenants.load(std::memory_order_relaxed))  // another tenant's recipes may read it
            for (Py* q : *g_family) {
              if (q == &P || !q->active) continue;
              c10::SmallVector<const c10::StorageImpl*, 4> hit;
              reading(*q, si, hit);
              if (!hit.empty()) tell_written(*q, hit, f.name);
            }
          if (f.written[i]) it = P.seen.find(si);  // (a core ran: found again)
          // (after the write: the op is not its own reader)
          if (it != P.seen.end()) rec->inputs.back().reader = it->second.reader();
        }
      }
      return;
    }
    handles.push_back(h->buffer);
    ins.append(py::reinterpret_borrow<py::object>(h->buffer->storage));
    if (!h->buffer->slot->resident()) evicted = true;
    if (f.written[i]) {
      bool again = false;
      for (auto& w : wrote) again |= w.first.get() == h->buffer.get();
      if (!again) {
        writes.append(py::reinterpret_borrow<py::object>(h->buffer->storage));
        wrote.emplace_back(h->buffer, rec->inputs.size());
      }
    }
    Input in{h->buffer->slot, {}, t.options(), Vec<int64_t>(t.sizes().begin(), t.sizes().end()),
             Vec<int64_t>(t.strides().begin(), t.strides().end()), t.storage_offset()};
    // rule 4 for managed statistics too: batch norm in training mode writes them unannounced, with no new version;
    // they are pinned after the op (never recomputed to their old value), and a replay writes a copy
    in.scratch = training && std::find(f.stats.begin(), f.stats.end(), i) != f.stats.end();
    if (in.scratch) stat_ins.append(py::reinterpret_borrow<py::object>(h->buffer->storage));
    in.conj = t.is_conj();
    in.neg = t.is_neg();
    rec->inputs.push_back(std::move(in));
  };
  for (size_t i = 0; i < nin; ++i) {
    const IValue& v = (*stack)[start + i];
    if (v.isTensor()) {
      rec->kinds[i] = v.toTensor().defined() ? 1 : 0;
      if (v.toTensor().defined()) note(v.toTensor(), i);
      rec->args.push_back(v.toTensor().defined() ? IValue() : v);
    } else if (v.isTensorList()) {
      rec->kinds[i] = 2;
      for (const at::Tensor& t : v.toTensorList()) note(t, i);
      rec->args.emplace_back();
    } else if (v.isList() && v.toListRef().size() && !v.isIntList() && !v.isDoubleList() && !v.isBoolList()) {
      bool tensors = false;
      for (const IValue& e : v.toListRef()) tensors |= e.isTensor();
      if (tensors) {  // an optional tensor list (index): a None's place is kept as kNone in `slots`
        rec->kinds[i] = 3;
        for (const IValue& e : v.toListRef()) {
          if (e.isTensor() && e.toTensor().defined()) note(e.toTensor(), i);
          else rec->slots[i].push_back(kNone);
        }
        rec->args.emplace_back();  // the list itself is not kept: it would hold the handles alive
      } else {
        rec->args.push_back(v);
      }
    } else {
      if (v.isGenerator()) opaque = true;  // a generator of its own: not replayed (outputs pinned)
      rec->args.push_back(v);
    }
  }
  // the call signature, for the size and cost caches
  // (its words in a buffer kept per thread: no allocation per op; handed back when the op is done)
  thread_local std::vector<int64_t> t_words;
  Key key{&op.schema(), std::move(t_words)};
  key.words.clear();
  struct Back {
    Key& k;
    ~Back() {
      if (k.words.capacity() > t_words.capacity()) t_words = std::move(k.words);
    }
  } back{key};
  bool cacheable = true;
  for (size_t i = start; i < stack->size() && cacheable; ++i) cacheable = describe((*stack)[i], key.words);
  int64_t need = 0;
  if ((P.budget >= 0 || g_trace) && !P.closed) need = predict(op, *stack, start, f, cacheable ? &key : nullptr, evicted);
  const int64_t predicted = need;
  // on CUDA (and the simulated device) the allocator rounds each output up: reserved as eager/front.py does
  const bool sim = g_count_plain == 3;
  if (need > 0 && P.retry) {
    bool rounds = sim;
    for (const auto& in : rec->inputs) rounds |= (in.slot ? in.opts.device() : in.plain.device()).is_cuda();
    if (rounds) need += 512 * static_cast<int64_t>(f.returns.size());
  }
  // NOTE [ Scratch memory ] 2: the most this signature held besides its outputs, so far
  const bool watch = sim && cacheable && P.budget >= 0 && simalloc::on();
  int64_t scratch = 0;
  if (watch && !g_scratch.empty()) {
    auto it = g_scratch.find(key);
    if (it != g_scratch.end()) scratch = it->second;
  }
  need += scratch;
  const bool dead = dead_pending();
  // deaths alone wait for `ran`, which drops them before it counts this op's outputs (the same order)
  const bool call = g_trace || evicted || (P.budget >= 0 && need + g_plain_bytes.load(std::memory_order_relaxed) > P.room) ||
                    fresh_consts.size() || writes.size() || P.closed;
  // constants whose last tensor died (eager/front.py learns of each death from a weak reference's callback before
  // its next op; here at the latest before the next call to `before`: see Py::sweep_in)
  if (!P.seen.empty() || !P.gone.empty()) {
    if (call || !P.sweep_in || !P.gone.empty()) {
      py::list gone = swept_constants(P);
      if (gone.size()) P.session.attr("constants_died")(gone);
      P.sweep_in = P.seen.size() / 8;
    } else {
      --P.sweep_in;
    }
  }
  py::object held = py::none();
  if (call) {
    ++g_calls;
    held = vcall(P.before, {ins.ptr(), py::int_(need).ptr(), f.name.ptr(), take_dead(P).ptr(),
                            fresh_consts.get().ptr(), writes.get().ptr(), py::int_(take_plain()).ptr(),
                            take_views(P).ptr()});
  }
  // a write to one managed value (NOTE [ Native front end ] 5): the core said how ("version": the new value
  // gets a recipe that replays the write, the old one keeps its own; "copy": the old value, which cannot be
  // recomputed but is read, stays in a copy; "plain": nothing needs the old value; "pin": more than one)
  enum { kNoWrite, kVersion, kCopy, kOther } mode = kNoWrite;
  py::object old_storage, mode_name;
  if (writes.size()) {
    auto t = held.cast<py::tuple>();
    mode_name = t[1];
    const std::string m = mode_name.cast<std::string>();
    mode = m == "version" ? kVersion : m == "copy" ? kCopy : kOther;
    held = t[0];
    old_storage = writes[0];
  }
  c10::Storage written_storage;  // the written buffer's storage: the handles' (before a copy replaces the slot's)
  if (writes.size()) written_storage = wrote[0].first->slot->storage();
  if (mode == kCopy) {
    Slot* old = wrote[0].first->slot.get();
    old->own(copy_of(old->storage()));
  }
  if (P.closed) {  // after disable(): values come back without a budget, outputs stay plain
    run_below(op, below, stack);
    return;
  }
  // random ops replay from their device's default generator state (a generator of their own: not replayed)
  if (f.random && !opaque) {
    std::optional<c10::Device> dev;
    for (auto& in : rec->inputs) {
      const auto d = in.slot ? in.opts.device() : in.plain.device();
      if (!dev || (dev->is_cpu() && !d.is_cpu())) dev = d;
    }
    if (!dev) dev = c10::Device(c10::kCPU);
    auto gen = at::globalContext().defaultGenerator(*dev);
    std::lock_guard<std::mutex> lock(gen.mutex());
    Below b;
    simalloc::HostBlocks host;
    rec->rng = gen.get_state();
    rec->rng_device = *dev;
    ++g_rng;
  }
  // the modelled cost, cached per call signature; a miss asks the cost model (eager/costs.py) after the op
  // runs, with its arguments as they were
  double cost = 0;
  auto hit = cacheable ? g_costs.find(key) : g_costs.end();
  const bool known = hit != g_costs.end();
  if (known) cost = hit->second;
  std::vector<IValue> called;  // a miss: the arguments as called, for the cost model after the op
  if (!known) called.assign(stack->begin() + static_cast<std::ptrdiff_t>(start), stack->end());
  int64_t held_before = 0, held_most = 0;  // NOTE [ Scratch memory ] 2
  try {
    const bool release = f.foreign || (known && cost >= kReleaseAbove);
    g_released += release;
    if (watch) held_before = simalloc::window();
    if (P.retry) run_retrying(op, below, stack, start, *rec, need, ins, release);
    else run_managed_op(op, below, stack, release);
    if (watch) held_most = simalloc::window_peak();
  } catch (...) {
    if (!held.is_none()) P.session.attr("release")(held);
    throw;
  }
  ++g_ops;
  for (auto& in : rec->inputs)  // a plain tensor the op wrote (an `out=` argument): a replay writes a clone
    if (!in.slot && in.version >= 0 &&
        in.plain.unsafeGetTensorImpl()->version_counter().current_version() != static_cast<uint32_t>(in.version)) {
      in.version = -1;
      in.scratch = true;
    }
  // outputs: fresh storages get slots; views and aliases of a managed input share its buffer
  const size_t nout = f.returns.size();
  const size_t base = stack->size() - nout;
  c10::SmallVector<std::pair<const c10::StorageImpl*, size_t>, 2> made;  // fresh storage -> index in `fresh`
  struct Fresh {
    size_t ret;
    int64_t elem;
    SlotPtr slot;
  };
  c10::SmallVector<Fresh, 2> fresh;
  py::list nbytes, values;
  int64_t made_bytes = 0, made_counted = 0;  // (the second as the device's allocator counts them)
  // an output without a strided storage of its own (sparse, nested) may hold managed inputs inside it (a sparse
  // gradient's values), where no op on it can see them: those inputs are pinned (never evicted) after the op
  bool escaped = false;
  auto classify = [&](const at::Tensor& t, size_t k, int64_t elem) {
    if (!t.defined()) return;
    if (!t.has_storage() || t.layout() != c10::kStrided || t.is_nested()) {
      escaped = true;
      return;
    }
    const c10::StorageImpl* si = t.storage().unsafeGetStorageImpl();
    for (auto& b : handles)
      if (b->slot->impl == si) return;  // a view or the input itself
    if (f.returns[k]) return;  // aliases a plain input
    for (auto& m : made)
      if (m.first == si) return;
    made.emplace_back(si, fresh.size());
    auto slot = c10::make_intrusive<Slot>(t.storage());
    // on CUDA counted as the caching allocator counts it, in blocks of 512 bytes (NOTE [ Device memory ] 2)
    const auto n = static_cast<int64_t>(si->nbytes());
    made_bytes += n;
    const int64_t counted = si->device().is_cuda() || g_count_plain == 3 ? (n + 511) / 512 * 512 : n;
    made_counted += counted;
    nbytes.append(counted);
    values.append(value_of(slot));
    fresh.push_back(Fresh{k, elem, std::move(slot)});
  };
  for (size_t k = 0; k < nout; ++k) {
    const IValue& v = (*stack)[base + k];
    if (v.isTensor()) classify(v.toTensor(), k, -1);
    else if (v.isTensorList()) {
      auto l = v.toTensorList();
      for (size_t e = 0; e < l.size(); ++e) classify(l.get(e), k, static_cast<int64_t>(e));
    }
  }
  // a miss of the cost cache: the model, here where it can be (NOTE [ Modelled costs ] 4), else in Python
  auto model_cost = [&]() -> double {
    ++g_cost_misses;
    double here = 0;
    const bool mine = cacheable && f.cost_kind <= 4 && cost_here(f, called, stack->data() + base, nout, here);
    if (mine) ++g_cost_here;
    if (mine && !g_check_costs) return here;
    py::list pin, pout;
    for (const IValue& v : called) pin.append(torch::jit::toPyObject(v));
    for (size_t k = 0; k < nout; ++k) pout.append(torch::jit::toPyObject((*stack)[base + k]));
    const double theirs = P.cost(f.name, pin, pout).cast<double>();
    if (mine && theirs != here && !g_cost_mismatches++)
      g_cost_mismatch = f.name.cast<std::string>() + ": " + py::repr(py::float_(here)).cast<std::string>() +
                        " here, " + py::repr(py::float_(theirs)).cast<std::string>() + " in Python";
    return theirs;
  };
  if (!fresh.empty() && !known) {
    cost = model_cost();
    if (cacheable) bounded(g_costs).emplace(key, cost);
  }
  // a recipe when it made storages and can run again: not random with a generator of its own, not an op
  // with a side effect, not a write (written inputs are pinned by the core: NOTE [ Native front end ] 5)
  SlotPtr new_slot;
  py::object new_value = py::none();
  if (mode == kVersion || mode == kCopy) {
    Buffer* b = wrote[0].first.get();
    new_slot = c10::make_intrusive<Slot>(written_storage);
    if (mode == kVersion) b->slot->own(empty_like_storage(b->slot->storage()));  // the old value: evicted
    b->slot = new_slot;
    // the handles hold the written StorageImpl (the op returned it): the new slot lends it to them (rule 6)
    for (size_t k = 0; k < nout; ++k) {
      const IValue& v = (*stack)[base + k];
      if (f.returns[k] && f.returns[k]->isWrite() && v.isTensor() && v.toTensor().has_storage() &&
          v.toTensor().storage().unsafeGetStorageImpl() == new_slot->impl)
        new_slot->lend();
    }
    new_value = value_of(new_slot);
  }
  const bool writing = mode == kVersion || mode == kCopy;
  bool replayable = (writing ? fresh.empty() : !fresh.empty() && !f.writes) && f.replayable && !opaque &&
                    !f.unannotated;
  if (replayable && f.cross_device && !handles.empty()) {  // a copy to another device is not replayed
    const c10::Device dev = handles[0]->slot->impl->device();
    for (auto& fr : fresh) replayable &= fr.slot->impl->device() == dev;
  }
  // while tracing, a write kept in place that a version of would replay says so (recipe False, which the core
  // ignores for a write kept in place): a replay under another budget may keep it as a version (NOTE [ Traces ] 2)
  const bool would = g_trace && mode == kOther && fresh.empty() && f.replayable && !opaque && !f.unannotated;
  py::object recipe = py::none();
  if (would) recipe = py::bool_(false);
  if (replayable) {
    if (writing) {
      rec->written = static_cast<int64_t>(wrote[0].second);
      rec->outs.push_back(Out{0, -1, new_slot});
    }
    for (auto& fr : fresh) rec->outs.push_back(Out{fr.ret, fr.elem, fr.slot});  // fr.ret: index into the returns
    recipe = recipe_of(std::move(rec));
  }
  Lazy read;
  if (replayable || would)
    for (auto* si : reads) {
      auto it = P.seen.find(si);
      if (it != P.seen.end() && !it->second.read) it->second.read = true;
      read.append(py::int_(reinterpret_cast<intptr_t>(si)));
    }
  // a write's cost (fresh outputs set it above); while tracing, a write kept in place too: under another budget the
  // replay may keep it as a version, whose recipe costs what it costs live (NOTE [ Traces ] 2)
  if ((writing || (g_trace && mode != kNoWrite)) && cost == 0 && !known) {
    cost = model_cost();
    if (cacheable) bounded(g_costs).emplace(key, cost);
  }
  py::object wrote_arg = py::none();
  if (writes.size()) wrote_arg = py::make_tuple(old_storage, mode_name, new_value);
  if (watch && held_most - held_before - made_counted > scratch) {  // NOTE [ Scratch memory ] 2: a new most
    scratch = held_most - held_before - made_counted;
    bounded(g_scratch)[key] = scratch;
  }
  py::object storages;
  if (fresh.empty() && writes.empty() && held.is_none() && !P.closed && !dead && !escaped && stat_ins.empty()) {
    P.views.append(py::make_tuple(ins, f.name));  // it made no memory: told with the next call (rule 7)
    ++g_queued;
  } else {
    py::object dead_arg = dead ? py::object(take_dead(P)) : py::reinterpret_borrow<py::object>(*g_empty);
    auto out = vcall(P.ran, {f.name.ptr(), py::float_(cost).ptr(), ins.ptr(), nbytes.ptr(), values.ptr(),
                             recipe.ptr(), held.ptr(), read.get().ptr(), wrote_arg.ptr(), dead_arg.ptr(),
                             py::int_(take_plain()).ptr(), take_views(P).ptr()});
    PyObject* res = out.ptr();
    if (!PyTuple_Check(res) || PyTuple_GET_SIZE(res) != 2)
      throw std::runtime_error("torch_dtr native: the core's ran returned something other than (storages, room)");
    storages = py::reinterpret_borrow<py::object>(PyTuple_GET_ITEM(res, 0));
    P.room = PyLong_AsLongLong(PyTuple_GET_ITEM(res, 1));
    if (P.room == -1 && PyErr_Occurred()) throw py::error_already_set();
    if (escaped && ins.size()) P.session.attr("pin")(ins);
    if (stat_ins.size()) P.session.attr("pin")(stat_ins.get());
    if (scratch > 0 && PyList_GET_SIZE(storages.ptr()) > 0) {  // its recomputations reserve it too
      py::object rop = py::reinterpret_borrow<py::object>(PyList_GET_ITEM(storages.ptr(), 0)).attr("op");
      if (!rop.is_none()) rop.attr("scratch") = py::int_(scratch);
    }
  }
  if (writing) {  // the handles now name the new version
    Buffer* b = wrote[0].first.get();
    py::object fresh_storage = py::reinterpret_borrow<py::list>(storages)[PyList_GET_SIZE(storages.ptr()) - 1];
    Py_INCREF(fresh_storage.ptr());
    Py_DECREF(b->storage);
    b->storage = fresh_storage.ptr();
  }
  // wrap: fresh outputs get a buffer each, views and aliases of managed inputs the input's buffer
  c10::SmallVector<c10::intrusive_ptr<Buffer>, 2> buffers;
  for (size_t j = 0; j < fresh.size(); ++j) {
    PyObject* st = PyList_GET_ITEM(storages.ptr(), j);  // (a write's new version, if any, comes last)
    Py_INCREF(st);
    buffers.push_back(c10::make_intrusive<Buffer>(fresh[j].slot, st, P.epoch));
  }
  auto wrap = [&](const at::Tensor& t, size_t k) -> at::Tensor {
    if (!t.defined() || !t.has_storage() || t.layout() != c10::kStrided || t.is_nested()) return t;
    if (f.returns[k] && f.returns[k]->isWrite()) return t;  // the input itself, written
    const c10::StorageImpl* si = t.storage().unsafeGetStorageImpl();
    for (auto& b : handles)
      if (b->slot->impl == si) return make_handle(t, b);
    for (auto& m : made)
      if (m.first == si) return make_handle(t, buffers[m.second]);
    return t;
  };
  for (size_t k = 0; k < nout; ++k) {
    IValue& v = (*stack)[base + k];
    if (v.isTensor()) {
      v = wrap(v.toTensor(), k);
    } else if (v.isTensorList()) {
      c10::List<at::Tensor> l;
      for (const at::Tensor& t : v.toTensorList()) l.push_back(wrap(t, k));
      v = l;
    }
  }
  // last, when the core has its records (a warning raised as an error leaves nothing half told)
  if (P.budget >= 0 && made_bytes > predicted && (predicted > 0 ? cacheable : f.size_rule != 1))
    fell_short(f, cacheable ? &key : nullptr, predicted, made_bytes);
  else if (f.size_rule == 1 && cacheable && made_bytes != predicted)  // a bound: the real size from now on
    bounded(g_sizes)[key] = made_bytes;
}

void kernel(const c10::OperatorHandle& op, DispatchKeySet ks, torch::jit::Stack* stack) {
  const DispatchKeySet below = below_of(ks);
  if (g_depth > 0) {
    op.redispatchBoxed(below, stack);
    return;
  }
  const Facts& f = facts(op);
  const size_t start = stack->size() - f.written.size();
  const bool region = t_region > 0;  // a compiled region's kernels' calls: plain (`region_enter`)
  bool tagged = false, grad = false;
  for (size_t i = start; i < stack->size() && !tagged && !region; ++i)
    each_tensor((*stack)[i], [&](const at::Tensor& t) {
      if (handle_of(t)) tagged = true;
      else if (t.requires_grad()) grad = true;
    });
  // NOTE [ Managed vs constant ] 5: with grad mode off (outside an optimizer's step), an op that makes new
  // tensors from strided tensors is managed too, so that what inference holds counts and can be evicted
  bool infer = false;
  Py& P = cur();
  if (!region && !tagged && !at::GradMode::is_enabled() && g_stepping.load(std::memory_order_relaxed) == 0 &&
      P.active && f.fresh && !f.writes && f.replayable && !f.nested) {
    bool strided = false, nested = false;
    for (size_t i = start; i < stack->size(); ++i)
      each_tensor((*stack)[i], [&](const at::Tensor& t) {
        nested |= t.is_nested();
        strided |= t.layout() == c10::kStrided;
      });
    infer = strided && !nested;
  }
  if (!tagged && !infer && !(grad && at::GradMode::is_enabled())) {
    ++g_plain;
    if (f.writes && (!P.seen.empty() || g_tenants.load(std::memory_order_relaxed))) {
      LockAny lock;  // (not the GIL: plain_writes takes it where it must)
      if (P.active) plain_writes(op, f, stack, start);
    }
    if (g_count_plain && f.fresh && P.budget >= 0 && P.active) reserve_plain(op, f, *stack, start);
    if (P.retry && !f.random) run_plain_retrying(op, below, stack, start);
    else run_below(op, below, stack);
    if (g_count_plain && f.fresh && P.budget >= 0) count_plain(f, *stack);
    return;
  }
  py::gil_scoped_acquire gil;
  Lock lock;
  if (!P.active && (!P.closed || !tagged)) {  // no session (or a closed one, no managed input): plain
    if (!tagged) attach(false);  // this thread's bit outlived its session (disable() ran on another thread)
    run_below(op, below, stack);
    return;
  }
  if (g_stepping.load(std::memory_order_relaxed) == 1 && at::GradMode::is_enabled())
    g_stepping.store(0, std::memory_order_relaxed);  // a step without a closure raised (NOTE [ Managed vs constant ] 5)
  managed(op, f, below, stack, start);
}

// Functional collectives (`_c10d_functional`'s, DTensor's all-to-all) have CompositeExplicitAutograd kernels,
// which serve PrivateUse1 as well: their composite allocates the output from a managed input (`new_empty`,
// `clone`, `empty_like`: a managed value whose recipe is that allocation), and the collective then writes into
// it where no op shows it (or into its input, for the in-place ones). Recomputed, such a value was garbage or the
// unreduced input. This kernel runs the composite below the bit, the thread attached as before (the allocation
// stays a managed op: its input made resident, its output counted), then pins what the op returns, as the core
// pins c10d's written outputs: never evicted, never recomputed (tests/native/test_collective_outputs.py).
void collective_kernel(const c10::OperatorHandle& op, DispatchKeySet ks, torch::jit::Stack* stack) {
  op.redispatchBoxed(below_of(ks), stack);
  if (g_depth > 0) return;
  const size_t nout = op.schema().returns().size();
  if (stack->size() < nout) return;
  std::vector<std::pair<int64_t, py::object>> got;
  py::gil_scoped_acquire gil;
  Lock lock;
  for (size_t i = stack->size() - nout; i < stack->size(); ++i)
    each_tensor((*stack)[i], [&](const at::Tensor& t) {
      Handle* h = handle_of(t);
      if (h) got.emplace_back(h->buffer->epoch, py::reinterpret_borrow<py::object>(h->buffer->storage));
    });
  for (auto& [epoch, storage] : got) {
    py::object session = (*g_sessions)[epoch];
    if (session.is_none()) continue;
    py::list one;
    one.append(storage);
    session.attr("pin")(one);
  }
}

std::unique_ptr<torch::Library> g_lib, g_other, g_c10d;
// the other libraries' ops that claim() takes (functional collectives), one library per namespace (leaked, as
// the ones above: registrations live as long as the process)
auto* g_foreign = new std::unordered_map<std::string, std::unique_ptr<torch::Library>>();

// Every aten op gets the kernel for PrivateUse1 (composite kernels registered for all backends would otherwise
// run instead of a fallback), and for the other per-backend functionalities that the TLS bit also selects
// (sparse, quantized, nested): their ops run on their own kernels below, managed when a managed or grad-requiring
// strided tensor is among their inputs.
int64_t claim() {
  if (g_lib) return 0;
  struct Quiet : c10::WarningHandler {  // c10d's kernels replaced below: PyTorch warns of each override
    void process(const c10::Warning&) override {}
  } quiet;
  c10::WarningUtils::WarningHandlerGuard guard(&quiet);
  g_lib = std::make_unique<torch::Library>(torch::Library::IMPL, "aten", c10::DispatchKey::PrivateUse1, __FILE__,
                                           __LINE__);
  g_other = std::make_unique<torch::Library>(torch::Library::IMPL, "aten", std::nullopt, __FILE__, __LINE__);
  int64_t n = 0;
  for (const auto& name : c10::Dispatcher::singleton().getAllOpNames()) {
    // c10d's collectives have PrivateUse1 kernels of their own that look for a process group backend of that
    // device type: with the thread's PrivateUse1 bit on they would run instead of the CPU or CUDA ones (DDP,
    // FSDP2 and tensor parallelism failed with "No backend type associated with device type privateuseone").
    // The kernel takes them (their outputs are never replayed: Facts.replayable) and runs them below the bit.
    if (name.name.rfind("c10d::", 0) == 0) {
      auto op = c10::Dispatcher::singleton().findOp(name);
      if (!op || !op->hasKernelForDispatchKey(c10::DispatchKey::PrivateUse1)) continue;
      if (!g_c10d)
        g_c10d = std::make_unique<torch::Library>(torch::Library::IMPL, "c10d", c10::DispatchKey::PrivateUse1,
                                                  __FILE__, __LINE__);
      std::string full = name.name.substr(6);
      if (!name.overload_name.empty()) full += "." + name.overload_name;
      g_c10d->impl(full.c_str(), torch::CppFunction::makeFromBoxedFunction<&kernel>());
      continue;
    }
    for (const char* ns : {"_c10d_functional::", "_dtensor::"}) {  // collective_kernel
      const std::string pre(ns);
      if (name.name.rfind(pre, 0) != 0) continue;
      auto op = c10::Dispatcher::singleton().findOp(name);
      if (!op || name.name == pre + "wait_tensor" || op->hasKernelForDispatchKey(c10::DispatchKey::PrivateUse1) ||
          !op->hasKernelForDispatchKey(c10::DispatchKey::CompositeExplicitAutograd))
        break;
      auto& lib = (*g_foreign)[pre];
      if (!lib)
        lib = std::make_unique<torch::Library>(torch::Library::IMPL, pre.substr(0, pre.size() - 2),
                                               c10::DispatchKey::PrivateUse1, __FILE__, __LINE__);
      std::string full = name.name.substr(pre.size());
      if (!name.overload_name.empty()) full += "." + name.overload_name;
      lib->impl(full.c_str(), torch::CppFunction::makeFromBoxedFunction<&collective_kernel>());
      break;
    }
    if (name.name.rfind("aten::", 0) != 0) continue;
    auto op = c10::Dispatcher::singleton().findOp(name);
    // an op decomposed above autograd stays decomposed, unless the CPU has a kernel of its own for it
    // (silu_backward: the CPU kernel, not the composite, is what plain PyTorch runs; the results differ in the
    // last bits). One with a CUDA kernel only (torch 2.14's _fused_rms_norm) stays decomposed too: claimed, its
    // autograd formula ran on CPU tensors and called a backward that has no CPU kernel. On CUDA it then runs
    // decomposed where plain PyTorch runs the fused kernel (one kernel serves both devices here).
    if (!op || op->hasKernelForDispatchKey(c10::DispatchKey::PrivateUse1) ||
        (op->hasKernelForDispatchKey(c10::DispatchKey::CompositeImplicitAutograd) &&
         !op->hasKernelForDispatchKey(c10::DispatchKey::CPU)))
      continue;
    std::string full = name.name.substr(6);
    if (!name.overload_name.empty()) full += "." + name.overload_name;
    g_lib->impl(full.c_str(), torch::CppFunction::makeFromBoxedFunction<&kernel>());
    for (auto k : {c10::DispatchKey::SparsePrivateUse1, c10::DispatchKey::SparseCsrPrivateUse1,
                   c10::DispatchKey::QuantizedPrivateUse1, c10::DispatchKey::NestedTensorPrivateUse1})
      if (!op->hasKernelForDispatchKey(k))
        g_other->impl(full.c_str(), k, torch::CppFunction::makeFromBoxedFunction<&kernel>());
    ++n;
  }
  return n;
}

}  // namespace

TORCH_LIBRARY_IMPL(_, PrivateUse1, m) { m.fallback(torch::CppFunction::makeFromBoxedFunction<&kernel>()); }
TORCH_LIBRARY_IMPL(_, SparsePrivateUse1, m) { m.fallback(torch::CppFunction::makeFromBoxedFunction<&kernel>()); }
TORCH_LIBRARY_IMPL(_, SparseCsrPrivateUse1, m) { m.fallback(torch::CppFunction::makeFromBoxedFunction<&kernel>()); }
TORCH_LIBRARY_IMPL(_, QuantizedPrivateUse1, m) { m.fallback(torch::CppFunction::makeFromBoxedFunction<&kernel>()); }
TORCH_LIBRARY_IMPL(_, NestedTensorPrivateUse1, m) { m.fallback(torch::CppFunction::makeFromBoxedFunction<&kernel>()); }

namespace {

// A new session, or a new tenant of the running one (`tenant`: NOTE [ Tenants ]); returns its number.
int64_t start_session(py::object session, int64_t budget, bool tenant) {
  Lock lock;
  TORCH_CHECK(!tenant || g_main->active, "torch_dtr native: a tenant needs a running session");
  if (!tenant)
    for (size_t e = 0; e < g_sessions->size(); ++e)  // earlier sessions no handle refers to any more
      if (!(*g_buffers)[e] && (*g_ctx)[e]->epoch >= 0) {
        (*g_sessions)[e] = py::none();
        (*g_ctx)[e]->clear();
      }
  auto* p = new Py();
  g_sessions->push_back(session);
  g_buffers->push_back(0);
  g_ctx->push_back(p);
  p->epoch = static_cast<int64_t>(g_sessions->size()) - 1;
  p->session = session;
  p->before = session.attr("before");
  p->ran = session.attr("ran");
  p->cost = session.attr("cost");
  p->written = session.attr("written");
  p->budget = budget;
  p->active = true;
  if (tenant) {
    p->retry = g_main->retry;
    g_family->push_back(p);
    g_tenants.store(true, std::memory_order_relaxed);
  } else {
    g_main = p;
    g_family->assign(1, p);
    g_tenants.store(false, std::memory_order_relaxed);
    t_py = nullptr;
  }
  return p->epoch;
}
int64_t start(py::object session, int64_t budget) { return start_session(std::move(session), budget, false); }
// session `epoch`'s per-op calls read again from it (its `before` and `ran` changed: a trace ended)
void rebind(int64_t epoch) {
  Lock lock;
  TORCH_CHECK(epoch >= 0 && epoch < static_cast<int64_t>(g_ctx->size()), "torch_dtr native: no session ", epoch);
  Py* p = (*g_ctx)[epoch];
  TORCH_CHECK(!p->session.is_none(), "torch_dtr native: session ", epoch, " has ended");
  p->before = p->session.attr("before");
  p->ran = p->session.attr("ran");
}
int64_t start_tenant(py::object session, int64_t budget) { return start_session(std::move(session), budget, true); }

// this thread's ops run on session `epoch` (a tenant; -1: the running session); returns the one they ran on
int64_t use(int64_t epoch) {
  const int64_t was = t_py ? t_py->epoch : -1;
  if (epoch < 0) {
    t_py = nullptr;
  } else {
    Lock lock;
    Py& p = ctx(epoch);
    TORCH_CHECK(std::find(g_family->begin(), g_family->end(), &p) != g_family->end(),
                "torch_dtr native: session ", epoch, " is not a tenant of the running session");
    t_py = &p;
  }
  return was;
}

void stop() {  // the sessions stay reachable, closed: values the program holds come back without a budget
  Lock lock;
  for (Py* p : *g_family) {
    p->active = false;
    p->closed = true;
    p->budget = -1;
  }
}

void forget() {  // the sessions are gone
  Lock lock;
  for (Py* p : *g_family) p->clear();
  t_py = nullptr;
}

void set_budget(int64_t epoch, int64_t b) {
  Py& p = ctx(epoch);
  p.budget = b;
  p.room = -1;
}
void forget_room() {
  for (Py* p : *g_family) p->room = -1;
}
// constants whose storages are about to be freed without an op (FSDP2's reshard, NOTE [ Resharded parameters ]):
// forgotten, so that the next op that reads one again counts it again
void forget_constants(int64_t epoch, const std::vector<intptr_t>& keys) {
  Lock lock;
  Py& p = ctx(epoch);
  for (auto k : keys) p.seen.erase(reinterpret_cast<const c10::StorageImpl*>(k));
}
void set_stepping(int level) { g_stepping.store(level, std::memory_order_relaxed); }
void set_retry(bool on) {
  for (Py* p : *g_family) p->retry = on;
}
void set_count_plain(int64_t device) {
  g_count_plain = static_cast<int>(device);
  g_plain_bytes = 0;
}
void set_lend(bool on) { g_lend = on; }

bool is_managed(const at::Tensor& t) { return handle_of(t) != nullptr; }

py::object storage_of(const at::Tensor& t) {
  Handle* h = handle_of(t);
  if (!h) return py::none();
  return py::reinterpret_borrow<py::object>(h->buffer->storage);
}

py::object session_of(const at::Tensor& t) {  // the session whose core keeps t's storage
  Handle* h = handle_of(t);
  if (!h) return py::none();
  return (*g_sessions)[h->buffer->epoch];
}

// A plain tensor with t's value, sharing its memory (the storage is pinned by the caller, in the core).
at::Tensor plain(const at::Tensor& t) {
  Handle* h = handle_of(t);
  if (!h) return t;
  TORCH_CHECK(h->buffer->slot->resident(), "torch_dtr native: plain() of an evicted value (bring it back first)");
  h->buffer->slot->shared = true;
  auto r = at::empty({0}, t.options());
  {
    Below b;
    r.set_(t.storage(), t.storage_offset(), t.sizes(), t.strides());
  }
  r._set_conj(t.is_conj());  // a lazily conjugated or negated view stays one (fft.ifft's output)
  r._set_neg(t.is_neg());
  return r;
}

// The host tier (NOTE [ Native front end ] 6): a value's bytes leave its slot for a plain tensor that the tier
// copies out, and a copy's bytes come back into the same slot (the handles and recipes that name it see them).
Slot* checked_slot(py::handle v) {
  Slot* s = slot_of_value(v);
  TORCH_CHECK(s, "torch_dtr native: expected a Value, got ", py::repr(v).cast<std::string>());
  return s;
}

at::Tensor take_bytes(py::handle v) {
  Slot* s = checked_slot(v);
  TORCH_CHECK(!s->shared && s->resident(), "torch_dtr native: only a resident value that the runtime alone holds "
              "can be copied out");
  c10::StorageImpl* si = s->impl;
  const auto n = static_cast<int64_t>(si->nbytes());
  c10::Storage bytes(c10::make_intrusive<c10::StorageImpl>(
      c10::StorageImpl::use_byte_size_t(), si->nbytes(), si->set_data_ptr(c10::DataPtr(nullptr, si->device())),
      si->allocator(), false));
  Below b;
  auto t = at::empty({0}, at::TensorOptions().dtype(at::kByte).device(si->device()));
  t.set_(bytes, 0, {n}, {1});
  return t;
}

void fill_bytes(py::handle v, const at::Tensor& t) {
  Slot* s = checked_slot(v);
  c10::StorageImpl* into = s->impl;
  c10::StorageImpl* from = t.storage().unsafeGetStorageImpl();
  TORCH_CHECK(!s->resident() || into->nbytes() == 0, "torch_dtr native: a copy came back into a resident value");
  TORCH_CHECK(from->nbytes() == into->nbytes() && from->device() == into->device(), "torch_dtr native: a copy of ",
              into->nbytes(), " bytes on ", into->device(), " came back as ", from->nbytes(), " bytes on ",
              from->device());
  into->set_data_ptr_noswap(from->set_data_ptr(c10::DataPtr(nullptr, from->device())));
}

std::unordered_map<std::string, int64_t> counters() {
  return {{"managed_ops", g_ops}, {"plain_ops", g_plain}, {"core_calls_before", g_calls}, {"replays", g_replays},
          {"random_states", g_rng}, {"queued", g_queued}, {"size_misses", g_misses}, {"sizes_fell_short", g_short}, {"sizes_unpredicted", g_unsized},
          {"size_cache", static_cast<int64_t>(g_sizes.size())},
          {"scratch_cache", static_cast<int64_t>(g_scratch.size())}, {"cost_cache", static_cast<int64_t>(g_costs.size())}, {"cost_misses", g_cost_misses},
          {"constants_seen", static_cast<int64_t>(g_main->seen.size())}, {"costs_here", g_cost_here},
          {"cost_mismatches", g_cost_mismatches}, {"gil_released_ops", g_released},
          {"constant_writes_told", g_writes_told}, {"constant_writes_untold", g_writes_untold}};
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  init_types(m);
  m.def("_value_take", &take_bytes);
  m.def("_value_fill", &fill_bytes);
  m.def("_recipe_call", [](py::handle r, const py::args& lend) {
    TORCH_CHECK(Py_TYPE(r.ptr()) == &g_recipe_type, "torch_dtr native: expected a Recipe");
    return reinterpret_cast<RecipeObject*>(r.ptr())->rec->call(lend);
  });
  g_empty = new py::list();
  g_value_take = new py::object(m.attr("_value_take"));  // never destroyed: no GIL at exit
  g_value_fill = new py::object(m.attr("_value_fill"));
  g_recipe_call = new py::object(m.attr("_recipe_call"));
  m.def("claim", &claim);
  m.def("start", &start);
  m.def("rebind", &rebind);
  m.def("stop", &stop);
  m.def("forget", &forget);
  m.def("set_budget", &set_budget);
  m.def("forget_room", &forget_room);
  m.def("forget_constants", &forget_constants);
  m.def("set_stepping", &set_stepping);
  m.def("region_enter", &region_enter);
  m.def("region_leave", &region_leave);
  m.def("set_retry", &set_retry);
  m.def("set_count_plain", &set_count_plain);
  m.def("start_tenant", &start_tenant);
  m.def("use", &use);
  m.def("take_views", [](int64_t epoch) { return take_views(ctx(epoch)); });
  m.def("take_dead", &take_dead_locked);
  // (the caller holds the kernel's lock: Session.sweep)
  m.def("sweep_constants", [](int64_t epoch) { return swept_constants(ctx(epoch)); });
  m.def("lock_core", &lock_core);
  m.def("unlock_core", &unlock_core);
  m.def("set_lend", &set_lend);
  m.def("attach", &attach);
  m.def("attached", &attached);
  m.def("set_passthrough", &set_passthrough);
  m.def("is_managed", &is_managed);
  m.def("storage_of", &storage_of);
  m.def("session_of", &session_of);
  m.def("plain", &plain);
  m.def("counters", &counters);
  m.def("set_trace", [](bool on) { g_trace = on; });
  m.def("check_costs", [](bool on) {  // tests: compare the kernel's cost model with Python's; returns the first
    g_check_costs = on;                  // mismatch since the last call ("": none)
    std::string first;
    std::swap(first, g_cost_mismatch);
    g_cost_mismatches = 0;
    return first;
  });
  m.def("cpu_blocks", &cpu_blocks);
  m.def("cpu_blocks_sim", &cpu_blocks_sim);
  simalloc::bind(m);
  m.def("cpu_blocks_on", &cpu_blocks_on);
  m.def("cpu_blocks_usage", &cpu_blocks_usage);
  m.def("cpu_blocks_owns", &cpu_blocks_owns);
  m.def("cpu_blocks_mark", &cpu_blocks_mark);
  m.def("cpu_blocks_reset_peak", &cpu_blocks_reset_peak);
  m.def("cpu_blocks_capacity", &cpu_blocks_capacity, py::arg("n"), py::arg("session_only") = false);
  m.def("cpu_blocks_empty", &cpu_blocks_empty);
  m.def("cpu_blocks_kept", &cpu_blocks_kept);
}
