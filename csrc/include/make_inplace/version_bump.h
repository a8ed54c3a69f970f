#pragma once
// Boxed ADInplaceOrView kernel shared by every mutating op.
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>
#include <c10/core/GradMode.h>
#include <c10/core/InferenceMode.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <c10/util/SmallVector.h>

#include <string>

namespace make_inplace {

inline void bump_versions_then_redispatch(const c10::OperatorHandle& op,
                                          c10::DispatchKeySet keys,
                                          torch::jit::Stack* stack) {
  const auto& args = op.schema().arguments();
  const size_t first = stack->size() - args.size();
  // "make_inplace.softmax_", built only for an error message.
  const auto dotted_name = [&op] {
    std::string name = op.schema().name();
    return name.replace(name.find("::"), 2, ".");
  };
  c10::SmallVector<at::Tensor, 2> written;
  for (size_t i = 0; i < args.size(); ++i) {
    const auto* alias = args[i].alias_info();
    const c10::IValue& value = (*stack)[first + i];
    if (alias != nullptr && alias->isWrite() && value.isTensor()) {
      written.push_back(value.toTensor());
      // As torch's in-place ops, before anything is written: an inference
      // tensor has no version counter, so autograd could not see the write.
      const at::Tensor& t = written.back();
      if (t.defined() && t.is_inference() && !c10::InferenceMode::is_enabled()) {
        TORCH_CHECK(false, dotted_name(), ": ", args[i].name(),
                    " is an inference tensor (made under torch.inference_mode()) and cannot "
                    "be written outside inference mode, as in torch; call the op inside "
                    "torch.inference_mode() or pass ", args[i].name(), ".clone()");
      }
      // The torch.ops entry points have no autograd formula (the Python
      // functions add it), so a write into a tensor autograd tracks would go unseen.
      if (t.defined() && t.requires_grad() && c10::GradMode::is_enabled()) {
        const std::string name = dotted_name();
        TORCH_CHECK(false, name, ": ", args[i].name(),
                    " requires grad, but torch.ops.", name,
                    " has no autograd formula and would write it behind autograd; call the "
                    "Python function (", name, "), which records the write, or run under "
                    "torch.no_grad()");
      }
    }
  }
  {
    c10::impl::ExcludeDispatchKeyGuard below(c10::DispatchKey::ADInplaceOrView);
    op.redispatchBoxed(keys & c10::after_ADInplaceOrView_keyset, stack);
  }
  for (auto& t : written) {
    if (t.defined() && !t.is_inference()) {
      t.unsafeGetTensorImpl()->bump_version();
    }
  }
}

}  // namespace make_inplace
