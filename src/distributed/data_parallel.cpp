#include "batchtune/distributed/data_parallel.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <fmt/format.h>

#include <chrono>
#include <cstring>

#include "batchtune/common/error.h"
#include "batchtune/memory/budget_allocator.h"
#include "batchtune/memory/device_memory.h"
#include "batchtune/step/trial_failure.h"
#include "batchtune/distributed/distributed.h"

namespace batchtune {

std::vector<int64_t> shard_batch(const std::vector<int64_t>& indices, int64_t rank,
                                 int64_t world_size) {
  const auto total = static_cast<int64_t>(indices.size());
  TORCH_CHECK(world_size >= 1 && rank >= 0 && rank < world_size,
              "shard_batch: rank ", rank, " of ", world_size);
  TORCH_CHECK(total % world_size == 0, "shard_batch: a logical batch of ", total,
              " does not split over ", world_size, " ranks");
  const int64_t per_rank = total / world_size;
  return {indices.begin() + rank * per_rank, indices.begin() + (rank + 1) * per_rank};
}

std::pair<int64_t, int64_t> shard_range(int64_t size, int64_t rank, int64_t world_size) {
  const int64_t base = size / world_size;
  const int64_t extra = size % world_size;
  const int64_t begin = rank * base + std::min(rank, extra);
  return {begin, begin + base + (rank < extra ? 1 : 0)};
}

int64_t DataParallel::rank() const { return communicator_ ? communicator_->rank() : 0; }

int64_t DataParallel::world_size() const {
  return communicator_ ? communicator_->world_size() : 1;
}

void DataParallel::broadcast_from_first(const std::vector<at::Tensor>& tensors) {
  if (!distributed()) return;
  at::NoGradGuard no_grad;
  std::vector<at::Tensor> contiguous;
  for (const auto& t : tensors) contiguous.push_back(t.detach().contiguous());
  communicator_->broadcast(contiguous, 0);
  for (size_t i = 0; i < tensors.size(); ++i) {
    if (!contiguous[i].is_same(tensors[i])) tensors[i].detach().copy_(contiguous[i]);
  }
}

DataParallel::StepOutcome DataParallel::share_step(bool out_of_memory, const at::Tensor& loss,
                                                   c10::Device device) {
  if (!distributed()) return {out_of_memory, loss};
  at::Tensor status = at::zeros({2}, at::TensorOptions().dtype(at::kFloat).device(device));
  if (out_of_memory) status[0].fill_(1);
  if (loss.defined()) status[1].copy_(loss.to(at::kFloat));
  communicator_->all_reduce(status, ReduceOp::kSum);
  StepOutcome outcome;
  outcome.out_of_memory = status[0].item<float>() > 0;
  outcome.loss = status[1] / static_cast<double>(world_size());
  return outcome;
}

void DataParallel::average_gradients(const std::vector<at::Tensor>& parameters,
                                     const DeviceMemory* memory) {
  if (!distributed()) return;
  const auto start = std::chrono::steady_clock::now();
  at::NoGradGuard no_grad;
  const int64_t ooms_before = memory != nullptr ? memory->oom_count() : 0;
  // What each rank tells the others before any gradient is sent: what it
  // could allocate. An out-of-memory on one rank in the middle of the
  // buckets would leave the others waiting in a collective it never starts,
  // for the whole timeout.
  enum Status : int { kReady = 0, kNoBuckets = 1, kNoGradients = 2 };
  int status = kReady;
  std::string oom_message;
  std::vector<at::Tensor> grads;
  struct Bucket {
    std::vector<at::Tensor> grads;
    at::Tensor flat;
    std::unique_ptr<PendingCollective> pending;
  };
  std::vector<Bucket> buckets;
  const double scale = 1.0 / static_cast<double>(world_size());
  const auto out_of_memory = [&](const c10::Error& e) {
    const int64_t after = memory != nullptr ? memory->oom_count() : ooms_before;
    if (classify_step_failure(e, ooms_before, after) != StepFailure::kOutOfMemory) return false;
    oom_message = first_line(e.what_without_backtrace());
    return true;
  };
  try {
    // Gradients come due in reverse order in backward; PyTorch's DDP
    // buckets them that way too.
    for (auto it = parameters.rbegin(); it != parameters.rend(); ++it) {
      at::Tensor p = *it;
      if (!p.requires_grad()) continue;
      if (!p.grad().defined()) p.mutable_grad() = at::zeros_like(p);
      grads.push_back(p.grad());
    }
  } catch (const c10::Error& e) {
    if (!out_of_memory(e)) throw;
    status = kNoGradients;
  }
  if (status == kReady) {
    try {
      int64_t bytes = kGradientBucketBytes;
      for (const auto& g : grads) {
        const int64_t size = g.numel() * static_cast<int64_t>(g.element_size());
        if (buckets.empty() || bytes + size > kGradientBucketBytes ||
            buckets.back().grads.front().scalar_type() != g.scalar_type()) {
          buckets.emplace_back();
          bytes = 0;
        }
        buckets.back().grads.push_back(g);
        bytes += size;
      }
      for (auto& b : buckets) {
        std::vector<at::Tensor> flat_parts;
        for (const auto& g : b.grads) flat_parts.push_back(g.reshape({-1}));
        b.flat = at::cat(flat_parts).mul_(scale);
      }
    } catch (const c10::Error& e) {
      if (!out_of_memory(e)) throw;
      status = kNoBuckets;
    }
  }
  if (status != kReady) buckets.clear();  // the flat copies go back before the fallback
  at::Tensor agreed = at::full({1}, status, at::TensorOptions().dtype(at::kInt).device(communicator_->device()));
  communicator_->all_reduce(agreed, ReduceOp::kMax);
  const int worst = agreed.item<int>();
  if (worst == kNoGradients) {
    throw Error(fmt::format(
        "train: out of memory making the gradients to average ({}); the model's gradients do "
        "not fit beside its parameters and optimizer state — use a larger memory limit or a "
        "smaller model",
        status == kNoGradients ? oom_message : "on another rank"));
  }
  if (worst == kNoBuckets) {
    // Some rank has no room for the flat copies: every rank sums each
    // gradient in place instead, one collective per tensor, no copy.
    ++in_place_averages_;
    for (auto& g : grads) {
      communicator_->all_reduce(g, ReduceOp::kSum);
      g.mul_(scale);
    }
  } else {
    for (auto& b : buckets) b.pending = communicator_->start_all_reduce_sum(b.flat);
    for (auto& b : buckets) {
      b.pending->wait();
      int64_t offset = 0;
      for (auto& g : b.grads) {
        g.copy_(b.flat.narrow(0, offset, g.numel()).view_as(g));
        offset += g.numel();
      }
    }
  }
  communication_seconds_ +=
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

int64_t DataParallel::sum(int64_t value) {
  if (!distributed()) return value;
  BudgetAllocator::UncountedScope uncounted;
  at::Tensor t = at::tensor({value}, at::kLong).to(communicator_->device());
  communicator_->all_reduce(t, ReduceOp::kSum);
  return t.item<int64_t>();
}

int64_t DataParallel::min(int64_t value) {
  if (!distributed()) return value;
  BudgetAllocator::UncountedScope uncounted;
  at::Tensor t = at::tensor({value}, at::kLong).to(communicator_->device());
  communicator_->all_reduce(t, ReduceOp::kMin);
  return t.item<int64_t>();
}

std::vector<double> DataParallel::max_over_ranks(const std::vector<double>& values) {
  if (!distributed() || values.empty()) return values;
  BudgetAllocator::UncountedScope uncounted;
  at::Tensor t = at::tensor(values, at::kDouble).to(communicator_->device());
  communicator_->all_reduce(t, ReduceOp::kMax);
  t = t.cpu();
  return {t.data_ptr<double>(), t.data_ptr<double>() + t.numel()};
}

Plan DataParallel::agree_plan(const Plan& plan) {
  if (!distributed()) return plan;
  BudgetAllocator::UncountedScope uncounted;
  const std::string text = to_json(plan).dump();
  const c10::Device device = communicator_->device();
  std::vector<at::Tensor> length{
      at::tensor({static_cast<int64_t>(text.size())}, at::kLong).to(device)};
  communicator_->broadcast(length, 0);
  const int64_t n = length[0].item<int64_t>();
  at::Tensor host = at::zeros({n}, at::kByte);
  if (rank() == 0) std::memcpy(host.data_ptr(), text.data(), text.size());
  std::vector<at::Tensor> bytes{host.to(device)};
  communicator_->broadcast(bytes, 0);
  host = bytes[0].cpu();
  const std::string received(static_cast<const char*>(host.data_ptr()), static_cast<size_t>(n));
  return plan_from_json(nlohmann::json::parse(received), "rank 0's plan");
}

}  // namespace batchtune
