#include <gtest/gtest.h>

#include <torch/torch.h>

#include "batchtune/common/error.h"
#include "batchtune/memory/device_memory.h"
#include "batchtune/preflight/step_trace.h"
#include "batchtune/step/workload.h"

using batchtune::AllocationEvent;
using batchtune::LinearTrace;
using batchtune::StepTrace;

namespace {

/// A made-up step at batch `n`: one tensor of 100 + 10 n bytes (or `third`
/// bytes when given), a constant 8-byte one freed at once.
StepTrace made_up(int64_t n, int64_t bytes = -1) {
  StepTrace t;
  t.events = {AllocationEvent::allocate(0, bytes >= 0 ? bytes : 100 + 10 * n),
              AllocationEvent::allocate(1, 8), AllocationEvent::free(1)};
  t.category = {{0, "activations"}, {1, "temporaries"}};
  return t;
}

}  // namespace

TEST(LinearTrace, DrawsEachAllocationAsALineInTheBatch) {
  LinearTrace linear({{2, made_up(2)}, {4, made_up(4)}, {6, made_up(6)}});
  EXPECT_EQ(linear.off_line_events(), 0);
  const auto at = linear.at(1000);
  ASSERT_EQ(at.size(), 3u);
  EXPECT_EQ(at[0].bytes, 100 + 10 * 1000);
  EXPECT_EQ(at[1].bytes, 8);
  EXPECT_EQ(at[2].kind, AllocationEvent::Kind::kFree);
  EXPECT_EQ(linear.category().at(0), "activations");
}

TEST(LinearTrace, CountsSizesOffTheirLineAndRefusesDifferentSteps) {
  LinearTrace bent({{2, made_up(2)}, {4, made_up(4)}, {6, made_up(6, 999)}});
  EXPECT_EQ(bent.off_line_events(), 1);
  StepTrace other = made_up(4);
  other.events.push_back(AllocationEvent::allocate(2, 4));
  EXPECT_THROW(LinearTrace({{2, made_up(2)}, {4, other}}), batchtune::Error);
  EXPECT_THROW(LinearTrace({{2, made_up(2)}}), batchtune::Error);
  EXPECT_THROW(LinearTrace({{2, made_up(2)}, {2, made_up(2)}}), batchtune::Error);
}

TEST(StepTrace, RecordsARealCpuStepAndLeavesTheWorkloadAsItWas) {
  auto memory = batchtune::make_device_memory(c10::Device(c10::kCPU), int64_t{1} << 30);
  batchtune::Workload workload(
      batchtune::WorkloadOptions().model("mlp").input_shape({3, 8, 8}).optimizer("adam"));
  std::vector<at::Tensor> before;
  for (const auto& p : workload.model().parameters()) before.push_back(p.detach().clone());

  const StepTrace t = batchtune::record_cpu_step(workload, batchtune::AmpMode::kOff, 4);
  std::map<std::string, int64_t> bytes;
  for (const auto& e : t.events) {
    if (e.kind == AllocationEvent::Kind::kAllocate) bytes[t.category.at(e.id)] += e.bytes;
  }
  const int64_t parameter_bytes = batchtune::parameter_bytes(workload.model());
  EXPECT_GE(bytes["parameters"], parameter_bytes);
  // Adam: two moments per parameter, live at the end.
  EXPECT_GE(bytes["optimizer_state"], 2 * parameter_bytes);
  // The step frees the gradients after the optimizer's step: an
  // allocator-level recording counts them with the activations.
  EXPECT_GT(bytes["activations"], 0);

  auto params = workload.model().parameters();
  ASSERT_EQ(params.size(), before.size());
  for (size_t i = 0; i < params.size(); ++i) {
    EXPECT_TRUE(torch::equal(params[i], before[i])) << "parameter " << i << " changed";
    EXPECT_FALSE(params[i].grad().defined());
  }
  // A second recording at another batch makes the same events: a line.
  const StepTrace t8 = batchtune::record_cpu_step(workload, batchtune::AmpMode::kOff, 8);
  LinearTrace linear({{4, t}, {8, t8}});
  EXPECT_GT(linear.at(64).size(), 0u);
}
