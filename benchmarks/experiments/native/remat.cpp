// A compiled DTR mechanism, end to end, as an experiment: tag outputs, keep records, count bytes against a
// budget, evict by the DTR score, rematerialize on access, free on handle death, all in a C++ boxed
// fallback below autograd (see floor.cpp for the tagging). Measured and checked by remat.py next to it.
// Not shipped. Simplifications, each written down in docs/decisions.md: the policy is the plain DTR score
// (cost / (bytes x staleness), no evicted neighbourhood), a linear scan picks the victim, the budget is
// checked after an op (its outputs may pass it by their own size), random ops and written storages are
// pinned instead of replayed.
#include <torch/extension.h>
#include <torch/library.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <chrono>
#include <unordered_map>

namespace {

using c10::BackendComponent;
using c10::DispatchKeySet;
using c10::IValue;

struct Cell;
std::vector<Cell*> g_resident;

// NOTE-like rule of the DTR authors' prototype: evicted cells joined by recipe edges form a component whose
// summed cost is what evicting a neighbour would add to its own recomputation (h_DTR's e*, approximated by
// union-find: a rematerialized cell leaves its component's cost but the component is not split).
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
}  // evictable and resident
int64_t g_clock = 0, g_bytes = 0, g_peak = 0, g_budget = -1;
int64_t g_ops = 0, g_evictions = 0, g_remats = 0, g_deaths = 0;
thread_local int g_depth = 0;

struct Input {  // a recipe's tensor argument: the cell it reads, and an uncounted view of its storage
  c10::intrusive_ptr<Cell> cell;  // null: not managed (a parameter, a constant): held as is
  at::Tensor ref;
  int64_t version;
};

struct Cell : c10::intrusive_ptr_target {
  c10::weak_intrusive_ptr<c10::StorageImpl> storage;
  int64_t nbytes = 0, last = 0, handles = 0, version = 0;
  double cost = 0;
  bool resident = true, pinned = false;
  int locks = 0;
  ptrdiff_t pos = -1;  // in g_resident
  // recipe
  std::optional<c10::OperatorHandle> op;
  DispatchKeySet keys;
  std::vector<IValue> args;  // tensors and tensor lists filled from `inputs` when run
  std::vector<std::vector<size_t>> slots;  // per argument, the `inputs` it takes (a list: several)
  std::vector<Input> inputs;
  size_t out = 0;
  std::vector<Cell*> children;  // cells whose recipes read this one (raw: a child holds its parents)
  c10::intrusive_ptr<Group> group;  // while evicted

  Cell(c10::StorageImpl* s, int64_t n)
      : storage(c10::weak_intrusive_ptr<c10::StorageImpl>(c10::intrusive_ptr<c10::StorageImpl>::reclaim_copy(s))),
        nbytes(n) {}
  ~Cell() override {
    unlist();
    if (resident) g_bytes -= nbytes;
    for (auto& in : inputs)
      if (in.cell) {
        auto& ch = in.cell->children;
        ch.erase(std::remove(ch.begin(), ch.end(), this), ch.end());
      }
  }
  bool evictable() const { return op && !pinned; }
  void list() {
    if (pos < 0 && !pinned && op) {
      pos = static_cast<ptrdiff_t>(g_resident.size());
      g_resident.push_back(this);
    }
  }
  void unlist() {
    if (pos < 0) return;
    Cell* last_cell = g_resident.back();
    g_resident[pos] = last_cell;
    last_cell->pos = pos;
    g_resident.pop_back();
    pos = -1;
  }
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

void evict(Cell* c) {
  auto s = c->storage.lock();
  if (s) s->set_data_ptr_noswap(c10::DataPtr(nullptr, s->device()));
  c->resident = false;
  c->unlist();
  g_bytes -= c->nbytes;
  c->group = c10::make_intrusive<Group>();
  c->group->cost = c->cost;
  for (auto& in : c->inputs)
    if (in.cell) join(c, in.cell.get());
  for (Cell* ch : c->children) join(c, ch);
}

// The cost of evicting c: its own, plus the components of evicted cells around it.
double neighbourhood(Cell* c) {
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
  for (auto& in : c->inputs)
    if (in.cell) add(in.cell.get());
  for (Cell* ch : c->children) add(ch);
  return cost;
}

// A value only recipes read, brought back for one, stays resident like any other (evictable, counted)
// until the policy evicts it or the last recipe reading it dies: letting it go after each use made the MLP
// recompute the same parents for each child (1,225 recomputations at 50% against 120 without).
void unlock(Cell* c) { --c->locks; }

DispatchKeySet tagged(DispatchKeySet ks) { return ks | DispatchKeySet(BackendComponent::PrivateUse1Bit); }

struct Impl : c10::TensorImpl {  // a handle: counts towards its cell's handles
  c10::intrusive_ptr<Cell> cell;
  Impl(c10::Storage s, DispatchKeySet ks, caffe2::TypeMeta dt, c10::intrusive_ptr<Cell> c)
      : c10::TensorImpl(std::move(s), ks, dt), cell(std::move(c)) {
    ++cell->handles;
  }
  ~Impl() override {
    if (--cell->handles == 0) {  // nothing but recipes can read it now: free it as plain PyTorch would
      ++g_deaths;  // (a pinned one stays until the last recipe that reads it dies)
      if (cell->resident && cell->evictable() && !cell->locks) evict(cell.get());
    }
  }
  template <typename VC>
  c10::intrusive_ptr<c10::TensorImpl> copy_(VC&& vc, bool allow) const {
    auto impl = c10::make_intrusive<Impl>(c10::Storage(storage()), key_set(), dtype(), cell);
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

at::Tensor handle(const at::Tensor& t, c10::intrusive_ptr<Cell> cell) {
  auto impl = c10::make_intrusive<Impl>(c10::Storage(t.storage()), tagged(t.key_set()), t.dtype(), std::move(cell));
  impl->set_sizes_and_strides(t.sizes(), t.strides(), t.storage_offset());
  return at::Tensor(std::move(impl));
}

at::Tensor uncounted(const at::Tensor& t) {  // same storage and view, no handle, no autograd
  auto impl = c10::make_intrusive<c10::TensorImpl>(c10::Storage(t.storage()), t.key_set(), t.dtype());
  impl->set_sizes_and_strides(t.sizes(), t.strides(), t.storage_offset());
  return at::Tensor(std::move(impl));
}

Cell* cell_of(const at::Tensor& t) {
  if (!t.defined()) return nullptr;
  auto* impl = dynamic_cast<Impl*>(t.unsafeGetTensorImpl());
  return impl ? impl->cell.get() : nullptr;
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

void rematerialize(Cell* c);

void make_resident(Cell* c) {
  c->last = g_clock;
  if (!c->resident) rematerialize(c);
}

void check_budget() {
  g_peak = std::max(g_peak, g_bytes);
  while (g_budget >= 0 && g_bytes > g_budget) {
    Cell* victim = nullptr;
    double best = 0;
    for (Cell* c : g_resident) {
      if (c->locks) continue;
      double score = neighbourhood(c) / (double(c->nbytes) * double(g_clock - c->last + 1));
      if (!victim || score < best) victim = c, best = score;
    }
    TORCH_CHECK(victim, "dtr_remat: ", g_bytes, " B resident, budget ", g_budget,
                " B, and nothing evictable: raise the budget");
    evict(victim);
    ++g_evictions;
  }
}

void rematerialize(Cell* c) {
  auto s = c->storage.lock();
  TORCH_CHECK(c->op, "dtr_remat: an evicted value without a recipe");
  for (auto& in : c->inputs)
    if (in.cell) {
      TORCH_CHECK(in.cell->version == in.version, "dtr_remat: a recipe's input was written since");
      ++in.cell->locks;
      make_resident(in.cell.get());
    }
  torch::jit::Stack stack;
  stack.reserve(c->args.size());
  for (size_t i = 0; i < c->args.size(); ++i) {
    const auto& sl = c->slots[i];
    if (sl.empty()) {
      stack.push_back(c->args[i]);
    } else if (c->args[i].isTensorList()) {
      c10::List<at::Tensor> l;
      for (auto k : sl) l.push_back(c->inputs[k].ref);
      stack.emplace_back(l);
    } else {
      stack.emplace_back(c->inputs[sl[0]].ref);
    }
  }
  auto t0 = std::chrono::steady_clock::now();
  ++g_depth;
  c->op->redispatchBoxed(c->keys, &stack);
  --g_depth;
  (void)t0;
  ++g_remats;
  for (auto& in : c->inputs)
    if (in.cell) unlock(in.cell.get());
  const at::Tensor& fresh = stack[c->out].toTensor();
  auto* src = fresh.storage().unsafeGetStorageImpl();
  if (s) {
    TORCH_CHECK(src->nbytes() == s->nbytes(), "dtr_remat: recomputed ", src->nbytes(), " B, held ", s->nbytes());
    s->set_data_ptr_noswap(src->set_data_ptr(c10::DataPtr(nullptr, src->device())));
  }
  c->resident = true;
  if (c->group) {
    find(c->group)->cost -= c->cost;
    c->group.reset();
  }
  g_bytes += c->nbytes;
  c->list();
  ++c->locks;
  check_budget();
  --c->locks;  // the caller holds its own lock on c
}

c10::intrusive_ptr<Cell> take(Cell* c) { return c10::intrusive_ptr<Cell>::reclaim_copy(c); }

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
  // scan: make inputs resident and lock them; remember the recipe's arguments
  std::vector<Cell*> locked;
  std::vector<IValue> args;
  std::vector<std::vector<size_t>> slots(nin);
  std::vector<Input> inputs;
  args.reserve(nin);
  auto note = [&](const at::Tensor& t, size_t i) {
    Cell* c = cell_of(t);
    if (c) {
      ++c->locks;
      locked.push_back(c);
      make_resident(c);
      if (f.written[i]) {  // a written storage is pinned (its recipe no longer makes it), and so is every
        c->pinned = true;   // cell whose recipe read it (their recipes would read the new value)
        c->unlist();
        ++c->version;
        for (Cell* ch : std::vector<Cell*>(c->children)) {
          ++ch->locks;
          make_resident(ch);
          ch->pinned = true;
          ch->unlist();
          --ch->locks;
        }
      }
    }
    slots[i].push_back(inputs.size());
    inputs.push_back(Input{c ? take(c) : c10::intrusive_ptr<Cell>(), c ? uncounted(t) : t, c ? c->version : 0});
  };
  for (size_t i = 0; i < nin; ++i) {
    const IValue& v = (*stack)[start + i];
    if (v.isTensor()) {
      if (v.toTensor().defined()) note(v.toTensor(), i);
      args.emplace_back();
    } else if (v.isTensorList()) {
      for (const at::Tensor& t : v.toTensorList()) note(t, i);
      args.push_back(v);  // replaced when run
    } else if (v.isOptionalTensorList()) {
      args.push_back(v);  // rare (index): kept as is, and its outputs pinned below
    } else {
      args.push_back(v);
    }
  }
  // a recipe that would write or draw random numbers cannot be replayed: its outputs are pinned
  bool replayable = !f.random && !f.writes;
  for (size_t i = 0; i < nin; ++i)
    if ((*stack)[start + i].isOptionalTensorList()) replayable = false;
  auto t0 = std::chrono::steady_clock::now();
  ++g_depth;
  try {
    op.redispatchBoxed(below, stack);
  } catch (...) {
    --g_depth;
    for (Cell* c : locked) unlock(c);
    throw;
  }
  --g_depth;
  ++g_ops;
  const double cost = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const size_t nout = f.returns.size();
  const size_t base = stack->size() - nout;
  std::shared_ptr<std::vector<Cell*>> siblings;
  auto wrap = [&](const at::Tensor& t, size_t k, const c10::AliasInfo* alias) -> at::Tensor {
    if (alias && alias->isWrite()) return t;  // the input itself, written
    // A view of an input: the cell of the storage it shares. Some ops alias an input although their schema
    // says fresh (_unsafe_view): the storage, not the schema, decides.
    for (auto& in : inputs)
      if (in.cell && in.ref.storage().unsafeGetStorageImpl() == t.storage().unsafeGetStorageImpl())
        return handle(t, in.cell);
    if (alias) return t;
    auto cell = c10::make_intrusive<Cell>(t.storage().unsafeGetStorageImpl(), static_cast<int64_t>(t.storage().nbytes()));
    cell->cost = cost;
    cell->last = g_clock;
    if (replayable) {
      cell->op = op;
      cell->keys = below;
      cell->args = args;
      cell->slots = slots;
      cell->inputs = inputs;
      cell->out = k;
      cell->list();
      for (auto& in : inputs)
        if (in.cell) in.cell->children.push_back(cell.get());
    } else {
      cell->pinned = true;
    }
    g_bytes += cell->nbytes;
    ++cell->locks;
    locked.push_back(cell.get());
    return handle(t, std::move(cell));
  };
  for (size_t k = 0; k < nout; ++k) {
    IValue& v = (*stack)[base + k];
    if (v.isTensor()) {
      if (v.toTensor().defined()) v = wrap(v.toTensor(), k, f.returns[k]);
    } else if (v.isTensorList()) {
      c10::List<at::Tensor> l;
      for (const at::Tensor& t : v.toTensorList()) {
        if (f.returns[k]) {
          l.push_back(wrap(t, k, f.returns[k]));
        } else {  // fresh tensors in a list: pinned (a recipe names one output, not a list element)
          bool was = replayable;
          replayable = false;
          l.push_back(wrap(t, k, nullptr));
          replayable = was;
        }
      }
      v = l;
    }
  }
  check_budget();
  for (Cell* c : locked) unlock(c);
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

// A managed leaf: pinned (no recipe), counted.
at::Tensor manage(const at::Tensor& t) {
  auto cell = c10::make_intrusive<Cell>(t.storage().unsafeGetStorageImpl(), static_cast<int64_t>(t.storage().nbytes()));
  cell->pinned = true;
  g_bytes += cell->nbytes;
  return handle(t, std::move(cell));
}

// A plain copy, outside the runtime's books (a result handed out of a measured step).
at::Tensor unmanaged(const at::Tensor& t) {
  Cell* c = cell_of(t);
  if (c) {
    ++c->locks;
    make_resident(c);
  }
  ++g_depth;
  auto r = at::empty_like(t, t.options()).copy_(t);
  --g_depth;
  if (c) unlock(c);
  TORCH_INTERNAL_ASSERT(!r.key_set().has_backend(BackendComponent::PrivateUse1Bit));
  return r;
}

void set_budget(int64_t b) { g_budget = b; }
void reset_peak() { g_peak = g_bytes; }
std::unordered_map<std::string, int64_t> counters() {
  return {{"ops", g_ops}, {"evictions", g_evictions}, {"remats", g_remats}, {"deaths", g_deaths},
          {"bytes", g_bytes}, {"peak", g_peak}, {"resident_cells", static_cast<int64_t>(g_resident.size())}};
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("manage", &manage);
  m.def("claim", &claim);
  m.def("unmanaged", &unmanaged);
  m.def("set_budget", &set_budget);
  m.def("reset_peak", &reset_peak);
  m.def("counters", &counters);
}
