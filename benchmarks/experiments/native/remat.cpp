// A compiled DTR mechanism, end to end, as an experiment: tag outputs, keep records, count bytes against a
// budget, evict by the DTR score, rematerialize on access, version in-place writes, free on handle death,
// all in a boxed C++ kernel below autograd (see floor.cpp for the tagging). Checked and timed by remat.py
// next to it; docs/native.md says what it found. Not shipped. Simplifications (native.md): costs are
// measured (not modelled), a linear scan picks the victim, random ops are replayed from their device's
// default generator state (an explicit generator: pinned), temporaries made while a recipe runs are not
// counted, ops whose sizes cannot be predicted are made room for after they run.
//
// Records: a Buffer per storage the program holds (its handles: the tagged TensorImpls), a Cell per value
// (a version of a buffer's contents, with the recipe that makes it). A buffer holds one value at a time;
// writing in place makes a new value whose recipe replays the write on a copy of the old one, and the old
// value lives on as a recipe only, recomputed into a storage of its own when a recipe reads it.
#include <torch/extension.h>
#include <torch/library.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/Context.h>
#include <chrono>
#include <cstring>
#include <unordered_map>

namespace {

using c10::BackendComponent;
using c10::DispatchKeySet;
using c10::IValue;

struct Cell;
std::vector<Cell*> g_resident;  // evictable and resident
int64_t g_clock = 0, g_bytes = 0, g_reserved = 0, g_peak = 0, g_budget = -1;  // reserved: room being filled
int64_t g_ops = 0, g_evictions = 0, g_remats = 0, g_deaths = 0, g_versions = 0, g_replays = 0;
thread_local int g_depth = 0;

// Evicted cells joined by recipe edges form a component whose summed cost is what evicting a neighbour adds
// to its own recomputation (h_DTR's e*, approximated by union-find as the DTR authors' prototype did: a
// recomputed cell leaves its component's cost, the component is not split).
struct Group : c10::intrusive_ptr_target {
  c10::intrusive_ptr<Group> parent;
  double cost = 0;
};
Group* find(c10::intrusive_ptr<Group>& g) {
  while (g->parent) {
    if (g->parent->parent) g->parent = g->parent->parent;
    g = g->parent;
  }
  return g.get();
}

struct Input {  // a recipe's tensor argument: a managed value and the view of it that was read, or a plain tensor
  c10::intrusive_ptr<Cell> cell;
  at::Tensor plain;
  at::TensorOptions opts;
  std::vector<int64_t> sizes, strides;
  int64_t offset = 0;
};

struct Buffer;

struct Cell : c10::intrusive_ptr_target {
  Buffer* buffer = nullptr;  // the buffer holding this value, while it is that buffer's current value
  c10::Storage kept;         // else, where it is kept while resident: recomputed for a recipe, or pinned
  int64_t nbytes = 0, last = 0;
  double cost = 0;
  bool resident = true, pinned = false;
  int locks = 0;
  ptrdiff_t pos = -1;  // in g_resident
  // recipe
  std::optional<c10::OperatorHandle> op;
  DispatchKeySet keys;
  std::vector<IValue> args;                // tensors and tensor lists filled from `inputs` when run
  std::vector<std::vector<size_t>> slots;  // per argument, the `inputs` it takes
  std::vector<Input> inputs;
  size_t out = 0;
  at::Tensor rng;                  // a random op: its device's generator state it started from
  c10::Device rng_device = c10::Device(c10::kCPU);
  c10::intrusive_ptr<Cell> prev;  // a write: the value written over (the recipe runs on a copy of it)
  size_t written = 0;             // a write: the input (index into `inputs`) that is written
  std::vector<Cell*> children;    // cells whose recipes read this one (raw: a child holds its parents)
  c10::intrusive_ptr<Group> group;

  ~Cell() override;
  bool evictable() const { return op && !pinned; }
  void list() {
    if (pos < 0 && evictable() && (buffer || kept)) {
      pos = static_cast<ptrdiff_t>(g_resident.size());
      g_resident.push_back(this);
    }
  }
  void unlist() {
    if (pos < 0) return;
    Cell* back = g_resident.back();
    g_resident[pos] = back;
    back->pos = pos;
    g_resident.pop_back();
    pos = -1;
  }
};

struct Buffer : c10::intrusive_ptr_target {
  c10::weak_intrusive_ptr<c10::StorageImpl> storage;
  c10::intrusive_ptr<Cell> value;
  int64_t handles = 0;
  explicit Buffer(c10::StorageImpl* s)
      : storage(c10::weak_intrusive_ptr<c10::StorageImpl>(c10::intrusive_ptr<c10::StorageImpl>::reclaim_copy(s))) {}
  ~Buffer() override;
};

void join(Cell* c, Cell* n) {
  if (n->resident || !n->group) return;
  Group* a = find(c->group);
  Group* b = find(n->group);
  if (a == b) return;
  b->cost += a->cost;
  a->parent = c10::intrusive_ptr<Group>::reclaim_copy(b);
  c->group = c10::intrusive_ptr<Group>::reclaim_copy(b);
}

// c's value leaves memory (its buffer's data is dropped when drop_data) and c joins the evicted around it.
void leave(Cell* c, bool drop_data) {
  if (!c->resident) return;
  if (drop_data && c->buffer) {
    auto s = c->buffer->storage.lock();
    if (s) s->set_data_ptr_noswap(c10::DataPtr(nullptr, s->device()));
  }
  c->kept = c10::Storage();
  c->resident = false;
  c->unlist();
  g_bytes -= c->nbytes;
  c->group = c10::make_intrusive<Group>();
  c->group->cost = c->cost;
  if (c->prev) join(c, c->prev.get());
  for (auto& in : c->inputs)
    if (in.cell) join(c, in.cell.get());
  for (Cell* ch : c->children) join(c, ch);
}

Cell::~Cell() {
  unlist();
  if (resident) g_bytes -= nbytes;
  for (auto& in : inputs)
    if (in.cell) {
      auto& ch = in.cell->children;
      ch.erase(std::remove(ch.begin(), ch.end(), this), ch.end());
    }
}

Buffer::~Buffer() {
  if (!value) return;
  Cell* v = value.get();
  v->buffer = nullptr;
  v->unlist();
  if (v->resident) {
    if (!v->evictable() && !v->children.empty()) {
      auto s = storage.lock();
      if (s) v->kept = c10::Storage(std::move(s));  // pinned and still read: keep its data
      else leave(v, false);
    } else {
      leave(v, false);  // the storage goes with its last handle
    }
  }
}

double neighbourhood(Cell* c) {  // the cost of evicting c: its own plus the evicted components around it
  double cost = c->cost;
  Group* seen[16];
  int n = 0;
  auto add = [&](Cell* x) {
    if (x->resident || !x->group) return;
    Group* g = find(x->group);
    for (int i = 0; i < n; ++i)
      if (seen[i] == g) return;
    if (n < 16) seen[n++] = g;
    cost += g->cost;
  };
  if (c->prev) add(c->prev.get());
  for (auto& in : c->inputs)
    if (in.cell) add(in.cell.get());
  for (Cell* ch : c->children) add(ch);
  return cost;
}

// Option: the victim chosen in Python (what a C++ front end with the rules left in Python pays per eviction):
// the candidates' features go out as one float64 tensor [n, 3] (evicted-neighbourhood cost, bytes, staleness),
// and the callable returns the index to evict.
py::object* g_chooser = new py::object();  // never destroyed: no GIL at exit
int64_t g_choices = 0;

Cell* choose_in_python() {
  std::vector<Cell*> cands;
  cands.reserve(g_resident.size());
  for (Cell* c : g_resident)
    if (!c->locks) cands.push_back(c);
  if (cands.empty()) return nullptr;
  auto feats = at::empty({static_cast<int64_t>(cands.size()), 3}, at::kDouble);
  auto a = feats.accessor<double, 2>();
  for (size_t i = 0; i < cands.size(); ++i) {
    a[i][0] = neighbourhood(cands[i]);
    a[i][1] = double(cands[i]->nbytes);
    a[i][2] = double(g_clock - cands[i]->last + 1);
  }
  py::gil_scoped_acquire gil;
  ++g_choices;
  auto k = (*g_chooser)(feats).cast<int64_t>();
  TORCH_CHECK(k >= 0 && k < static_cast<int64_t>(cands.size()), "dtr_remat: the chooser returned ", k, " of ",
              cands.size(), " candidates");
  return cands[k];
}

// Evicts until what is resident, reserved and `coming` fits the budget.
void check_budget(int64_t coming = 0) {
  g_peak = std::max(g_peak, g_bytes + g_reserved);
  while (g_budget >= 0 && g_bytes + g_reserved + coming > g_budget) {
    if (*g_chooser && !g_chooser->is_none()) {
      Cell* v = choose_in_python();
      TORCH_CHECK(v, "dtr_remat: ", g_bytes + g_reserved, " B resident, ", coming, " B to come, budget ", g_budget,
                  " B, and nothing evictable: raise the budget");
      leave(v, true);
      ++g_evictions;
      continue;
    }
    Cell* victim = nullptr;
    double best = 0;
    for (Cell* c : g_resident) {
      if (c->locks) continue;
      double score = neighbourhood(c) / (double(c->nbytes) * double(g_clock - c->last + 1));
      if (!victim || score < best) victim = c, best = score;
    }
    TORCH_CHECK(victim, "dtr_remat: ", g_bytes + g_reserved, " B resident, ", coming, " B to come, budget ",
                g_budget, " B, and nothing evictable: raise the budget");
    leave(victim, true);
    ++g_evictions;
  }
}

struct Below {  // ops run inside are not the program's (exception-safe)
  Below() { ++g_depth; }
  ~Below() { --g_depth; }
};

struct Locks {  // cells locked for the scope (exception-safe); the cells outlive it
  std::vector<Cell*> cells;
  void add(Cell* c) {
    ++c->locks;
    cells.push_back(c);
  }
  ~Locks() {
    for (Cell* c : cells) --c->locks;
  }
};

struct Reserve {  // room made for a value being recomputed, held until it arrives
  int64_t n;
  explicit Reserve(int64_t bytes);
  ~Reserve() { g_reserved -= n; }
};

void make_room(int64_t coming) {  // evict until `coming` more bytes fit
  if (g_budget >= 0 && coming > 0) check_budget(coming);
}

Reserve::Reserve(int64_t bytes) : n(0) {
  make_room(bytes);
  n = bytes;
  g_reserved += n;
}

DispatchKeySet tagged(DispatchKeySet ks) { return ks | DispatchKeySet(BackendComponent::PrivateUse1Bit); }

struct Impl : c10::TensorImpl {  // a handle
  c10::intrusive_ptr<Buffer> buffer;
  Impl(c10::Storage s, DispatchKeySet ks, caffe2::TypeMeta dt, c10::intrusive_ptr<Buffer> b)
      : c10::TensorImpl(std::move(s), ks, dt), buffer(std::move(b)) {
    ++buffer->handles;
  }
  ~Impl() override {
    if (--buffer->handles == 0) {  // nothing but recipes can read it now: free it, as plain PyTorch would
      ++g_deaths;
      Cell* v = buffer->value.get();
      if (v && v->resident && v->evictable() && !v->locks) leave(v, true);
    }
  }
  template <typename VC>
  c10::intrusive_ptr<c10::TensorImpl> copy_(VC&& vc, bool allow) const {
    auto impl = c10::make_intrusive<Impl>(c10::Storage(storage()), key_set(), dtype(), buffer);
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

at::Tensor handle(const at::Tensor& t, c10::intrusive_ptr<Buffer> b) {
  auto impl = c10::make_intrusive<Impl>(c10::Storage(t.storage()), tagged(t.key_set()), t.dtype(), std::move(b));
  impl->set_sizes_and_strides(t.sizes(), t.strides(), t.storage_offset());
  return at::Tensor(std::move(impl));
}

// A buffer for t's storage holding a new value (resident, no recipe yet).
c10::intrusive_ptr<Buffer> fresh(const at::Tensor& t) {
  auto b = c10::make_intrusive<Buffer>(t.storage().unsafeGetStorageImpl());
  b->value = c10::make_intrusive<Cell>();
  b->value->buffer = b.get();
  b->value->nbytes = static_cast<int64_t>(t.storage().nbytes());
  return b;
}

Impl* impl_of(const at::Tensor& t) {
  if (!t.defined()) return nullptr;
  return dynamic_cast<Impl*>(t.unsafeGetTensorImpl());
}

struct Facts {  // per operator, computed once
  std::vector<bool> written;  // per argument
  std::vector<const c10::AliasInfo*> returns;
  bool random = false, writes = false;
};

const Facts& facts(const c10::OperatorHandle& op) {
  static std::unordered_map<const c10::FunctionSchema*, Facts> cache;
  const auto& schema = op.schema();
  auto it = cache.find(&schema);
  if (it != cache.end()) return it->second;
  Facts f;
  for (const auto& a : schema.arguments()) {
    bool w = a.alias_info() && a.alias_info()->isWrite();
    f.written.push_back(w);
    f.writes |= w;
    if (a.type()->kind() == c10::TypeKind::OptionalType &&
        a.type()->castRaw<c10::OptionalType>()->getElementType()->kind() == c10::TypeKind::GeneratorType)
      f.random = true;
  }
  for (const auto& r : schema.returns()) f.returns.push_back(r.alias_info());
  f.random |= op.hasTag(at::Tag::nondeterministic_seeded);
  return cache.emplace(&schema, std::move(f)).first->second;
}

c10::Storage materialize(Cell* c);

struct Replay {  // RNG replay: the op draws what it drew the first time; the generator is left as it was
  at::Generator gen;
  at::Tensor saved;
  Replay(const at::Tensor& state, c10::Device device) {
    if (!state.defined()) return;
    ++g_replays;
    gen = at::globalContext().defaultGenerator(device);
    std::lock_guard<std::mutex> lock(gen.mutex());
    saved = gen.get_state();
    gen.set_state(state);
  }
  ~Replay() {
    if (!saved.defined()) return;
    std::lock_guard<std::mutex> lock(gen.mutex());
    gen.set_state(saved);
  }
};

at::Tensor view_of(const c10::Storage& s, const Input& in, const at::TensorOptions& opts) {
  auto t = at::empty({0}, opts);
  t.set_(s, in.offset, in.sizes, in.strides);
  return t;
}

// Runs c's recipe; the value lands in `into` when given (c's own buffer), else in a fresh storage.
c10::Storage run_recipe(Cell* c, const c10::intrusive_ptr<c10::StorageImpl>& into) {
  TORCH_CHECK(c->op, "dtr_remat: an evicted value without a recipe");
  std::vector<c10::Storage> held;  // inputs' storages, kept while the op runs
  Locks locked;
  for (auto& in : c->inputs)
    if (in.cell) locked.add(in.cell.get());
  c10::Storage target;
  // Room for the value is made once its inputs are in (a chain of recomputations reserves one value at a
  // time, not the whole chain) and held until it arrives in its buffer, by the caller, right after.
  std::optional<Reserve> room;
  if (c->prev) {  // a write: replay it on a copy of the value written over
    room.emplace(c->nbytes);
    locked.add(c->prev.get());
    c10::Storage old = materialize(c->prev.get());
    const auto n = static_cast<int64_t>(old.nbytes());
    at::Tensor copy;
    {
      Below below;
      copy = at::empty({n}, at::TensorOptions().dtype(at::kByte).device(old.device()));
      copy.copy_(at::empty({0}, copy.options()).set_(old, 0, {n}, {1}));
    }
    target = copy.storage();
    if (into) {
      into->set_data_ptr_noswap(target.unsafeGetStorageImpl()->set_data_ptr(c10::DataPtr(nullptr, into->device())));
      target = c10::Storage(into);
    }
  }
  torch::jit::Stack stack;
  stack.reserve(c->args.size());
  auto input = [&](size_t k) -> at::Tensor {
    const Input& in = c->inputs[k];
    if (!in.cell) return in.plain;
    if (c->prev && k == c->written) return view_of(target, in, in.opts);
    held.push_back(materialize(in.cell.get()));
    return view_of(held.back(), in, in.opts);
  };
  {
  Below below;
  for (size_t i = 0; i < c->args.size(); ++i) {
    const auto& sl = c->slots[i];
    if (sl.empty()) {
      stack.push_back(c->args[i]);
    } else if (c->args[i].isTensorList()) {
      c10::List<at::Tensor> l;
      for (auto k : sl) l.push_back(input(k));
      stack.emplace_back(l);
    } else {
      stack.emplace_back(input(sl[0]));
    }
  }
  if (!room) room.emplace(c->nbytes);
  Replay replay(c->rng, c->rng_device);
  c->op->redispatchBoxed(c->keys, &stack);
  }
  ++g_remats;
  if (c->prev) return target;
  c10::Storage fresh = stack[c->out].toTensor().storage();
  if (!into) return fresh;
  TORCH_CHECK(fresh.nbytes() == into->nbytes(), "dtr_remat: recomputed ", fresh.nbytes(), " B, held ", into->nbytes());
  into->set_data_ptr_noswap(fresh.unsafeGetStorageImpl()->set_data_ptr(c10::DataPtr(nullptr, into->device())));
  return c10::Storage(into);
}

// c's value is back in memory: it leaves its evicted component, counts, may be evicted again, and makes room.
void arrive(Cell* c) {
  c->resident = true;
  if (c->group) {
    find(c->group)->cost -= c->cost;
    c->group.reset();
  }
  g_bytes += c->nbytes;
  c->list();
  Locks held;
  held.add(c);
  check_budget();
}

void make_resident(Cell* c) {
  c->last = g_clock;
  if (c->resident) return;
  auto s = c->buffer ? c->buffer->storage.lock() : c10::intrusive_ptr<c10::StorageImpl>();
  TORCH_INTERNAL_ASSERT(s, "make_resident: a value without a buffer");
  run_recipe(c, s);
  arrive(c);
}

// The storage holding c's value: its buffer's (brought back if evicted) or, for a value no buffer holds any
// more (written over, or its handles died), a storage of its own, kept while resident like any other value
// (evictable, counted): recomputing it for each reader instead made the MLP at 50% recompute 2,237 times
// against 110-210 (runs differ: costs are measured).
c10::Storage materialize(Cell* c) {
  c->last = g_clock;
  if (c->kept) return c->kept;
  if (c->buffer) {
    make_resident(c);
    return c10::Storage(c->buffer->storage.lock());
  }
  c10::Storage s = run_recipe(c, {});
  c->kept = s;
  arrive(c);
  return s;
}

// Size prediction: the bytes an op's fresh outputs will take, known before it runs, so that room is made
// first and the budget is a hard cap. Cached per call signature (operator, tensors' dtype, sizes and strides,
// scalar arguments); a miss runs the op's meta kernel. Ops whose output sizes depend on data (nonzero) or
// that have no meta kernel predict nothing: their outputs are made room for after they run.
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
std::unordered_map<Key, int64_t, KeyHash> g_sizes;
int64_t g_predictions = 0, g_misses = 0;

bool describe(const IValue& v, std::vector<int64_t>& w) {
  if (v.isTensor()) {
    const auto& t = v.toTensor();
    if (!t.defined()) {
      w.push_back(-1);
      return true;
    }
    w.push_back(static_cast<int64_t>(t.scalar_type()) * 1000 + t.dim());
    w.push_back(static_cast<int64_t>(t.device().type()));
    for (auto x : t.sizes()) w.push_back(x);
    for (auto x : t.strides()) w.push_back(x);
    return true;
  }
  if (v.isNone()) w.push_back(-2);
  else if (v.isInt()) w.push_back(v.toInt());
  else if (v.isBool()) w.push_back(v.toBool());
  else if (v.isDouble()) {
    double d = v.toDouble();
    int64_t bits;
    std::memcpy(&bits, &d, sizeof bits);
    w.push_back(bits);
  } else if (v.isIntList()) {
    for (auto x : v.toIntVector()) w.push_back(x);
    w.push_back(-3);
  } else if (v.isTensorList()) {
    for (const at::Tensor& t : v.toTensorList()) describe(IValue(t), w);
    w.push_back(-4);
  } else if (v.isScalar()) {
    auto sc = v.toScalar();
    if (!sc.isIntegral(false) && !sc.isFloatingPoint()) return false;
    double d = sc.toDouble();
    int64_t bits;
    std::memcpy(&bits, &d, sizeof bits);
    w.push_back(bits);
  } else if (v.isDevice()) {
    w.push_back(static_cast<int64_t>(v.toDevice().type()));
  } else if (v.isBoolList()) {
    for (bool b : v.toBoolList()) w.push_back(b);
    w.push_back(-5);
  } else if (v.isDoubleList()) {
    for (double d : v.toDoubleVector()) {
      int64_t bits;
      std::memcpy(&bits, &d, sizeof bits);
      w.push_back(bits);
    }
    w.push_back(-6);
  } else if (v.isString()) {
    w.push_back(static_cast<int64_t>(std::hash<std::string_view>()(v.toStringView())));
  } else {
    return false;  // generators, optional tensor lists: not cached (a miss runs the meta kernel each time)
  }
  return true;
}

IValue to_meta(const IValue& v) {
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

int64_t predict(const c10::OperatorHandle& op, const torch::jit::Stack& stack, size_t start, const Facts& f) {
  Key key{&op.schema(), {}};
  key.words.reserve(16);
  bool cacheable = true;
  for (size_t i = start; i < stack.size() && cacheable; ++i) cacheable = describe(stack[i], key.words);
  if (cacheable) {
    auto it = g_sizes.find(key);
    if (it != g_sizes.end()) return it->second;
  }
  ++g_misses;
  int64_t bytes = 0;
  try {
    Below b;
    torch::jit::Stack meta;
    for (size_t i = start; i < stack.size(); ++i) meta.push_back(to_meta(stack[i]));
    std::vector<const c10::StorageImpl*> ins;
    for (const auto& v : meta)
      if (v.isTensor() && v.toTensor().defined()) ins.push_back(v.toTensor().storage().unsafeGetStorageImpl());
    op.redispatchBoxed(DispatchKeySet(c10::DispatchKey::Meta), &meta);
    for (size_t k = 0; k < meta.size() && k < f.returns.size(); ++k) {
      if (f.returns[k]) continue;  // a view or the input itself: no new bytes
      if (meta[k].isTensor() && meta[k].toTensor().defined() && meta[k].toTensor().has_storage() &&
          std::find(ins.begin(), ins.end(), meta[k].toTensor().storage().unsafeGetStorageImpl()) == ins.end())
        bytes += static_cast<int64_t>(meta[k].toTensor().storage().nbytes());  // (_unsafe_view aliases)
      else if (meta[k].isTensorList())
        for (const at::Tensor& t : meta[k].toTensorList()) bytes += static_cast<int64_t>(t.storage().nbytes());
    }
  } catch (const std::exception&) {
    bytes = 0;  // no meta kernel, or sizes that depend on data
  }
  if (cacheable) g_sizes.emplace(std::move(key), bytes);
  return bytes;
}

void fallback(const c10::OperatorHandle& op, DispatchKeySet ks, torch::jit::Stack* stack) {
  auto below = (ks & DispatchKeySet(DispatchKeySet::FULL_AFTER, c10::DispatchKey::Fake))
                   .remove_backend(BackendComponent::PrivateUse1Bit);
  if (g_depth > 0) {  // an op called by a kernel or a recipe: not the program's
    op.redispatchBoxed(below, stack);
    return;
  }
  const Facts& f = facts(op);
  const size_t nin = f.written.size();
  const size_t start = stack->size() - nin;
  ++g_clock;
  std::vector<IValue> args;
  std::vector<std::vector<size_t>> slots(nin);
  std::vector<Input> inputs;
  Locks locked;  // after `inputs`, which holds the locked cells: released first
  std::vector<std::pair<Buffer*, size_t>> writes;  // buffer written, its input index
  bool opaque = false;  // inputs the recipe cannot name (an optional tensor list): not replayable
  args.reserve(nin);
  auto note = [&](const at::Tensor& t, size_t i) {
    Impl* impl = impl_of(t);
    Cell* c = impl ? impl->buffer->value.get() : nullptr;
    slots[i].push_back(inputs.size());
    if (!c) {
      inputs.push_back(Input{{}, t, {}, {}, {}, 0});
      return;
    }
    locked.add(c);
    make_resident(c);
    if (f.written[i]) writes.emplace_back(impl->buffer.get(), inputs.size());
    inputs.push_back(Input{c10::intrusive_ptr<Cell>::reclaim_copy(c), {}, t.options(), t.sizes().vec(),
                           t.strides().vec(), t.storage_offset()});
  };
  for (size_t i = 0; i < nin; ++i) {
    const IValue& v = (*stack)[start + i];
    if (v.isTensor()) {
      if (v.toTensor().defined()) {
        note(v.toTensor(), i);
        args.emplace_back();
      } else {
        args.push_back(v);
      }
    } else if (v.isTensorList()) {  // held through `inputs` only: a recipe must not keep a handle alive
      for (const at::Tensor& t : v.toTensorList()) note(t, i);
      args.emplace_back(c10::List<at::Tensor>());
    } else {
      if (v.isOptionalTensorList()) opaque = true;
      args.push_back(v);
    }
  }
  // A random op replays from its device's default generator state before it ran (on CUDA a seed and an
  // offset); one given a generator, or reading tensors of two accelerators, is not replayed: its outputs
  // are pinned.
  at::Tensor rng;
  std::optional<c10::Device> rng_device;
  bool one_device = true;
  for (size_t i = 0; i < nin; ++i)
    if ((*stack)[start + i].isGenerator()) one_device = false;
  if (f.random && one_device) {
    for (auto& in : inputs) {  // the accelerator's generator if any input is on one (CPU scalars ride along)
      const auto dev = in.cell ? in.opts.device() : in.plain.device();
      if (!rng_device || (rng_device->is_cpu() && !dev.is_cpu())) rng_device = dev;
      else if (!dev.is_cpu() && dev != *rng_device) one_device = false;
    }
    if (rng_device && one_device) {
      auto gen = at::globalContext().defaultGenerator(*rng_device);
      std::lock_guard<std::mutex> lock(gen.mutex());
      Below b;
      rng = gen.get_state();
    }
  }
  const bool replayable = (!f.random || rng.defined()) && !opaque;
  if (g_budget >= 0) {
    ++g_predictions;
    make_room(predict(op, *stack, start, f));
  }
  auto t0 = std::chrono::steady_clock::now();
  {
    Below b;
    op.redispatchBoxed(below, stack);
  }
  ++g_ops;
  const double cost = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  auto recipe = [&](Cell* cell, size_t k) {
    cell->op = op;
    cell->keys = below;
    cell->args = args;
    cell->slots = slots;
    cell->inputs = inputs;
    cell->out = k;
    cell->rng = rng;
    if (rng_device) cell->rng_device = *rng_device;
    for (auto& in : inputs)
      if (in.cell) in.cell->children.push_back(cell);
  };
  // writes: the buffer's new value replays the write on a copy of the old one
  for (auto& [b, k] : writes) {
    Cell* old = b->value.get();
    if (!old || b->value->buffer != b) continue;
    if (!old->evictable() && old->children.empty()) continue;  // nothing can need the old value: written as is
    if (!old->evictable() || !replayable) {  // the old value cannot be recomputed: its readers keep what they read
      for (Cell* ch : std::vector<Cell*>(old->children)) {  // (pinned; torch-dtr copies it instead)
        Locks held;
        held.add(ch);
        if (ch->buffer) make_resident(ch);
        ch->pinned = true;
        ch->unlist();
      }
      old->pinned = true;
      old->unlist();
      continue;
    }
    auto v = c10::make_intrusive<Cell>();
    v->buffer = b;
    v->nbytes = old->nbytes;
    v->cost = cost;
    v->last = g_clock;
    recipe(v.get(), 0);
    v->prev = c10::intrusive_ptr<Cell>::reclaim_copy(old);
    v->written = k;
    old->buffer = nullptr;
    leave(old, false);  // its bytes move to the new value
    g_bytes += v->nbytes;
    b->value = v;
    v->list();
    locked.add(v.get());
    ++g_versions;
  }
  const size_t nout = f.returns.size();
  const size_t base = stack->size() - nout;
  auto wrap = [&](const at::Tensor& t, size_t k, const c10::AliasInfo* alias, bool replay) -> at::Tensor {
    if (alias && alias->isWrite()) return t;  // the input itself, written
    if (!t.has_storage()) return t;  // sparse, nested: not managed
    // A view of an input: a handle of the buffer it shares. Some ops alias an input although their schema
    // says fresh (_unsafe_view): the storage, not the schema, decides.
    for (auto& in : inputs)
      if (in.cell && in.cell->buffer) {
        auto s = in.cell->buffer->storage.lock();
        if (s.get() == t.storage().unsafeGetStorageImpl())
          return handle(t, c10::intrusive_ptr<Buffer>::reclaim_copy(in.cell->buffer));
      }
    if (alias) return t;
    auto b = fresh(t);
    Cell* cell = b->value.get();
    cell->cost = cost;
    cell->last = g_clock;
    if (replay) recipe(cell, k);
    else cell->pinned = true;
    cell->list();
    g_bytes += cell->nbytes;
    locked.add(cell);
    return handle(t, std::move(b));
  };
  for (size_t k = 0; k < nout; ++k) {
    IValue& v = (*stack)[base + k];
    if (v.isTensor()) {
      if (v.toTensor().defined()) v = wrap(v.toTensor(), k, f.returns[k], replayable && !f.writes);
    } else if (v.isTensorList()) {  // fresh tensors in a list: pinned (a recipe names one output, not an element)
      c10::List<at::Tensor> l;
      for (const at::Tensor& t : v.toTensorList()) l.push_back(wrap(t, k, f.returns[k], false));
      v = l;
    }
  }
  check_budget();
}

std::unique_ptr<torch::Library> g_lib;

int64_t claim() {  // see floor.cpp: composite kernels would otherwise run instead of the fallback
  if (g_lib) return 0;
  g_lib = std::make_unique<torch::Library>(torch::Library::IMPL, "aten", c10::DispatchKey::PrivateUse1, __FILE__, __LINE__);
  int64_t n = 0;
  for (const auto& name : c10::Dispatcher::singleton().getAllOpNames()) {
    if (name.name.rfind("aten::", 0) != 0) continue;
    auto op = c10::Dispatcher::singleton().findOp(name);
    if (!op || op->hasKernelForDispatchKey(c10::DispatchKey::CompositeImplicitAutograd) ||
        op->hasKernelForDispatchKey(c10::DispatchKey::PrivateUse1))
      continue;
    std::string full = name.name.substr(6);
    if (!name.overload_name.empty()) full += "." + name.overload_name;
    g_lib->impl(full.c_str(), torch::CppFunction::makeFromBoxedFunction<&fallback>());
    ++n;
  }
  return n;
}

}  // namespace

TORCH_LIBRARY_IMPL(_, PrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFromBoxedFunction<&fallback>());
}

at::Tensor manage(const at::Tensor& t) {  // a managed leaf: pinned (no recipe), counted
  auto b = fresh(t);
  b->value->pinned = true;
  g_bytes += b->value->nbytes;
  return handle(t, std::move(b));
}

at::Tensor unmanaged(const at::Tensor& t) {  // a plain copy, outside the books (a result handed out of a step)
  Impl* impl = impl_of(t);
  Cell* c = impl ? impl->buffer->value.get() : nullptr;
  Locks held;
  if (c) {
    held.add(c);
    make_resident(c);
  }
  at::Tensor r;
  {
    Below b;
    r = at::empty_like(t).copy_(t);
  }
  TORCH_INTERNAL_ASSERT(!r.key_set().has_backend(BackendComponent::PrivateUse1Bit));
  return r;
}

void set_budget(int64_t b) { g_budget = b; }
void set_chooser(py::object f) { *g_chooser = std::move(f); }
void reset_peak() { g_peak = g_bytes; }
std::unordered_map<std::string, int64_t> counters() {
  return {{"ops", g_ops}, {"evictions", g_evictions}, {"remats", g_remats}, {"deaths", g_deaths},
          {"versions", g_versions}, {"predictions", g_predictions}, {"prediction_misses", g_misses}, {"python_choices", g_choices}, {"random_replays", g_replays}, {"bytes", g_bytes}, {"peak", g_peak},
          {"resident_cells", static_cast<int64_t>(g_resident.size())}};
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("manage", &manage);
  m.def("claim", &claim);
  m.def("unmanaged", &unmanaged);
  m.def("set_budget", &set_budget);
  m.def("set_chooser", &set_chooser);
  m.def("reset_peak", &reset_peak);
  m.def("counters", &counters);
}
