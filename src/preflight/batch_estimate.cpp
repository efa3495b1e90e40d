#include "batchtune/preflight/batch_estimate.h"

#include <fmt/format.h>

#include <algorithm>
#include <map>

#include "batchtune/common/error.h"
#include "batchtune/step/trial.h"

namespace batchtune {

EstimateCapacity estimate_capacity(const GpuProfile& profile, double margin) {
  check_margin(margin);
  EstimateCapacity c;
  const double kept = 1 - margin;
  if (profile.emulated) {
    c.high = static_cast<int64_t>(static_cast<double>(profile.total_bytes) * kept);
    c.low = static_cast<int64_t>(static_cast<double>(c.high) * (1 - kUnseenShare));
  } else {
    c.high = static_cast<int64_t>(static_cast<double>(profile.allocator_capacity(false)) * kept);
    c.low = static_cast<int64_t>(static_cast<double>(profile.allocator_capacity(true)) * kept *
                                 (1 - kUnseenShare));
  }
  c.low = std::max<int64_t>(c.low, 0);
  c.high = std::max<int64_t>(c.high, 0);
  return c;
}

AllocatorReplay replay_on(const AllocationTrace& trace, const GpuProfile& profile,
                          int64_t capacity) {
  if (!profile.emulated) {
    AllocationTrace with_workspace;
    with_workspace.reserve(trace.size() + 1);
    // An id no storage of a trace has: traces number theirs from 0.
    with_workspace.push_back(AllocationEvent::allocate(-1, profile.cublas_workspace));
    with_workspace.insert(with_workspace.end(), trace.begin(), trace.end());
    return replay_trace(with_workspace, capacity);
  }
  // The emulated device counts the bytes asked for, with no allocator
  // between: the replay under no cap gives the tensors' peak.
  AllocatorReplay r = replay_trace(trace, INT64_MAX);
  r.peak_reserved = r.peak_requested;
  r.peak_allocated = r.peak_requested;
  r.fits = r.peak_requested <= capacity;
  return r;
}

BatchEstimate estimate_largest_batch(const std::function<AllocationTrace(int64_t)>& trace_at,
                                     const GpuProfile& profile, double margin,
                                     int64_t max_batch) {
  if (max_batch < 1 || max_batch > kMaxEstimateBatch) {
    throw Error(fmt::format("max_batch: must be from 1 to {}, got {}", kMaxEstimateBatch, max_batch));
  }
  BatchEstimate out;
  out.capacity = estimate_capacity(profile, margin);
  std::map<int64_t, AllocationTrace> traces;
  auto trace = [&](int64_t n) -> const AllocationTrace& {
    auto it = traces.find(n);
    if (it == traces.end()) it = traces.emplace(n, trace_at(n)).first;
    return it->second;
  };
  auto largest = [&](int64_t capacity) -> int64_t {
    auto fits = [&](int64_t n) {
      const AllocatorReplay r = replay_on(trace(n), profile, capacity);
      out.trials.push_back({n, capacity, r.fits, r.peak_reserved, r.peak_requested});
      return r.fits;
    };
    // From 2: a model with batch norm cannot train on one sample at all.
    const int64_t first = std::min<int64_t>(2, max_batch);
    if (!fits(first)) return first > 1 && fits(1) ? 1 : 0;
    int64_t good = first;
    int64_t bad = 0;
    while (bad == 0) {
      const int64_t n = std::min(good * 2, max_batch);
      if (n == good) return good;
      if (fits(n)) {
        good = n;
      } else {
        bad = n;
      }
    }
    while (bad - good > 1) {
      const int64_t mid = good + (bad - good) / 2;
      if (fits(mid)) {
        good = mid;
      } else {
        bad = mid;
      }
    }
    return good;
  };
  out.low = largest(out.capacity.low);
  out.high = largest(out.capacity.high);
  return out;
}

std::vector<std::string> breakdown_keys() {
  return {"parameters",  "gradients",  "optimizer_state",    "activations",
          "temporaries", "workspaces", "allocator_overhead", "context"};
}

MemoryBreakdown breakdown_at_peak(const AllocationTrace& trace,
                                  const std::map<int64_t, std::string>& category,
                                  const GpuProfile& profile, int64_t capacity) {
  MemoryBreakdown out;
  for (const auto& key : breakdown_keys()) out.bytes[key] = 0;
  // The storages live when the bytes asked for peak.
  std::map<int64_t, int64_t> live;
  std::map<int64_t, int64_t> at_peak;
  int64_t total = 0;
  for (const auto& e : trace) {
    if (e.kind == AllocationEvent::Kind::kAllocate) {
      live[e.id] = e.bytes;
      total += e.bytes;
      if (total > out.tensor_peak) {
        out.tensor_peak = total;
        at_peak = live;
      }
    } else if (auto it = live.find(e.id); it != live.end()) {
      total -= it->second;
      live.erase(it);
    }
  }
  for (const auto& [id, bytes] : at_peak) {
    auto it = category.find(id);
    std::string what = it == category.end() ? "temporaries" : it->second;
    if (out.bytes.count(what) == 0) what = "temporaries";
    out.bytes[what] += bytes;
  }
  const AllocatorReplay replay = replay_on(trace, profile, capacity);
  out.fits = replay.fits;
  if (profile.emulated) {
    out.peak_bytes = out.tensor_peak;
  } else {
    out.bytes["workspaces"] = profile.cublas_workspace;
    out.bytes["allocator_overhead"] =
        std::max<int64_t>(0, replay.peak_reserved - out.tensor_peak - profile.cublas_workspace);
    out.bytes["context"] = profile.context_high;
    out.peak_bytes = replay.peak_reserved;
  }
  return out;
}

}  // namespace batchtune
