// bench/token_budget: token-budget batching against fixed batches padded to
// the longest sequence, on the same text, model and memory budget.
//
//   build/bench/token_budget [DIR] [--memory-limit MiB] [--epochs N]
//
// DIR (default /usr/share/common-licenses, on every Debian machine) is read
// as `--data text:DIR` reads it: each paragraph one sample of 16..512 byte
// tokens. The workload is the built-in gpt at its defaults (2 blocks, width
// 64, vocabulary 256) with adam, on the CPU under an emulated budget. The
// search at the longest length gives the largest fixed batch that fits
// there; the length phase of a tune gives the token budget and buckets.
// Then one epoch each way, the same samples: tokens/s (real tokens, padding
// not counted), the share of computed tokens that were padding, and the
// out-of-memory recoveries (none expected in either). Prints a markdown
// table for the README.
#include <fmt/format.h>

#include <cstdlib>
#include <string>

#include "batchtune/common/size.h"
#include "batchtune/data/text.h"
#include "batchtune/memory/device_memory.h"
#include "batchtune/step/trial.h"
#include "batchtune/step/workload.h"
#include "batchtune/training/token_trainer.h"
#include "batchtune/tuning/search.h"
#include "batchtune/tuning/token_budget.h"

namespace {

using namespace batchtune;

constexpr LengthRange kRange{16, 512};

double padding_share(const TrainSummary& s) {
  return s.padded_tokens > 0
             ? 1.0 - static_cast<double>(s.tokens) / static_cast<double>(s.padded_tokens)
             : 0.0;
}

}  // namespace

int main(int argc, char** argv) {
  std::string dir = "/usr/share/common-licenses";
  int64_t limit_mib = 64;
  int64_t epochs = 1;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--memory-limit" && i + 1 < argc) {
      limit_mib = std::atoll(argv[++i]);
    } else if (arg == "--epochs" && i + 1 < argc) {
      epochs = std::atoll(argv[++i]);
    } else {
      dir = arg;
    }
  }
  const TextDataset text(dir, kRange);
  fmt::print("data: {}\n", text.describe());
  auto memory = make_device_memory(c10::Device(c10::kCPU), limit_mib << 20);
  Workload workload(WorkloadOptions()
                        .model("gpt")
                        .input_spec(parse_input_flags(
                            InputFlags().inputs({"int64:16..512"}).vocab(kByteVocab)))
                        .seed(0));
  fmt::print("model: {}; memory: {} capacity, {} % margin\n", workload.model().describe(),
             format_bytes(memory->capacity_bytes()), 100 * kDefaultMargin);

  TrialRunner runner(workload, *memory, kDefaultMargin);
  const auto trial = [&](int64_t b, int64_t l) {
    return runner.run(TrialOptions().batch_size(b).sequence_length(l).steps(1).warmup_steps(1));
  };
  const SearchResult search =
      search_max_batch([&](int64_t b) { return trial(b, 0); }, SearchOptions().time_budget_s(300));
  fmt::print("largest fixed batch at {} tokens: {} ({})\n", kRange.max, search.max_batch_size,
             search.stop_reason);
  const TokenBudgetResult planned = plan_token_budget(
      trial, search.trials, search.max_batch_size, kRange,
      memory->usable_bytes() - parameter_bytes(workload.model()), 8192);
  fmt::print("{}\n", planned.reason);

  Plan plan;
  plan.token_budget = planned.token_budget;
  plan.length_buckets = planned.buckets;
  plan.micro_batch_size = search.max_batch_size;
  plan.lr = 1e-3;

  // Steps of one budget of real tokens (the plan's default), fixed batches
  // one a step: the steps differ in how their micro-batches are made.
  const TokenTrainOptions common = TokenTrainOptions().run(TrainOptions().epochs(epochs).seed(1));
  const TrainSummary by_tokens = train_by_tokens(workload, *memory, plan, text, common);
  const TrainSummary fixed =
      train_by_tokens(workload, *memory, plan, text,
                      TokenTrainOptions(common)
                          .fixed_batch_size(search.max_batch_size)
                          .pad_to(kRange.max));

  fmt::print("\n| batching | micro-batch | optimizer steps | padding | tokens/s | samples/s | "
             "out-of-memory | seconds |\n|---|---|---:|---:|---:|---:|---:|---:|\n");
  fmt::print("| token budget | {} tokens, {} buckets | {} | {:.1f} % | {:.0f} | {:.1f} | {} | {:.1f} |\n",
             plan.token_budget, plan.length_buckets.size(), by_tokens.steps,
             100 * padding_share(by_tokens), by_tokens.tokens_per_s, by_tokens.samples_per_s,
             by_tokens.oom_recoveries, by_tokens.seconds);
  fmt::print("| fixed, padded to {} | {} samples | {} | {:.1f} % | {:.0f} | {:.1f} | {} | {:.1f} |\n",
             kRange.max, search.max_batch_size, fixed.steps, 100 * padding_share(fixed),
             fixed.tokens_per_s, fixed.samples_per_s, fixed.oom_recoveries, fixed.seconds);
  fmt::print("\ntoken budget / fixed: {:.2f}x the tokens/s; peak {} of {} usable\n",
             fixed.tokens_per_s > 0 ? by_tokens.tokens_per_s / fixed.tokens_per_s : 0.0,
             format_bytes(memory->peak_bytes()), format_bytes(memory->usable_bytes()));
  return 0;
}
