#pragma once
// Boxed ADInplaceOrView kernel shared by every mutating op.
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>
#include <c10/core/impl/LocalDispatchKeySet.h>

namespace make_inplace {

inline void bump_versions_then_redispatch(const c10::OperatorHandle& op,
                                          c10::DispatchKeySet keys,
                                          torch::jit::Stack* stack) {
  const auto& args = op.schema().arguments();
  const size_t first = stack->size() - args.size();
  std::vector<at::Tensor> written;
  for (size_t i = 0; i < args.size(); ++i) {
    const auto* alias = args[i].alias_info();
    const c10::IValue& value = (*stack)[first + i];
    if (alias != nullptr && alias->isWrite() && value.isTensor()) {
      written.push_back(value.toTensor());
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
