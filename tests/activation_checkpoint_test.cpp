// Activation checkpointing of resnet18's residual blocks (gpt's: gpt_test.cpp).
#include <gtest/gtest.h>
#include <iostream>
#include <torch/torch.h>

#include "batchtune/common/error.h"
#include "batchtune/memory/device_memory.h"
#include "batchtune/step/trial.h"
#include "batchtune/step/workload.h"

namespace {

using namespace batchtune;

WorkloadOptions small_resnet(bool checkpointing, int64_t side = 32) {
  return WorkloadOptions()
      .model("resnet18")
      .input_shape({3, side, side})
      .classes(5)
      .seed(5)
      .checkpointing(checkpointing);
}

/// One backward pass of `workload` on `batch`: the parameters' gradients.
std::vector<at::Tensor> gradients(Workload& workload, const Batch& batch) {
  workload.optimizer().zero_grad(true);
  workload.compute_loss(batch).backward();
  std::vector<at::Tensor> grads;
  for (const auto& p : workload.model().parameters()) grads.push_back(p.grad().clone());
  return grads;
}

TEST(ActivationCheckpoint, Resnet18GivesTheSameGradientsAndRunningStatistics) {
  Workload kept(small_resnet(false));
  Workload recomputed(small_resnet(true));
  kept.model().train(true);
  recomputed.model().train(true);
  const Batch batch = kept.synthetic_batch(6);
  const auto a = gradients(kept, batch);
  const auto b = gradients(recomputed, batch);
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    ASSERT_TRUE(b[i].defined()) << "parameter " << i << " got no gradient";
    EXPECT_TRUE(torch::allclose(a[i], b[i], 1e-5, 1e-7))
        << "parameter " << i << ": " << (a[i] - b[i]).abs().max().item<double>();
  }
  // The recomputation ran every batch norm again; the running statistics
  // and the batch count still show one forward pass.
  const auto kept_buffers = kept.model().named_buffers();
  const auto recomputed_buffers = recomputed.model().named_buffers();
  ASSERT_EQ(kept_buffers.size(), recomputed_buffers.size());
  int64_t tracked = 0;
  for (size_t i = 0; i < kept_buffers.size(); ++i) {
    const auto& [name, x] = kept_buffers[i];
    const at::Tensor& y = recomputed_buffers[i].second;
    EXPECT_EQ(name, recomputed_buffers[i].first);
    if (name.find("num_batches_tracked") != std::string::npos) {
      EXPECT_EQ(x.item<int64_t>(), 1) << name;
      EXPECT_EQ(y.item<int64_t>(), 1) << name;
      ++tracked;
    } else {
      EXPECT_TRUE(torch::allclose(x, y, 1e-5, 1e-7))
          << name << ": " << (x - y).abs().max().item<double>();
    }
  }
  EXPECT_EQ(tracked, 20) << "resnet18 has 20 batch norms";
}

TEST(ActivationCheckpoint, Resnet18LowersTheStepsPeak) {
  // SGD and batch 64: the activations, not the weights and the optimizer's
  // state, make most of the peak. What checkpointing saves is bounded by
  // the stem (its 7x7 convolution at half the resolution is not a block, so
  // it is kept) and by the gradients, which appear during the backward pass:
  // 0.93x here, 0.89x at batch 128 (the emulated device counts every byte,
  // so the figures are exact).
  auto memory = make_device_memory(c10::Device(c10::kCPU), int64_t{1} << 30);
  const auto peak = [&](bool checkpointing) {
    Workload workload(small_resnet(checkpointing, 64).optimizer("sgd"));
    TrialRunner runner(workload, *memory);
    const TrialResult r = runner.run(TrialOptions().batch_size(64).steps(1));
    EXPECT_TRUE(r.fits) << r.error;
    return r.peak_bytes;
  };
  const int64_t kept = peak(false);
  const int64_t recomputed = peak(true);
  std::cout << "resnet18 3x64x64 batch 64 peak: " << kept << " -> " << recomputed << " bytes ("
            << static_cast<double>(recomputed) / static_cast<double>(kept) << "x)\n";
  EXPECT_LT(static_cast<double>(recomputed), 0.95 * static_cast<double>(kept))
      << kept << " -> " << recomputed;
}

TEST(ActivationCheckpoint, ModelsWithoutBlocksRefuseIt) {
  for (const char* name : {"convnet", "mlp", "lenet"}) {
    try {
      Workload workload(WorkloadOptions().model(name).input_shape({3, 32, 32}).checkpointing(true));
      ADD_FAILURE() << name << " took checkpointing";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("has no blocks to recompute (resnet18's and gpt's are)"),
                std::string::npos)
          << e.what();
    }
  }
}

}  // namespace
