// The floor of a compiled front end: what a C++ boxed fallback costs per op where torch-dtr's Python
// dispatch mode and wrapper subclass cost 30 us. Not shipped; measured by floor.py next to this file.
//
// A managed tensor is an ordinary TensorImpl (same device, storage, sizes) whose key set also holds the
// PrivateUse1 backend bit: the dispatcher sends every op on it to `fallback` below autograd, which runs the
// op on the real backend (the key set without that bit) and tags its outputs. "tag" does only that;
// "book" also keeps, per output, the records a DTR runtime needs (a cell with size, cost, staleness,
// handle count, and a recipe: the op and its arguments with tensors replaced by their cells), and counts
// handle deaths, so the difference is the bookkeeping's price in C++.
#include <torch/extension.h>
#include <torch/library.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <chrono>

namespace {

using c10::BackendComponent;
using c10::DispatchKeySet;

struct Cell : c10::intrusive_ptr_target {
  int64_t nbytes = 0;
  double cost = 0;
  int64_t last = 0;
  int64_t handles = 0;
  bool resident = true;
  const c10::OperatorHandle* op = nullptr;
  std::vector<c10::IValue> args;             // tensors replaced by None
  std::vector<c10::intrusive_ptr<Cell>> inputs;
};

int64_t g_clock = 0, g_ops = 0, g_deaths = 0, g_bytes = 0;
bool g_book = false;
thread_local int g_depth = 0;

DispatchKeySet tagged(DispatchKeySet ks) { return ks | DispatchKeySet(BackendComponent::PrivateUse1Bit); }

struct Impl : c10::TensorImpl {
  c10::intrusive_ptr<Cell> cell;
  Impl(c10::Storage s, DispatchKeySet ks, caffe2::TypeMeta dt, c10::intrusive_ptr<Cell> c)
      : c10::TensorImpl(std::move(s), ks, dt), cell(std::move(c)) {
    if (cell) ++cell->handles;
  }
  ~Impl() override {
    if (cell && --cell->handles == 0) {
      ++g_deaths;
      g_bytes -= cell->nbytes;
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
  c10::intrusive_ptr<c10::TensorImpl> shallow_copy_and_detach(const c10::VariableVersion& vc, bool allow) const override {
    return copy_(vc, allow);
  }
  c10::intrusive_ptr<c10::TensorImpl> shallow_copy_and_detach(c10::VariableVersion&& vc, bool allow) const override {
    return copy_(std::move(vc), allow);
  }
};

at::Tensor tag(const at::Tensor& t, c10::intrusive_ptr<Cell> cell) {
  auto impl = c10::make_intrusive<Impl>(c10::Storage(t.storage()), tagged(t.key_set()), t.dtype(), std::move(cell));
  impl->set_sizes_and_strides(t.sizes(), t.strides(), t.storage_offset());
  return at::Tensor(std::move(impl));
}

Cell* cell_of(const at::Tensor& t) {
  auto* impl = dynamic_cast<Impl*>(t.unsafeGetTensorImpl());
  return impl ? impl->cell.get() : nullptr;
}

void fallback(const c10::OperatorHandle& op, DispatchKeySet ks, torch::jit::Stack* stack) {
  auto below = (ks & DispatchKeySet(DispatchKeySet::FULL_AFTER, c10::DispatchKey::Fake))
                   .remove_backend(BackendComponent::PrivateUse1Bit);
  if (g_depth > 0) {  // an op called by a kernel: not the program's
    op.redispatchBoxed(below, stack);
    return;
  }
  const auto& schema = op.schema();
  const auto nin = schema.arguments().size();
  const auto start = stack->size() - nin;
  std::vector<c10::IValue> args;
  std::vector<c10::intrusive_ptr<Cell>> incells;
  const int64_t now = ++g_clock;
  for (size_t i = start; i < stack->size(); ++i) {
    const auto& v = (*stack)[i];
    if (v.isTensor()) {
      const auto& t = v.toTensor();
      if (g_book) {
        Cell* c = cell_of(t);
        if (c) {
          c->last = now;
          incells.emplace_back(c10::intrusive_ptr<Cell>::reclaim_copy(c));
        }
        args.emplace_back();
      }
    } else if (g_book) {
      args.push_back(v);
    }
  }
  auto t0 = g_book ? std::chrono::steady_clock::now() : std::chrono::steady_clock::time_point();
  ++g_depth;
  try {
    op.redispatchBoxed(below, stack);
  } catch (...) {
    --g_depth;
    throw;
  }
  --g_depth;
  ++g_ops;
  double cost = 0;
  if (g_book) cost = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const auto nout = schema.returns().size();
  for (size_t i = stack->size() - nout; i < stack->size(); ++i) {
    auto& v = (*stack)[i];
    if (!v.isTensor()) continue;
    const auto& t = v.toTensor();
    const auto* alias = schema.returns()[i - (stack->size() - nout)].alias_info();
    if (alias && alias->isWrite()) continue;  // in-place or out=: an input, tagged already
    c10::intrusive_ptr<Cell> cell;
    if (alias) {  // a view: the cell of the storage it shares (the first tensor argument's here)
      if (g_book && !incells.empty()) cell = incells.front();
    } else if (g_book) {
      cell = c10::make_intrusive<Cell>();
      cell->nbytes = static_cast<int64_t>(t.storage().nbytes());
      cell->cost = cost;
      cell->last = now;
      cell->op = &op;
      cell->args = args;
      cell->inputs = incells;
      g_bytes += cell->nbytes;
    }
    v = tag(t, std::move(cell));
  }
}

}  // namespace

TORCH_LIBRARY_IMPL(_, PrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFromBoxedFunction<&fallback>());
}

// Composite kernels (CompositeExplicitAutograd, the structured ops' NonFunctional wrappers) take precedence
// over a backend fallback: without a kernel of its own an op like mul.Tensor would run its composite, which
// allocates a plain output and calls mul.out. So every aten op that is not decomposed above autograd
// (CompositeImplicitAutograd) gets the fallback as its PrivateUse1 kernel.
std::unique_ptr<torch::Library> g_lib;

int64_t claim() {
  if (g_lib) return 0;
  g_lib = std::make_unique<torch::Library>(torch::Library::IMPL, "aten", c10::DispatchKey::PrivateUse1, __FILE__, __LINE__);
  int64_t n = 0;
  for (const auto& name : c10::Dispatcher::singleton().getAllOpNames()) {
    if (name.name.rfind("aten::", 0) != 0) continue;
    auto op = c10::Dispatcher::singleton().findOp(name);
    if (!op) continue;
    if (op->hasKernelForDispatchKey(c10::DispatchKey::CompositeImplicitAutograd)) continue;
    if (op->hasKernelForDispatchKey(c10::DispatchKey::PrivateUse1)) continue;
    std::string full = name.name.substr(6);
    if (!name.overload_name.empty()) full += "." + name.overload_name;
    g_lib->impl(full.c_str(), torch::CppFunction::makeFromBoxedFunction<&fallback>());
    ++n;
  }
  return n;
}

at::Tensor manage(const at::Tensor& t, bool book) {
  g_book = book;
  return tag(t, book ? c10::make_intrusive<Cell>() : c10::intrusive_ptr<Cell>());
}

std::vector<int64_t> counters() { return {g_ops, g_deaths, g_bytes}; }

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("manage", &manage);
  m.def("counters", &counters);
  m.def("claim", &claim);
}
