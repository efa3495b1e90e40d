// The bare LibTorch loop `bench/train_overhead` compares `batchtune train`
// with: the same model, data, optimizer and steps, and nothing else — no
// plan, no accumulation bookkeeping, no events, no OOM guard.
//
//   bench_bare_train_loop MODEL BATCH STEPS THREADS [budget|system]
//
// Prints `samples_per_s <value>`. `budget` (the default) installs batchtune's
// caching CPU allocator with no limit, as the batchtune CLI does, so the
// comparison measures the loop and not the allocator.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/nn/functional/loss.h>
#include <torch/optim/adam.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "batchtune/memory/budget_allocator.h"
#include "batchtune/data/fashion_mnist.h"
#include "batchtune/models/model.h"

int main(int argc, char** argv) {
  if (argc < 5) {
    std::fprintf(stderr, "usage: %s MODEL BATCH STEPS THREADS [budget|system]\n", argv[0]);
    return 2;
  }
  const std::string model_name = argv[1];
  const int64_t batch = std::atoll(argv[2]);
  const int64_t steps = std::atoll(argv[3]);
  at::set_num_threads(std::atoi(argv[4]));
  if (argc < 6 || std::string(argv[5]) == "budget") batchtune::BudgetAllocator::install();

  const auto train = batchtune::load_fashion_mnist(batchtune::kFashionMnistDefaultDir,
                                                   batchtune::FashionMnistSplit::kTrain);
  // All samples as one normalised tensor, as a hand-written loop would hold them.
  std::vector<int64_t> all(static_cast<size_t>(train->size()));
  for (int64_t i = 0; i < train->size(); ++i) all[static_cast<size_t>(i)] = i;
  const batchtune::Batch data = train->get_batch(all);

  torch::manual_seed(0);
  batchtune::ModelSpec spec;
  spec.input_shape = {1, 28, 28};
  spec.classes = 10;
  auto model = batchtune::make_builtin_model(model_name, spec);
  model->train(true);
  torch::optim::Adam optimizer(model->parameters(), torch::optim::AdamOptions(1e-3));

  const int64_t per_epoch = train->size() / batch;
  at::Tensor order;
  const auto start = std::chrono::steady_clock::now();
  for (int64_t step = 0; step < steps; ++step) {
    if (step % per_epoch == 0) order = at::randperm(train->size(), at::kLong);
    const at::Tensor index = order.slice(0, (step % per_epoch) * batch, (step % per_epoch + 1) * batch);
    const at::Tensor input = data.inputs[0].index_select(0, index);
    const at::Tensor target = data.target.index_select(0, index);
    optimizer.zero_grad(true);
    const at::Tensor loss = torch::nn::functional::cross_entropy(model->forward(input), target);
    loss.backward();
    optimizer.step();
    if (step + 1 == steps) (void)loss.item<double>();
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("samples_per_s %.1f\n", static_cast<double>(steps * batch) / seconds);
  return 0;
}
