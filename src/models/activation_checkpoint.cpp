#include "batchtune/models/activation_checkpoint.h"

#include <ATen/autocast_mode.h>
#include <c10/core/GradMode.h>
#include <torch/autograd.h>
#include <torch/custom_class.h>

#include <utility>

namespace batchtune {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

/// The block to run again, kept by the autograd graph until its backward,
/// and the buffers its recomputation must leave as they are.
struct HeldBlock : torch::CustomClassHolder {
  HeldBlock(std::function<at::Tensor(const at::Tensor&)> f, std::vector<at::Tensor> b)
      : run(std::move(f)), buffers(std::move(b)) {}
  std::function<at::Tensor(const at::Tensor&)> run;
  std::vector<at::Tensor> buffers;
};

/// Puts `buffers` back as they were when it was made, on leaving the scope.
class BuffersKept {
 public:
  explicit BuffersKept(const std::vector<at::Tensor>& buffers) : buffers_(buffers) {
    const at::NoGradGuard no_grad;
    for (const auto& b : buffers_) saved_.push_back(b.clone());
  }
  ~BuffersKept() {
    const at::NoGradGuard no_grad;
    for (size_t i = 0; i < buffers_.size(); ++i) buffers_[i].copy_(saved_[i]);
  }
  BuffersKept(const BuffersKept&) = delete;
  BuffersKept& operator=(const BuffersKept&) = delete;

 private:
  const std::vector<at::Tensor>& buffers_;
  std::vector<at::Tensor> saved_;
};

/// Autocast as the forward pass had it, for the recomputation.
class AutocastAsInForward {
 public:
  AutocastAsInForward(c10::DeviceType device, bool enabled, at::ScalarType dtype)
      : device_(device),
        was_enabled_(at::autocast::is_autocast_enabled(device)),
        was_dtype_(at::autocast::get_autocast_dtype(device)),
        enabled_(enabled) {
    at::autocast::set_autocast_enabled(device_, enabled);
    at::autocast::set_autocast_dtype(device_, dtype);
    if (enabled_) at::autocast::increment_nesting();
  }
  ~AutocastAsInForward() {
    if (enabled_ && at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
    at::autocast::set_autocast_enabled(device_, was_enabled_);
    at::autocast::set_autocast_dtype(device_, was_dtype_);
  }
  AutocastAsInForward(const AutocastAsInForward&) = delete;
  AutocastAsInForward& operator=(const AutocastAsInForward&) = delete;

 private:
  c10::DeviceType device_;
  bool was_enabled_;
  at::ScalarType was_dtype_;
  bool enabled_;
};

struct Recompute : torch::autograd::Function<Recompute> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& input,
                            c10::intrusive_ptr<HeldBlock> block) {
    // Function::apply runs this without gradient mode: nothing is kept.
    const c10::DeviceType device = input.device().type();
    ctx->save_for_backward({input});
    ctx->saved_data["autocast"] = at::autocast::is_autocast_enabled(device);
    ctx->saved_data["dtype"] = at::autocast::get_autocast_dtype(device);
    ctx->saved_data["block"] =
        c10::IValue::make_capsule(c10::intrusive_ptr<torch::CustomClassHolder>(block));
    return block->run(input);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const at::Tensor saved = ctx->get_saved_variables().at(0);
    auto block = c10::static_intrusive_pointer_cast<HeldBlock>(
        ctx->saved_data["block"].toCapsule());
    at::Tensor input = saved.detach().requires_grad_(saved.requires_grad());
    // Put back after this backward: the recomputation's graph saved the
    // buffers (batch norm's running statistics), and a copy into them
    // before its backward would fail autograd's version check.
    const BuffersKept kept(block->buffers);
    at::Tensor output;
    {
      const at::AutoGradMode grad(true);
      const AutocastAsInForward autocast(saved.device().type(),
                                         ctx->saved_data["autocast"].toBool(),
                                         ctx->saved_data["dtype"].toScalarType());
      output = block->run(input);
    }
    // Reentrant: this backward accumulates the block's parameter gradients
    // and gives the input's, which the outer pass carries on from.
    torch::autograd::backward({output}, {grads.at(0)});
    return {input.grad(), at::Tensor()};
  }
};

}  // namespace

at::Tensor checkpointed(std::function<at::Tensor(const at::Tensor&)> block,
                        const at::Tensor& input) {
  return checkpointed(std::move(block), input, {});
}

at::Tensor checkpointed(std::function<at::Tensor(const at::Tensor&)> block, const at::Tensor& input,
                        std::vector<at::Tensor> buffers) {
  if (!c10::GradMode::is_enabled() || !input.requires_grad()) return block(input);
  return Recompute::apply(input,
                          c10::make_intrusive<HeldBlock>(std::move(block), std::move(buffers)));
}

}  // namespace batchtune
