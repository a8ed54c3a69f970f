// Eager entry points for the Python wrappers. A call whose tensors need
// nothing of the dispatcher but the backend kernel (plain tensors on one
// device, none requiring grad under grad mode, no mode, transform, autocast or
// profiler active) goes straight to that kernel and bumps the written tensor's
// version itself. This skips torch.ops' boxed path (argument parsing against the
// schema, the boxed Autograd and ADInplaceOrView kernels): about 1 us a call,
// as much as a small op's whole kernel. Any other call returns False and the
// wrapper takes torch.ops as before. Built into the Python routes only
// (setup.py, the JIT loader), which link libtorch_python; the Python side
// fetches the table with ctypes (the library is not a Python module).
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/grad_mode.h>
#include <ATen/PythonTorchFunctionTLS.h>
#include <ATen/record_function.h>
#include <c10/core/InferenceMode.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <pybind11/pybind11.h>
#include <torch/csrc/Exceptions.h>
#include <torch/csrc/autograd/python_variable.h>

#include <c10/util/SmallVector.h>

#include <optional>

namespace make_inplace {
namespace {

// The backend kernel a plain call reaches, or nullopt where the dispatcher
// would do more than Autograd's pass-through and the version bump.
class PlainCall {
 public:
  // A torch.Tensor or nn.Parameter (no subclass) on the first tensor's
  // device that does not require grad, or does with grad mode off (no_grad,
  // inference mode: Autograd then records nothing, as for a module's
  // parameters at inference); `written` must not be an inference tensor
  // outside inference mode (torch.ops raises for it).
  bool add(PyObject* obj, bool written, at::Tensor* out) {
    if (!THPVariable_CheckExact(obj)) return false;
    const at::Tensor& t = THPVariable_Unpack(obj);
    if (t.requires_grad() && at::GradMode::is_enabled()) return false;
    if (written && t.is_inference() && !c10::InferenceMode::is_enabled()) return false;
    if (count_++ == 0) {
      device_ = t.device();
    } else if (t.device() != device_) {
      return false;
    }
    keys_ = keys_ | t.key_set();
    *out = t;
    return true;
  }

  // None or a tensor as add() takes it.
  bool add_optional(PyObject* obj, std::optional<at::Tensor>* out) {
    if (obj == Py_None) return true;
    at::Tensor t;
    if (!add(obj, false, &t)) return false;
    *out = std::move(t);
    return true;
  }

  std::optional<c10::DispatchKey> backend() const {
    if (at::impl::torch_function_mode_enabled() || at::hasCallbacks()) return std::nullopt;
    // As the dispatcher computes it, less what a plain call passes through:
    // BackendSelect (a fallthrough for every op but factories, always in the
    // thread-local set), Autograd (nothing to record) and ADInplaceOrView
    // (the version bump, done below).
    const auto local = c10::impl::tls_local_dispatch_key_set();
    const c10::DispatchKeySet keys = ((keys_ | local.included_) - local.excluded_) -
                                     c10::autograd_dispatch_keyset_with_ADInplaceOrView -
                                     c10::DispatchKeySet(c10::DispatchKey::BackendSelect);
    const c10::DispatchKey key = keys.highestPriorityTypeId();
    if (key != c10::DispatchKey::CPU && key != c10::DispatchKey::CUDA) return std::nullopt;
    return key;
  }

 private:
  c10::DispatchKeySet keys_;
  c10::Device device_{c10::kCPU};
  int count_ = 0;
};

void bump_version(const at::Tensor& t) {
  if (!t.is_inference()) t.unsafeGetTensorImpl()->bump_version();
}

// Python arguments of exactly the types the wrappers pass (anything else:
// not plain, and torch.ops converts or rejects it as before).
bool py_bool(PyObject* obj, bool* out) {
  if (obj != Py_True && obj != Py_False) return false;
  *out = obj == Py_True;
  return true;
}

bool py_int(PyObject* obj, int64_t* out) {
  if (!PyLong_CheckExact(obj)) return false;
  int overflow = 0;
  const long long value = PyLong_AsLongLongAndOverflow(obj, &overflow);
  if (overflow != 0 || (value == -1 && PyErr_Occurred())) {
    PyErr_Clear();
    return false;
  }
  *out = value;
  return true;
}

bool py_double(PyObject* obj, double* out) {
  if (!PyFloat_CheckExact(obj)) return false;
  *out = PyFloat_AS_DOUBLE(obj);
  return true;
}

// None, or what Parse takes.
template <typename T, bool (*Parse)(PyObject*, T*)>
bool py_optional(PyObject* obj, std::optional<T>* out) {
  if (obj == Py_None) return true;
  T value{};
  if (!Parse(obj, &value)) return false;
  *out = value;
  return true;
}

bool py_int_list(PyObject* obj, c10::SmallVector<int64_t, 4>* out) {
  if (!PyList_CheckExact(obj)) return false;
  const Py_ssize_t size = PyList_GET_SIZE(obj);
  for (Py_ssize_t i = 0; i < size; ++i) {
    int64_t value = 0;
    if (!py_int(PyList_GET_ITEM(obj, i), &value)) return false;
    out->push_back(value);
  }
  return true;
}

// The op's handle, typed as its kernels are registered.
template <typename Signature>
c10::TypedOperatorHandle<Signature> typed_op(const char* name) {
  return c10::Dispatcher::singleton().findSchemaOrThrow(name, "").template typed<Signature>();
}

// False where the call is not plain; else runs op's backend kernel without
// the GIL, then bumps `written`'s version (after the kernel, as torch's
// ADInplaceOrView kernels do: a failed check writes nothing and bumps nothing).
template <typename Signature, typename... Args>
PyObject* run(const PlainCall& call, const c10::TypedOperatorHandle<Signature>& op, const at::Tensor& written,
              const Args&... args) {
  const auto backend = call.backend();
  if (!backend) Py_RETURN_FALSE;
  {
    pybind11::gil_scoped_release no_gil;
    op.redispatch(c10::DispatchKeySet(*backend), args...);
  }
  bump_version(written);
  Py_RETURN_TRUE;
}

using TensorRef = const at::Tensor&;
using OptionalTensorRef = const std::optional<at::Tensor>&;

// square_matmul_(x, weight, bias, transpose, workspace_bytes)
PyObject* square_matmul_(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  HANDLE_TH_ERRORS
  PlainCall call;
  at::Tensor x, weight;
  std::optional<at::Tensor> bias;
  bool transpose = false;
  std::optional<int64_t> workspace_bytes;
  if (nargs != 5 || !call.add(args[0], true, &x) || !call.add(args[1], false, &weight) ||
      !call.add_optional(args[2], &bias) || !py_bool(args[3], &transpose) ||
      !py_optional<int64_t, py_int>(args[4], &workspace_bytes)) {
    Py_RETURN_FALSE;
  }
  static const auto op =
      typed_op<void(TensorRef, TensorRef, OptionalTensorRef, bool, std::optional<int64_t>)>("make_inplace::square_matmul_");
  return run(call, op, x, x, weight, bias, transpose, workspace_bytes);
  END_HANDLE_TH_ERRORS
}

// softmax_(x, dim, scale, causal, mask)
PyObject* softmax_(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  HANDLE_TH_ERRORS
  PlainCall call;
  at::Tensor x;
  int64_t dim = 0;
  std::optional<double> scale;
  bool causal = false;
  std::optional<at::Tensor> mask;
  if (nargs != 5 || !call.add(args[0], true, &x) || !py_int(args[1], &dim) ||
      !py_optional<double, py_double>(args[2], &scale) || !py_bool(args[3], &causal) ||
      !call.add_optional(args[4], &mask)) {
    Py_RETURN_FALSE;
  }
  static const auto op =
      typed_op<void(TensorRef, int64_t, std::optional<double>, bool, OptionalTensorRef)>("make_inplace::softmax_");
  return run(call, op, x, x, dim, scale, causal, mask);
  END_HANDLE_TH_ERRORS
}

// layer_norm_(x, normalized_shape, weight, bias, eps)
PyObject* layer_norm_(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  HANDLE_TH_ERRORS
  PlainCall call;
  at::Tensor x;
  c10::SmallVector<int64_t, 4> shape;
  std::optional<at::Tensor> weight, bias;
  double eps = 0;
  if (nargs != 5 || !call.add(args[0], true, &x) || !py_int_list(args[1], &shape) ||
      !call.add_optional(args[2], &weight) || !call.add_optional(args[3], &bias) || !py_double(args[4], &eps)) {
    Py_RETURN_FALSE;
  }
  static const auto op =
      typed_op<void(TensorRef, at::IntArrayRef, OptionalTensorRef, OptionalTensorRef, double)>("make_inplace::layer_norm_");
  return run(call, op, x, x, at::IntArrayRef(shape), weight, bias, eps);
  END_HANDLE_TH_ERRORS
}

// rms_norm_(x, normalized_shape, weight, eps)
PyObject* rms_norm_(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  HANDLE_TH_ERRORS
  PlainCall call;
  at::Tensor x;
  c10::SmallVector<int64_t, 4> shape;
  std::optional<at::Tensor> weight;
  std::optional<double> eps;
  if (nargs != 4 || !call.add(args[0], true, &x) || !py_int_list(args[1], &shape) ||
      !call.add_optional(args[2], &weight) || !py_optional<double, py_double>(args[3], &eps)) {
    Py_RETURN_FALSE;
  }
  static const auto op =
      typed_op<void(TensorRef, at::IntArrayRef, OptionalTensorRef, std::optional<double>)>("make_inplace::rms_norm_");
  return run(call, op, x, x, at::IntArrayRef(shape), weight, eps);
  END_HANDLE_TH_ERRORS
}

// An op of two inputs writing `out`: outer_product(a, b, out),
// trilinear_interpolation(feats, points, out).
template <const char* kName>
PyObject* two_inputs_out(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  HANDLE_TH_ERRORS
  PlainCall call;
  at::Tensor out, first, second;
  // out first: the written tensor sets the device the others must share.
  if (nargs != 3 || !call.add(args[2], true, &out) || !call.add(args[0], false, &first) ||
      !call.add(args[1], false, &second)) {
    Py_RETURN_FALSE;
  }
  static const auto op = typed_op<void(TensorRef, TensorRef, TensorRef)>(kName);
  return run(call, op, out, first, second, out);
  END_HANDLE_TH_ERRORS
}

constexpr char kOuterProduct[] = "make_inplace::outer_product";
constexpr char kTrilinear[] = "make_inplace::trilinear_interpolation";

template <PyObject* (*F)(PyObject*, PyObject* const*, Py_ssize_t)>
constexpr PyCFunction entry() {
  return reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(F));
}

PyMethodDef kEntries[] = {
    {"square_matmul_", entry<square_matmul_>(), METH_FASTCALL, "(x, weight, bias, transpose, workspace_bytes) -> ran"},
    {"softmax_", entry<softmax_>(), METH_FASTCALL, "(x, dim, scale, causal, mask) -> ran"},
    {"layer_norm_", entry<layer_norm_>(), METH_FASTCALL, "(x, normalized_shape, weight, bias, eps) -> ran"},
    {"rms_norm_", entry<rms_norm_>(), METH_FASTCALL, "(x, normalized_shape, weight, eps) -> ran"},
    {"outer_product", entry<two_inputs_out<kOuterProduct>>(), METH_FASTCALL, "(a, b, out) -> ran"},
    {"trilinear_interpolation", entry<two_inputs_out<kTrilinear>>(), METH_FASTCALL, "(feats, points, out) -> ran"},
};

}  // namespace
}  // namespace make_inplace

// A new dict {op name: entry}; make_inplace/_loader.py reads it with ctypes.
extern "C" __attribute__((visibility("default"))) PyObject* make_inplace_eager_entries() {
  PyObject* table = PyDict_New();
  if (table == nullptr) return nullptr;
  for (PyMethodDef& def : make_inplace::kEntries) {
    PyObject* fn = PyCFunction_New(&def, nullptr);
    if (fn == nullptr || PyDict_SetItemString(table, def.ml_name, fn) != 0) {
      Py_XDECREF(fn);
      Py_DECREF(table);
      return nullptr;
    }
    Py_DECREF(fn);
  }
  return table;
}
