#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <iostream>
#include <map>

#include "batchtune/common/atomic_file.h"
#include "batchtune/common/error.h"
#include "batchtune/common/precision.h"
#include "batchtune/common/size.h"
#include "batchtune/preflight/batch_estimate.h"
#include "batchtune/preflight/gpu_profile.h"
#include "batchtune/preflight/step_trace.h"
#include "batchtune/step/trial.h"
#include "commands.h"
#include "workload_flags.h"

namespace batchtune::cli {
namespace {

/// The batches the real CPU steps run at: small enough for any model that
/// trains at all, three so that the third checks each size's line.
constexpr int64_t kTraceBatches[] = {2, 4, 6};

struct EstimateFlags {
  WorkloadFlags workload;
  std::string gpu = "H100";
  std::string amp = "bf16";
  int64_t batch_size = 0;
  int64_t max_batch = kMaxEstimateBatch;
  double margin = kDefaultMargin;
  std::string json;
};

/// The step's trace at any batch, from real CPU steps at `kTraceBatches`.
LinearTrace trace_workload(Workload& workload, AmpMode amp) {
  std::vector<std::pair<int64_t, StepTrace>> traces;
  for (int64_t n : kTraceBatches) traces.emplace_back(n, record_cpu_step(workload, amp, n));
  return LinearTrace(traces);
}

std::string confidence(const GpuProfile& profile, const BatchEstimate& e, int64_t off_line) {
  std::string lines =
      off_line > 0 ? fmt::format("; {} allocations did not grow in a line with the batch", off_line)
                   : std::string();
  if (profile.emulated) {
    return fmt::format(
        "batch {} to {} on the emulated device: its step's allocations recorded at batches 2, 4 "
        "and 6 and drawn as lines{}",
        e.low, e.high, lines);
  }
  return fmt::format(
      "batch {} to {} on {}: the low end takes the CUDA context at its high end ({} MiB) and keeps "
      "{:.0f} % of the allocator's memory for what the trace cannot see, the high end neither. The "
      "step's allocations are the CPU's (recorded at batches 2, 4 and 6 and drawn as lines{}): "
      "cuDNN's and cuBLASLt's workspaces are not in them, the CPU's own kernel scratch is. The card's "
      "figures: {}",
      e.low, e.high, profile.name, profile.context_high >> 20, kUnseenShare * 100, lines,
      profile.source);
}

int run_estimate(const EstimateFlags& flags) {
  std::vector<FileRole> files = workload_file_roles(flags.workload);
  files.push_back({"--json", flags.json, FileAccess::kWrite});
  check_file_roles(files);
  check_output_file(flags.json, "--json");
  check_margin(flags.margin);
  const AmpMode amp = parse_amp(flags.amp);
  if (amp == AmpMode::kAuto) {
    throw Error("--amp: estimate needs the precision the GPU will train at: off, bf16 or fp16");
  }
  std::optional<int64_t> limit;
  if (!flags.workload.memory_limit.empty()) {
    limit = parse_size(flags.workload.memory_limit, "--memory-limit");
  }
  GpuProfile profile;
  try {
    profile = gpu_profile(flags.gpu, limit.value_or(0));
  } catch (const Error& e) {
    throw Error(fmt::format("{}: {}", limit || flags.gpu != "cpu" ? "--gpu" : "--memory-limit",
                            e.what()));
  }
  if (limit && !profile.emulated) {
    throw Error(fmt::format("--memory-limit: is the emulated device's size, for --gpu cpu; {} has "
                            "its own memory",
                            profile.name));
  }
  if (amp == AmpMode::kFp16 && profile.emulated) {
    throw Error("--amp: fp16 autocast is for CUDA devices; on the emulated device use bf16 or off");
  }
  // The steps that are traced run on this CPU with no budget but the host's.
  WorkloadFlags on_cpu = flags.workload;
  on_cpu.device = "cpu";
  on_cpu.memory_limit.clear();
  ResolvedWorkload resolved = resolve_workload(on_cpu);
  if (flags.batch_size != 0) {
    check_batch_size(flags.batch_size, resolved.workload->input_spec(), "--batch-size");
  }
  // fp16 runs as bf16 on the CPU: the same sizes.
  const AmpMode traced_amp = amp == AmpMode::kFp16 ? AmpMode::kBf16 : amp;
  const LinearTrace linear = trace_workload(*resolved.workload, traced_amp);
  const BatchEstimate e = estimate_largest_batch(
      [&](int64_t n) { return linear.at(n); }, profile, flags.margin, flags.max_batch);
  const int64_t at = flags.batch_size > 0 ? flags.batch_size : std::max<int64_t>(e.low, 1);
  const MemoryBreakdown b =
      breakdown_at_peak(linear.at(at), linear.category(), profile, e.capacity.high);

  nlohmann::json out;
  out["device"] = profile.name;
  out["amp"] = amp_name(amp);
  out["max_batch_size"] = e.low;
  out["max_batch_size_high"] = e.high;
  out["batch_size"] = at;
  out["peak_bytes"] = b.peak_bytes;
  out["tensor_peak_bytes"] = b.tensor_peak;
  out["breakdown"] = b.bytes;
  out["capacity_bytes"] = e.capacity.low;
  out["capacity_bytes_high"] = e.capacity.high;
  out["traced_at"] = std::vector<int64_t>(std::begin(kTraceBatches), std::end(kTraceBatches));
  out["off_line_events"] = linear.off_line_events();
  out["confidence"] = confidence(profile, e, linear.off_line_events());
  out["source"] = profile.source;
  if (flags.json != "-") {
    fmt::print("{} for {} ({}), amp {}\n", resolved.workload->model().describe(), profile.name,
               profile.description, amp_name(amp));
    fmt::print("largest batch: {} (interval {} to {})\n", e.low, e.low, e.high);
    fmt::print("at batch {}: peak {}{}\n", at, format_bytes(b.peak_bytes),
               b.fits ? "" : " (does not fit)");
    for (const auto& key : breakdown_keys()) {
      fmt::print("  {:<19} {}\n", key, format_bytes(b.bytes.at(key)));
    }
    fmt::print("{}\n", out["confidence"].get<std::string>());
  }
  if (!flags.json.empty()) write_json_output(flags.json, out);
  return 0;
}

}  // namespace

CommandRun add_estimate_command(CLI::App& app) {
  auto* cmd = app.add_subcommand(
      "estimate", "the largest batch on a GPU you do not have, from this CPU (no GPU needed)");
  auto flags = std::make_shared<EstimateFlags>();
  add_workload_flags(*cmd, flags->workload);
  cmd->add_option("--gpu", flags->gpu,
                  fmt::format("the GPU: {}", fmt::join(gpu_profile_names(), ", ")))
      ->capture_default_str();
  cmd->add_option("--amp", flags->amp, "precision the GPU trains at: off, bf16 or fp16")
      ->capture_default_str();
  cmd->add_option("--batch-size", flags->batch_size,
                  "the batch the peak and breakdown are for (default: the estimate)");
  cmd->add_option("--max-batch", flags->max_batch, "the search's largest batch")
      ->capture_default_str();
  cmd->add_option("--margin", flags->margin, "share of the memory kept free, as tune keeps it")
      ->capture_default_str();
  cmd->add_option("--json", flags->json, "write the result as JSON to FILE, or - for stdout");
  return [flags] { return run_estimate(*flags); };
}

}  // namespace batchtune::cli
